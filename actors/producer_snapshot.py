"""Producer-state snapshots: a partition's producer and transaction tables as of an offset.

A partition's idempotent-producer table (actors/producer_state.py) and transaction state
(actors/txn_state.py) are derived from its log. Rebuilding them from the log start after a
cut or on start reads every batch header there is; so, as Kafka does, the partition saves the
tables at each segment roll in a `<offset>.snapshot` file beside the segments, and a rebuild
starts from the last snapshot at or below the log's end, replaying only the headers after it
(actors/producer_rebuild.py).

A snapshot at offset X holds the tables as they were once every batch below X was noted, and
names the last of those batches (its base offset, leader epoch and CRC): a snapshot is used
only where the log still holds that very batch ending at X - 1, so one that outlived what it
describes (a cut it raced, a power loss that took the log's tail, a clean that removed the
batch) is passed over, never trusted.

    00000000000000004711.snapshot   (all big-endian)
    magic "KPSS", version int16, CRC-32C uint32 of everything after it
    offset int64, last batch: base offset int64, epoch int32, CRC uint32
    producers uint32, each: id int64, epoch int32, next sequence int32 (-1: none), its last
      marker's coordinator epoch int32 (-1: none), batches uint8, each: first and last
      sequence int32, first and last offset int64
    open transactions uint32, each: producer id int64, first offset int64
    ended transactions uint32, each: producer id, first offset, marker offset int64, aborted
    aborted transactions uint32, each: producer id, first offset, last offset int64

A file that does not decode (a torn write, a bad CRC, a count past its bound) is skipped with
a log line, and the rebuild takes the next older one or the log start. Files are written to a
temp name and renamed, without an fsync: a lost or torn snapshot only makes a rebuild longer.

`SnapshotFiles` is the partition's side: it hands the writes and removals to the I/O pool one
job at a time, in the order asked, so a removal never passes a write it should remove. What
goes: snapshots above a cut, those at or below the log start (never used: a rebuild starts at
the log start there), and all but the newest `producer_snapshots_max`.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import crc32c

from actors import limits
from actors.producer_state import ProducerEntry, RememberedBatch
from actors.txn_state import AbortedTxn, EndedTxn, TxnEntries
from storage import limits as storage_limits

__all__ = [
    "Boundary",
    "Snapshot",
    "SnapshotError",
    "SnapshotFiles",
    "decode",
    "encode",
    "list_snapshots",
    "read_snapshot",
    "snapshot_name",
    "write_snapshot",
]

log = logging.getLogger(__name__)

_MAGIC = b"KPSS"
_VERSION = 1
_PREFIX = struct.Struct(">4shI")
_HEAD = struct.Struct(">qqiI")
_COUNT = struct.Struct(">I")
_PRODUCER = struct.Struct(">qiiiB")
_BATCH = struct.Struct(">iiqq")
_OPEN = struct.Struct(">qq")
_ENDED = struct.Struct(">qqq?")
_ABORTED = struct.Struct(">qqq")
_SUFFIX = ".snapshot"
_NAME = re.compile(rf"^(\d{{{storage_limits.segment_name_digits}}}){re.escape(_SUFFIX)}$")


class SnapshotError(ValueError):
    """A snapshot file that does not decode."""


class Boundary(NamedTuple):
    """The last batch below a snapshot's offset, as the log held it."""

    base_offset: int
    epoch: int
    crc: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    offset: int  # the tables once every batch below it was noted
    boundary: Boundary
    producers: tuple[ProducerEntry, ...]
    txns: TxnEntries


# Codec ---------------------------------------------------------------------------------------


def encode(snapshot: Snapshot) -> bytes:
    b = snapshot.boundary
    parts = [_HEAD.pack(snapshot.offset, b.base_offset, b.epoch, b.crc),
             _COUNT.pack(len(snapshot.producers))]
    for p in snapshot.producers:
        next_sequence = -1 if p.next_sequence is None else p.next_sequence
        parts.append(_PRODUCER.pack(p.producer_id, p.epoch, next_sequence,
                                    p.coordinator_epoch, len(p.batches)))
        parts.extend(_BATCH.pack(*batch) for batch in p.batches)
    txns = snapshot.txns
    for entries, entry in ((txns.open, _OPEN), (txns.ended, _ENDED), (txns.aborted, _ABORTED)):
        parts.append(_COUNT.pack(len(entries)))
        parts.extend(entry.pack(*e) for e in entries)
    body = b"".join(parts)
    return _PREFIX.pack(_MAGIC, _VERSION, crc32c.crc32c(body)) + body


class _Reader:
    """Takes fixed-size entries from the front of a body; every count is checked first."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._position = 0

    @property
    def left(self) -> int:
        return len(self._data) - self._position

    def take(self, entry: struct.Struct) -> tuple[Any, ...]:
        if self.left < entry.size:
            raise SnapshotError(f"{self.left} bytes left where {entry.size} were expected")
        values = entry.unpack_from(self._data, self._position)
        self._position += entry.size
        return values

    def count(self, entry: struct.Struct, most: int, what: str) -> int:
        (count,) = self.take(_COUNT)
        if count > most or count * entry.size > self.left:
            raise SnapshotError(f"{count} {what} ({self.left} bytes left, at most {most})")
        return int(count)


def decode(data: bytes | bytearray | memoryview) -> Snapshot:
    """The snapshot in `data`, or SnapshotError."""
    if not _PREFIX.size <= len(data) <= limits.producer_snapshot_bytes_max:
        raise SnapshotError(f"{len(data)} bytes")
    magic, version, crc = _PREFIX.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise SnapshotError(f"magic {magic!r}, version {version}")
    body = memoryview(data)[_PREFIX.size:]
    if crc32c.crc32c(body) != crc:
        raise SnapshotError("CRC-32C mismatch")
    r = _Reader(body)
    offset, base, epoch, batch_crc = r.take(_HEAD)
    if not 0 <= base < offset:
        raise SnapshotError(f"last batch at {base} for a snapshot at {offset}")
    producers = []
    for _ in range(r.count(_PRODUCER, limits.producer_ids_per_partition_max, "producers")):
        producer_id, producer_epoch, next_sequence, coordinator_epoch, batches = r.take(
            _PRODUCER)
        if batches > limits.producer_batches_remembered:
            raise SnapshotError(f"producer {producer_id}: {batches} batches")
        remembered = tuple(RememberedBatch(*r.take(_BATCH)) for _ in range(batches))
        producers.append(ProducerEntry(producer_id, producer_epoch,
                                       None if next_sequence < 0 else next_sequence, remembered,
                                       coordinator_epoch))
    open_ = tuple(r.take(_OPEN) for _ in range(
        r.count(_OPEN, limits.transactions_open_per_partition_max, "open transactions")))
    ended = tuple(EndedTxn(*r.take(_ENDED)) for _ in range(
        r.count(_ENDED, limits.aborted_transactions_per_partition_max, "ended transactions")))
    aborted = tuple(AbortedTxn(*r.take(_ABORTED)) for _ in range(
        r.count(_ABORTED, limits.aborted_transactions_per_partition_max, "aborted")))
    if r.left:
        raise SnapshotError(f"{r.left} bytes after the last entry")
    return Snapshot(offset, Boundary(base, epoch, batch_crc), tuple(producers),
                    TxnEntries(open_, ended, aborted))  # type: ignore[arg-type]


# Files (blocking: on the I/O pool) ---------------------------------------------------------


def snapshot_name(offset: int) -> str:
    return f"{offset:0{storage_limits.segment_name_digits}d}{_SUFFIX}"


def list_snapshots(dir_fd: int) -> list[int]:
    """The offsets of the snapshot files in the directory, in order."""
    return sorted(int(m.group(1)) for name in os.listdir(dir_fd) if (m := _NAME.match(name)))


def write_snapshot(dir_fd: int, snapshot: Snapshot) -> None:
    data = encode(snapshot)
    name = snapshot_name(snapshot.offset)
    temp = name + ".tmp"  # recovery removes one a crash left behind
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_snapshot(dir_fd: int, offset: int) -> Snapshot:
    """The snapshot at `offset`; SnapshotError if it does not decode, OSError if unreadable."""
    fd = os.open(snapshot_name(offset), os.O_RDONLY, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        if size > limits.producer_snapshot_bytes_max:
            raise SnapshotError(f"{size} bytes")
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    snapshot = decode(data)
    if snapshot.offset != offset:
        raise SnapshotError(f"holds offset {snapshot.offset}")
    return snapshot


def _remove(dir_fd: int, offsets: list[int]) -> None:
    for offset in offsets:
        try:
            os.unlink(snapshot_name(offset), dir_fd=dir_fd)
        except FileNotFoundError:
            pass


def _tidy(dir_fd: int, write: Snapshot | None, above: int | None, start: int) -> None:
    """Remove the snapshots above `above` and at or below `start`, write `write`, keep the
    newest `producer_snapshots_max`; closes `dir_fd`."""
    try:
        offsets = list_snapshots(dir_fd)
        _remove(dir_fd, [o for o in offsets if o <= start or (above is not None and o > above)])
        if write is not None and write.offset > start:
            write_snapshot(dir_fd, write)
        _remove(dir_fd, list_snapshots(dir_fd)[:-limits.producer_snapshots_max])
    finally:
        os.close(dir_fd)


# The partition's side (on its loop) --------------------------------------------------------


class SnapshotFiles:
    """One partition's snapshot files, changed by one I/O job at a time in the order asked.

    Requests made while a job runs are merged into the next one: the newest write (it covers
    more than an older one), the lowest cut, the highest log start. A write above a later
    cut is dropped before it is ever made."""

    def __init__(self, run_blocking: Callable[[Callable[[], Any], Callable[[Any, Any], None]],
                                              None],
                 directory_fd: Callable[[], int | None], name: str) -> None:
        """`directory_fd()`: a handle of the job's own on the partition's directory, or None
        once the log is closed (what is still asked then is dropped)."""
        self._run_blocking = run_blocking
        self._directory_fd = directory_fd
        self._name = name
        self._write: Snapshot | None = None
        self._above: int | None = None  # remove snapshots above this offset
        self._start = -1  # remove snapshots at or below this offset
        self._start_moved = False  # since the last job
        self._running = False
        self.written = 0  # snapshots handed to a job (tests, logs)

    def write(self, snapshot: Snapshot) -> None:
        self._write = snapshot
        self._next()

    def truncated(self, end_offset: int) -> None:
        """The log was cut to end at `end_offset`: snapshots above it describe batches gone."""
        if self._write is not None and self._write.offset > end_offset:
            self._write = None
        self._above = end_offset if self._above is None else min(self._above, end_offset)
        self._next()

    def log_start_moved(self, log_start_offset: int) -> None:
        if log_start_offset > self._start:
            self._start = log_start_offset
            self._start_moved = True
            self._next()

    def _wanted(self) -> bool:
        return self._write is not None or self._above is not None or self._start_moved

    def _next(self) -> None:
        if self._running or not self._wanted():
            return
        dir_fd = self._directory_fd()
        if dir_fd is None:
            self._write = self._above = None
            self._start_moved = False
            return
        write, above, start = self._write, self._above, self._start
        self._write = self._above = None
        self._start_moved = False
        self._running = True
        self.written += write is not None

        def done(_result: Any, error: BaseException | None) -> None:
            self._running = False
            if error is not None:
                log.warning("%s: producer snapshots: %r", self._name, error)
            self._next()

        self._run_blocking(lambda: _tidy(dir_fd, write, above, start), done)
