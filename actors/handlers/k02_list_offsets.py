"""ListOffsets (key 2), versions 0-7.

v0 (deprecated, still spoken by Sarama-based tools such as Burrow before 1.9.4) asks for up
to `max_num_offsets` offsets "before" a time and gets them back in `old_style_offsets`; v1
drops those arrays for one (timestamp, offset) pair; v2 isolation level (READ_COMMITTED, 1:
latest is the last stable offset, actors/txn_state.py) and throttle time; v4
leader epochs; v6 flexible; v7 MAX_TIMESTAMP (-3, KIP-734).
Timestamps from v1: -2 earliest, -1 latest (the high watermark), -3 the record with the
largest timestamp (of data records: a LEADER_CHANGE or a marker stamped later is no record a
consumer reads), else the first offset whose timestamp is at or after the one given (found
by the time index at batch granularity: the batch's base offset and max timestamp).

v0 follows Kafka's legacy rule (`UnifiedLog.legacyFetchOffsetsBefore` and, for consumers,
`Partition.legacyFetchOffsetsForTimestamp`): the log is a list of points (each segment's base
offset and last-modified time, then the log end offset at the broker's current time if the
last segment holds data); -1 starts from the last point, -2 (and -4) from the first, a time T
from the last point whose time is at or before T; up to `max_num_offsets` offsets are taken
from there towards the start, newest first, and a consumer never sees one above the high
watermark. Krill does not show a partition's segments to handlers, so the log counts as one
segment last modified at its newest record's timestamp: -1 and -2 answer as Kafka does for a
log of one segment (-1 with `max_num_offsets` >= 2 gives [high watermark, log start]); for a
longer log Kafka would also list the segment bases in between. A negative `max_num_offsets`
is UNKNOWN_SERVER_ERROR, as Kafka's failed array allocation is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from actors.handlers.join import Join, send
from actors.partition_messages import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    ListOffset,
    ListOffsetResult,
)
from actors.services import now_ms
from wire.errors import ErrorCode
from wire.messages.list_offsets import ListOffsetsRequest, ListOffsetsResponse

ListOffsetsPartition = ListOffsetsRequest.ListOffsetsPartition
ListOffsetsPartitionResponse = ListOffsetsResponse.ListOffsetsPartitionResponse
ListOffsetsTopicResponse = ListOffsetsResponse.ListOffsetsTopicResponse

API_KEY = 2
MIN_VERSION = 0
MAX_VERSION = 7
REQUEST = ListOffsetsRequest

log = logging.getLogger(__name__)

_READ_COMMITTED = 1  # isolation_level (v2+; older versions decode it as 0)


class LegacyResult(NamedTuple):
    """One partition's v0 answer."""

    error: ErrorCode
    offsets: list[int]


def handle(ctx: Any, request: ListOffsetsRequest) -> None:
    parts = [(t.name, p) for t in request.topics for p in t.partitions]
    legacy = ctx.version == 0

    def done(results: list[ListOffsetResult | LegacyResult]) -> None:
        topics: dict[str, list[ListOffsetsPartitionResponse]] = {}
        for (topic, p), result in zip(parts, results, strict=True):
            topics.setdefault(topic, []).append(_partition_response(p.partition_index, result))
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
    committed = request.isolation_level == _READ_COMMITTED
    for index, (topic, p) in enumerate(parts):
        ref = ctx.services.partition(topic, p.partition_index)
        if ref is None:
            unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            join.fill(index, LegacyResult(unknown, []) if legacy else ListOffsetResult(unknown))
        elif legacy:
            _legacy_lookup(ref, p, join.slot(index))
        elif not send(ref, ListOffset(p.timestamp, p.current_leader_epoch, join.slot(index),
                                      committed)):
            join.fill(index, ListOffsetResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))


def _partition_response(
    partition_index: int, result: ListOffsetResult | LegacyResult
) -> ListOffsetsPartitionResponse:
    if isinstance(result, LegacyResult):
        return ListOffsetsPartitionResponse(
            partition_index=partition_index,
            error_code=result.error,
            old_style_offsets=result.offsets,
        )
    return ListOffsetsPartitionResponse(
        partition_index=partition_index,
        error_code=result.error,
        timestamp=result.timestamp,
        offset=result.offset,
        leader_epoch=result.leader_epoch,
    )


# v0 ---------------------------------------------------------------------------------------


def _legacy_lookup(
    ref: Any, p: ListOffsetsPartition, reply: Callable[[LegacyResult], None]
) -> None:
    """Ask the partition for its log start, its high watermark and (for a real time) its
    newest record's timestamp, then answer as Kafka's v0 does from those points."""
    real_time = p.timestamp not in (LATEST_TIMESTAMP, EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP)
    queries = [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP] + ([MAX_TIMESTAMP] if real_time else [])

    def done(results: list[ListOffsetResult]) -> None:
        error = next((r.error for r in results if r.error != ErrorCode.NONE), None)
        if error is not None:
            reply(LegacyResult(error, []))
        elif p.max_num_offsets < 0:
            log.warning("ListOffsets v0: max_num_offsets %d is negative", p.max_num_offsets)
            reply(LegacyResult(ErrorCode.UNKNOWN_SERVER_ERROR, []))
        else:
            start, high_watermark = results[0].offset, results[1].offset
            newest = results[2].timestamp if real_time else -1
            points = _log_points(start, high_watermark, newest, now_ms())
            offsets = offsets_before(points, p.timestamp, p.max_num_offsets)
            reply(LegacyResult(ErrorCode.NONE, offsets))

    answers = Join(len(queries), done)
    for index, timestamp in enumerate(queries):
        if not send(ref, ListOffset(timestamp, -1, answers.slot(index))):
            answers.fill(index, ListOffsetResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))


def _log_points(
    log_start_offset: int, high_watermark: int, newest_timestamp_ms: int, now: int
) -> list[tuple[int, int]]:
    """The (offset, last-modified ms) points Kafka builds from a log of one segment.

    Kafka's last point is the log end offset, which its consumer rule then replaces with the
    high watermark whenever it is above it; starting from the high watermark gives the same
    answer. An empty log has only its segment's point, dated 0 here (Kafka's is the segment
    file's creation time, which Krill does not keep)."""
    if high_watermark <= log_start_offset:
        return [(log_start_offset, 0)]
    return [(log_start_offset, newest_timestamp_ms), (high_watermark, now)]


def offsets_before(
    points: list[tuple[int, int]], timestamp: int, max_num_offsets: int
) -> list[int]:
    """Kafka's `legacyFetchOffsetsBefore` over `points` (offset, last-modified ms, ascending).

    points [(0, 1000), (40, 2000), (70, now)]: -1 -> [70, 40, 0] (max 3), -2 -> [0],
    1500 -> [0], 2000 -> [40, 0] (max 5), 999 -> []."""
    assert max_num_offsets >= 0 and points, (max_num_offsets, points)
    if timestamp == LATEST_TIMESTAMP:
        start = len(points) - 1
    elif timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
        start = 0
    else:
        start = len(points) - 1
        while start >= 0 and points[start][1] > timestamp:
            start -= 1
    count = min(max_num_offsets, start + 1)
    return sorted((points[start - i][0] for i in range(count)), reverse=True)
