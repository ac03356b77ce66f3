"""DeleteRecords (key 21), versions 0-2: move partitions' log start offsets forward.

v1 is v0 with throttling semantics; v2 is flexible. Each partition's offset (-1: its high
watermark) becomes its log start: reads below it get OFFSET_OUT_OF_RANGE at once, whole
segments below it are removed, and the answer (the new low watermark) comes once the start
is durable (actors/log_lifecycle.py) and, on a replicated topic, once every follower whose
node is up has taken it (REQUEST_TIMED_OUT if one does not in time, as Kafka's purgatory
answers; actors/partition_replication.py). Refused, as Kafka does: an internal topic
(INVALID_TOPIC_EXCEPTION), a topic whose cleanup.policy lacks `delete` (POLICY_VIOLATION),
an offset above the high watermark (OFFSET_OUT_OF_RANGE).
"""

from __future__ import annotations

from typing import Any

from actors.controller import INTERNAL_TOPICS
from actors.handlers.join import Join, send
from actors.partition_messages import DeleteRecords
from wire.errors import ErrorCode
from wire.messages.delete_records import DeleteRecordsRequest, DeleteRecordsResponse

PartitionResult = DeleteRecordsResponse.DeleteRecordsPartitionResult
TopicResult = DeleteRecordsResponse.DeleteRecordsTopicResult

API_KEY = 21
MIN_VERSION = 0
MAX_VERSION = 2
REQUEST = DeleteRecordsRequest


def handle(ctx: Any, request: DeleteRecordsRequest) -> None:
    parts = [(t.name, p.partition_index, p.offset) for t in request.topics for p in t.partitions]

    def done(results: list[tuple[ErrorCode, int]]) -> None:
        topics: dict[str, list[Any]] = {}
        for (topic, index, _), (error, low_watermark) in zip(parts, results, strict=True):
            topics.setdefault(topic, []).append(PartitionResult(
                partition_index=index, low_watermark=low_watermark, error_code=error))
        ctx.respond(DeleteRecordsResponse(
            throttle_time_ms=0,
            topics=[TopicResult(name=name, partitions=ps) for name, ps in topics.items()],
        ))

    join = Join(len(parts), done)
    for slot, (topic, index, offset) in enumerate(parts):
        if topic in INTERNAL_TOPICS:  # by name, as Kafka's Topic.isInternal
            join.fill(slot, (ErrorCode.INVALID_TOPIC_EXCEPTION, -1))
            continue
        ref = ctx.services.partition(topic, index)
        if ref is None or not send(ref, DeleteRecords(offset, join.slot(slot))):
            join.fill(slot, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1))
