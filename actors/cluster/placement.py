"""Replica placement: which nodes, and which shard of each, host a new partition's replicas.

The proposer places before it proposes (the CreateTopic and CreatePartitions commands carry
the result), so placement may look at soft state, such as which nodes are live, that applying
may not. It is a pure function of its inputs: the same nodes, assignments and `start` give
the same replicas on every node and in every test.

The goals, after Kafka's striped placer and Redpanda's partition allocator:

- every replica of a partition on a different node (a constraint: RF > nodes is refused);
- a topic's leaders (first replicas) spread evenly over the nodes, and its followers too;
- within a node, leaders spread evenly over its shards, and followers too (a shard is a core:
  a shard full of leaders is a hot core);
- counting what is already placed, so that many small topics still even out.

Kafka's rack-unaware assignment gets the first two with a round robin whose follower offset
shifts each round; Redpanda's allocator picks the least-loaded node for each replica. Here
each partition is placed greedily, in two steps, by keys whose first part is the topic's own
load and whose next is the whole cluster's, so a topic is balanced whatever the cluster looks
like and the cluster's ties go to its least-loaded nodes:

    the set     RF nodes, one at a time: min (topic's replicas there, cluster's replicas
                there, partitions shared with the nodes chosen so far, rotation)
    its leader  min over all nodes (topic's leaders there, outside the set, cluster's leaders
                there, partitions it leads with the set as followers, rotation); a leader
                from outside the set takes the place of the set's last choice
    its shards  leader: min (topic's leaders there, cluster's leaders there, replicas there,
                rotation); follower: the same with followers

Choosing the set by replicas first holds the cluster's replicas per node within a couple of
each other however many topics come; choosing the leader by the topic's leaders first holds
a topic's leaders per node within one (a greedy minimum never widens a spread it starts
within), and inside the set by the cluster's leaders keeps those close too. The same
argument holds a node's leaders per shard within one. The shared-partition terms spread a
node's partners: when a node fails, its leaderships and its re-replication fall on many
nodes, not on one partner (the job of Kafka's shifting follower offset). The rotation (rank
in node order, offset by `start` and the partition number; shard index likewise) breaks
what ties remain, round-robin:

    3 nodes, RF 2, 6 partitions, empty cluster, start 0
    p0 [0, 1]   p1 [1, 2]   p2 [2, 0]   p3 [1, 0]   p4 [2, 1]   p5 [0, 2]

Nodes are weighed equally whatever their shard counts: a partition's client traffic goes to
its leader's node, and Metadata spreads clients over nodes, not cores. A node with no room left
(`room`: the replicas it may still host, from its partitions_max) takes no more; too few nodes
with room is INVALID_PARTITIONS. Explicit assignments from CreateTopics (node lists) are
checked instead, and only their shards are chosen (`assign_shards`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from actors.cluster import limits
from actors.cluster.commands import Address, Replicas
from wire.errors import ErrorCode

__all__ = ["Load", "PlacementError", "assign_shards", "move_target", "place_replicas"]


class PlacementError(ValueError):
    """Replicas that cannot be placed as asked: a Kafka error code and one line why."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


class Load:
    """Leaders and followers counted per node and per (node, shard), and how many
    partitions each pair of nodes shares."""

    __slots__ = (
        "node_leaders", "node_followers", "shard_leaders", "shard_followers", "pairs", "follows"
    )

    def __init__(self, assignments: Iterable[Sequence[Address]] = ()) -> None:
        self.node_leaders: Counter[int] = Counter()
        self.node_followers: Counter[int] = Counter()
        self.shard_leaders: Counter[Address] = Counter()
        self.shard_followers: Counter[Address] = Counter()
        self.pairs: Counter[tuple[int, int]] = Counter()  # (lower node, higher node)
        self.follows: Counter[tuple[int, int]] = Counter()  # (leader node, follower node)
        for replicas in assignments:
            self.add(replicas)

    def add(self, replicas: Sequence[Address]) -> None:
        for i, address in enumerate(replicas):
            if i == 0:
                self.node_leaders[address[0]] += 1
                self.shard_leaders[address] += 1
            else:
                self.node_followers[address[0]] += 1
                self.shard_followers[address] += 1
                self.follows[(replicas[0][0], address[0])] += 1
            for other, _ in replicas[i + 1:]:
                self.pairs[_pair(address[0], other)] += 1

    def replicas(self, node: int) -> int:
        return self.node_leaders[node] + self.node_followers[node]

    def replicas_on(self, address: Address) -> int:
        return self.shard_leaders[address] + self.shard_followers[address]

    def shared(self, node: int, others: Iterable[int]) -> int:
        """Partitions `node` shares with each of `others`, summed."""
        return sum(self.pairs[_pair(node, other)] for other in others if other != node)

    def followed(self, leader: int, others: Iterable[int]) -> int:
        """Partitions `leader` leads with each of `others` as a follower, summed."""
        return sum(self.follows[(leader, other)] for other in others if other != leader)


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def place_replicas(
    nodes: Mapping[int, int],
    partitions: int,
    replication_factor: int,
    *,
    existing: Iterable[Sequence[Address]] = (),
    topic_existing: Iterable[Sequence[Address]] = (),
    start: int = 0,
    room: Mapping[int, int] | None = None,
) -> list[Replicas]:
    """Replicas for `partitions` new partitions of one topic, the preferred leader first.

    `nodes`: the live nodes that may take replicas, node id -> its shard count. `existing`:
    every partition's replicas in the cluster (this topic's included); `topic_existing`: this
    topic's partitions so far (CreatePartitions), so that its new ones balance with them.
    `start`: where ties begin (the proposer passes any int it likes, e.g. a hash of the topic
    name, and records the outcome). `room`: replicas each node may still host; None: no limit.
    Raises PlacementError: INVALID_REPLICATION_FACTOR when RF is below 1 or above the nodes,
    INVALID_PARTITIONS when fewer than RF nodes have room."""
    _check_nodes(nodes)
    if not 1 <= replication_factor <= min(len(nodes), limits.replication_factor_max):
        raise PlacementError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} with {len(nodes)} live nodes",
        )
    if partitions < 1:
        raise PlacementError(ErrorCode.INVALID_PARTITIONS, f"{partitions} partitions")
    order = sorted(nodes)
    cluster, topic = Load(existing), Load(topic_existing)
    left = dict(room) if room is not None else None
    placed: list[Replicas] = []
    for p in range(partitions):
        candidates = [n for n in order if left is None or left.get(n, 0) > 0]
        if len(candidates) < replication_factor:
            raise PlacementError(
                ErrorCode.INVALID_PARTITIONS,
                f"{len(candidates)} nodes have room for more partitions; "
                f"replication factor {replication_factor} needs {replication_factor}",
            )
        turn = start + p
        chosen = _choose_nodes(candidates, replication_factor, turn, cluster, topic)
        replicas = tuple(
            (node, _shard(node, nodes[node], i == 0, turn, cluster, topic))
            for i, node in enumerate(chosen)
        )
        cluster.add(replicas)
        topic.add(replicas)
        if left is not None:
            for node in chosen:
                left[node] -= 1
        placed.append(replicas)
    return placed


def _choose_nodes(
    candidates: list[int], replication_factor: int, turn: int, cluster: Load, topic: Load
) -> list[int]:
    """One partition's nodes, its leader first: the least-loaded set, then its leader."""
    rotation = {n: (i - turn) % len(candidates) for i, n in enumerate(candidates)}
    chosen: list[int] = []
    for _ in range(replication_factor):
        chosen.append(min((n for n in candidates if n not in chosen), key=lambda n: (
            topic.replicas(n), cluster.replicas(n), cluster.shared(n, chosen), rotation[n])))
    leader = min(candidates, key=lambda n: (
        topic.node_leaders[n], n not in chosen, cluster.node_leaders[n],
        cluster.followed(n, chosen), rotation[n]))
    if leader in chosen:
        chosen.remove(leader)
    else:
        chosen.pop()  # the last chosen gives way to a node that leads fewer of the topic
    return [leader, *chosen]


def _shard(node: int, shards: int, leader: bool, turn: int, cluster: Load, topic: Load) -> int:
    if leader:
        return min(range(shards), key=lambda s: (
            topic.shard_leaders[(node, s)], cluster.shard_leaders[(node, s)],
            cluster.replicas_on((node, s)), (s - turn) % shards))
    return min(range(shards), key=lambda s: (
        topic.shard_followers[(node, s)], cluster.shard_followers[(node, s)],
        cluster.replicas_on((node, s)), (s - turn) % shards))


def assign_shards(
    nodes: Mapping[int, int],
    assignments: Sequence[tuple[int, Sequence[int]]],
    *,
    existing: Iterable[Sequence[Address]] = (),
    topic_existing: Iterable[Sequence[Address]] = (),
    first_partition: int = 0,
    start: int = 0,
) -> list[Replicas]:
    """An explicit assignment (CreateTopics' `(partition index, [node ids])`), checked and
    given shards the way `place_replicas` chooses them. The indexes must run from
    `first_partition` with no gap (in any order); every node must be registered (`nodes`:
    all of them, live or not, id -> shard count); no node twice in one partition; one
    replication factor for all. `existing`, `topic_existing`, `start`: as for
    `place_replicas`. Raises PlacementError (INVALID_REPLICA_ASSIGNMENT)."""
    assert all(shards >= 1 for shards in nodes.values()), f"a node without shards: {nodes}"
    invalid = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    by_index = dict(assignments)
    expected = range(first_partition, first_partition + len(assignments))
    if len(by_index) != len(assignments) or set(by_index) != set(expected):
        raise PlacementError(
            invalid, f"partitions must be numbered {first_partition} to {expected[-1]} once each"
            if assignments else "no partitions")
    factors = {len(node_ids) for node_ids in by_index.values()}
    if len(factors) != 1:
        raise PlacementError(invalid, "every partition must have the same number of replicas")
    factor = factors.pop()
    if not 1 <= factor <= limits.replication_factor_max:
        raise PlacementError(invalid, f"replication factor {factor}")
    cluster, topic = Load(existing), Load(topic_existing)
    placed = []
    for index in expected:
        node_ids = list(by_index[index])
        unknown = [n for n in node_ids if n not in nodes]
        if unknown:
            raise PlacementError(invalid, f"partition {index}: unknown nodes {unknown}")
        if len(set(node_ids)) != len(node_ids):
            raise PlacementError(invalid, f"partition {index}: a node twice in {node_ids}")
        turn = start + index
        replicas = tuple(
            (node, _shard(node, nodes[node], i == 0, turn, cluster, topic))
            for i, node in enumerate(node_ids)
        )
        cluster.add(replicas)
        topic.add(replicas)
        placed.append(replicas)
    return placed


def move_target(
    nodes: Mapping[int, int],
    current: Sequence[Address],
    node_ids: Sequence[int],
    *,
    existing: Iterable[Sequence[Address]] = (),
    turn: int = 0,
) -> Replicas:
    """A move's target (actors/cluster/moves.py) from Kafka's node ids: a node among
    `current` keeps its shard, a new one gets the shard `place_replicas` would choose for it
    (`nodes`: every registered node, id -> shard count). Raises PlacementError
    (INVALID_REPLICA_ASSIGNMENT) for an unknown node, a node twice, or a size out of range."""
    invalid = ErrorCode.INVALID_REPLICA_ASSIGNMENT
    if not 1 <= len(node_ids) <= limits.replication_factor_max:
        raise PlacementError(invalid, f"{len(node_ids)} replicas")
    unknown = [n for n in node_ids if n not in nodes]
    if unknown:
        raise PlacementError(invalid, f"unknown nodes {unknown}")
    if len(set(node_ids)) != len(node_ids):
        raise PlacementError(invalid, f"a node twice in {list(node_ids)}")
    kept = dict(current)
    cluster = Load(existing)
    return tuple((node, kept[node] if node in kept else
                  _shard(node, nodes[node], i == 0, turn, cluster, Load()))
                 for i, node in enumerate(node_ids))


def _check_nodes(nodes: Mapping[int, int]) -> None:
    if not nodes:
        raise PlacementError(ErrorCode.INVALID_REPLICATION_FACTOR, "no live nodes")
    assert all(shards >= 1 for shards in nodes.values()), f"a node without shards: {nodes}"
