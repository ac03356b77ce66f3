"""The log as a Raft log: rolls on an epoch change, the epoch cache, a follower's appends,
cuts and resets, their durability across a crash, and a property test against headers."""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    CutTicket,
    DiskLog,
    EpochCache,
    Log,
    LogConfig,
    MemoryLog,
    NotBatchBoundary,
    NotContiguous,
)
from storage.compaction import CleanerConfig, clean_log
from storage.log import AppendFailed, OffsetOutOfRange
from tests.storage.batches import leader_records, make_batch, make_records
from wire.record_batch import iter_batches, patch_base_offset
from wire.records import build_batch

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 40
UNDEFINED = (-1, -1)
SMALL_SEGMENTS = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def lead(log: Log, epoch: int, batches: int = 1, now_ms: int = 0) -> None:
    """A leader's append of `batches` batches of 2 records in `epoch`."""
    records, headers = make_records(*(make_batch([1, 2]) for _ in range(batches)))
    log.append(records, headers, epoch, now_ms)


def follow(log: Log, *epochs: int, now_ms: int = 0) -> None:
    """A follower's append of one 2-record batch per epoch given, from the log's end."""
    log.append_replicated(*leader_records(log.next_offset, list(epochs)), now_ms)


def cut(log: Log, ticket: CutTicket) -> None:
    ticket.run()
    log.cut_complete(ticket)


def batches(log: Log) -> list[tuple[int, int, int]]:
    """(base offset, last offset, epoch) of every batch from the log start."""
    return [(h.base_offset, h.last_offset, h.partition_leader_epoch)
            for h in log.iter_batch_headers(log.log_start_offset)]


def brute_epochs(log: Log) -> list[tuple[int, int]]:
    """The epoch cache as the headers say it should be."""
    runs: list[tuple[int, int]] = []
    for h in log.iter_batch_headers(log.log_start_offset):
        if not runs or runs[-1][0] != h.partition_leader_epoch:
            runs.append((h.partition_leader_epoch, max(h.base_offset, log.log_start_offset)))
    return runs


def segment_epochs(log: DiskLog) -> list[set[int]]:
    """The epochs found in each segment, by reading every header."""
    bases = log.segment_base_offsets
    found: list[set[int]] = [set() for _ in bases]
    for h in log.iter_batch_headers(log.log_start_offset):
        found[max(i for i, b in enumerate(bases) if b <= h.base_offset)].add(
            h.partition_leader_epoch)
    return found


def abandon(log: DiskLog) -> None:
    """Let go of a log as a crash would: no index entry written, fds closed."""
    for segment in log._segments + log._retired:
        segment.index.deleted = segment.time_index.deleted = True
    log._ticket = None
    log.close()


# Rolls on an epoch change ----------------------------------------------------------------------


def test_a_new_epoch_rolls_a_segment(make_log):
    log = make_log()
    lead(log, 1, batches=3)  # 0..5
    lead(log, 1)  # 6..7: same epoch, same segment
    assert log.segment_base_offsets == [0]
    lead(log, 2)  # 8..9
    follow(log, 2, 3, 3, 5)  # 10..11 stays, 12..15 rolls, 16..17 rolls
    assert log.segment_base_offsets == [0, 8, 12, 16]
    assert log.epochs() == [(1, 0), (2, 8), (3, 12), (5, 16)]
    assert log.last_epoch == 5


def test_an_empty_segment_takes_any_epoch_and_size_rolls_keep_theirs(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    follow(log, 4)  # the empty first segment: no roll
    for epoch in [4] * 30 + [6] * 30:
        follow(log, epoch)
    assert log.segment_base_offsets == [0, 42, 62, 104]  # 21 batches a segment, 62: epoch 6
    assert all(len(epochs) == 1 for epochs in segment_epochs(log))
    assert log.epochs() == [(4, 0), (6, 62)]
    log.close()


# The epoch cache -------------------------------------------------------------------------------


def test_term_at_and_last_epoch(make_log):
    log = make_log()
    assert log.last_epoch is None and log.term_at(0) is None and log.epochs() == []
    follow(log, 1, 1, 3, 3, 3, 4)  # offsets 0..11
    assert [log.term_at(o) for o in (-1, 0, 3, 4, 9, 10, 11, 12)] == [
        None, 1, 1, 3, 3, 4, 4, None]
    assert log.last_epoch == 4 and log.epoch_before_start is None


def test_truncate_to_drops_the_epochs_past_the_cut(make_log):
    log = make_log()
    follow(log, 1, 2, 2, 3, 3)  # 0..9
    cut(log, log.truncate_to(6))
    assert log.epochs() == [(1, 0), (2, 2)] and log.last_epoch == 2 and log.next_offset == 6
    cut(log, log.truncate_to(2))
    assert log.epochs() == [(1, 0)]
    cut(log, log.truncate_to(0))
    assert log.epochs() == [] and log.last_epoch is None
    follow(log, 7)
    assert log.epochs() == [(7, 0)]


class TestEndOffsetForEpoch:
    """OffsetForLeaderEpoch as Kafka's LeaderEpochFileCache.endOffsetFor answers it."""

    def test_the_latest_epoch_ends_at_the_log_end(self):
        assert EpochCache([(2, 10)]).end_offset_for_epoch(2, 14) == (2, 14)

    def test_an_older_epoch_ends_where_the_next_one_starts(self):
        cache = EpochCache([(1, 11), (2, 13), (3, 15)])
        assert cache.end_offset_for_epoch(1, 17) == (1, 13)
        assert cache.end_offset_for_epoch(2, 17) == (2, 15)

    def test_an_epoch_between_two_gets_the_one_below(self):
        cache = EpochCache([(0, 10), (2, 13), (4, 17)])
        assert cache.end_offset_for_epoch(1, 20) == (0, 13)
        assert cache.end_offset_for_epoch(3, 20) == (2, 17)

    def test_below_every_epoch_the_first_start(self):
        # Kafka's code (and its test shouldReturnFirstEpochIfRequestedEpochLessThanFirstEpoch)
        # answers (requested, first start); only its stale javadoc says UNDEFINED.
        assert EpochCache([(5, 11), (6, 12), (7, 13)]).end_offset_for_epoch(4, 20) == (4, 11)

    def test_undefined_answers(self):
        cache = EpochCache([(2, 11), (3, 12)])
        assert cache.end_offset_for_epoch(-1, 20) == UNDEFINED  # UNDEFINED_EPOCH requested
        assert cache.end_offset_for_epoch(4, 20) == UNDEFINED  # above every epoch
        assert EpochCache().end_offset_for_epoch(0, 0) == UNDEFINED
        assert EpochCache().end_offset_for_epoch(-1, 73) == UNDEFINED

    def test_epochs_that_start_above_zero_and_many_leader_changes(self):
        cache = EpochCache([(0, 0)])
        cache.append(1, 5)
        cache.append(2, 10)
        assert cache.end_offset_for_epoch(0, 12) == (0, 5)
        assert cache.end_offset_for_epoch(1, 12) == (1, 10)
        assert cache.end_offset_for_epoch(2, 12) == (2, 12)

    def test_an_empty_log_after_a_reset_answers_for_the_epoch_before_it(self):
        cache = EpochCache()
        cache.reset(7)
        assert cache.end_offset_for_epoch(7, 100) == (7, 100)
        assert cache.end_offset_for_epoch(6, 100) == (6, 100)
        assert cache.end_offset_for_epoch(8, 100) == UNDEFINED
        assert cache.last_epoch == 7

    def test_on_a_log(self, make_log):
        log = make_log()
        follow(log, 1, 1, 3, 3, 4)  # 0..9
        assert [log.end_offset_for_epoch(e) for e in (-1, 0, 1, 2, 3, 4, 5)] == [
            UNDEFINED, (0, 0), (1, 4), (1, 4), (3, 8), (4, 10), UNDEFINED]


class TestStartMoves:
    """Kafka's truncateFromStart: entries wholly below the start go, the first is clamped."""

    def cache(self) -> EpochCache:
        return EpochCache([(2, 6), (3, 8), (4, 11)])

    @pytest.mark.parametrize(("start", "entries", "before"), [
        (1, [(2, 6), (3, 8), (4, 11)], None),  # nothing below: nothing changes
        (6, [(2, 6), (3, 8), (4, 11)], None),
        (8, [(3, 8), (4, 11)], 2),
        (9, [(3, 9), (4, 11)], 3),
        (11, [(4, 11)], 3),
        (15, [(4, 15)], 4),
        (20, [], 4),  # the log end: no batch left, the last epoch is the one before
    ])
    def test_advance_start(self, start, entries, before):
        cache = self.cache()
        cache.advance_start(start, 20)
        assert (cache.epochs(), cache.epoch_before_start) == (entries, before)
        assert cache.last_epoch == 4

    def test_truncate_keeps_entries_below_the_end(self):
        cache = self.cache()
        cache.truncate(9)
        assert cache.epochs() == [(2, 6), (3, 8)]
        cache.truncate(8)
        assert cache.epochs() == [(2, 6)]
        cache.truncate(7)  # the entry starting below the end stays
        assert cache.epochs() == [(2, 6)]

    def test_on_a_disk_log_delete_records_and_retention(self, tmp_path):
        log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
        for epoch in [1] * 20 + [2] * 20 + [3] * 20:
            follow(log, epoch)  # 2 offsets a batch: epoch 2 at 40, 3 at 80
        log.flush()
        assert log.advance_log_start(45)  # DeleteRecords, inside epoch 2
        assert log.epochs() == [(2, 45), (3, 80)] and log.epoch_before_start == 2
        log.log_start_writer(45)()
        assert log.term_at(44) is None and log.term_at(45) == 2
        below = sum(1 for s in log.summaries()[:-1] if s.next_offset <= 45)
        removed = log.remove_head(below)
        assert removed and log.log_start_offset == 45  # inside a segment
        for segment in removed:
            segment.delete()
            segment.close()
        assert log.epochs() == brute_epochs(log) == [(2, 45), (3, 80)]
        log.close()
        log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
        assert log.epochs() == [(2, 45), (3, 80)] and log.epoch_before_start == 2
        assert log.segment_base_offsets == [40, 80]  # one segment an epoch
        log.flush()  # the recovery sync: nothing leaves before it
        (retained,) = log.remove_head(1)  # retention: the start moves to the next segment
        assert log.log_start_offset == 80 and log.epochs() == brute_epochs(log) == [(3, 80)]
        assert log.epoch_before_start == 2 and log.end_offset_for_epoch(2) == (2, 80)
        retained.close()
        log.close()


# A follower's appends --------------------------------------------------------------------------


@pytest.mark.parametrize("first", [9, 11])
def test_replicated_batches_must_start_at_the_log_end(make_log, first):
    log = make_log()
    follow(log, 1, 1, 1, 1, 1)  # 0..9
    with pytest.raises(NotContiguous, match=f"batch at offset {first} where the log "
                                            "continues at 10"):
        log.append_replicated(*leader_records(first, [1]), 0)
    assert (log.next_offset, batches(log)[-1]) == (10, (8, 9, 1))


def test_replicated_batches_must_follow_each_other(make_log):
    log = make_log()
    records, headers = leader_records(0, [1, 1, 1])
    patch_base_offset(records, headers[2].position, 5, 1)  # 0..1, 2..3, then 5..6
    with pytest.raises(NotContiguous, match="batch at offset 5 where the log continues at 4"):
        log.append_replicated(records, iter_batches(records), 0)
    assert log.next_offset == 0 and batches(log) == []


def test_replicated_epochs_never_go_down(make_log):
    log = make_log()
    follow(log, 2, 3)
    with pytest.raises(NotContiguous, match="epoch 2, after epoch 3"):
        follow(log, 2)
    with pytest.raises(NotContiguous, match="epoch 3, after epoch 4"):
        follow(log, 4, 3)
    assert log.next_offset == 4 and log.epochs() == [(2, 0), (3, 2)]


def test_replicated_bytes_are_written_as_they_came(make_log):
    log = make_log()
    records, headers = leader_records(0, [5, 6])
    result = log.append_replicated(bytearray(records), headers, 0)
    assert (result.base_offset, result.last_offset) == (0, 3)
    assert log.read_bytes(0, BIG, 2) == bytes(records[:headers[0].size])
    assert log.read_bytes(2, BIG, BIG) == bytes(records[headers[0].size:])


# Truncation ------------------------------------------------------------------------------------


def test_truncate_to_needs_a_batch_boundary_inside_the_log(make_log):
    log = make_log()
    follow(log, 1, 1, 2)  # 0..5
    with pytest.raises(NotBatchBoundary, match="inside the batch 2..3"):
        log.truncate_to(3)
    with pytest.raises(NotBatchBoundary, match="outside the log"):
        log.truncate_to(7)
    assert log.next_offset == 6 and not log.cut_pending
    cut(log, log.truncate_to(6))  # at the end: nothing goes, still a ticket to complete
    assert log.next_offset == 6


def test_no_append_or_second_cut_while_a_cut_ticket_is_out(make_log):
    log = make_log()
    follow(log, 1, 2)
    ticket = log.truncate_to(2)
    assert log.cut_pending
    with pytest.raises(AssertionError, match="append while"):
        follow(log, 3)
    with pytest.raises(AssertionError, match="append while"):
        lead(log, 3)
    with pytest.raises(AssertionError, match="a cut while"):
        log.truncate_to(0)
    cut(log, ticket)
    follow(log, 3)
    assert log.epochs() == [(1, 0), (3, 2)]


def test_truncate_to_caps_the_flushed_offset(make_log):
    log = make_log()
    follow(log, 1, 1, 1)
    log.flush()
    follow(log, 1, 1)
    ticket = log.flush_prepare()  # out while the cut happens
    cut(log, log.truncate_to(4))
    assert (log.flushed_offset, log.written_offset, log.next_offset) == (4, 4, 4)
    ticket.run()
    log.flush_complete(ticket)
    assert log.flushed_offset == 4


def diverged_log(directory: Path) -> tuple[DiskLog, list[int]]:
    """Epoch 1 in 0..79, epoch 2 from 80 to 159, several segments each, flushed."""
    log = DiskLog.open(directory, SMALL_SEGMENTS)
    for epoch in [1] * 40 + [2] * 40:
        follow(log, epoch)
    log.flush()
    return log, log.segment_base_offsets


@pytest.mark.parametrize("where", ["mid-segment", "segment start", "epoch start"])
def test_truncate_to_then_append_then_reopen(tmp_path, where):
    log, bases = diverged_log(tmp_path)
    assert bases == [0, 42, 80, 122]
    at = {"mid-segment": 126, "segment start": 122, "epoch start": 80}[where]
    kept = [b for b in batches(log) if b[0] < at]
    cut(log, log.truncate_to(at))
    assert batches(log) == kept and log.next_offset == at
    assert log.segment_base_offsets == [b for b in bases if b < at]
    assert log.epochs() == brute_epochs(log)
    for _ in range(5):
        follow(log, 3)  # the new leader's batches, in epoch 3
    expected = kept + [(at + 2 * i, at + 2 * i + 1, 3) for i in range(5)]
    assert batches(log) == expected and log.segment_base_offsets[-1] == at  # rolled for 3
    log.flush()
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert batches(log) == expected and log.epochs() == brute_epochs(log)
    assert log.epochs()[-1] == (3, at)
    assert log.end_offset_for_epoch(2) == ((2, at) if at > 80 else (1, 80))
    log.close()


def test_a_durable_truncation_survives_a_crash(tmp_path):
    log, bases = diverged_log(tmp_path)
    at = bases[-3] + 6
    kept = [b for b in batches(log) if b[0] < at]
    cut(log, log.truncate_to(at))
    abandon(log)  # crash: no close, nothing more written
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert batches(log) == kept and log.next_offset == at
    assert log.epochs() == brute_epochs(log)
    log.close()


@pytest.mark.parametrize("where", ["mid-segment", "segment start"])
def test_a_crash_before_the_cut_ticket_never_mixes_old_and_cut(tmp_path, where):
    """A crash before the ticket ran may lose the removal of any later segment file; the
    recovered log is the cut one, or (when the cut segment itself came back) a prefix of
    the old one: never old batches after a gap."""
    log, bases = diverged_log(tmp_path)
    before = batches(log)
    saved = {p.name: p.read_bytes() for p in tmp_path.glob("*.log")}
    at = bases[-3] + 4 if where == "mid-segment" else bases[-3]
    assert (at in bases) == (where == "segment start")
    kept = [b for b in before if b[0] < at]
    log.truncate_to(at)  # the ticket never runs
    abandon(log)
    gone = sorted(name for name in saved if not (tmp_path / name).exists())
    assert len(gone) >= 2

    def reopened_after_losing(names: list[str]) -> list[tuple[int, int, int]]:
        for name in names:  # the removal did not reach the disk
            (tmp_path / name).write_bytes(saved[name])
        log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
        found = batches(log)
        log.close()
        return found

    if where == "mid-segment":  # the cut file ends at `at`: what follows it never fits
        assert reopened_after_losing(gone) == kept
    else:
        assert reopened_after_losing(gone[1:]) == kept
        assert reopened_after_losing(gone) == before  # the old log, whole


# Reset -----------------------------------------------------------------------------------------


def test_reset_then_append_then_reopen(tmp_path):
    log, _ = diverged_log(tmp_path)
    cut(log, log.reset(1000, 7))
    assert (log.log_start_offset, log.next_offset, log.flushed_offset) == (1000, 1000, 1000)
    assert log.segment_base_offsets == [1000] and batches(log) == []
    assert (log.epochs(), log.last_epoch, log.epoch_before_start) == ([], 7, 7)
    assert log.end_offset_for_epoch(7) == (7, 1000) and log.term_at(999) is None
    assert [p.name for p in sorted(tmp_path.glob("*.log"))] == [f"{1000:020d}.log"]
    follow(log, 7, 8)
    log.flush()
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset) == (1000, 1004)
    assert batches(log) == [(1000, 1001, 7), (1002, 1003, 8)]
    assert log.epochs() == [(7, 1000), (8, 1002)] and log.epoch_before_start == 7
    log.close()


def test_reset_survives_a_crash_before_any_append(tmp_path):
    log, _ = diverged_log(tmp_path)
    cut(log, log.reset(50, 4))  # inside the old log: every old batch goes all the same
    abandon(log)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset, batches(log)) == (50, 50, [])
    assert (log.last_epoch, log.epoch_before_start) == (4, 4)
    follow(log, 5)
    assert log.epochs() == [(5, 50)]
    log.close()


def test_a_reset_cut_short_leaves_an_empty_log_at_its_start(tmp_path):
    """The old files gone, the log start file not yet written: the start is the new
    segment's, its epoch unknown."""
    log, _ = diverged_log(tmp_path)
    log.reset(1000, 7)  # the ticket never runs
    abandon(log)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset, batches(log)) == (1000, 1000, [])
    assert log.epoch_before_start is None and log.last_epoch is None
    log.close()


def test_reset_on_a_memory_log():
    log = MemoryLog()
    follow(log, 1, 2)
    cut(log, log.reset(10, 2))
    assert (log.log_start_offset, log.next_offset, log.segment_base_offsets) == (10, 10, [10])
    follow(log, 3)
    assert batches(log) == [(10, 11, 3)] and log.epochs() == [(3, 10)]


# A log start inside a batch ----------------------------------------------------------------------


def tens(base_offset: int, batches: int, epoch: int = 3) -> tuple[bytearray, list]:
    """A leader's batches of 10 records each from `base_offset`, in `epoch`."""
    return leader_records(base_offset, [epoch] * batches, records_per_batch=10)


def started_inside_a_batch(log: Log) -> None:
    """Reset at 25 (a leader's start after DeleteRecords inside its batch 20..29), then the
    leader's batches from the one holding it: 20..29, 30..39."""
    cut(log, log.reset(25, 3))
    result = log.append_replicated(*tens(20, 2), 0)
    assert (result.base_offset, result.last_offset) == (20, 39)


def test_a_log_that_holds_no_batch_takes_a_first_one_holding_its_start(make_log):
    log = make_log()
    started_inside_a_batch(log)
    assert (log.log_start_offset, log.next_offset, log.segment_base_offsets) == (25, 40, [20])
    assert batches(log) == [(20, 29, 3), (30, 39, 3)]
    assert log.epochs() == [(3, 25)] and log.epoch_before_start == 3
    assert (log.term_at(24), log.term_at(25)) == (None, 3)
    with pytest.raises(OffsetOutOfRange):
        log.read_bytes(24, BIG, BIG)
    assert log.read_bytes(25, BIG, 30) == bytes(tens(20, 1)[0])
    follow(log, 4)
    assert log.epochs() == [(3, 25), (4, 40)]


def test_only_an_empty_log_takes_a_batch_from_below_its_end(make_log):
    log = make_log()
    cut(log, log.reset(25, 3))
    below = leader_records(20, [3], records_per_batch=5)  # 20..24: it does not hold 25
    with pytest.raises(NotContiguous, match="batch at offset 20 where the log continues at 25"):
        log.append_replicated(*below, 0)
    follow(log, 3)  # 25..26: the log holds a batch now
    with pytest.raises(NotContiguous, match="batch at offset 20 where the log continues at 27"):
        log.append_replicated(*tens(20, 1), 0)
    assert (log.log_start_offset, log.next_offset, batches(log)) == (25, 27, [(25, 26, 3)])


def test_a_log_started_inside_a_batch_reopens_as_it_was(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    started_inside_a_batch(log)
    log.flush()
    assert log.flushed_offset == 40
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset, log.segment_base_offsets) == (25, 40, [20])
    assert log.epochs() == [(3, 25)] and log.epoch_before_start == 3
    assert [p.name for p in sorted(tmp_path.glob("*.log"))] == [f"{20:020d}.log"]
    log.close()


def test_a_crash_before_the_first_flush_keeps_the_start_or_falls_below_it(tmp_path):
    """Killed before a flush, the page cache keeps the batch: the log is as it was. Had the
    batch itself been lost (power), the log reopens empty at its base, below the start (the
    start file still says 25): nothing there was acknowledged, and the next install moves
    the start up again."""
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    started_inside_a_batch(log)
    assert log.flushed_offset == 20  # nothing of the new segment is durable yet
    abandon(log)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset, log.segment_base_offsets) == (25, 40, [20])
    assert log.epochs() == [(3, 25)] and log.epoch_before_start == 3
    log.close()
    os.truncate(tmp_path / f"{20:020d}.log", 0)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.log_start_offset, log.next_offset, batches(log)) == (20, 20, [])
    log.close()


def test_a_failed_write_or_flush_of_it_leaves_the_log_empty_at_its_start(tmp_path,
                                                                          monkeypatch):
    from storage import probes
    from storage import segment as segment_module

    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    cut(log, log.reset(25, 3))

    def full(fd, data, position):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_module.os, "pwrite", full)
    with pytest.raises(AppendFailed):
        log.append_replicated(*tens(20, 2), 0)
    monkeypatch.undo()
    empty_at_25 = (25, 25, 25, 25, [25])
    assert (log.log_start_offset, log.flushed_offset, log.written_offset, log.next_offset,
            log.segment_base_offsets) == empty_at_25
    assert log.epochs() == [] and log.last_epoch == 3

    log.append_replicated(*tens(20, 2), 0)
    ticket = log.flush_prepare()
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", True)
    with pytest.raises(OSError):
        ticket.run()
    monkeypatch.undo()
    log.flush_failed(ticket)  # cut back to what was durable: nothing of the batch
    assert (log.log_start_offset, log.flushed_offset, log.written_offset, log.next_offset,
            log.segment_base_offsets) == empty_at_25
    assert log.epochs() == [] and log.last_epoch == 3
    log.append_replicated(*tens(20, 2), 0)
    log.flush()
    assert (log.log_start_offset, log.flushed_offset, log.segment_base_offsets) == (25, 40, [20])
    log.close()


# Reopen ----------------------------------------------------------------------------------------


def test_reopen_reads_the_epochs_of_segments_holding_several(tmp_path):
    """Segments written before epochs rolled them: recovery reads their headers."""
    records, headers = leader_records(0, [1, 1, 2, 2, 3])  # 0..9
    (tmp_path / f"{0:020d}.log").write_bytes(records)
    records, headers = leader_records(10, [3, 3, 5])  # 10..15
    (tmp_path / f"{10:020d}.log").write_bytes(records)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert log.segment_base_offsets == [0, 10] and log.next_offset == 16
    assert log.epochs() == brute_epochs(log) == [(1, 0), (2, 4), (3, 8), (5, 14)]
    follow(log, 5)
    assert log.segment_base_offsets == [0, 10]  # the active segment's last batch is 5
    log.close()


def keyed(key: bytes, value: bytes) -> bytes:
    return bytes(build_batch([(key, value, ())], timestamps=[1000]))


def test_a_clean_keeps_the_first_batch_of_each_epoch(tmp_path):
    """A clean merges segments of several epochs; the batch each epoch starts with stays
    (emptied if need be), so the cache read back from the headers is the same."""
    log = DiskLog.open(tmp_path, LogConfig(index_interval_bytes=150))
    for epoch, key, value in [(1, b"a", b"1"), (1, b"b", b"1"), (2, b"a", b"2"),
                              (2, b"c", b"2"), (3, b"a", b"3"), (4, b"d", b"4")]:
        records, headers = make_records(keyed(key, value))
        log.append(records, headers, epoch, 0)
    log.flush()
    assert log.segment_base_offsets == [0, 2, 4, 5]
    before = log.epochs()
    config = CleanerConfig(index_interval_bytes=150, io_bytes_per_second=BIG)
    result = clean_log(tmp_path, log._segments[:-1], 0, 0, config, set())
    log.replace_segments(result.old_segments, result.new_segments)
    assert result.records_removed == 2 and log.segment_base_offsets == [0, 5]
    log.close()
    log = DiskLog.open(tmp_path, LogConfig(index_interval_bytes=150))
    assert log.epochs() == brute_epochs(log) == before == [(1, 0), (2, 2), (3, 4), (4, 5)]
    log.close()


# Property: the cache is what the headers say, whatever happens -----------------------------


class Model:
    """Drives one log through random operations, epochs only growing, as Raft's do."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind, self.directory = kind, directory
        self.log: DiskLog | MemoryLog = (
            DiskLog.open(directory, SMALL_SEGMENTS) if kind == "disk" else MemoryLog(
                SMALL_SEGMENTS))
        self.epoch = 0  # the highest epoch given out

    def step(self, op: str, rng: random.Random) -> None:
        log = self.log
        if op == "lead":
            self.epoch += rng.random() < 0.3
            lead(log, self.epoch, batches=rng.randint(1, 3))
        elif op == "follow":
            epochs = []
            for _ in range(rng.randint(1, 4)):
                self.epoch += rng.random() < 0.3
                epochs.append(self.epoch)
            follow(log, *epochs)
        elif op == "truncate":
            boundaries = [h.base_offset for h in log.iter_batch_headers(log.log_start_offset)
                          if h.base_offset >= log.log_start_offset] + [log.next_offset]
            cut(log, log.truncate_to(rng.choice(boundaries[-6:])))
        elif op == "reset":
            self.epoch += 1
            cut(log, log.reset(log.next_offset + rng.randint(0, 20), self.epoch))
        elif isinstance(log, DiskLog):
            self.disk_step(op, log, rng)

    def disk_step(self, op: str, log: DiskLog, rng: random.Random) -> None:
        if op == "start":
            offset = rng.randint(log.log_start_offset, log.next_offset)
            if log.advance_log_start(offset):
                log.log_start_writer(offset)()
        elif op == "retain":
            log.flush()
            for segment in log.remove_head(log.removable_head(rng.randint(1, 3))):
                segment.delete()
                segment.close()
        elif op == "reopen":
            log.flush()
            log.close()
            self.log = DiskLog.open(self.directory, SMALL_SEGMENTS)

    def check(self) -> None:
        log = self.log
        runs = brute_epochs(log)
        assert log.epochs() == runs
        if runs:
            assert log.last_epoch == runs[-1][0]
        headers = list(log.iter_batch_headers(log.log_start_offset))
        for h in headers[-3:]:
            assert log.term_at(h.last_offset) == h.partition_leader_epoch
        assert log.term_at(log.log_start_offset - 1) is None
        assert log.term_at(log.next_offset) is None
        if not runs and log.epoch_before_start is not None:
            runs = [(log.epoch_before_start, log.next_offset)]
        for epoch in range(-1, self.epoch + 2):
            assert log.end_offset_for_epoch(epoch) == kafka_end_offset(
                runs, epoch, log.next_offset), (epoch, runs)


def kafka_end_offset(runs: list[tuple[int, int]], epoch: int, end: int) -> tuple[int, int]:
    """endOffsetFor over a TreeMap of the entries, as Kafka computes it."""
    if epoch < 0 or not runs:
        return UNDEFINED
    if epoch == runs[-1][0]:
        return epoch, end
    higher = [start for e, start in runs if e > epoch]
    if not higher:
        return UNDEFINED
    lower = [e for e, _ in runs if e <= epoch]
    return (max(lower) if lower else epoch), min(higher)


OPERATIONS = ["lead", "follow", "follow", "truncate", "reset", "start", "retain", "reopen"]


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(["disk", "memory"]),
       ops=st.lists(st.sampled_from(OPERATIONS), min_size=5, max_size=40),
       seed=st.integers(0, 2**32 - 1))
def test_the_cache_is_what_the_headers_say(kind, ops, seed):
    rng = random.Random(seed)
    directory = Path(tempfile.mkdtemp())
    model = Model(kind, directory)
    try:
        for op in ops:
            model.step(op, rng)
            model.check()
    finally:
        model.log.close()
        shutil.rmtree(directory)
