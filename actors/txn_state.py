"""Transaction state of one partition: a pure table, rebuilt from the log on start.

Kafka transactions (KIP-98) leave three things in a partition's log: transactional data
batches (attributes bit 4), written by a producer between its AddPartitionsToTxn and its
EndTxn; and one control batch per transaction and partition, the marker, written by the
transaction coordinator (`WriteTxnMarker`): COMMIT or ABORT for (producer id, epoch). This
table is what a partition derives from them, after Kafka's ProducerStateManager and
TransactionIndex:

    open          producer id -> the offset of its first transactional batch since its
                  last marker: a transaction in progress
    ended         transactions whose marker is in the log but not yet committed (at or above
                  the high watermark): still unstable, since a new Raft leader may cut that
                  marker and the transaction is then open again
    aborted       (producer id, first offset, last offset = the ABORT marker's offset) of
                  every aborted transaction whose marker is committed: the aborted index a
                  read_committed fetch answers with, in marker-offset order

    last stable offset (LSO) = max(log start, min(high watermark, first offset of every open
                               or ended transaction))

A read_committed fetch reads only whole batches below the LSO, and gets the aborted
transactions that overlap what it read, so the client drops their records; a transaction's
records below the LSO are either committed or listed as aborted.

    data batch, transactional, pid not open    -> open[pid] = its base offset
    marker(pid, offset, abort)                 -> open -> ended (nothing if pid was not open:
                                                  Kafka writes the marker anyway, and there is
                                                  nothing to list)
    committed(hwm)                             -> ended whose marker < hwm leave; an ABORT's
                                                  goes into the aborted index
    log start moved                            -> aborted entries that end below it go
    log cut at offset (truncation, failed fsync)-> `forget_from`: what was written there is
                                                  gone; a cut marker reopens its transaction

Bounds (actors/limits.py): `transactions_open_per_partition_max` open transactions (past it a
new one is refused by the partition, CONCURRENT_TRANSACTIONS, retriable), and
`aborted_transactions_per_partition_max` aborted entries: past it the oldest is forgotten,
so a read_committed consumer reading that far back would see that transaction's records (a
partition holding that many aborted transactions in its retention is far outside what this
broker is built for; Kafka keeps them on disk, one .txnindex per segment).

Nothing here does I/O; the Partition actor feeds it from what it appends and what it reads
back from the log on start and after a cut. The marker batch itself (`marker_batch`) and
reading it back (`read_marker`, `marker_type`) live here too.
"""

from __future__ import annotations

import bisect
import collections
import struct
from typing import NamedTuple

from actors import limits
from wire.errors import DecodeError
from wire.records import build_batch, decode_batch

__all__ = [
    "ABORT",
    "COMMIT",
    "AbortedTxn",
    "EndedTxn",
    "Marker",
    "TxnEntries",
    "TxnState",
    "marker_batch",
    "marker_type",
    "read_marker",
]

# Kafka's ControlRecordType: 0 ABORT, 1 COMMIT (key: int16 version 0, int16 type; value of an
# EndTransactionMarker: int16 version 0, int32 coordinator epoch).
ABORT = 0
COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytearray:
    """A COMMIT or ABORT control batch, as Kafka's coordinator has a leader write it:
    transactional and control bits, the producer's id and epoch, no sequence, one record."""
    key = _CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value, [])], producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=-1, transactional=True,
                       control=True, base_timestamp=timestamp_ms)


class Marker(NamedTuple):
    kind: int  # ABORT or COMMIT
    coordinator_epoch: int  # -1 where the value does not say


def read_marker(batch: bytes | bytearray | memoryview) -> Marker | None:
    """What a transaction marker batch (one whole batch) says; None for any other batch (a
    LEADER_CHANGE, a batch that does not decode)."""
    try:
        header, records = decode_batch(batch, check_crc=False)
    except DecodeError:
        return None
    if not header.is_control or not records or records[0].key is None:
        return None
    key, value = records[0].key, records[0].value
    if len(key) < _CONTROL_KEY.size:
        return None
    _version, kind = _CONTROL_KEY.unpack_from(key)
    if kind not in (ABORT, COMMIT):
        return None
    if value is None or len(value) < _MARKER_VALUE.size:
        return Marker(kind, -1)
    _version, coordinator_epoch = _MARKER_VALUE.unpack_from(value)
    return Marker(kind, coordinator_epoch)


def marker_type(batch: bytes | bytearray | memoryview) -> int | None:
    """ABORT or COMMIT for a transaction marker batch (one whole batch); None for any other
    batch."""
    marker = read_marker(batch)
    return None if marker is None else marker.kind


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


class EndedTxn(NamedTuple):
    """A transaction whose marker is in the log, not yet committed."""

    producer_id: int
    first_offset: int
    marker_offset: int
    aborted: bool


class TxnEntries(NamedTuple):
    """What a TxnState holds, for a snapshot (actors/producer_snapshot.py)."""

    open: tuple[tuple[int, int], ...]  # (producer id, first offset), oldest first
    ended: tuple[EndedTxn, ...]  # marker order
    aborted: tuple[AbortedTxn, ...]  # marker order


class TxnState:
    def __init__(self) -> None:
        # Insertion order is first-offset order: a transaction opens at the log's end.
        self._open: dict[int, int] = {}
        self._ended: collections.deque[EndedTxn] = collections.deque()  # marker order
        self._aborted: collections.deque[AbortedTxn] = collections.deque()  # marker order
        self.aborted_forgotten = 0  # entries dropped past the limit (a log line, tests)

    def __repr__(self) -> str:
        return (f"TxnState(open={self._open}, ended={list(self._ended)}, "
                f"aborted={len(self._aborted)})")

    def entries(self) -> TxnEntries:
        return TxnEntries(tuple(self._open.items()), tuple(self._ended), tuple(self._aborted))

    @classmethod
    def restored(cls, entries: TxnEntries) -> TxnState:
        """The state `entries()` was taken from."""
        state = cls()
        state._open = dict(entries.open)
        state._ended.extend(entries.ended)
        state._aborted.extend(entries.aborted)
        return state

    # Questions ----------------------------------------------------------------------------

    def is_open(self, producer_id: int) -> bool:
        return producer_id in self._open

    def may_open(self, producer_id: int) -> bool:
        """Whether a transactional batch of `producer_id` may be appended: its transaction
        is open already, or there is room for one more."""
        return (producer_id in self._open
                or len(self._open) < limits.transactions_open_per_partition_max)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open or ended transaction, or None."""
        first = next(iter(self._open.values()), None)
        for ended in self._ended:
            if first is None or ended.first_offset < first:
                first = ended.first_offset
        return first

    def last_stable_offset(self, high_watermark: int, log_start_offset: int) -> int:
        first = self.first_unstable_offset()
        lso = high_watermark if first is None else min(first, high_watermark)
        return max(lso, log_start_offset)

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions that overlap offsets
        [start, end), oldest marker first (Kafka's collectAbortedTransactions)."""
        aborted = self._aborted
        # Entries whose marker is at or past `start`; the deque is in marker order.
        index = bisect.bisect_left(aborted, start, key=lambda a: a.last_offset)
        return [(a.producer_id, a.first_offset)
                for a in (aborted[i] for i in range(index, len(aborted)))
                if a.first_offset < end]

    def aborted(self) -> list[AbortedTxn]:
        return list(self._aborted)

    # Events -------------------------------------------------------------------------------

    def data_batch(self, producer_id: int, base_offset: int) -> None:
        """A transactional data batch was appended at `base_offset`."""
        if producer_id not in self._open:
            self._open[producer_id] = base_offset

    def marker(self, producer_id: int, offset: int, aborted: bool) -> None:
        """A COMMIT or ABORT marker for `producer_id` was appended at `offset`."""
        first = self._open.pop(producer_id, None)
        if first is not None:
            self._ended.append(EndedTxn(producer_id, first, offset, aborted))

    def committed(self, high_watermark: int) -> None:
        """Everything below `high_watermark` is committed: markers below it are final."""
        ended = self._ended
        while ended and ended[0].marker_offset < high_watermark:
            done = ended.popleft()
            if done.aborted:
                self._aborted.append(AbortedTxn(done.producer_id, done.first_offset,
                                                done.marker_offset))
        while len(self._aborted) > limits.aborted_transactions_per_partition_max:
            self._aborted.popleft()
            self.aborted_forgotten += 1

    def log_start_moved(self, log_start_offset: int) -> None:
        """Retention or DeleteRecords: aborted transactions that end below the log start
        have nothing left to filter."""
        aborted = self._aborted
        while aborted and aborted[0].last_offset < log_start_offset:
            aborted.popleft()

    def forget_from(self, offset: int) -> None:
        """The log was cut at `offset`: forget what was written there. A transaction whose
        marker was cut but whose data was not is open again; one that began at or past the
        cut is gone."""
        entries: list[EndedTxn | AbortedTxn] = [*self._ended, *self._aborted]
        reopened = {e.producer_id: e.first_offset for e in entries
                    if e.first_offset < offset <= _end_of(e)}
        opened = {pid: first for pid, first in self._open.items() if first < offset}
        opened.update(reopened)
        self._open = dict(sorted(opened.items(), key=lambda item: item[1]))
        self._ended = collections.deque(e for e in self._ended if e.marker_offset < offset)
        self._aborted = collections.deque(a for a in self._aborted if a.last_offset < offset)


def _end_of(entry: EndedTxn | AbortedTxn) -> int:
    return entry.marker_offset if isinstance(entry, EndedTxn) else entry.last_offset
