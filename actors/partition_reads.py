"""A partition's reads: Fetch, ListOffsets and OffsetForLeaderEpoch, and the retry of a read
that missed the page cache.

The `Partition` actor (actors/partition.py) owns one `Reads` and hands it those messages; it
answers from the partition's log, watermarks and transactions, which it reads through
`ReadHost` and never changes. Reads never wait on the disk on the loop (DESIGN.md §3): the
log is read with `nowait`, and a range that is not in the page cache is read in on the read
pool and the message comes back to the partition as `Warmed`, to be served again, at most
`cold_read_attempts_max` times before it may wait.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError

from actors import limits
from actors.partition_messages import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    EpochEndOffset,
    ListOffset,
    ListOffsetResult,
    Read,
    ReadResult,
)
from actors.services import Services
from actors.txn_state import TxnState
from storage import DiskLog, NotCached, OffsetOutOfRange
from wire.errors import DecodeError, ErrorCode
from wire.records import decode_batch

__all__ = ["ReadHost", "Reads", "Warmed"]

log = logging.getLogger("actors.partition")  # the partition's lines, as they have always been


class Warmed(NamedTuple):
    """A read that missed the page cache, back once the I/O pool has read its range in."""

    message: Read | ListOffset
    attempts: int  # reads of it that missed so far


class ReadHost(Protocol):
    """What the reads need of their partition (actors/partition.py's Partition)."""

    leader_epoch: int
    services: Services

    @property
    def actor_ref(self) -> Any: ...  # the Warmed retry comes back to the partition's mailbox
    @property
    def high_watermark(self) -> int: ...
    @property
    def leading(self) -> bool: ...
    @property
    def replicated(self) -> bool: ...
    @property
    def txns(self) -> TxnState: ...
    def log_or_none(self) -> DiskLog | None: ...
    def last_stable_offset(self) -> int: ...
    def replica_ready(self) -> bool: ...
    def on_dropped(self, message: Any) -> None: ...


class Reads:
    def __init__(self, host: ReadHost) -> None:
        self._host = host

    def epoch_error(self, current_leader_epoch: int) -> ErrorCode | None:
        if not self._host.leading:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch < 0 or current_leader_epoch == self._host.leader_epoch:
            return None
        if current_leader_epoch < self._host.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.UNKNOWN_LEADER_EPOCH

    def read(self, m: Read, attempts: int = 0) -> None:
        log_ = self._host.log_or_none()
        if log_ is None:
            m.reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return
        error = self.epoch_error(m.current_leader_epoch)
        if error is ErrorCode.NOT_LEADER_OR_FOLLOWER and m.any_replica:
            error = None  # a follower serves what it knows is committed
        if error is not None:
            m.reply(ReadResult(error))
            return
        hwm, start = self._host.high_watermark, log_.log_start_offset
        lso = self._host.last_stable_offset()
        if m.offset < start or m.offset > log_.next_offset:
            m.reply(ReadResult(ErrorCode.OFFSET_OUT_OF_RANGE, hwm, start, None, lso))
            return
        budget = m.budget
        limit = min(m.max_bytes, budget.remaining)
        end = lso if m.committed else hwm  # read_committed: whole batches below the LSO
        if m.offset >= end or (limit <= 0 and budget.taken):
            m.reply(ReadResult(ErrorCode.NONE, hwm, start, None, lso))
            return
        try:
            records = log_.read(m.offset, max(limit, 1), end, self._nowait(attempts))
        except OffsetOutOfRange:
            m.reply(ReadResult(ErrorCode.OFFSET_OUT_OF_RANGE, hwm, start, None, lso))
            return
        except NotCached as miss:
            self._warm_and_retry(miss, m, attempts)
            return
        aborted = self._host.txns.aborted_between(m.offset, end) if m.committed else None
        result = ReadResult(ErrorCode.NONE, hwm, start, records, lso, aborted)
        size = result.size
        if size > limit and budget.taken:
            # Only the first batch of a response may exceed the limit (KIP-74).
            result = ReadResult(ErrorCode.NONE, hwm, start, None, lso)
            size = 0
        budget.remaining -= size
        budget.taken += size
        m.reply(result)

    def list_offset(self, m: ListOffset, attempts: int = 0) -> None:
        try:
            self._answer_list_offset(m, self._nowait(attempts))
        except NotCached as miss:
            self._warm_and_retry(miss, m, attempts)

    def _answer_list_offset(self, m: ListOffset, nowait: bool) -> None:
        log_ = self._host.log_or_none()
        if log_ is None:
            m.reply(ListOffsetResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return
        error = self.epoch_error(m.current_leader_epoch)
        if error is not None:
            m.reply(ListOffsetResult(error))
            return
        epoch = self._host.leader_epoch
        if m.timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            m.reply(ListOffsetResult(ErrorCode.NONE, -1, log_.log_start_offset, epoch))
        elif m.timestamp == LATEST_TIMESTAMP:
            if not self._host.replica_ready():
                m.reply(ListOffsetResult(ErrorCode.OFFSET_NOT_AVAILABLE))
                return
            latest = self._host.last_stable_offset() if m.committed else self._host.high_watermark
            m.reply(ListOffsetResult(ErrorCode.NONE, -1, latest, epoch))
        elif m.timestamp == MAX_TIMESTAMP:
            found = log_.max_timestamp(nowait)
            if found is None or found[0] >= self._host.high_watermark:
                m.reply(ListOffsetResult(ErrorCode.NONE, -1, -1, -1))
            else:
                offset, timestamp = self._record_in_batch(
                    found[0], found[1], exact=True, nowait=nowait
                )
                m.reply(ListOffsetResult(ErrorCode.NONE, timestamp, offset, epoch))
        elif m.timestamp < 0:
            m.reply(ListOffsetResult(ErrorCode.INVALID_REQUEST))
        else:
            found = log_.offset_for_timestamp(m.timestamp, nowait)
            if found is None or found[0] >= self._host.high_watermark:
                m.reply(ListOffsetResult(ErrorCode.NONE, -1, -1, -1))
            else:
                offset, timestamp = self._record_in_batch(
                    found[0], m.timestamp, exact=False, nowait=nowait
                )
                m.reply(ListOffsetResult(ErrorCode.NONE, timestamp, offset, epoch))

    def _record_in_batch(
        self, batch_offset: int, timestamp: int, exact: bool, nowait: bool
    ) -> tuple[int, int]:
        """(offset, timestamp) of the first record of the batch at `batch_offset` whose
        timestamp is `timestamp` (exact) or at least `timestamp`, as Kafka answers by-time
        lookups; records below the log start (a batch DeleteRecords cut through) are not
        answered. The indexes find the batch; this decodes just that one batch."""
        log_ = self._host.log_or_none()
        assert log_ is not None
        start = log_.log_start_offset
        first = max(batch_offset, start)
        data = log_.read_bytes(first, 1, self._host.high_watermark, nowait)  # one batch
        try:
            _, records = decode_batch(data)
        except DecodeError as e:  # our log holds only batches that passed their CRC
            log.error("%s: batch at %d does not decode: %s", self._host, batch_offset, e)
            return first, timestamp
        kept = [record for record in records if record.offset >= start]
        for record in kept:
            if record.timestamp == timestamp or (not exact and record.timestamp > timestamp):
                return record.offset, record.timestamp
        if exact and kept:  # the batch's latest record lay below the log start
            latest = max(kept, key=lambda record: record.timestamp)
            return latest.offset, latest.timestamp
        return first, timestamp

    # Reads that missed the page cache ------------------------------------------------------

    def _nowait(self, attempts: int) -> bool:
        """Whether a read may only use the page cache. A read whose range was brought in
        that many times and still misses (memory this tight) waits for the disk instead."""
        return attempts < limits.cold_read_attempts_max

    def _warm_and_retry(self, miss: NotCached, m: Read | ListOffset, attempts: int) -> None:
        """Read the missing range in on the read pool, then serve `m` again."""
        ref = self._host.actor_ref

        def warmed(_result: Any, error: BaseException | None) -> None:
            if error is not None:  # the file went (deleted); the retry answers what it finds
                log.debug("%s: warming %s failed: %r", self._host, miss, error)
            try:
                ref.tell(Warmed(m, attempts + 1))
            except ActorDeadError:
                self._host.on_dropped(m)

        if self._host.services.metrics is not None:
            self._host.services.metrics.cold_reads += 1
        self._host.services.read_blocking(miss.warm, warmed)

    def warmed(self, m: Warmed) -> None:
        if isinstance(m.message, Read):
            self.read(m.message, m.attempts)
        else:
            self.list_offset(m.message, m.attempts)

    def epoch_end_offset(self, m: EpochEndOffset) -> None:
        log_ = self._host.log_or_none()
        if log_ is None:
            m.reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1))
            return
        error = self.epoch_error(m.current_leader_epoch)
        if error is not None:
            m.reply((error, -1, -1))
        elif m.leader_epoch > self._host.leader_epoch:
            m.reply((ErrorCode.NONE, -1, -1))  # UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        elif not self._host.replicated:
            # Every batch so far was written in epoch 0, the only epoch there has been.
            m.reply((ErrorCode.NONE, self._host.leader_epoch, log_.next_offset))
        else:
            # Kafka's endOffsetFor: the largest epoch <= the one asked, and where it ends.
            epoch, end = log_.end_offset_for_epoch(m.leader_epoch)
            last = log_.last_epoch
            if epoch < 0 and m.leader_epoch >= 0 and (last is None or last < m.leader_epoch):
                # Our own epoch holds no batch yet (a leader elected with everything
                # committed writes no no-op). Kafka's leader starts its epoch in its cache
                # at its log end when elected: the epoch asked, or the last one below it
                # with a batch, ends at the log end.
                asked = m.leader_epoch
                epoch = asked if asked == self._host.leader_epoch or last is None else last
                end = log_.next_offset
            m.reply((ErrorCode.NONE, epoch, end))
