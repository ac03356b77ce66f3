"""Idempotent-producer state of one partition: a pure table, rebuilt from the log on start.

For each producer id the partition remembers the current epoch and the last few batches
(first and last sequence, first and last offset), as Kafka does. A new batch is checked
against them before it is appended:

    epoch older than current               -> INVALID_PRODUCER_EPOCH
    epoch newer than current, sequence != 0 -> OUT_OF_ORDER_SEQUENCE_NUMBER
    same sequences as a remembered batch    -> duplicate: answer with that batch's offsets
    first sequence != last sequence + 1     -> OUT_OF_ORDER_SEQUENCE_NUMBER
    producer unknown to this partition      -> accepted with any sequence (Kafka >= 2.5)

A transaction marker (COMMIT or ABORT, from the transaction coordinator) is checked too, as
Kafka's ProducerAppendInfo.appendEndTxnMarker does: a producer epoch older than the
producer's is INVALID_PRODUCER_EPOCH, and a coordinator epoch older than the last marker's
for that producer is TRANSACTION_COORDINATOR_FENCED (a coordinator since replaced: the
coordinator epoch is the leader epoch of the transaction's `__consumer_offsets` partition).

Sequences wrap at int32 max. Nothing here does I/O; the Partition actor feeds it.

The table holds at most `producer_ids_per_partition_max` producers: past it the one that
wrote least recently is forgotten (as Redpanda's max_concurrent_producer_ids does; Kafka
forgets a producer idle for a day). A forgotten producer's next batch is accepted as a new
producer's, so only a retry of a batch it sent before it was forgotten could be stored twice.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import NamedTuple

from actors import limits
from wire.errors import ErrorCode

__all__ = ["ProducerEntry", "ProducerStateTable", "SequenceCheck", "RememberedBatch"]

_INT32_MAX = 2**31 - 1


def _next_sequence(sequence: int, count: int) -> int:
    return (sequence + count) % (_INT32_MAX + 1)


class RememberedBatch(NamedTuple):
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


class SequenceCheck(NamedTuple):
    """Outcome of a check: an error, a duplicate of a remembered batch, or accepted (both None)."""

    error: ErrorCode | None = None
    duplicate: RememberedBatch | None = None


class ProducerEntry(NamedTuple):
    """One producer as the table holds it, for a snapshot (actors/producer_snapshot.py)."""

    producer_id: int
    epoch: int
    next_sequence: int | None
    batches: tuple[RememberedBatch, ...]
    coordinator_epoch: int = -1  # its last transaction marker's


@dataclass(slots=True)
class _Producer:
    epoch: int
    batches: collections.deque[RememberedBatch] = field(
        default_factory=lambda: collections.deque(maxlen=limits.producer_batches_remembered)
    )
    # The sequence its next batch must start at when no batch is remembered: set when a
    # truncation took them all (`forget_from`), so the producer's retries come in order.
    next_sequence: int | None = None
    coordinator_epoch: int = -1  # its last marker's; it outlives epoch bumps, as in Kafka


class ProducerStateTable:
    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entries(self) -> list[ProducerEntry]:
        """Every producer, the one that wrote least recently first (the order `restored`
        needs to forget the same one next)."""
        return [ProducerEntry(pid, p.epoch, p.next_sequence, tuple(p.batches),
                              p.coordinator_epoch)
                for pid, p in self._producers.items()]

    @classmethod
    def restored(cls, entries: list[ProducerEntry]) -> ProducerStateTable:
        """The table `entries()` was taken from."""
        table = cls()
        for entry in entries:
            producer = _Producer(entry.epoch, next_sequence=entry.next_sequence,
                                 coordinator_epoch=entry.coordinator_epoch)
            producer.batches.extend(entry.batches)
            table._producers[entry.producer_id] = producer
        return table

    def check(
        self, producer_id: int, epoch: int, first_sequence: int, last_offset_delta: int
    ) -> SequenceCheck:
        producer = self._producers.get(producer_id)
        if producer is None:
            return SequenceCheck()
        if epoch < producer.epoch:
            return SequenceCheck(error=ErrorCode.INVALID_PRODUCER_EPOCH)
        if epoch > producer.epoch:
            if first_sequence != 0:
                return SequenceCheck(error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            return SequenceCheck()
        last_sequence = _next_sequence(first_sequence, last_offset_delta)
        for batch in producer.batches:
            if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                return SequenceCheck(duplicate=batch)
        expected = producer.next_sequence
        if producer.batches:
            expected = _next_sequence(producer.batches[-1].last_sequence, 1)
        if expected is not None and first_sequence != expected:
                return SequenceCheck(error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return SequenceCheck()

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int
                     ) -> ErrorCode | None:
        """Why a COMMIT or ABORT marker for the producer in `epoch`, written by the
        coordinator of `coordinator_epoch`, may not be appended (see the module docstring)."""
        producer = self._producers.get(producer_id)
        if producer is None:
            return None
        if epoch < producer.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if coordinator_epoch < producer.coordinator_epoch:
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        return None

    def check_epoch(self, producer_id: int, epoch: int) -> ErrorCode | None:
        """The one check of a batch with no sequence (the group coordinator's transactional
        offsets for the producer): an epoch older than its current one is fenced."""
        producer = self._producers.get(producer_id)
        if producer is not None and epoch < producer.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return None

    def record(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        first_offset: int,
        last_offset: int,
    ) -> None:
        """Remember a batch that was appended at [first_offset, last_offset]."""
        producers = self._producers
        producer = producers.pop(producer_id, None)  # back in at the end: most recent
        if producer is None or epoch > producer.epoch:
            producer = _Producer(epoch, coordinator_epoch=_coordinator_epoch(producer))
        producers[producer_id] = producer
        if len(producers) > limits.producer_ids_per_partition_max:
            del producers[next(iter(producers))]  # the one that wrote least recently
        last_sequence = _next_sequence(first_sequence, last_offset - first_offset)
        producer.batches.append(
            RememberedBatch(first_sequence, last_sequence, first_offset, last_offset)
        )

    def epoch_of(self, producer_id: int) -> int | None:
        """The producer's current epoch on this partition, None if it is unknown here."""
        producer = self._producers.get(producer_id)
        return None if producer is None else producer.epoch

    def marker(self, producer_id: int, epoch: int, coordinator_epoch: int | None) -> None:
        """A transaction marker (COMMIT or ABORT) for the producer in `epoch` was appended,
        written by the coordinator of `coordinator_epoch`, which becomes the producer's.
        A newer epoch than the producer's becomes its epoch (the coordinator fenced it, or
        bumped it at the transaction's end): its batches of the old epoch are forgotten and
        its next batch must start at sequence 0, as a new epoch's first batch does. A marker
        has no sequence of its own; nor has a batch of the group coordinator's (`no_sequence`,
        no coordinator epoch), which moves the epoch the same way."""
        producers = self._producers
        producer = producers.pop(producer_id, None)
        if producer is None or epoch > producer.epoch:
            producer = _Producer(epoch, next_sequence=0,
                                 coordinator_epoch=_coordinator_epoch(producer))
        if coordinator_epoch is not None:
            producer.coordinator_epoch = coordinator_epoch
        producers[producer_id] = producer
        if len(producers) > limits.producer_ids_per_partition_max:
            del producers[next(iter(producers))]

    def no_sequence(self, producer_id: int, epoch: int) -> None:
        """A batch with no sequence (the coordinator's, `check_epoch`) was appended."""
        self.marker(producer_id, epoch, None)

    def last_batch_offsets(self) -> set[int]:
        """The base offset of each remembered producer's last batch: compaction keeps these
        batches (empty if need be), so the producer's state survives a restart."""
        return {p.batches[-1].first_offset for p in self._producers.values() if p.batches}

    def forget_from(self, offset: int) -> None:
        """Drop every remembered batch at or after `offset` (the log was truncated there).

        A producer expects next the first sequence cut, as if those batches had never come:
        their retries are taken, in order, and a later batch that overtakes them is out of
        order (the client retries it after them). Even with every batch of it cut, it does
        not become unknown (which would take any sequence)."""
        for producer in self._producers.values():
            cut = [b for b in producer.batches if b.last_offset >= offset]
            if not cut:
                continue
            kept = [b for b in producer.batches if b.last_offset < offset]
            producer.batches.clear()
            producer.batches.extend(kept)
            producer.next_sequence = cut[0].first_sequence


def _coordinator_epoch(producer: _Producer | None) -> int:
    return -1 if producer is None else producer.coordinator_epoch
