"""Which closed segments retention deletes: a pure decision over what the log knows.

Kafka's rules (UnifiedLog.deleteOldSegments), applied to the closed segments in offset order,
each stopping at the first segment that does not qualify, since a log only loses its head:

- below the log start: a segment whose every offset is below `log_start_offset` (moved by
  DeleteRecords) goes, whatever the policy;
- by time (`retention.ms`, -1: never): a segment whose largest timestamp is older than
  `now - retention.ms`;
- by size (`retention.bytes`, -1: never): while the partition stays at or above the limit
  without the segment, the oldest segment goes.

Only closed segments wholly below the high watermark qualify (the active one takes appends;
nothing a consumer cannot yet read is deleted). Example: sizes 100, 100, 100 (+ active 50),
retention.bytes 200: the partition holds 350, dropping the first leaves 250 >= 200, dropping
the second would leave 150 < 200, so one segment goes.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SegmentSummary", "deletable_prefix"]


class SegmentSummary(NamedTuple):
    base_offset: int
    next_offset: int  # one past its last offset
    size: int  # bytes
    max_timestamp: int  # -1 when it holds no batch


def deletable_prefix(
    segments: list[SegmentSummary],
    log_start_offset: int,
    high_watermark: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
) -> tuple[int, str]:
    """How many leading segments may go, and why (`start`, `time`, `size`, or "")."""
    closed = segments[:-1]  # the last one is the active segment
    count, reason = 0, ""
    while count < len(closed) and closed[count].next_offset <= log_start_offset:
        count, reason = count + 1, "start"
    if not delete_policy:
        return count, reason
    if retention_ms >= 0:
        while count < len(closed) and _readable(closed[count], high_watermark) and (
            0 <= closed[count].max_timestamp < now_ms - retention_ms
        ):
            count, reason = count + 1, "time"
    if retention_bytes >= 0:
        excess = sum(s.size for s in segments[count:]) - retention_bytes
        while count < len(closed) and _readable(closed[count], high_watermark) and (
            excess - closed[count].size >= 0
        ):
            excess -= closed[count].size
            count, reason = count + 1, "size"
    return count, reason


def _readable(segment: SegmentSummary, high_watermark: int) -> bool:
    return segment.next_offset <= high_watermark
