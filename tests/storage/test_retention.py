"""Retention's decision (pure) and what DiskLog does to drop its head, on real files."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from storage import DiskLog, LogConfig, OffsetOutOfRange
from storage.retention import SegmentSummary, deletable_prefix
from tests.storage.batches import as_file_slice, batch_of_size, make_records

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

HOUR_MS = 3_600_000
NOW_MS = 100 * HOUR_MS


def summaries(*specs: tuple[int, int]) -> list[SegmentSummary]:
    """(size, max timestamp) per segment, 10 offsets each; the last one is the active one."""
    return [SegmentSummary(10 * i, 10 * i + 10, size, ts) for i, (size, ts) in enumerate(specs)]


def decide(segments: list[SegmentSummary], *, start: int = 0, hwm: int = 1 << 40,
           ms: int = -1, size: int = -1, delete: bool = True) -> tuple[int, str]:
    return deletable_prefix(segments, start, hwm, NOW_MS, ms, size, delete)


def test_by_time_stops_at_the_first_young_segment() -> None:
    old, young = NOW_MS - 3 * HOUR_MS, NOW_MS - 10
    segments = summaries((100, old), (100, young), (100, old), (100, old))
    assert decide(segments, ms=HOUR_MS) == (1, "time")
    assert decide(segments, ms=-1) == (0, "")


def test_by_size_keeps_at_least_retention_bytes() -> None:
    segments = summaries((100, 1), (100, 1), (100, 1), (50, 1))  # 350 in all
    assert decide(segments, size=200) == (1, "size")  # 250 left; dropping another: 150
    assert decide(segments, size=150) == (2, "size")
    assert decide(segments, size=0) == (3, "size")  # never the active segment
    assert decide(segments, size=1000) == (0, "")


def test_nothing_above_the_high_watermark_and_never_the_active_segment() -> None:
    segments = summaries((100, 1), (100, 1), (100, 1))
    assert decide(segments, ms=HOUR_MS, hwm=15) == (1, "time")
    assert decide(summaries((100, 1)), ms=HOUR_MS, size=0) == (0, "")


def test_below_the_log_start_goes_whatever_the_policy() -> None:
    segments = summaries((100, NOW_MS), (100, NOW_MS), (100, NOW_MS))
    assert decide(segments, start=20, delete=False) == (2, "start")
    assert decide(segments, start=19, delete=False) == (1, "start")
    assert decide(summaries((100, 1), (100, 1)), ms=HOUR_MS, delete=False) == (0, "")


# DiskLog ----------------------------------------------------------------------------------


def filled_log(directory: Path, segments: int) -> DiskLog:
    """`segments` closed segments of 10 one-record batches (1000 bytes each), then one more
    batch in the active segment; everything flushed."""
    log = DiskLog.open(directory, LogConfig(segment_bytes=10_000))
    for _ in range(segments * 10 + 1):
        records, headers = make_records(batch_of_size(1000))
        log.append(records, headers, 0, 0)
    log.flush()
    assert len(log.segment_base_offsets) == segments + 1
    return log


def test_remove_head_moves_the_start_and_reads_below_are_out_of_range(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 3)
    assert log.removable_head(5) == 3
    removed = log.remove_head(2)
    assert [s.base_offset for s in removed] == [0, 10]
    assert log.log_start_offset == 20 and log.segment_base_offsets == [20, 30]
    with pytest.raises(OffsetOutOfRange):
        log.read(19, 1 << 20, log.next_offset)
    assert log.read(20, 1 << 20, log.next_offset) is not None
    for segment in removed:
        segment.mark_deleted()
    names = sorted(os.listdir(tmp_path))
    assert f"{0:020d}.log.deleted" in names and f"{0:020d}.log" not in names
    log.close()
    # A crash before the delay ran out: start-up removes the marked files.
    reopened = DiskLog.open(tmp_path, LogConfig(segment_bytes=10_000))
    assert not any(name.endswith(".deleted") for name in os.listdir(tmp_path))
    assert reopened.log_start_offset == 20
    reopened.close()


def test_segments_a_flush_still_owes_are_not_removable(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 2)
    records, headers = make_records(batch_of_size(9500))  # rolls: segment 2 closes unflushed
    log.append(records, headers, 0, 0)
    assert log.removable_head(3) == 2  # segment 2 (just sealed) waits for its flush
    ticket = log.flush_prepare()
    assert ticket is not None
    assert log.removable_head(3) == 2  # its fds are in the ticket out
    ticket.run()
    log.flush_complete(ticket)
    assert log.removable_head(3) == 3
    log.close()


def test_log_start_set_by_delete_records_survives_reopening(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 2)
    assert log.advance_log_start(15)
    assert not log.advance_log_start(12)  # never backwards
    log.log_start_writer(15)()
    assert log.removable_head(3) == 2 and log.remove_head(1)[0].base_offset == 0
    assert log.log_start_offset == 15  # inside segment 10..19: the start stays where it was
    log.close()
    reopened = DiskLog.open(tmp_path, LogConfig(segment_bytes=10_000))
    assert reopened.log_start_offset == 15
    reopened.close()


def test_a_slice_keeps_its_file_open_after_the_segment_goes(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 1)
    region = as_file_slice(log.read(0, 1 << 20, log.next_offset), log._segments[0])
    (segment,) = log.remove_head(1)
    segment.mark_deleted()
    segment.delete_marked()
    segment.close()
    gc.collect()
    assert len(region.read()) == region.length  # the fd is still this file's
    fd = region.fd
    del region, segment
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the last holder let go: closed
    log.close()


def test_segment_index_bytes_and_jitter_roll(tmp_path: Path) -> None:
    # Two offset-index entries (16 bytes; the time index's 12-byte entries fill first at 24).
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1, segment_index_bytes=24)
    log = DiskLog.open(tmp_path / "index", config)
    for _ in range(5):
        records, headers = make_records(batch_of_size(200))
        log.append(records, headers, 0, 0)
    assert log.segment_base_offsets == [0, 2, 4]
    log.close()
    jittery = DiskLog.open(tmp_path / "jitter", LogConfig(segment_ms=1000, segment_jitter_ms=400))
    jitters = []
    for now_ms in range(0, 20_000, 100):  # one batch every 100 ms
        active = jittery._segments[-1]
        segments = len(jittery.segment_base_offsets)
        records, headers = make_records(batch_of_size(200))
        jittery.append(records, headers, 0, now_ms)
        rolled = len(jittery.segment_base_offsets) > segments
        if active.first_append_ms is not None and active.first_append_ms < now_ms:
            age = now_ms - active.first_append_ms
            assert rolled == (age >= 1000 - active.roll_jitter_ms), (age, active.roll_jitter_ms)
            if rolled:
                jitters.append(active.roll_jitter_ms)
    assert all(0 <= j < 400 for j in jitters) and len(set(jitters)) > 1  # drawn per segment
    jittery.close()
