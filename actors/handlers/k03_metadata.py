"""Metadata (key 3), versions 0-12.

v0: an empty topic list means all topics; v1+: null means all, empty means none (gotcha 6).
v1 rack, controller id, internal flag; v2 cluster id; v3 throttle; v4 AllowAutoTopicCreation
(v0-3 imply true); v5 offline replicas; v7 leader epoch; v8 topic authorized operations, and
cluster authorized operations in v8-10 only (v11 moved them to DescribeCluster, KIP-700); v9
flexible; v10 topic ids (a topic may be asked for by id, name null from v12).
Authorized operations, when asked for, are every operation (no authorizer, see
`authorized_operations`), for every topic asked for by name, as Kafka answers them.

Unknown topics are created when the request allows it and `auto_create_topics` is on, and the
answer waits for the creation, so the client sees the topic at once. An internal topic is never
created as a plain topic: Kafka's AutoTopicCreationManager creates `__consumer_offsets` with the
group coordinator's layout (offsets partitions, compacted), so here its owner, the group
coordinator, is asked to make it; `__transaction_state` has no owner (no transactions) and
stays unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from actors.controller import INTERNAL_TOPICS, CreateTopics, TopicSpec, check_topic_name
from actors.group import OFFSETS_TOPIC
from actors.group.messages import EnsureReady
from actors.handlers.authorized_operations import (
    CLUSTER_OPERATIONS,
    OPERATIONS_NOT_REQUESTED,
    TOPIC_OPERATIONS,
    authorized_operations,
)
from actors.handlers.group_common import tell_coordinator
from actors.handlers.join import Join
from actors.services import TopicInfo, TopicTable
from wire.errors import ErrorCode
from wire.messages.metadata import MetadataRequest, MetadataResponse

MetadataResponseBroker = MetadataResponse.MetadataResponseBroker
MetadataResponsePartition = MetadataResponse.MetadataResponsePartition
MetadataResponseTopic = MetadataResponse.MetadataResponseTopic

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 12
REQUEST = MetadataRequest

_ZERO_ID = bytes(16)
# Any coordinator creates the whole offsets topic; this group's (partition 0's) is asked.
_ANY_GROUP = ""


class _Operations(NamedTuple):
    """The authorized-operations fields of this answer."""

    topic: int
    cluster: int


def handle(ctx: Any, request: MetadataRequest) -> None:
    table = ctx.services.topics()
    operations = _Operations(
        authorized_operations(
            ctx.version >= 8 and request.include_topic_authorized_operations, TOPIC_OPERATIONS
        ),
        authorized_operations(
            8 <= ctx.version <= 10 and request.include_cluster_authorized_operations,
            CLUSTER_OPERATIONS,
        ),
    )
    wanted = _wanted(ctx.version, request, table)
    if wanted is None:
        everything: list[tuple[str | None, bytes | None]] = [
            (name, None) for name in sorted(table.topics)
        ]
        ctx.respond(_response(ctx, table, everything, operations))
        return
    allow = request.allow_auto_topic_creation if ctx.version >= 4 else True
    missing = list(
        dict.fromkeys(
            name
            for name, topic_id in wanted
            if name is not None and name not in table.topics and check_topic_name(name) is None
        )
    )
    if not (missing and allow and ctx.services.settings.auto_create_topics):
        ctx.respond(_response(ctx, table, wanted, operations))
        return
    _create(
        ctx,
        missing,
        lambda: ctx.respond(_response(ctx, ctx.services.topics(), wanted, operations)),
    )


def _create(ctx: Any, names: list[str], done: Callable[[], None]) -> None:
    """Create the missing topics `names`, then `done()`: plain topics through the Controller,
    `__consumer_offsets` through its owner, the group coordinator; other internal topics not
    at all. Failures need no handling: the answer then shows the topic as still unknown."""
    join = Join(2, lambda _: done())
    plain = [TopicSpec(name, -1, -1, [], {}) for name in names if name not in INTERNAL_TOPICS]
    if plain:
        ctx.services.controller().tell(CreateTopics(plain, False, join.slot(0)))
    else:
        join.fill(0, [])
    if OFFSETS_TOPIC not in names:
        join.fill(1, ErrorCode.NONE)
    elif not tell_coordinator(ctx, _ANY_GROUP, EnsureReady(join.slot(1))):
        join.fill(1, ErrorCode.COORDINATOR_NOT_AVAILABLE)


def _wanted(
    version: int, request: MetadataRequest, table: TopicTable
) -> list[tuple[str | None, bytes | None]] | None:
    """(name, id) pairs asked for, or None for every topic."""
    topics = request.topics
    if topics is None or (version == 0 and not topics):
        return None
    wanted: list[tuple[str | None, bytes | None]] = []
    for topic in topics:
        if topic.name is None and version >= 10 and topic.topic_id != _ZERO_ID:
            info = table.by_id(topic.topic_id)
            wanted.append((info.name if info else None, topic.topic_id))
        else:
            wanted.append((topic.name, None))
    return wanted


def _response(
    ctx: Any,
    table: TopicTable,
    wanted: list[tuple[str | None, bytes | None]],
    operations: _Operations,
) -> MetadataResponse:
    settings = ctx.services.settings
    node = settings.node_id
    topics = []
    for name, topic_id in wanted:
        info = table.topics.get(name) if name is not None else None
        if info is not None:
            topics.append(_topic(info, node, operations.topic, ctx.services))
        elif name is None:
            topics.append(
                MetadataResponseTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                    name=None,
                    topic_id=topic_id or _ZERO_ID,
                    topic_authorized_operations=OPERATIONS_NOT_REQUESTED,
                )
            )
        else:
            invalid = check_topic_name(name) is not None
            error = (
                ErrorCode.INVALID_TOPIC_EXCEPTION
                if invalid
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
            topics.append(
                MetadataResponseTopic(
                    error_code=error,
                    name=name,
                    is_internal=name in INTERNAL_TOPICS,
                    topic_authorized_operations=operations.topic,
                )
            )
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponseBroker(node_id=broker, host=host, port=port, rack=rack)
            for broker, host, port, rack in ctx.services.brokers()
        ],
        cluster_id=settings.cluster_id,
        controller_id=ctx.services.controller_id(),
        topics=topics,
        cluster_authorized_operations=operations.cluster,
    )


def _partition(services: Any, topic: str, index: int, node: int) -> MetadataResponsePartition:
    """A partition's leader, epoch, replicas and in-sync replicas: on a node of its own, this
    node at epoch 0; in a cluster, as this node last heard, and while an election is on, the
    leader before it (`Shard.partition_leader`); LEADER_NOT_AVAILABLE only where this node
    has heard of no leader at all."""
    leader = services.partition_leader(topic, index, guess=True)
    if leader is None:
        return MetadataResponsePartition(
            error_code=ErrorCode.NONE, partition_index=index, leader_id=node, leader_epoch=0,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
    leader_id, epoch, replicas, isr = leader
    return MetadataResponsePartition(
        error_code=ErrorCode.NONE if leader_id >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
        partition_index=index, leader_id=leader_id, leader_epoch=epoch,
        replica_nodes=replicas, isr_nodes=isr, offline_replicas=[])


def _topic(info: TopicInfo, node: int, operations: int, services: Any) -> MetadataResponseTopic:
    return MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=info.name,
        topic_id=info.topic_id,
        is_internal=info.internal,
        partitions=[_partition(services, info.name, index, node)
                    for index in range(info.partitions)],
        topic_authorized_operations=operations,
    )
