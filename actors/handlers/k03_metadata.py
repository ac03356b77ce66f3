"""Metadata (key 3), versions 0-12.

v0: an empty topic list means all topics; v1+: null means all, empty means none (gotcha 6).
v1 rack, controller id, internal flag; v2 cluster id; v3 throttle; v4 AllowAutoTopicCreation
(v0-3 imply true); v5 offline replicas; v7 leader epoch; v8-10 cluster authorized operations;
v9 flexible; v10 topic ids (a topic may be asked for by id, name null from v12).
Unknown topics are created when the request allows it and `auto_create_topics` is on, and the
answer waits for the creation, so the client sees the topic at once.
"""

from __future__ import annotations

from typing import Any

from actors.controller import CreateTopics, TopicResult, TopicSpec, check_topic_name
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

_NO_OPERATIONS = -(2**31)  # INT32_MIN: authorized operations not requested
_ZERO_ID = bytes(16)


def handle(ctx: Any, request: MetadataRequest) -> None:
    table = ctx.services.topics()
    wanted = _wanted(ctx.version, request, table)
    if wanted is None:
        ctx.respond(_response(ctx, table, [(name, None) for name in sorted(table.topics)]))
        return
    allow = request.allow_auto_topic_creation if ctx.version >= 4 else True
    missing = [
        name
        for name, topic_id in wanted
        if name is not None and name not in table.topics and check_topic_name(name) is None
    ]
    if not (missing and allow and ctx.services.settings.auto_create_topics):
        ctx.respond(_response(ctx, table, wanted))
        return
    specs = [TopicSpec(name, -1, -1, [], {}) for name in dict.fromkeys(missing)]

    def created(results: list[TopicResult]) -> None:
        ctx.respond(_response(ctx, ctx.services.topics(), wanted))

    ctx.services.controller().tell(CreateTopics(specs, False, created))


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
    ctx: Any, table: TopicTable, wanted: list[tuple[str | None, bytes | None]]
) -> MetadataResponse:
    settings = ctx.services.settings
    node = settings.node_id
    topics = []
    for name, topic_id in wanted:
        info = table.topics.get(name) if name is not None else None
        if info is not None:
            topics.append(_topic(info, node))
        elif name is None:
            topics.append(
                MetadataResponseTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                    name=None,
                    topic_id=topic_id or _ZERO_ID,
                    topic_authorized_operations=_NO_OPERATIONS,
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
                    error_code=error, name=name, topic_authorized_operations=_NO_OPERATIONS
                )
            )
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponseBroker(
                node_id=node,
                host=settings.advertised_host,
                port=settings.advertised_port,
                rack=None,
            )
        ],
        cluster_id=settings.cluster_id,
        controller_id=node,
        topics=topics,
        cluster_authorized_operations=_NO_OPERATIONS,
    )


def _topic(info: TopicInfo, node: int) -> MetadataResponseTopic:
    return MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=info.name,
        topic_id=info.topic_id,
        is_internal=info.internal,
        partitions=[
            MetadataResponsePartition(
                error_code=ErrorCode.NONE,
                partition_index=index,
                leader_id=node,
                leader_epoch=0,
                replica_nodes=[node],
                isr_nodes=[node],
                offline_replicas=[],
            )
            for index in range(info.partitions)
        ],
        topic_authorized_operations=_NO_OPERATIONS,
    )
