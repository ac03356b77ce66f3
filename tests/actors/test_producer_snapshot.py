"""Producer-state snapshots (actors/producer_snapshot.py) and the rebuild that starts from one
(actors/producer_rebuild.py), on real DiskLogs: the codec round trip and its refusals, state
from a snapshot plus the tail equal to state from the whole log over random logs (cut and grown
again past stale snapshots), a cut below the newest snapshot taking an older one, a snapshot
that does not decode passed over, and the snapshot files' housekeeping."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import limits
from actors.producer_rebuild import ProducerState, Rebuilt, marker_kind, rebuild, replay
from actors.producer_snapshot import (
    Boundary,
    Snapshot,
    SnapshotError,
    SnapshotFiles,
    decode,
    encode,
    list_snapshots,
    snapshot_name,
    write_snapshot,
)
from actors.producer_state import ProducerEntry, RememberedBatch
from actors.txn_state import AbortedTxn, EndedTxn, TxnEntries, marker_batch
from storage import DiskLog, LogConfig
from tests.support.io_pool import pool_call
from wire.record_batch import iter_batches, read_header
from wire.records import build_batch

pytestmark = pytest.mark.timeout(60)

SMALL_SEGMENTS = LogConfig(segment_bytes=1500, index_interval_bytes=200)


# Codec -----------------------------------------------------------------------------------------

_int32 = st.integers(0, 2**31 - 1)
_int64 = st.integers(0, 2**62)
_producers = st.lists(st.builds(
    ProducerEntry, _int64, st.integers(0, 32767), st.none() | _int32,
    st.lists(st.builds(RememberedBatch, _int32, _int32, _int64, _int64),
             max_size=limits.producer_batches_remembered).map(tuple),
    st.integers(-1, 2**31 - 1)), max_size=8).map(tuple)
_txns = st.builds(
    TxnEntries,
    st.lists(st.tuples(_int64, _int64), max_size=5).map(tuple),
    st.lists(st.builds(EndedTxn, _int64, _int64, _int64, st.booleans()), max_size=5).map(tuple),
    st.lists(st.builds(AbortedTxn, _int64, _int64, _int64), max_size=5).map(tuple))
_snapshots = st.builds(
    lambda offset, base, epoch, crc, producers, txns: Snapshot(
        offset + base + 1, Boundary(base, epoch, crc), producers, txns),
    st.integers(0, 2**40), st.integers(0, 2**40), _int32, st.integers(0, 2**32 - 1),
    _producers, _txns)


@settings(max_examples=200, deadline=None)
@given(_snapshots)
def test_a_snapshot_decodes_to_what_was_encoded(snapshot: Snapshot) -> None:
    assert decode(encode(snapshot)) == snapshot


@settings(max_examples=200, deadline=None)
@given(_snapshots, st.data())
def test_a_damaged_or_torn_snapshot_is_refused(snapshot: Snapshot, data: st.DataObject) -> None:
    encoded = bytearray(encode(snapshot))
    torn = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(SnapshotError):
        decode(encoded[:torn])
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(SnapshotError):
        decode(encoded)


def test_counts_past_their_bound_are_refused_before_anything_is_read() -> None:
    many = tuple(ProducerEntry(i, 0, None, ()) for i in range(
        limits.producer_ids_per_partition_max + 1))
    snapshot = Snapshot(10, Boundary(9, 0, 0), many, TxnEntries((), (), ()))
    with pytest.raises(SnapshotError, match="producers"):
        decode(encode(snapshot))


# Random logs -----------------------------------------------------------------------------------


class LogWriter:
    """A DiskLog written batch by batch as a partition writes it: live producer state noted
    along, a snapshot at each roll (written at once), the live transactions committed now and
    then as a high watermark would."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        self.log = DiskLog.open(directory, SMALL_SEGMENTS)
        self.log.flush()
        self.rng = rng
        self.live = ProducerState()
        self.epoch = 0
        self.sequences: dict[int, int] = {}
        self.producer_epochs: dict[int, int] = {}
        self.snapshots: list[int] = []
        self.now_ms = 1_000

    def close(self) -> None:
        self.log.close()

    def append(self, batch: bytearray) -> None:
        headers = iter_batches(batch)
        rolled_from = self.log.active_base_offset
        self.now_ms += 1
        result = self.log.append(batch, headers, self.epoch, self.now_ms)
        header = headers[0]
        self.live.note(header, result.base_offset,
                       marker_kind(header, lambda h: batch[h.position:h.position + h.size]))
        if self.log.active_base_offset != rolled_from:
            end = self.log.next_offset
            boundary = Boundary(result.base_offset, self.epoch, read_header(batch, 0).crc)
            dir_fd = self.log.directory_fd()
            try:
                write_snapshot(dir_fd, self.live.snapshot(end, boundary))
            finally:
                os.close(dir_fd)
            self.snapshots.append(end)
        if self.rng.random() < 0.2:
            self.live.txns.committed(self.rng.randint(0, self.log.next_offset))

    def random_batch(self) -> bytearray:
        rng = self.rng
        pid = rng.choice([-1, 1, 2, 3, 4, 5, 6])
        value = rng.randbytes(rng.randint(1, 60))
        records: list[Any] = [(None, value, [])] * rng.randint(1, 4)
        if pid < 0:
            return build_batch(records, base_timestamp=self.now_ms)
        epoch = self.producer_epochs.setdefault(pid, 0)
        kind = rng.random()
        if kind < 0.15 and pid % 2 == 0:  # a transaction marker, now and then a bumped epoch
            if rng.random() < 0.3:
                epoch = self.producer_epochs[pid] = epoch + 1
                self.sequences[pid] = 0
            return marker_batch(pid, epoch, rng.random() < 0.5, 1, self.now_ms)
        if kind < 0.2:  # the group coordinator's transactional offsets: no sequence
            return build_batch(records, producer_id=pid, producer_epoch=epoch,
                               transactional=True, base_timestamp=self.now_ms)
        sequence = self.sequences.get(pid, 0)
        self.sequences[pid] = sequence + len(records)
        return build_batch(records, producer_id=pid, producer_epoch=epoch,
                           base_sequence=sequence, transactional=pid % 2 == 0,
                           base_timestamp=self.now_ms)

    def cut(self, end: int) -> None:
        """A Raft cut at a batch boundary; the snapshots stay (a rebuild must see past them)."""
        ticket = self.log.truncate_to(end)
        ticket.run()
        self.log.cut_complete(ticket)


def whole_log_state(log: DiskLog) -> ProducerState:
    state = ProducerState()
    replay(state, log.header_scan(log.next_offset), log.log_start_offset)
    return state


def rebuilt(log: DiskLog) -> Rebuilt:
    return rebuild(log.directory_fd(), log.header_scan(log.next_offset), "t-0")


def same_state(a: ProducerState, b: ProducerState, end: int) -> bool:
    """Equal tables once every marker below `end` is final (what a rebuilt partition's first
    publish makes of both)."""
    a.txns.committed(end)
    b.txns.committed(end)
    return a.producers.entries() == b.producers.entries() and a.txns.entries() == b.txns.entries()


def boundaries(log: DiskLog) -> list[int]:
    return [h.base_offset for h in log.iter_batch_headers(log.log_start_offset)]


@pytest.mark.parametrize("seed", range(30))
def test_state_from_a_snapshot_and_the_tail_is_the_state_of_the_whole_log(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    writer = LogWriter(tmp_path / "t-0", rng)
    used = 0
    try:
        for _round in range(rng.randint(1, 4)):
            for _ in range(rng.randint(20, 120)):
                writer.append(writer.random_batch())
            log = writer.log
            from_snapshot = rebuilt(log)
            used += from_snapshot.snapshot_offset is not None
            assert same_state(from_snapshot.state, whole_log_state(log), log.next_offset)
            # A cut, as Raft makes one (maybe below snapshots), then the log grows again in
            # a new term or, as a lone partition's log after a failed flush, the same one.
            cut = rng.choice(boundaries(log)[-30:])
            writer.cut(cut)
            writer.live = whole_log_state(log)  # what the partition's rebuild gives it
            if rng.random() < 0.7:
                writer.epoch += 1
            after_cut = rebuilt(log)
            assert after_cut.snapshot_offset is None or after_cut.snapshot_offset <= cut
            assert same_state(after_cut.state, whole_log_state(log), log.next_offset)
        assert used or not writer.snapshots
    finally:
        writer.close()


def test_a_cut_below_the_newest_snapshot_rebuilds_from_an_older_one(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path / "t-0", random.Random(7))
    try:
        while len(writer.snapshots) < 4:
            writer.append(writer.random_batch())
        log = writer.log
        newest, older = writer.snapshots[-1], writer.snapshots[-2]
        assert rebuilt(log).snapshot_offset == newest
        cut = next(b for b in reversed(boundaries(log)) if older < b < newest)
        writer.cut(cut)
        result = rebuilt(log)
        assert result.snapshot_offset == older
        assert result.replayed == sum(1 for b in boundaries(log) if b >= older)
        assert same_state(result.state, whole_log_state(log), log.next_offset)
    finally:
        writer.close()


def test_a_snapshot_that_does_not_decode_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = LogWriter(tmp_path / "t-0", random.Random(11))
    try:
        while len(writer.snapshots) < 3:
            writer.append(writer.random_batch())
        log = writer.log
        newest, older = writer.snapshots[-1], writer.snapshots[-2]
        path = tmp_path / "t-0" / snapshot_name(newest)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(data)
        result = rebuilt(log)
        assert result.snapshot_offset == older
        assert f"producer snapshot at {newest} ignored" in caplog.text
        assert same_state(result.state, whole_log_state(log), log.next_offset)
        for offset in writer.snapshots:  # none left that decodes: from the log start
            (tmp_path / "t-0" / snapshot_name(offset)).write_bytes(b"KPSS")
        result = rebuilt(log)
        assert result.snapshot_offset is None
        assert same_state(result.state, whole_log_state(log), log.next_offset)
    finally:
        writer.close()


# Housekeeping ----------------------------------------------------------------------------------


class Pool:
    """Services.run_blocking as a list of held calls, released by hand."""

    def __init__(self) -> None:
        self.held: list[Callable[[], None]] = []

    def __call__(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self.held.append(pool_call(fn, done))

    def drain(self) -> None:
        while self.held:
            self.held.pop(0)()


def snapshot_at(offset: int) -> Snapshot:
    return Snapshot(offset, Boundary(offset - 1, 0, 0), (), TxnEntries((), (), ()))


def offsets_in(directory: Path) -> list[int]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        return list_snapshots(fd)
    finally:
        os.close(fd)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[SnapshotFiles, Pool]]:
    pool = Pool()
    yield SnapshotFiles(pool, lambda: os.open(tmp_path, os.O_RDONLY), "t-0"), pool


def test_a_cut_removes_the_snapshots_above_it_even_one_being_written(
    tmp_path: Path, files: tuple[SnapshotFiles, Pool]
) -> None:
    snapshots, pool = files
    for offset in (10, 20, 30):
        snapshots.write(snapshot_at(offset))
        pool.drain()
    snapshots.write(snapshot_at(40))  # out on the pool when the cut comes
    snapshots.truncated(25)
    snapshots.write(snapshot_at(50))  # dropped: above the cut...
    snapshots.truncated(25)
    snapshots.write(snapshot_at(24))  # ...this one is taken after it
    assert len(pool.held) == 1
    pool.drain()
    assert offsets_in(tmp_path) == [10, 20, 24]


def test_snapshots_at_or_below_the_log_start_go_and_only_the_newest_stay(
    tmp_path: Path, files: tuple[SnapshotFiles, Pool]
) -> None:
    snapshots, pool = files
    count = limits.producer_snapshots_max + 3
    for i in range(1, count + 1):
        snapshots.write(snapshot_at(i * 10))
        pool.drain()
    assert offsets_in(tmp_path) == [i * 10 for i in range(4, count + 1)]
    snapshots.log_start_moved(70)
    pool.drain()
    assert offsets_in(tmp_path) == [i * 10 for i in range(8, count + 1)]
