"""Log compaction on real files: what survives a clean, batch fields and offsets kept, codecs,
tombstones and their delete horizon, producers' last batches, the key map's limit, the
cleanable range, the throttle, and a crash at every step of the swap."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import DiskLog, LogConfig
from storage.compaction import (
    CleanerConfig,
    CleanerError,
    CleanResult,
    Throttle,
    clean_log,
    cleanable_range,
)
from storage.retention import SegmentSummary
from storage.segment import BatchInfo, Segment
from storage.segment_swap import CLEANED_SUFFIX, SWAP_SUFFIX
from tests.storage.batches import as_file_slice, make_records
from wire.compression import CODEC_NONE, CODECS
from wire.record_batch import BatchHeader, iter_batches
from wire.records import Record, build_batch, decode_batch

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

NOW = 1_700_000_000_000
BIG = 1 << 40
DAY_MS = 86_400_000
# segment_ms rolls: each list of batches given to `write` lands in a segment of its own.
LOG_CONFIG = LogConfig(segment_ms=1000, index_interval_bytes=150)
CONFIG = CleanerConfig(index_interval_bytes=150, io_bytes_per_second=BIG,
                       delete_retention_ms=DAY_MS)
SEGMENT_FILE = re.compile(r"^\d{20}\.(log|index|timeindex)$")

Pairs = list[tuple[bytes | None, bytes | None]]


def batch(pairs: Pairs, codec: int = CODEC_NONE, producer_id: int = -1, ts: int = NOW) -> bytes:
    return bytes(build_batch(
        [(k, v, ()) for k, v in pairs], codec=codec, timestamps=[ts + i for i in range(len(pairs))],
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1))


def write(log: DiskLog, *segments: list[bytes], active: list[bytes] | None = None) -> list[int]:
    """Append each list of batches into a segment of its own, then `active` (default: one
    batch) into the active segment; return every batch's base offset."""
    bases = []
    now = log._segments[-1].first_append_ms or NOW  # later calls roll the active segment
    for batches in [*segments, active or [batch([(b"tail", b"t")])]]:
        now += LOG_CONFIG.segment_ms
        for b in batches:
            records, headers = make_records(b)
            bases.append(log.append(records, headers, 3, now).base_offset)
    log.flush()
    return bases


def sealed(log: DiskLog) -> list[Segment]:
    return list(log._segments[:-1])


def clean(log: DiskLog, first_dirty: int = 0, now_ms: int = NOW, config: CleanerConfig = CONFIG,
          last: set[int] | None = None, **kwargs) -> CleanResult:
    result = clean_log(log.directory, sealed(log), first_dirty, now_ms, config, last or set(),
                       **kwargs)
    log.replace_segments(result.old_segments, result.new_segments)
    return result


def headers_of(log: DiskLog) -> list[BatchHeader]:
    return list(log.iter_batch_headers())


def records_of(log: DiskLog) -> list[Record]:
    """Every record, read through DiskLog.read (each batch's CRC checked on decode)."""
    out: list[Record] = []
    offset = log.log_start_offset
    while offset < log.next_offset:
        data = log.read_bytes(offset, BIG, BIG)
        assert data, offset
        for h in iter_batches(data):
            out += decode_batch(data[h.position : h.position + h.size])[1]
            offset = h.next_offset
    return out


def compacted(records: list[Record], end: int, first_dirty: int = 0) -> list[Record]:
    """What a clean of everything below `end` with a key map of [first_dirty, end) keeps
    (tombstones not yet past a horizon)."""
    latest = {r.key: r.offset for r in records if first_dirty <= r.offset < end and r.key}
    return [r for r in records if r.offset >= end
            or (r.key is not None and r.offset >= latest.get(r.key, -1))]


def leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not SEGMENT_FILE.match(n))


def three_rounds(codec: int = CODEC_NONE) -> list[list[bytes]]:
    """Six segments of keyed batches: ten keys, each written many times."""
    return [[batch([(b"k%d" % ((s * 7 + b * 3 + j) % 10), b"v%d.%d.%d" % (s, b, j) * 5)
                    for j in range(4)], codec) for b in range(3)] for s in range(6)]


# What survives ----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_latest_value_per_key_survives_with_offsets_and_batch_fields(tmp_path, codec):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds(codec), active=[batch([(b"k0", b"newest")], codec)])
    before, headers_before = records_of(log), {h.base_offset: h for h in headers_of(log)}
    end = sealed(log)[-1].next_offset
    result = clean(log)
    after = records_of(log)
    assert after == compacted(before, end)
    assert result.error is None and result.first_dirty_offset == end
    assert result.records_removed == len(before) - len(after) > 0
    assert log.next_offset == headers_of(log)[-1].next_offset == max(headers_before) + 1
    for h in headers_of(log):
        old = headers_before[h.base_offset]
        assert (h.last_offset_delta, h.partition_leader_epoch, h.producer_id,
                h.log_append_time) == (old.last_offset_delta, 3, -1, False)
        assert h.codec == (old.codec if h.record_count else CODEC_NONE)
    # One cleaned segment, named by the first one it replaced; the active one untouched.
    assert log.segment_base_offsets == [0, end]
    log.close()
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    assert records_of(log) == after and leftovers(tmp_path) == []
    log.close()


def test_records_without_a_key_are_removed(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"a", b"1")]), batch([(None, b"x"), (b"b", b"1"), (None, b"y")]),
                batch([(b"c", b"1")])])
    clean(log)
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"tail", b"t")]
    log.close()


def test_indexes_of_a_cleaned_segment_are_what_recovery_would_build(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds())
    clean(log)
    bases = log.segment_base_offsets
    log.close()
    for base in bases[:-1]:  # the cleaned ones
        segment = Segment(tmp_path, base, LOG_CONFIG.index_interval_bytes)
        files = [segment.index.path, segment.time_index.path]
        written = [p.read_bytes() for p in files]
        infos = [BatchInfo(h.base_offset, h.last_offset, h.max_timestamp, h.size)
                 for h in segment.headers_from(0)]
        segment.rebuild_indexes(infos, sealed=True)
        assert [p.read_bytes() for p in files] == written
        assert len(segment.index) > 1  # several entries: the interval was honoured
        segment.close()


def test_a_segment_with_nothing_to_remove_is_not_rewritten(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"a%d" % i, b"1") for i in range(5)])],
          [batch([(b"b%d" % i, b"1") for i in range(5)])])
    inodes = [s.inode for s in sealed(log)]
    result = clean(log, config=CleanerConfig(segment_bytes=100, io_bytes_per_second=BIG))
    assert result.new_segments == [] and result.bytes_written == 0 and result.error is None
    assert result.first_dirty_offset == sealed(log)[-1].next_offset
    assert [s.inode for s in sealed(log)] == inodes
    log.close()


def test_groups_stay_within_segment_bytes(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds())
    sizes = [s.size for s in sealed(log)]
    bases = [s.base_offset for s in sealed(log)]
    config = CleanerConfig(segment_bytes=sizes[0] + sizes[1], io_bytes_per_second=BIG)
    clean(log, config=config)
    assert [s.base_offset for s in sealed(log)] == bases[::2]  # pairs of segments
    assert all(s.size <= config.segment_bytes for s in sealed(log))
    log.close()


# Tombstones and producers -----------------------------------------------------------------


def test_tombstone_kept_until_its_delete_horizon(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    bases = write(log, [batch([(b"a", b"1"), (b"b", b"1")]), batch([(b"c", b"1")])],
                  [batch([(b"a", None)]), batch([(b"d", b"1")])])
    first = clean(log)
    horizon = NOW + DAY_MS
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"b", b"1"), (b"c", b"1"), (b"a", None), (b"d", b"1"), (b"tail", b"t")]
    tombstone_batch = {h.base_offset: h for h in headers_of(log)}[bases[2]]
    assert tombstone_batch.delete_horizon_ms == horizon == first.delete_horizon_ms
    # Before the horizon a clean keeps it (and, with nothing else to do, writes nothing).
    second = clean(log, first.first_dirty_offset, now_ms=horizon - 1)
    assert second.new_segments == [] and second.delete_horizon_ms == horizon
    assert (b"a", None) in [(r.key, r.value) for r in records_of(log)]
    third = clean(log, second.first_dirty_offset, now_ms=horizon)
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"b", b"1"), (b"c", b"1"), (b"d", b"1"), (b"tail", b"t")]
    assert third.batches_removed == 1 and third.delete_horizon_ms is None
    assert bases[2] not in {h.base_offset for h in headers_of(log)}
    log.close()


@pytest.mark.parametrize("kept", [True, False])
def test_a_producers_last_batch_stays_empty_others_go(tmp_path, kept):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    bases = write(log, [batch([(b"x", b"1")]), batch([(b"a", b"1"), (b"b", b"1")], producer_id=7)],
                  [batch([(b"a", b"2"), (b"b", b"2")]), batch([(b"z", b"1")])])
    clean(log, last={bases[1]} if kept else set())
    by_base = {h.base_offset: h for h in headers_of(log)}
    if not kept:
        assert bases[1] not in by_base
    else:
        empty = by_base[bases[1]]
        assert (empty.record_count, empty.last_offset_delta, empty.producer_id,
                empty.producer_epoch, empty.base_sequence) == (0, 1, 7, 0, 0)
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"x", b"1"), (b"a", b"2"), (b"b", b"2"), (b"z", b"1"), (b"tail", b"t")]
    log.close()


def test_first_and_last_batch_of_a_cleaned_segment_stay_empty(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    bases = write(log, [batch([(b"a", b"1")]), batch([(b"m", b"1")])],
                  [batch([(b"a", b"2")]), batch([(b"b", b"1")])],
                  [batch([(b"b", b"2")])])
    clean(log, config=CleanerConfig(segment_bytes=1, io_bytes_per_second=BIG))  # no merging
    counts = {h.base_offset: h.record_count for h in headers_of(log)}
    assert counts[bases[0]] == 0 and counts[bases[3]] == 0  # a first and a last batch
    assert log.segment_base_offsets == [bases[0], bases[2], bases[4], bases[5]]
    log.close()
    log = DiskLog.open(tmp_path, LOG_CONFIG)  # recovery trusts them as they are
    assert log.segment_base_offsets == [bases[0], bases[2], bases[4], bases[5]]
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"m", b"1"), (b"a", b"2"), (b"b", b"2"), (b"tail", b"t")]
    log.close()


# The key map's limit ----------------------------------------------------------------------


def test_a_full_key_map_cleans_whole_segments_and_the_next_clean_goes_on(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1")])],
          [batch([(b"d", b"1"), (b"e", b"1"), (b"f", b"1")])],
          [batch([(b"a", b"3"), (b"d", b"2"), (b"g", b"1")])])
    before = records_of(log)
    ends = [s.next_offset for s in sealed(log)]
    config = CleanerConfig(key_map_entries_max=4, io_bytes_per_second=BIG)
    first = clean(log, config=config)
    assert first.key_map_full and first.first_dirty_offset == ends[0]
    assert records_of(log) == compacted(before, ends[0])
    second = clean(log, first.first_dirty_offset, config=config)
    assert second.key_map_full and second.first_dirty_offset == ends[1]
    third = clean(log, second.first_dirty_offset, config=config)
    assert not third.key_map_full and third.first_dirty_offset == ends[2]
    assert records_of(log) == compacted(before, ends[2])
    log.close()


def test_a_segment_too_big_for_the_key_map_is_cleaned_in_parts(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"k%d" % (i % 5), b"%d" % i) for i in range(12)])],
          [batch([(b"k%d" % (i % 3), b"x%d" % i) for i in range(4)])])
    before = records_of(log)
    end = sealed(log)[-1].next_offset
    config = CleanerConfig(key_map_entries_max=2, io_bytes_per_second=BIG)
    first_dirty, passes = 0, 0
    while first_dirty < end:
        result = clean(log, first_dirty, config=config)
        assert result.error is None and result.first_dirty_offset > first_dirty
        first_dirty, passes = result.first_dirty_offset, passes + 1
    assert passes >= 3
    assert records_of(log) == compacted(before, end)
    log.close()


# What to clean: the cleanable range (pure) -----------------------------------------------


def summaries(*segments: tuple[int, int, int]) -> list[SegmentSummary]:
    """(size, max timestamp, offsets) per segment, the last one active."""
    out, base = [], 0
    for size, max_timestamp, offsets in segments:
        out.append(SegmentSummary(base, base + offsets, size, max_timestamp))
        base += offsets
    return out


FOUR = summaries((100, NOW - 50_000, 10), (100, NOW - 40_000, 10), (100, NOW - 30_000, 10),
                 (10, NOW, 1))


def test_range_clean_and_dirty_bytes():
    r = cleanable_range(FOUR, 0, 10, BIG, NOW, CONFIG)
    assert (r.first_dirty_offset, r.end_offset, r.clean_bytes, r.dirty_bytes) == (10, 30, 100, 200)
    assert r.dirty_ratio == pytest.approx(2 / 3) and r.due and not r.forced
    nothing = cleanable_range(FOUR, 0, 30, BIG, NOW, CONFIG)
    assert (nothing.dirty_bytes, nothing.due) == (0, False)


def test_range_checkpoint_outside_the_log_starts_over():
    assert cleanable_range(FOUR, 10, 5, BIG, NOW, CONFIG).first_dirty_offset == 10
    assert cleanable_range(FOUR, 10, 99, BIG, NOW, CONFIG).first_dirty_offset == 10


def test_range_stops_at_the_high_watermark():
    r = cleanable_range(FOUR, 0, 0, 25, NOW, CONFIG)
    assert (r.end_offset, r.dirty_bytes) == (20, 200)


def test_range_min_compaction_lag_stops_at_the_first_segment_too_new():
    config = CleanerConfig(min_compaction_lag_ms=45_000)
    r = cleanable_range(FOUR, 0, 0, BIG, NOW, config)
    assert (r.end_offset, r.dirty_bytes) == (10, 100)
    # A newer segment stops the range though an older one follows it.
    mixed = summaries((100, NOW - 50_000, 10), (100, NOW - 1, 10), (100, NOW - 90_000, 10),
                      (10, NOW, 1))
    assert cleanable_range(mixed, 0, 0, BIG, NOW, config).end_offset == 10
    assert cleanable_range(FOUR, 0, 0, BIG, NOW, CleanerConfig()).end_offset == 30


def test_range_max_compaction_lag_forces_a_clean_below_the_ratio():
    low = CleanerConfig(min_cleanable_dirty_ratio=0.9)
    assert not cleanable_range(FOUR, 0, 20, BIG, NOW, low).due  # ratio 1/3
    # The dirty segment's newest record is 30 s old.
    forced = CleanerConfig(min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=29_999)
    r = cleanable_range(FOUR, 0, 20, BIG, NOW, forced)
    assert r.forced and r.due
    not_yet = CleanerConfig(min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=30_000)
    assert not cleanable_range(FOUR, 0, 20, BIG, NOW, not_yet).forced
    no_times = summaries((100, -1, 10), (100, -1, 10), (10, -1, 1))
    assert not cleanable_range(no_times, 0, 10, BIG, NOW, forced).forced


def test_min_compaction_lag_keeps_new_segments_out_of_a_clean(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"a", b"1")], ts=NOW - 60_000), batch([(b"a", b"2")], ts=NOW - 60_000)],
          [batch([(b"a", b"3")], ts=NOW - 1), batch([(b"a", b"4")], ts=NOW - 1)])
    config = CleanerConfig(min_compaction_lag_ms=30_000, io_bytes_per_second=BIG)
    r = cleanable_range(log.summaries(), log.log_start_offset, 0, BIG, NOW, config)
    assert r.end_offset == 2 and r.due
    segments = [s for s in sealed(log) if s.next_offset <= r.end_offset]
    result = clean_log(log.directory, segments, 0, NOW, config, set())
    log.replace_segments(result.old_segments, result.new_segments)
    assert [(r.offset, r.value) for r in records_of(log)] == [
        (1, b"2"), (2, b"3"), (3, b"4"), (4, b"t")]
    assert result.first_dirty_offset == 2
    log.close()


# The live log and failures ----------------------------------------------------------------


def test_replace_segments_while_appends_went_on(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds())
    before = records_of(log)
    end = sealed(log)[-1].next_offset
    in_flight = as_file_slice(log.read(0, BIG, BIG), log._segments[0])
    sent_before = in_flight.read()
    result = clean_log(log.directory, sealed(log), 0, NOW, CONFIG, set())
    count = len(log.segment_base_offsets)
    more = write(log, [batch([(b"k1", b"later")])])  # rolls the active segment meanwhile
    assert len(log.segment_base_offsets) == count + 2
    log.replace_segments(result.old_segments, result.new_segments)
    assert in_flight.read() == sent_before  # its fd still reads the replaced file
    assert records_of(log) == compacted(before, end) + [
        Record(more[0], NOW, b"k1", b"later", ()), Record(more[1], NOW, b"tail", b"t", ())]
    assert log.next_offset == more[1] + 1
    log.close()
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    assert records_of(log)[-2].value == b"later" and leftovers(tmp_path) == []
    log.close()


def test_a_stop_request_leaves_the_log_as_it_was(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds())
    before = records_of(log)
    stop = threading.Event()
    stop.set()
    result = clean(log, stop=stop)
    assert isinstance(result.error, CleanerError) and result.new_segments == []
    assert result.first_dirty_offset == 0
    assert records_of(log) == before and leftovers(tmp_path) == []
    log.close()


def test_a_corrupt_batch_fails_its_group_and_keeps_the_groups_before(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *[[batch([(b"u%d" % i, b"1")]), batch([(b"a", b"%d" % i)])] for i in range(5)])
    one_each = CleanerConfig(segment_bytes=1, io_bytes_per_second=BIG)  # a group a segment
    checkpoint = clean(log, config=one_each).first_dirty_offset
    write(log, [batch([(b"u%d" % i, b"2") for i in range(5)])])  # dirty: u0..u4 again
    victim = sealed(log)[3]  # clean already: only the rewrite reads it
    os.pwrite(victim.fd, b"\xff", victim.size - 3)  # a record byte: the CRC no longer holds
    result = clean(log, checkpoint, config=one_each)
    assert isinstance(result.error, CleanerError) and "CRC" in str(result.error)
    assert len(result.new_segments) == 3 and result.first_dirty_offset == checkpoint
    assert log.segment_base_offsets[:3] == [s.base_offset for s in result.new_segments]
    assert leftovers(tmp_path) == []
    stop = threading.Event()
    stop.set()
    failed = clean(log, checkpoint, config=one_each, stop=stop)  # the map stops at once
    assert isinstance(failed.error, CleanerError) and failed.new_segments == []
    log.close()


# A crash at every step of the swap --------------------------------------------------------


class Crash(BaseException):
    """The process dies here (not an Exception: nothing cleans up after it)."""


def crash_at(step_index: int, labels: list[str]) -> Callable[[str], None]:
    def step(label: str) -> None:
        labels.append(label)
        if len(labels) - 1 == step_index:
            raise Crash(label)
    return step


def two_groups(directory: Path) -> tuple[DiskLog, CleanerConfig]:
    log = DiskLog.open(directory, LOG_CONFIG)
    write(log, *three_rounds())
    size = sealed(log)[0].size
    return log, CleanerConfig(segment_bytes=size * 3, index_interval_bytes=150,
                              io_bytes_per_second=BIG)


def test_steps_of_a_swap(tmp_path):
    log, config = two_groups(tmp_path)
    labels: list[str] = []
    clean(log, config=config, step=crash_at(-1, labels))
    assert labels[:5] == [
        "cleaned files written",
        f"renamed {0:020d}.index{CLEANED_SUFFIX} to {SWAP_SUFFIX}",
        f"renamed {0:020d}.timeindex{CLEANED_SUFFIX} to {SWAP_SUFFIX}",
        f"renamed {0:020d}.log{CLEANED_SUFFIX} to {SWAP_SUFFIX}",
        "swap committed",
    ]
    assert labels.count("swap done") == 2
    log.close()


def test_a_crash_at_every_step_recovers_to_a_whole_log(tmp_path):
    log, config = two_groups(tmp_path / "dry")
    before = records_of(log)
    end = sealed(log)[-1].next_offset
    labels: list[str] = []
    clean(log, config=config, step=crash_at(-1, labels))
    log.close()
    latest = {r.key: r for r in before}
    for i, label in enumerate(labels):
        directory = tmp_path / f"crash-{i}"
        log, config = two_groups(directory)
        with pytest.raises(Crash):
            clean_log(directory, sealed(log), 0, NOW, config, set(),
                      step=crash_at(i, []))
        log.close()  # everything was flushed: closing writes nothing
        log = DiskLog.open(directory, LOG_CONFIG)
        after = records_of(log)
        assert leftovers(directory) == [], label
        assert set(after) <= set(before), label  # offsets, timestamps, values unchanged
        assert [r.offset for r in after] == sorted({r.offset for r in after}), label
        assert all(r in after for r in latest.values()), label
        assert log.next_offset == before[-1].offset + 1, label
        clean(log, config=config)  # and the log cleans as if nothing had happened
        assert records_of(log) == compacted(before, end), label
        log.close()
        shutil.rmtree(directory)


def test_unfinished_cleaned_and_uncommitted_swap_files_are_removed(tmp_path):
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, *three_rounds())
    before = records_of(log)
    log.close()
    (tmp_path / f"{0:020d}.log{CLEANED_SUFFIX}").write_bytes(b"half a batch")
    (tmp_path / f"{0:020d}.index{CLEANED_SUFFIX}").write_bytes(b"")
    (tmp_path / f"{0:020d}.index{SWAP_SUFFIX}").write_bytes(b"\0" * 8)  # no .log.swap
    (tmp_path / f"{0:020d}.timeindex{SWAP_SUFFIX}").write_bytes(b"")
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    assert records_of(log) == before and leftovers(tmp_path) == []
    log.close()


# The throttle -----------------------------------------------------------------------------


def test_throttle_sleeps_what_the_rate_asks_in_its_own_thread():
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttle = Throttle(1000, clock=lambda: now[0], sleep=sleep)
    throttle.read(5)  # 5 ms ahead: under the minimum, no sleep yet
    assert slept == []
    throttle.wrote(500)
    assert slept == [pytest.approx(0.505)]
    now[0] += 10  # idle time earns no credit
    throttle.read(100)
    assert slept[-1] == pytest.approx(0.1)
    assert (throttle.bytes_read, throttle.bytes_written) == (105, 500)
    assert throttle.slept_s == pytest.approx(0.605)


@pytest.mark.parametrize("codec", CODECS)
def test_throttle_charges_what_compressed_batches_decode_to(codec):
    records = [(b"key", b"v" * 1000, ())] * 50
    header, decoded = decode_batch(build_batch(records, codec=codec))
    charged: list[float] = []
    throttle = Throttle(1, clock=lambda: 0.0, sleep=charged.append)
    throttle.decoded(header, decoded)
    if codec == CODEC_NONE:
        assert charged == []  # its read charged it all
    else:
        assert header.size < 10_000 and charged == [pytest.approx(50 * 1011 - header.size)]


def txn_batch(pairs: Pairs, producer_id: int) -> bytes:
    return bytes(build_batch(
        [(k, v, ()) for k, v in pairs], timestamps=[NOW] * len(pairs), producer_id=producer_id,
        producer_epoch=0, base_sequence=0, transactional=True))


def test_an_aborted_transactions_records_never_supersede_and_are_removed(tmp_path):
    """Kafka's cleaner: a committed `a` outlives a later `a` of an aborted transaction, whose
    records go (its batch emptied away); a committed transaction's records compact as any."""
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    bases = write(log, [batch([(b"a", b"1"), (b"b", b"1")])],
                  [txn_batch([(b"a", b"2"), (b"c", b"2")], producer_id=5),  # aborted
                   txn_batch([(b"b", b"3")], producer_id=6)],  # committed
                  [batch([(b"z", b"1")])])
    aborted = [(5, bases[1], bases[1] + 5)]  # its ABORT marker further on
    result = clean(log, aborted=aborted)
    assert [(r.key, r.value) for r in records_of(log)] == [
        (b"a", b"1"), (b"b", b"3"), (b"z", b"1"), (b"tail", b"t")]
    assert bases[1] not in {h.base_offset for h in headers_of(log)}
    assert result.records_removed == 3  # b=1 superseded; a=2 and c=2 aborted
    log.close()


def test_without_the_aborted_list_an_aborted_record_would_win(tmp_path):
    """The same log cleaned as if the transaction had committed: `a` is then the aborted
    value, which is what the aborted list prevents."""
    log = DiskLog.open(tmp_path, LOG_CONFIG)
    write(log, [batch([(b"a", b"1")])], [txn_batch([(b"a", b"2")], producer_id=5)],
          [batch([(b"z", b"1")])])
    clean(log)
    assert [(r.key, r.value) for r in records_of(log)][0] == (b"a", b"2")
    log.close()
