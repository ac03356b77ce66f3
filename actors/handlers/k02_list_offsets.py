"""ListOffsets (key 2), versions 1-7.

v1 drops the v0 offset arrays for one (timestamp, offset) pair; v2 isolation level and
throttle time; v4 leader epochs; v6 flexible; v7 MAX_TIMESTAMP (-3, KIP-734).
Timestamps: -2 earliest, -1 latest (the high watermark), -3 the record with the largest
timestamp, else the first offset whose timestamp is at or after the one given (found by the
time index at batch granularity: the batch's base offset and max timestamp).
"""

from __future__ import annotations

from typing import Any

from actors.handlers.join import Join, send
from actors.partition import ListOffset, ListOffsetResult
from wire.errors import ErrorCode
from wire.messages.list_offsets import ListOffsetsRequest, ListOffsetsResponse

ListOffsetsPartitionResponse = ListOffsetsResponse.ListOffsetsPartitionResponse
ListOffsetsTopicResponse = ListOffsetsResponse.ListOffsetsTopicResponse

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 7
REQUEST = ListOffsetsRequest


def handle(ctx: Any, request: ListOffsetsRequest) -> None:
    parts = [(t.name, p) for t in request.topics for p in t.partitions]

    def done(results: list[ListOffsetResult]) -> None:
        topics: dict[str, list[ListOffsetsPartitionResponse]] = {}
        for (topic, p), result in zip(parts, results, strict=True):
            topics.setdefault(topic, []).append(
                ListOffsetsPartitionResponse(
                    partition_index=p.partition_index,
                    error_code=result.error,
                    timestamp=result.timestamp,
                    offset=result.offset,
                    leader_epoch=result.leader_epoch,
                )
            )
        ctx.respond(
            ListOffsetsResponse(
                throttle_time_ms=0,
                topics=[
                    ListOffsetsTopicResponse(name=name, partitions=partitions)
                    for name, partitions in topics.items()
                ],
            )
        )

    join = Join(len(parts), done)
    for index, (topic, p) in enumerate(parts):
        ref = ctx.services.partition(topic, p.partition_index)
        query = ListOffset(p.timestamp, p.current_leader_epoch, join.slot(index))
        if ref is None or not send(ref, query):
            join.fill(index, ListOffsetResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
