"""The cluster's metadata as a replicated state machine: commands in log order, results out.

Nodes, topics (with every partition's replicas) and the next producer-id block live in the
controller Raft group's log (DESIGN.md §7). Every seed node applies the committed commands
(actors/cluster/commands.py) in log order to its own `ClusterState`; applying is
deterministic, so every node holds the same state at the same offset, and a snapshot taken
at one offset and restored elsewhere continues exactly as the log would:

    state = ClusterState()                    or ClusterState.from_snapshot(data)
    result = state.apply(command, offset)     each committed command, in order
    result.error                              NONE, or the Kafka error to answer with
    state.view()                              an immutable ClusterView for readers
    state.to_snapshot()                       bytes: a checkpoint at state.version

A command may be stale by the time it is applied: it was checked against the state its
proposer saw, and other commands may have committed before it (the same topic created twice
concurrently: the second fails with TOPIC_ALREADY_EXISTS). So `apply` checks every command
again against the state it meets, and a failed command changes nothing but `version`.
`check(command)` runs the same checks without applying (validate_only, and the proposer's
early answer).

`version` is the end offset of what is applied: the last applied record's offset + 1 (0:
nothing yet), so it moves forward with every record, failed or not, and a view's `TopicTable`
has a version that only grows, which is what the shards compare (shards/shard_topics.py). Records
that carry no command (the leader's no-op) advance it with `skip(offset)`.

The state is a mutable object rather than a value: applying a command touches one topic,
and copying every topic per command would make replaying a long log quadratic. Readers never
see it mutate: `view()` hands out an immutable `ClusterView` (a shallow copy of two dicts
whose values are immutable records), built once per version and cached.

Checks reused from the single-node controller: topic names (topic_names.py), configs and
their alteration (actors/topic_config.py), `__consumer_offsets`'s own rules, the partition
limits; replicas are checked here (registered nodes, shards in range, one node once per
partition, one replication factor per topic) and capacity is per node (`partitions_max`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from actors import limits as actor_limits
from actors.cluster import limits
from actors.cluster.commands import (
    AllocateProducerIdBlock,
    AlterTopicConfigs,
    Command,
    CompleteMove,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    Move,
    MovePartitions,
    NodeInfo,
    RegisterNode,
    Replicas,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
)
from actors.cluster.moves import replicas_during
from actors.cluster.topic_names import INTERNAL_TOPICS, check_topic_name
from actors.group import OFFSETS_TOPIC
from actors.services import TopicInfo, TopicTable
from actors.topic_config import (
    ConfigError,
    OperationError,
    altered,
    check_offsets_topic,
    replaced,
    validate,
)
from wire.errors import ErrorCode

__all__ = [
    "FIRST_PRODUCER_ID",
    "Applied",
    "ClusterState",
    "ClusterView",
    "PlacedTopic",
    "ProducerIdBlock",
]

# The first producer id handed out, as the single-node controller starts (producer_ids.json).
FIRST_PRODUCER_ID = 1
_TOPIC_ID_BYTES = 16
_PORT_MAX = 65535


@dataclass(frozen=True, slots=True)
class PlacedTopic(TopicInfo):
    """A topic with every partition's replicas, the preferred leader first: a `TopicInfo`, so
    a `TopicTable` of these is what shards already take. A partition being moved
    (`moves`, actors/cluster/moves.py) has as replicas its target's, then those of the
    replicas it had that the target leaves out, until the move completes."""

    replicas: tuple[Replicas, ...] = ()
    moves: Mapping[int, Move] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert len(self.replicas) == self.partitions, f"{self.name}: replicas per partition"

    @property
    def replication_factor(self) -> int:
        """Partition 0's (its move's target's, while one is under way)."""
        if not self.replicas:
            return 0
        move = self.moves.get(0)
        return len(move.target if move is not None else self.replicas[0])

    def voters(self, partition: int) -> Replicas:
        """The replicas that vote in the partition's Raft group where its log says no more
        (its first membership: actors/partition_replication.py): those it had when its move
        began, else its replicas."""
        move = self.moves.get(partition)
        return move.origin if move is not None else self.replicas[partition]


class ProducerIdBlock(NamedTuple):
    """Producer ids `start` to `start + size - 1`, handed to `node` alone."""

    node: int
    start: int
    size: int


class Applied(NamedTuple):
    """What applying (or checking) a command gave: NONE, or the Kafka error and why. `topic`:
    the topic after CreateTopic, CreatePartitions or AlterTopicConfigs, the one removed by
    DeleteTopic; `block`: AllocateProducerIdBlock's block; `node`: RegisterNode's node."""

    error: ErrorCode
    message: str | None = None
    topic: PlacedTopic | None = None
    block: ProducerIdBlock | None = None
    node: NodeInfo | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The state at one version, for readers: Metadata, shards, placement."""

    version: int
    nodes: Mapping[int, NodeInfo]
    table: TopicTable  # of PlacedTopic; table.version == version

    def replicas(self, topic: str, partition: int) -> Replicas | None:
        info = self.table.topics.get(topic)
        if not isinstance(info, PlacedTopic) or not 0 <= partition < info.partitions:
            return None
        return info.replicas[partition]

    def assignments(self) -> Iterator[Replicas]:
        """Every partition's replicas (placement's `existing`)."""
        for info in self.table.topics.values():
            if isinstance(info, PlacedTopic):
                yield from info.replicas

    def shard_counts(self) -> dict[int, int]:
        return {node: info.shards for node, info in self.nodes.items()}

    def room(self) -> dict[int, int]:
        """Replicas each node may still host (placement's `room`)."""
        hosted: Counter[int] = Counter(node for r in self.assignments() for node, _ in r)
        return {n: max(0, info.partitions_max - hosted[n]) for n, info in self.nodes.items()}


class ClusterState:
    """One node's copy of the cluster metadata, as of `version` (see the module's notes)."""

    def __init__(self) -> None:
        self._version = 0
        self._nodes: dict[int, NodeInfo] = {}
        self._topics: dict[str, PlacedTopic] = {}
        self._names_by_id: dict[bytes, str] = {}
        self._hosted: Counter[int] = Counter()  # replicas per node, kept with the topics
        self._next_producer_id = FIRST_PRODUCER_ID
        self._view: ClusterView | None = None

    @property
    def version(self) -> int:
        return self._version

    @property
    def next_producer_id(self) -> int:
        return self._next_producer_id

    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(
                self._version, dict(self._nodes), TopicTable(dict(self._topics), self._version)
            )
        return self._view

    # Applying ----------------------------------------------------------------------------

    def check(self, command: Command) -> Applied:
        """What applying `command` now would give, without applying it."""
        if type(command) is RegisterNode:
            return self._check_node(command)
        if type(command) is CreateTopic:
            return self._check_create(command)
        if type(command) is DeleteTopic:
            return self._check_delete(command)
        if type(command) is CreatePartitions:
            return self._check_grow(command)
        if type(command) is AlterTopicConfigs:
            return self._check_alter(command)
        if type(command) is AllocateProducerIdBlock:
            return self._check_block(command)
        if type(command) is MovePartitions:
            return self._check_moves(command)
        if type(command) is CompleteMove:
            return self._check_complete(command)
        raise AssertionError(f"not a command: {command!r}")

    def apply(self, command: Command, offset: int) -> Applied:
        """Apply the command found at log offset `offset` (past every one applied before)."""
        self.skip(offset)
        result = self.check(command)
        if result.error != ErrorCode.NONE:
            return result
        if type(command) is RegisterNode:
            assert result.node is not None
            self._nodes[result.node.node] = result.node
        elif type(command) is DeleteTopic:
            assert result.topic is not None
            self._remove(result.topic)
        elif type(command) is AllocateProducerIdBlock:
            assert result.block is not None
            self._next_producer_id = result.block.start + result.block.size
        else:  # CreateTopic, CreatePartitions, AlterTopicConfigs, the moves
            assert result.topic is not None
            old = self._topics.get(result.topic.name)
            if old is not None:
                self._remove(old)
            self._add(result.topic)
        return result

    def skip(self, offset: int) -> None:
        """A record at `offset` that is no command (the leader's no-op): only the version
        moves."""
        assert offset >= self._version, f"offset {offset} applied after {self._version - 1}"
        self._version = offset + 1
        self._view = None

    def _add(self, topic: PlacedTopic) -> None:
        self._topics[topic.name] = topic
        self._names_by_id[topic.topic_id] = topic.name
        for replicas in topic.replicas:
            for node, _ in replicas:
                self._hosted[node] += 1

    def _remove(self, topic: PlacedTopic) -> None:
        del self._topics[topic.name]
        del self._names_by_id[topic.topic_id]
        for replicas in topic.replicas:
            for node, _ in replicas:
                self._hosted[node] -= 1

    # Nodes and producer ids ----------------------------------------------------------------

    def _check_node(self, c: RegisterNode) -> Applied:
        info = c.info
        bad = ErrorCode.INVALID_REQUEST
        if info.node < 0:
            return Applied(bad, f"node id {info.node} is negative")
        if info.node not in self._nodes and len(self._nodes) >= limits.nodes_max:
            return Applied(bad, f"the cluster has {len(self._nodes)} nodes, the most it takes")
        if not info.host or not info.rpc_host:
            return Applied(bad, f"node {info.node}: a host is empty")
        if not 0 < info.shards <= limits.shards_per_node_max:
            return Applied(bad, f"node {info.node}: {info.shards} shards is out of range")
        if not (0 < info.port <= _PORT_MAX
                and 0 < info.rpc_port and info.rpc_port + info.shards - 1 <= _PORT_MAX):
            return Applied(bad, f"node {info.node}: ports {info.port}, {info.rpc_port}")
        if info.partitions_max < 0:
            return Applied(bad, f"node {info.node}: partitions_max {info.partitions_max}")
        if info.reader is not None and not _is_host_port(info.reader):
            return Applied(bad, f"node {info.node}: reader address {info.reader!r:.80}")
        used = max((shard + 1 for shard in self._shards_used(info.node)), default=0)
        if info.shards < used:
            return Applied(bad, f"node {info.node} hosts replicas on shard {used - 1}; "
                                f"it cannot come back with {info.shards} shards")
        return Applied(ErrorCode.NONE, node=info)

    def _shards_used(self, node: int) -> Iterator[int]:
        if not self._hosted[node]:
            return
        for topic in self._topics.values():
            for replicas in topic.replicas:
                for n, shard in replicas:
                    if n == node:
                        yield shard

    def _check_block(self, c: AllocateProducerIdBlock) -> Applied:
        if c.node not in self._nodes:
            return Applied(ErrorCode.BROKER_NOT_AVAILABLE, f"node {c.node} is not registered")
        size = actor_limits.producer_id_block_size
        if self._next_producer_id + size - 1 > limits.producer_id_max:
            return Applied(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids are exhausted")
        return Applied(ErrorCode.NONE, block=ProducerIdBlock(c.node, self._next_producer_id, size))

    # Topics --------------------------------------------------------------------------------

    def _check_create(self, c: CreateTopic) -> Applied:
        name = c.name
        problem = check_topic_name(name)
        if problem is not None:
            return Applied(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self._topics:
            return Applied(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if len(c.topic_id) != _TOPIC_ID_BYTES or not any(c.topic_id):
            return Applied(ErrorCode.INVALID_REQUEST, "a topic id is 16 bytes, not all zero")
        if c.topic_id in self._names_by_id:
            existing = self._names_by_id[c.topic_id]
            return Applied(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {existing!r} has that id")
        partitions = len(c.replicas)
        if not 0 < partitions <= actor_limits.partitions_per_topic_max:
            return Applied(
                ErrorCode.INVALID_PARTITIONS, f"{partitions} partitions is out of range")
        refused = self._check_replicas(c.replicas, None) or self._over_capacity(c.replicas)
        if refused is not None:
            return refused
        try:
            configs = validate(c.configs)
        except ConfigError as e:
            return Applied(ErrorCode.INVALID_CONFIG, str(e))
        refused = _caching_refused(configs, len(c.replicas[0]))
        if refused is not None:
            return refused
        topic = PlacedTopic(
            name, c.topic_id, partitions, configs, name in INTERNAL_TOPICS, tuple(c.replicas))
        return Applied(ErrorCode.NONE, topic=topic)

    def _topic_of(self, name: str, topic_id: bytes) -> PlacedTopic | Applied:
        """The topic `name` if it is still the incarnation `topic_id`, else the refusal."""
        topic = self._topics.get(name)
        if topic is None:
            return Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
        if topic.topic_id != topic_id:
            return Applied(ErrorCode.UNKNOWN_TOPIC_ID, f"topic {name!r} has another id now")
        return topic

    def _check_delete(self, c: DeleteTopic) -> Applied:
        topic = self._topic_of(c.name, c.topic_id)
        if isinstance(topic, Applied):
            return topic
        return Applied(ErrorCode.NONE, topic=topic)

    def _check_grow(self, c: CreatePartitions) -> Applied:
        topic = self._topic_of(c.name, c.topic_id)
        if isinstance(topic, Applied):
            return topic
        invalid = ErrorCode.INVALID_PARTITIONS
        if c.partitions <= topic.partitions:
            return Applied(
                invalid, f"topic has {topic.partitions} partitions; asked for {c.partitions}")
        if c.partitions > actor_limits.partitions_per_topic_max:
            return Applied(invalid, "too many")
        if topic.partitions + len(c.replicas) != c.partitions:
            return Applied(invalid, f"topic has {topic.partitions} partitions; "
                                    f"{len(c.replicas)} more do not make {c.partitions}")
        refused = (self._check_replicas(c.replicas, topic.replication_factor)
                   or self._over_capacity(c.replicas))
        if refused is not None:
            return refused
        grown = replace(topic, partitions=c.partitions,
                        replicas=topic.replicas + tuple(c.replicas))
        return Applied(ErrorCode.NONE, topic=grown)

    def _check_alter(self, c: AlterTopicConfigs) -> Applied:
        topic = self._topics.get(c.name)
        if topic is None:
            return Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
        try:
            configs = replaced(c.operations) if c.replace else altered(topic.configs,
                                                                         c.operations)
            if c.name == OFFSETS_TOPIC:
                check_offsets_topic(configs, topic.replication_factor)
        except OperationError as e:
            return Applied(ErrorCode.INVALID_REQUEST, str(e))
        except ConfigError as e:
            return Applied(ErrorCode.INVALID_CONFIG, str(e))
        refused = _caching_refused(configs, topic.replication_factor)
        if refused is not None:
            return refused
        return Applied(ErrorCode.NONE, topic=replace(topic, configs=configs))

    def _check_moves(self, c: MovePartitions) -> Applied:
        """Each partition named exists, and its target is a valid replica set that keeps the
        shard of every node it keeps (actors/cluster/moves.py); a cancel needs a move under
        way. A target equal to the replicas of a partition that is not moving is nothing to
        do."""
        topic = self._topic_of(c.name, c.topic_id)
        if isinstance(topic, Applied):
            return topic
        replicas = list(topic.replicas)
        moves = dict(topic.moves)
        added: list[Replicas] = []
        for index, wanted in c.moves:
            if not 0 <= index < topic.partitions:
                return Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               f"topic {c.name!r} has no partition {index}")
            move = moves.get(index)
            if wanted is None:
                if move is None:
                    return Applied(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                                   f"partition {index} is not being moved")
                wanted = move.origin
            refused = self._check_replicas((wanted,), None)
            if refused is not None:
                return refused._replace(message=f"partition {index}: {refused.message}")
            current = replicas[index]
            if len(wanted) == 1 or len(current) == 1:
                return Applied(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                               f"partition {index}: moves to or from one replica are not built "
                               "(a partition of replication factor 1 has no Raft group)")
            shards = dict(current)
            for node, shard in wanted:
                if shards.get(node, shard) != shard:
                    return Applied(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                   f"partition {index}: node {node} keeps its replica on shard "
                                   f"{shards[node]}, not {shard}")
            if move is None and wanted == current:
                continue
            during = replicas_during(current, wanted)
            added.append(tuple(r for r in during if r not in current))
            replicas[index] = during
            moves[index] = Move(move.origin if move is not None else current, wanted)
        refused = self._over_capacity(tuple(added))
        if refused is not None:
            return refused
        return Applied(ErrorCode.NONE, topic=replace(topic, replicas=tuple(replicas),
                                                     moves=moves))

    def _check_complete(self, c: CompleteMove) -> Applied:
        """The partition's move to `c.target` is the one under way (not since redirected)."""
        topic = self._topic_of(c.name, c.topic_id)
        if isinstance(topic, Applied):
            return topic
        move = topic.moves.get(c.partition)
        if move is None or move.target != c.target:
            return Applied(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                           f"partition {c.partition} is not being moved to {c.target}")
        replicas = list(topic.replicas)
        replicas[c.partition] = c.target
        moves = {p: m for p, m in topic.moves.items() if p != c.partition}
        return Applied(ErrorCode.NONE, topic=replace(topic, replicas=tuple(replicas),
                                                     moves=moves))

    def _check_replicas(self, partitions: tuple[Replicas, ...], factor: int | None
                        ) -> Applied | None:
        """Why these replicas cannot be (INVALID_REPLICA_ASSIGNMENT), or None: registered
        nodes, shards they have, no node twice in a partition, one replication factor."""
        invalid = ErrorCode.INVALID_REPLICA_ASSIGNMENT
        for index, replicas in enumerate(partitions):
            factor = len(replicas) if factor is None else factor
            if len(replicas) != factor or not 0 < factor <= limits.replication_factor_max:
                return Applied(invalid, f"partition {index} has {len(replicas)} replicas; "
                                        f"the topic's replication factor is {factor}")
            if len({node for node, _ in replicas}) != len(replicas):
                return Applied(invalid, f"partition {index}: a node twice in {replicas}")
            for node, shard in replicas:
                info = self._nodes.get(node)
                if info is None:
                    return Applied(invalid, f"partition {index}: node {node} is unknown")
                if not 0 <= shard < info.shards:
                    return Applied(
                        invalid, f"partition {index}: node {node} has no shard {shard}")
        return None

    def _over_capacity(self, partitions: tuple[Replicas, ...]) -> Applied | None:
        """INVALID_PARTITIONS if a node would host more replicas than its partitions_max."""
        more = Counter(node for replicas in partitions for node, _ in replicas)
        for node in sorted(more):
            limit = self._nodes[node].partitions_max
            if self._hosted[node] + more[node] > limit:
                return Applied(
                    ErrorCode.INVALID_PARTITIONS,
                    f"node {node} hosts {self._hosted[node]} replicas and takes at most {limit} "
                    f"(topic_partitions_per_shard x shards); {more[node]} more do not fit")
        return None

    # Snapshots -----------------------------------------------------------------------------

    def to_snapshot(self) -> bytes:
        return encode_snapshot(Snapshot(
            self._version,
            self._next_producer_id,
            tuple(self._nodes.values()),
            tuple(CreateTopic(t.name, t.topic_id, t.replicas, t.configs)
                  for t in self._topics.values()),
            {t.name: t.moves for t in self._topics.values() if t.moves},
        ))

    @classmethod
    def from_snapshot(cls, data: bytes | memoryview) -> ClusterState:
        """The state a snapshot holds; CommandError if the bytes are not one. What it holds
        was valid when applied and is not checked again (a node may since have lowered its
        partitions_max below what it hosts)."""
        snapshot = decode_snapshot(data)
        state = cls()
        state._version = snapshot.version
        state._next_producer_id = snapshot.next_producer_id
        for info in snapshot.nodes:
            state._nodes[info.node] = info
        for t in snapshot.topics:
            state._add(PlacedTopic(t.name, t.topic_id, len(t.replicas), dict(t.configs),
                                   t.name in INTERNAL_TOPICS, t.replicas,
                                   dict(snapshot.moves.get(t.name, {}))))
        return state


def _is_host_port(address: str) -> bool:
    """'host:port' or '[v6 host]:port', as a node advertises its reader."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host) and port.isdigit() and 0 < int(port) <= _PORT_MAX


def _caching_refused(configs: Mapping[str, str], factor: int) -> Applied | None:
    """write.caching=true on a replicated topic: refused, not built. Redpanda's meaning is
    acks=all answered once a majority has the batch in memory; Raft here counts only what
    each follower has fdatasync'd, and that would leave the setting ignored."""
    if factor > 1 and configs.get("write.caching", "false").lower() == "true":
        return Applied(ErrorCode.INVALID_CONFIG,
                       "write.caching: not built for replicated topics (replication factor "
                       f"{factor}): acks=all waits for a quorum's fdatasync")
    return None
