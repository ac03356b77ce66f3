"""A partition's appends: a client's produce and a transaction coordinator's marker, checked
and written to the log.

Every append goes through the same checks, in Kafka's order, and is refused before anything
is written if one fails:

- the partition takes writes: its log is open, it did not fail (`KAFKA_STORAGE_ERROR`), a
  replica leads (`NOT_LEADER_OR_FOLLOWER`, actors/partition_replication.py);
- min.insync.replicas, as Kafka enforces it: an acks=all append is refused NOT_ENOUGH_REPLICAS
  while fewer replicas are in sync (this one copy without replication; with it, the leader's
  in-sync replicas, actors/isr.py). One waiting when they become fewer is answered
  NOT_ENOUGH_REPLICAS_AFTER_APPEND (the partition's `in_sync_changed`); above a majority,
  acks=all also waits for that many replicas' flushes. acks=0 and acks=1 are not affected;
- a full disk: the shard's free-space guard (storage/free_space.py, `storage_min_free_bytes`)
  is asked first; under the threshold a produce is answered KAFKA_STORAGE_ERROR (retriable) and
  nothing of it is written, and the next produce after space returns is taken as usual.
  `__consumer_offsets` is let through, as Redpanda lets its internal writes through: commits
  and group state are a few hundred bytes, and groups go on;
- max.message.bytes per batch, keys on a compacted topic, and the producer's sequence and
  transaction state (actors/producer_state.py, actors/txn_state.py): a duplicate is answered
  with its first offset once that is durable.

A produce that passed them and would roll the log is not written yet: the next segment's
files are made on the I/O pool (storage/log.py, rolling ahead) while it waits, put back first
among the partition's held messages with every write after it, then it is taken again.

A segment write that still fails (ENOSPC or EIO: the guard is off, or the disk filled between
looks) is undone to the last whole batch by the log and answered KAFKA_STORAGE_ERROR; the
partition goes on. Only a log that cannot even be cut back takes no more writes.

Transactions (actors/txn_state.py holds the theory): transactional batches open their
producer's transaction; the coordinator's `WriteTxnMarker` appends a COMMIT or ABORT control
batch through the same path (so Raft replicates it, and followers read it back from what they
append), answered once it is committed. The marker of a producer with no transaction open here
is written all the same (as Kafka does; it lists nothing); one from a coordinator older than
the producer's last marker's is refused (Kafka's coordinator epoch fencing).

The `Partition` (actors/partition.py) owns one `Appends` and hands it those messages; what is
appended goes on to its producer state (actors/partition_producers.py) and its flushes
(actors/partition_flush.py), which it hands `Appends` as well.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError

from actors.group import OFFSETS_TOPIC
from actors.group.messages import TxnOffsetsMarker
from actors.partition_flush import Flushes, Waiter, acks_of
from actors.partition_messages import Produce, ProduceResult, WriteTxnMarker
from actors.partition_producers import Producers
from actors.record_checks import keyless_records
from actors.services import Services, now_ms
from actors.topic_config import TopicSettings
from actors.txn_state import marker_batch
from storage import DiskLog
from storage.log import AppendFailed
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader, iter_batches, set_log_append_time

__all__ = ["AppendHost", "Appends", "SegmentMade"]

log = logging.getLogger("actors.partition")  # the partition's lines, as they have always been

_ACKS_ALL = -1


class SegmentMade(NamedTuple):
    """The segment a produce waits for is back from the I/O pool (`Appends._roll_first`)."""

    segment: Any  # storage.segment.Segment, None if it could not be made
    error: BaseException | None


class AppendHost(Protocol):
    """What the appends need of their partition (actors/partition.py's Partition)."""

    topic: str
    index: int
    settings: TopicSettings
    services: Services
    leader_epoch: int

    @property
    def actor_ref(self) -> Any: ...  # SegmentMade comes back to its mailbox
    @property
    def disk_log(self) -> DiskLog | None: ...
    def retry_held(self) -> None: ...
    def hold_first(self, message: Produce | WriteTxnMarker) -> None: ...
    def settling(self) -> bool: ...
    def write_refused(self) -> ErrorCode | None: ...
    def log_writes_waiting(self) -> bool:
        """Whether a replicated leader's log does not end where Raft's does yet (its own
        writes wait behind a cut or the memberships file: actors/replica.py)."""
    def in_sync_count(self) -> int: ...
    def proposed(self, base_offset: int, count: int, data: memoryview) -> None:
        """The leader appended `count` offsets from `base_offset`; `data`: their batches'
        bytes as the log holds them (the produce's buffer, valid for this call only)."""
    def storage_failed(self) -> None: ...


class Appends:
    def __init__(self, host: AppendHost, name: str, producers: Producers,
                 flushes: Flushes) -> None:
        self._host = host
        self._name = name
        self._producers = producers
        self._flushes = flushes
        self.rolling = False  # a segment is being made ahead of the writes held
        self.awaiting_settle = False  # a write held until this new leader settles
        self.awaiting_log = False  # a write held until the leader's own log writes are made
        services = host.services
        metrics = services.metrics
        self._stats = None if metrics is None else metrics.partition(host.topic, host.index)
        # The shard's free-space guard, for the partitions that take clients' writes.
        self._disk_space = None if host.topic == OFFSETS_TOPIC else services.disk_space

    def __str__(self) -> str:
        return self._name

    # Rolling ahead (storage/log.py): a segment's files are made off the loop -------------

    def _roll_first(self, m: Produce, log_: DiskLog, size: int) -> bool:
        """Whether `m`, checked and about to be appended, waits for a segment made ahead of
        it on the I/O pool (started now): its append would roll the log before its first
        batch. The partition holds it, first, with the writes after it until
        `segment_made`; then it is taken again from the start."""
        host = self._host
        base = log_.next_offset
        records = sum(h.last_offset_delta + 1 for h in m.headers)
        job = log_.roll_ahead(base, base + records - 1, size, host.leader_epoch, now_ms())
        if job is None:
            return False
        self.rolling = True
        ref = host.actor_ref

        def done(segment: Any, error: BaseException | None) -> None:
            try:
                ref.tell(SegmentMade(segment, error))
            except ActorDeadError:
                if segment is not None:
                    segment.close()

        host.services.run_blocking(job, done)
        host.hold_first(m)
        return True

    def segment_made(self, m: SegmentMade) -> None:
        self.rolling = False
        log_ = self._host.disk_log
        if m.error is not None:  # the append rolls the usual way, and says what fails
            log.error("%s: a segment could not be made ahead: %r", self, m.error)
        elif log_ is not None:
            log_.install_segment(m.segment)
        else:
            m.segment.close()
        self._host.retry_held()

    def produce(self, m: Produce) -> None:
        # Phase one is answered as the partition takes the message: from here its place in the
        # log is fixed (messages are handled one at a time). It runs after the append, in the
        # same turn: its caller may then reuse the bytes (an arena region). Not for a produce
        # held again (behind the segment it waits for, or until this leader settles): it is
        # taken again then.
        held_again = False
        try:
            held_again = self._append(m)
        finally:
            if m.on_dispatched is not None and not held_again:
                m.on_dispatched()

    def _append(self, m: Produce) -> bool:
        """Check and append `m`, or answer why not; True if it is held again."""
        if m.trace is not None:
            m.trace.at_partition = m.trace.now()
        host = self._host
        refused = host.write_refused()
        if refused is not None:
            _answer(m, ProduceResult(refused))
            return False
        if host.log_writes_waiting():
            # Raft placed a write of its own at the log's end (a membership change waiting
            # for its file): this one goes after it, held until then.
            self.awaiting_log = True
            host.hold_first(m)
            return True
        log_ = host.disk_log
        assert log_ is not None
        settings = host.settings
        if m.acks == _ACKS_ALL and host.in_sync_count() < settings.min_insync_replicas:
            message = (f"{host.in_sync_count()} replica(s) in sync, fewer than "
                       f"min.insync.replicas={settings.min_insync_replicas}")
            log.debug("%s: acks=all produce refused: %s", self, message)
            _answer(m, ProduceResult(ErrorCode.NOT_ENOUGH_REPLICAS, message=message))
            return False
        first, last = m.headers[0], m.headers[-1]
        size = last.position + last.size - first.position
        guard = self._disk_space
        if guard is not None and not guard.admits(size):
            message = (f"free space on the data disk ({guard.free_bytes} bytes) is under "
                       f"storage_min_free_bytes ({guard.min_free_bytes})")
            _answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=message))
            return False
        limit = settings.max_message_bytes
        for header in m.headers:
            if header.size > limit:
                message = f"batch of {header.size} bytes is over max.message.bytes={limit}"
                _answer(m, ProduceResult(ErrorCode.MESSAGE_TOO_LARGE, message=message))
                return False
        if settings.compact:
            keyless = keyless_records(m.records, m.headers, f"{host.topic}-{host.index}")
            if keyless is not None:
                log.info("%s: produce refused: %s", self, keyless.message)
                _answer(m, keyless)
                return False
        checked = self._check_sequences(m, log_)
        if checked is None:
            return True  # held until this new leader settles
        if checked:
            return False
        if self._roll_first(m, log_, size):
            return True
        now = now_ms()
        append_time = -1
        if settings.log_append_time:
            append_time = now
            for header in m.headers:
                set_log_append_time(m.records, header, now)
        first_base = log_.next_offset
        try:
            result = log_.append(
                m.records, m.headers, host.leader_epoch, now)  # type: ignore[arg-type]
        except AppendFailed as e:
            self._append_failed(m, e)
            return False
        except OSError as e:  # the undo failed too: the files cannot be trusted
            log.critical("%s: append failed and cannot be undone: %r; partition offline",
                         self, e)
            host.storage_failed()
            _answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR))
            return False
        count = result.last_offset + 1 - result.base_offset
        first, last = m.headers[0], m.headers[-1]
        host.proposed(result.base_offset, count,
                      memoryview(m.records)[first.position:last.position + last.size])
        self._producers.note_appended(m.records, m.headers, first_base)
        self._producers.maybe_snapshot(m.headers[-1], m.records)
        if self._disk_space is not None:
            self._disk_space.appended(size)
        stats = self._stats
        if stats is not None:
            stats.produced_bytes += size
            stats.produced_records += count
        produced = ProduceResult(
            ErrorCode.NONE, result.base_offset, append_time, log_.log_start_offset
        )
        waiter = None if m.reply is None else Waiter(m.reply, produced, m.trace)
        if m.trace is not None:
            m.trace.appended, m.trace.last_offset = m.trace.now(), result.last_offset
        self._flushes.appended(result.last_offset, size, waiter, acks_of(m.acks))
        return False

    def _append_failed(self, m: Produce, failure: AppendFailed) -> None:
        """A segment write failed; the log undid the append: refuse it, take the next."""
        log.error("%s: append failed, undone: %s", self, failure.error)
        services = self._host.services
        if failure.error.errno == errno.ENOSPC and services.disk_space is not None:
            services.disk_space.write_failed()  # refuse the rest until a look finds room
        if services.metrics is not None:
            services.metrics.write_errors += 1
        message = f"write failed: {failure.error.strerror or failure.error}"
        _answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=message))

    def _refused_unsettled(self, m: Produce | WriteTxnMarker) -> bool:
        """A new replicated leader refuses a write by its producer state only once an entry
        of its term has committed (actors/partition_held.py says why): until then `m` is
        held first, and taken again then. Whether it was held."""
        if not self._host.settling():
            return False
        self.awaiting_settle = True
        self._host.hold_first(m)
        return True

    def _check_sequences(self, m: Produce, log_: DiskLog) -> bool | None:
        """Answer and return True if the request is a duplicate or refused by its producer's
        state; None if it is held until this new leader settles; False to append it."""
        producers = self._producers.producers
        for header in m.headers:
            if header.producer_id < 0 or header.is_control:
                continue  # a control batch here is a marker, checked by write_txn_marker
            txn_error = self._txn_check(header)
            if txn_error is None and m.from_coordinator:
                txn_error = producers.check_epoch(header.producer_id, header.producer_epoch)
                if txn_error is None:
                    continue
            if txn_error is not None:
                if self._refused_unsettled(m):
                    return None
                _answer(m, ProduceResult(txn_error))
                return True
            check = producers.check(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.last_offset_delta,
            )
            if check.error is not None:
                if self._refused_unsettled(m):
                    return None
                log.debug("%s: producer %d: %s", self, header.producer_id, check.error.name)
                _answer(m, ProduceResult(check.error))
                return True
            if check.duplicate is not None:
                # Already appended: answer with the original offset once that is durable.
                batch = check.duplicate
                result = ProduceResult(ErrorCode.NONE, batch.first_offset, -1,
                                       log_.log_start_offset)
                if m.reply is not None:
                    if m.trace is not None:
                        m.trace.last_offset = batch.last_offset
                    flushes = self._flushes
                    flushes.carry_out(flushes.window.wait(batch.last_offset,
                                                          Waiter(m.reply, result, m.trace),
                                                          acks_of(m.acks)))
                return True
        return False

    def _txn_check(self, header: BatchHeader) -> ErrorCode | None:
        """A transactional batch needs room for its transaction; a plain batch of a producer
        whose transaction is open here is refused (Kafka's InvalidTxnStateException)."""
        producer_id, txns = header.producer_id, self._producers.txns
        if header.is_transactional:
            if not txns.may_open(producer_id):
                log.warning("%s: %d transactions open, refusing producer %d's", self,
                            txns.open_count, producer_id)
                return ErrorCode.CONCURRENT_TRANSACTIONS
        elif txns.is_open(producer_id):
            return ErrorCode.INVALID_TXN_STATE
        return None

    def write_txn_marker(self, m: WriteTxnMarker) -> None:
        """Append the COMMIT or ABORT marker through the produce path (acks=all: answered
        once committed). A producer epoch older than the producer's here, or a coordinator
        epoch older than its last marker's, is fenced (actors/producer_state.py)."""
        fenced = self._producers.producers.check_marker(m.producer_id, m.producer_epoch,
                                                        m.coordinator_epoch)
        if fenced is not None:
            if self._refused_unsettled(m):
                return
            log.warning("%s: marker for producer %d (epoch %d, coordinator epoch %d): %s",
                        self, m.producer_id, m.producer_epoch, m.coordinator_epoch,
                        fenced.name)
            m.reply(fenced)
            return
        batch = marker_batch(m.producer_id, m.producer_epoch, m.commit, m.coordinator_epoch,
                             now_ms())
        self._append(Produce(memoryview(batch), iter_batches(batch, check_crc=False), -1,
                             self._marker_written(m)))

    def _marker_written(self, m: WriteTxnMarker) -> Callable[[ProduceResult], None]:
        """Answer the coordinator once the marker is committed. On `__consumer_offsets` the
        shard's group coordinator (that partition's, as it is led here) learns it first: the
        producer's pending transactional offsets there are committed or dropped (Kafka's
        scheduleHandleTxnCompletion)."""
        host = self._host

        def written(result: ProduceResult) -> None:
            if result.error == ErrorCode.NONE and host.topic == OFFSETS_TOPIC:
                coordinator = host.services.local_group_coordinator()
                marker = TxnOffsetsMarker(host.index, m.producer_id, m.commit,
                                          result.base_offset)
                try:
                    if coordinator is not None:
                        coordinator.tell(marker)
                except ActorDeadError:
                    pass  # the shard is stopping: the next load replays the marker
            m.reply(result.error)

        return written


def _answer(m: Produce, result: ProduceResult) -> None:
    if m.reply is not None:
        m.reply(result)
