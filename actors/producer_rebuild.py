"""A partition's producer state rebuilt from its log, off the loop: a snapshot, then the tail.

What a partition knows of its idempotent producers and transactions (`ProducerState`: the
tables of actors/producer_state.py and actors/txn_state.py) is derived from its log, batch
header by batch header, in log order. On start, and after a cut or a reset changed what the
log holds (actors/partition.py `log_rewritten`), it is rebuilt:

    snapshots at 4711, 9000, 15020; log 0..17000, cut to 12000
    -> tables from 9000.snapshot (the last at or below the log's end, above its start, that
       decodes and whose last batch the log still holds), then headers 9000..11999 noted

and with no usable snapshot, from empty tables at the log start. Only a transaction marker's
own bytes are read (its header does not say COMMIT or ABORT). `rebuild` is the blocking job,
for the shard's read pool: it reads a `HeaderScan` (storage/header_scan.py) while the loop goes
on. Batches appended meanwhile are the partition's to note again: a `RebuildRun` keeps them
(up to `producer_rebuild_notes_max`; past it, `replay` reads them back from the log in one
more pass) and the partition plays them on the rebuilt tables before it takes them.

Rebuilt from a snapshot or from the log start, the tables are the same (tests/actors/
test_producer_snapshot.py), with two exceptions that only keep more: a producer or an
aborted transaction the log start has since passed stays in a snapshot, as it stays in the
tables of a partition that keeps running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

from actors import limits
from actors.producer_snapshot import (
    Boundary,
    Snapshot,
    SnapshotError,
    list_snapshots,
    read_snapshot,
)
from actors.producer_state import ProducerStateTable
from actors.txn_state import ABORT, Marker, TxnState, read_marker
from storage.header_scan import HeaderScan
from wire.record_batch import BatchHeader

__all__ = ["ProducerState", "RebuildRun", "Rebuilt", "marker_kind", "rebuild", "replay"]

log = logging.getLogger(__name__)

# A batch to note: its header, the base offset it was appended at, what it says if it is a
# transaction marker (else None).
Note = tuple[BatchHeader, int, Marker | None]


def marker_kind(header: BatchHeader,
                batch: Callable[[BatchHeader], bytes | bytearray | memoryview]
                ) -> Marker | None:
    """What a producer's transaction marker says (ABORT or COMMIT, the coordinator's epoch;
    `batch(header)` gives its bytes, asked only then); None for any other batch."""
    if header.producer_id < 0 or not header.is_control:
        return None
    return read_marker(batch(header))


class ProducerState:
    """A partition's producer table and transaction state, fed batch by batch."""

    __slots__ = ("producers", "txns")

    def __init__(self, producers: ProducerStateTable | None = None,
                 txns: TxnState | None = None) -> None:
        self.producers = producers if producers is not None else ProducerStateTable()
        self.txns = txns if txns is not None else TxnState()

    @classmethod
    def of(cls, snapshot: Snapshot) -> ProducerState:
        return cls(ProducerStateTable.restored(list(snapshot.producers)),
                   TxnState.restored(snapshot.txns))

    def snapshot(self, offset: int, boundary: Boundary) -> Snapshot:
        """The tables as of `offset`, whose last batch below is `boundary` (on the loop: a
        copy of the tables, encoded on the I/O pool)."""
        return Snapshot(offset, boundary, tuple(self.producers.entries()), self.txns.entries())

    def note(self, header: BatchHeader, base_offset: int, kind: Marker | None) -> None:
        """A batch appended at `base_offset` (the leader's own, a follower's, or one read back
        from the log); `kind`: what it says as a transaction marker (`marker_kind`)."""
        producer_id = header.producer_id
        if producer_id < 0:
            return
        if header.is_control:
            if kind is not None:
                self.producers.marker(producer_id, header.producer_epoch,
                                      kind.coordinator_epoch)
                self.txns.marker(producer_id, base_offset + header.last_offset_delta,
                                 kind.kind == ABORT)
            return
        if header.base_sequence < 0:  # the group coordinator's transactional offsets
            self.producers.no_sequence(producer_id, header.producer_epoch)
        else:
            self.producers.record(producer_id, header.producer_epoch, header.base_sequence,
                                  base_offset, base_offset + header.last_offset_delta)
        if header.is_transactional:
            self.txns.data_batch(producer_id, base_offset)


class Rebuilt(NamedTuple):
    state: ProducerState
    snapshot_offset: int | None  # the snapshot it started from; None: the log start
    replayed: int  # batch headers read after it


def rebuild(dir_fd: int, scan: HeaderScan, name: str) -> Rebuilt:
    """The producer state of the log `scan` reads, from its last usable snapshot in the
    directory open as `dir_fd` (closed here). Blocking: for an I/O thread."""
    try:
        for offset in reversed(list_snapshots(dir_fd)):
            if not scan.log_start_offset < offset <= scan.end_offset:
                continue
            try:
                snapshot = read_snapshot(dir_fd, offset)
            except (SnapshotError, OSError) as e:
                log.warning("%s: producer snapshot at %d ignored: %s", name, offset, e)
                continue
            rebuilt = _from_snapshot(snapshot, scan)
            if rebuilt is not None:
                return rebuilt
            log.info("%s: producer snapshot at %d ignored: the log no longer holds its last "
                     "batch %s", name, offset, snapshot.boundary)
    finally:
        os.close(dir_fd)
    state = ProducerState()
    return Rebuilt(state, None, replay(state, scan, scan.log_start_offset))


def _from_snapshot(snapshot: Snapshot, scan: HeaderScan) -> Rebuilt | None:
    """The snapshot's state played forward to the scan's end; None where the log's batch
    ending at the snapshot's offset is not the one it names."""
    headers = scan.headers(snapshot.offset - 1)
    last = next(headers, None)
    if last is None or last.next_offset != snapshot.offset:
        return None
    if Boundary(last.base_offset, last.partition_leader_epoch, last.crc) != snapshot.boundary:
        return None
    state = ProducerState.of(snapshot)
    return Rebuilt(state, snapshot.offset, _note_all(state, scan, headers))


def replay(state: ProducerState, scan: HeaderScan, from_offset: int) -> int:
    """Note the batches from `from_offset` to the scan's end into `state`; how many.
    Blocking: for an I/O thread."""
    return _note_all(state, scan, scan.headers(from_offset))


def _note_all(state: ProducerState, scan: HeaderScan, headers: Iterator[BatchHeader]) -> int:
    count = 0
    for header in headers:
        state.note(header, header.base_offset, marker_kind(header, scan.read))
        count += 1
    return count


class RebuildRun:
    """A rebuild under way (on the loop): the log's end it reads to, and what the partition
    appended since, to note once it is back."""

    def __init__(self, end_offset: int) -> None:
        self.end_offset = end_offset
        self.notes: list[Note] = []
        self.overflowed = False  # more came than it keeps: read them back from the log

    def __repr__(self) -> str:
        return f"RebuildRun(to {self.end_offset}, {len(self.notes)} noted)"

    def note(self, header: BatchHeader, base_offset: int, kind: Marker | None) -> None:
        if self.overflowed:
            return
        if len(self.notes) >= limits.producer_rebuild_notes_max:
            self.overflowed = True
            self.notes.clear()
            return
        self.notes.append((header, base_offset, kind))
