"""From a client's request to a command: defaults, placement and ids, chosen before proposing.

The controller's leader turns each CreateTopics, CreatePartitions and DeleteTopics entry into
a command here, against its latest `ClusterView` and the nodes it sees live, then proposes it
(or, for validate_only, only `check`s it). Everything that is not deterministic happens here
and nowhere after: the topic id (given by the caller, a uuid4), which nodes are live, the
placement. What is refused here is refused the way `ClusterState.apply` would refuse it, as
an `Applied` with the Kafka error:

    command = propose_create_topic(view, "orders", 6, 3, [], {}, topic_id=uuid4().bytes,
                                   live={1, 2, 3}, default_partitions=1,
                                   default_replication_factor=1)
    if isinstance(command, Applied): answer command.error
    else: state.check(command) for validate_only, or propose encode(command)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from actors import limits as actor_limits
from actors.cluster.commands import CreatePartitions, CreateTopic, DeleteTopic, Replicas
from actors.cluster.placement import PlacementError, assign_shards, move_target, place_replicas
from actors.cluster.state import Applied, ClusterView, PlacedTopic
from actors.topic_config import ConfigError, validate
from wire.errors import ErrorCode

__all__ = ["propose_create_partitions", "propose_create_topic", "propose_delete_topic",
           "propose_moves"]


def propose_create_topic(
    view: ClusterView,
    name: str,
    partitions: int,
    replication_factor: int,
    assignments: Sequence[tuple[int, Sequence[int]]],
    configs: Mapping[str, str | None],
    *,
    topic_id: bytes,
    live: Collection[int],
    default_partitions: int,
    default_replication_factor: int,
    start: int = 0,
) -> CreateTopic | Applied:
    """CreateTopics' entry (`partitions`, `replication_factor`: -1 for the defaults;
    `assignments`: Kafka's explicit `(partition index, [node ids])`, instead of both)."""
    try:
        checked = validate(configs)
    except ConfigError as e:
        return Applied(ErrorCode.INVALID_CONFIG, str(e))
    try:
        if assignments:
            if partitions != -1 or replication_factor != -1:
                return Applied(ErrorCode.INVALID_REQUEST,
                               "give partitions and replication factor, or assignments")
            replicas = assign_shards(view.shard_counts(), assignments,
                                     existing=view.assignments(), start=start)
        else:
            count = default_partitions if partitions == -1 else partitions
            if not 0 < count <= actor_limits.partitions_per_topic_max:
                return Applied(ErrorCode.INVALID_PARTITIONS, f"{count} partitions is out of range")
            factor = (default_replication_factor if replication_factor == -1
                      else replication_factor)
            replicas = place_replicas(
                _live(view, live), count, factor, existing=view.assignments(), start=start,
                room=view.room())
    except PlacementError as e:
        return Applied(e.error, e.message)
    return CreateTopic(name, topic_id, tuple(replicas), checked)


def propose_create_partitions(
    view: ClusterView,
    name: str,
    count: int,
    assignments: Sequence[Sequence[int]] | None,
    *,
    live: Collection[int],
    start: int = 0,
) -> CreatePartitions | Applied:
    """CreatePartitions' entry: grow `name` to `count`, on the nodes given for each new
    partition (`assignments`) or placed like the topic's others, at its replication factor."""
    topic = view.table.topics.get(name)
    if not isinstance(topic, PlacedTopic):
        return Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
    more = count - topic.partitions
    if more <= 0 or count > actor_limits.partitions_per_topic_max:
        return Applied(ErrorCode.INVALID_PARTITIONS,
                       f"topic has {topic.partitions} partitions; asked for {count}")
    try:
        if assignments:
            if len(assignments) != more:
                return Applied(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                               f"{len(assignments)} assignments for {more} new partitions")
            if any(len(nodes) != topic.replication_factor for nodes in assignments):
                return Applied(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                               f"the topic's replication factor is {topic.replication_factor}")
            first = topic.partitions
            replicas = assign_shards(
                view.shard_counts(), [(first + i, nodes) for i, nodes in enumerate(assignments)],
                existing=view.assignments(), topic_existing=topic.replicas,
                first_partition=first, start=start)
        else:
            replicas = place_replicas(
                _live(view, live), more, topic.replication_factor, existing=view.assignments(),
                topic_existing=topic.replicas, start=start + topic.partitions, room=view.room())
    except PlacementError as e:
        return Applied(e.error, e.message)
    return CreatePartitions(name, topic.topic_id, count, tuple(replicas))


def propose_delete_topic(
    view: ClusterView, name: str | None, topic_id: bytes | None
) -> DeleteTopic | Applied:
    """DeleteTopics' entry, by name or (v6+) by id."""
    if name is not None:
        topic = view.table.topics.get(name)
        if topic is None:
            return Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
        return DeleteTopic(topic.name, topic.topic_id)
    found = view.table.by_id(topic_id or b"")
    if found is None:
        return Applied(ErrorCode.UNKNOWN_TOPIC_ID, "no such topic")
    return DeleteTopic(found.name, found.topic_id)


def propose_moves(
    view: ClusterView,
    name: str,
    moves: Sequence[tuple[int, Sequence[int] | None]],
    *,
    start: int = 0,
) -> list[tuple[int, Replicas | None | Applied]]:
    """AlterPartitionReassignments' entries for one topic: for each (partition, node ids or
    None to cancel), the target replicas (a node the partition keeps keeps its shard, a new
    one gets the shard placement would give it), None to cancel, or why it cannot be. The
    state checks each again (actors/cluster/state.py)."""
    topic = view.table.topics.get(name)
    out: list[tuple[int, Replicas | None | Applied]] = []
    if not isinstance(topic, PlacedTopic):
        return [(index, Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic"))
                for index, _ in moves]
    seen: set[int] = set()
    existing = list(view.assignments())
    for index, nodes in moves:
        if index in seen:
            out.append((index, Applied(ErrorCode.INVALID_REQUEST, "a partition named twice")))
            continue
        seen.add(index)
        if not 0 <= index < topic.partitions:
            out.append((index, Applied(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                       f"topic {name!r} has no partition {index}")))
            continue
        if nodes is None:
            out.append((index, None))
            continue
        try:
            target = move_target(view.shard_counts(), topic.replicas[index], nodes,
                                 existing=existing, turn=start + index)
        except PlacementError as e:
            out.append((index, Applied(e.error, f"partition {index}: {e.message}")))
            continue
        existing.append(target)
        out.append((index, target))
    return out


def _live(view: ClusterView, live: Collection[int]) -> dict[int, int]:
    """The live registered nodes, id -> shard count: where new replicas may go."""
    return {n: info.shards for n, info in view.nodes.items() if n in live}
