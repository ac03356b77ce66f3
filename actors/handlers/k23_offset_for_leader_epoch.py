"""OffsetForLeaderEpoch (key 23), versions 0-4.

v1 returns the leader epoch with the end offset; v2 takes the client's current leader epoch
(fencing); v3 replica id; v4 flexible. Clients use it to detect log truncation after a
leader change (CLIENTS.md gotcha 7). With one node every partition stays in epoch 0.
"""

from __future__ import annotations

from typing import Any

from actors.handlers.join import Join, send
from actors.partition_messages import EpochEndOffset as EpochEndOffsetQuery
from wire.errors import ErrorCode
from wire.messages.offset_for_leader_epoch import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

EpochEndOffset = OffsetForLeaderEpochResponse.EpochEndOffset
OffsetForLeaderTopicResult = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult

API_KEY = 23
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = OffsetForLeaderEpochRequest


def handle(ctx: Any, request: OffsetForLeaderEpochRequest) -> None:
    parts = [(t.topic, p) for t in request.topics for p in t.partitions]

    def done(results: list[tuple[ErrorCode, int, int]]) -> None:
        topics: dict[str, list[EpochEndOffset]] = {}
        for (topic, p), (error, epoch, end_offset) in zip(parts, results, strict=True):
            topics.setdefault(topic, []).append(
                EpochEndOffset(
                    error_code=error,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        ctx.respond(
            OffsetForLeaderEpochResponse(
                throttle_time_ms=0,
                topics=[
                    OffsetForLeaderTopicResult(topic=name, partitions=partitions)
                    for name, partitions in topics.items()
                ],
            )
        )

    join = Join(len(parts), done)
    for index, (topic, p) in enumerate(parts):
        ref = ctx.services.partition(topic, p.partition)
        query = EpochEndOffsetQuery(p.leader_epoch, p.current_leader_epoch, join.slot(index))
        if ref is None or not send(ref, query):
            join.fill(index, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1))
