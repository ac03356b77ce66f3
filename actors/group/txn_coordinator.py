"""The transaction coordinator's I/O, for the GroupCoordinator actor that owns it (as it owns
its PartitionLoader): it runs the effects of the pure `TransactionTable`
(actors/group/transactions.py) — records appended to `__consumer_offsets` through the
coordinator, producer ids from the controller, transaction markers written to partitions,
client answers, and one timer for transaction timeouts and id expiry.

Markers (Kafka's TransactionMarkerChannelManager, one marker at a time per partition here):

    WriteMarkers(id, partitions)  --WriteTxnMarker-->  each partition's leader
                                     (Services.partition_writer; answers come back as
                                     `_MarkerAnswer` messages to the coordinator)
    NONE, or its topic deleted: that partition is done      all done: markers_written(id)
    INVALID_PRODUCER_EPOCH: a newer epoch wrote there, so this marker is moot: done
    TRANSACTION_COORDINATOR_FENCED: a newer coordinator has the id: stop
    anything else (a leader moving, no leader known): again after a backoff, doubled per
    try, for as long as this coordinator owns the id

The coordinator epoch a marker carries is the offsets partition's leader epoch when its load
began (its Raft term; 0 for a partition of one replica, whose epoch never moves), as Kafka's:
a partition refuses a marker whose coordinator epoch is older than the last marker's for that
producer (TRANSACTION_COORDINATOR_FENCED, actors/producer_state.py), so a coordinator that
lost the partition cannot end a transaction its successor has taken over.
Answers for a job that has ended (the id's partition unloaded, or loaded again since) are
dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError, ActorRef

from actors.controller import AllocateProducerId
from actors.group import OFFSETS_TOPIC, limits
from actors.group.log_records import encode_transaction_key, encode_transaction_value
from actors.group.messages import (
    AddTxnOffsets,
    AddTxnPartitions,
    DescribeTxns,
    EndTransaction,
    InitTransactional,
    ListTxns,
    TxnDescription,
    TxnListing,
)
from actors.group.transactions import (
    NeedProducerId,
    Persist,
    Reply,
    TransactionTable,
    TxnState,
    WriteMarkers,
)
from actors.partition_messages import WriteTxnMarker
from actors.services import Services, now_ms
from wire.errors import ErrorCode

__all__ = ["TXN_MESSAGES", "TXN_REQUESTS", "TxnCoordinator"]

log = logging.getLogger(__name__)

TXN_REQUESTS = (InitTransactional, AddTxnPartitions, AddTxnOffsets, EndTransaction,
                DescribeTxns, ListTxns)


class _Allocated(NamedTuple):
    request: InitTransactional
    producer_id: int  # < 0: none could be handed out


class _MarkerAnswer(NamedTuple):
    transactional_id: str
    job_id: int
    topic: str
    partition: int
    error: ErrorCode


TXN_MESSAGES = (_Allocated, _MarkerAnswer)


@dataclass(slots=True)
class _MarkerJob:
    job_id: int
    marker: WriteMarkers
    coordinator_epoch: int
    left: set[tuple[str, int]]
    backoff_ms: dict[tuple[str, int], int] = field(default_factory=dict)
    timers: dict[tuple[str, int], asyncio.TimerHandle] = field(default_factory=dict)

    def cancel(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


class OwnerActor(Protocol):
    """What the transaction coordinator uses of the actor that owns it (the GroupCoordinator):
    where its answers go, its timers, and whether it has stopped."""

    @property
    def actor_ref(self) -> ActorRef[Any]: ...

    @property
    def actor_stopped(self) -> threading.Event: ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        ...


class TxnCoordinator:
    """See the module docstring. `append(id, records, done)` is the coordinator's append to
    the id's offsets partition; `partition_of(id)` its offsets partition; `incarnation(id)`
    which load of that partition is served (None: not served)."""

    def __init__(self, services: Services, actor: OwnerActor,
                 append: Callable[[str, Sequence[tuple[bytes, bytes | None]],
                                   Callable[[ErrorCode], None]], None],
                 partition_of: Callable[[str], int],
                 incarnation: Callable[[str], int | None],
                 append_error: Callable[[ErrorCode], ErrorCode]) -> None:
        settings = services.settings
        self.services = services
        self.table = TransactionTable(settings.transaction_max_timeout_ms,
                                      settings.transactional_id_expiration_ms)
        self._actor = actor  # the coordinator: its ActorRef and its `call_later`
        self._append = append
        self._partition_of = partition_of
        self._incarnation = incarnation
        self._append_error = append_error
        self._epochs: dict[int, int] = {}  # offsets partition -> coordinator epoch
        self._jobs: dict[str, _MarkerJob] = {}
        self._job_ids = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ms: int | None = None
        self.handlers: dict[type, Callable[[Any], None]] = {
            InitTransactional: self._init,
            AddTxnPartitions: self._add,
            AddTxnOffsets: self._add_offsets,
            EndTransaction: self._end,
            DescribeTxns: self._describe,
            ListTxns: self._list,
        }

    # Requests ---------------------------------------------------------------------------------

    def _init(self, m: InitTransactional, fresh_id: int | None = None) -> None:
        self._run(self.table.init_producer_id(
            m.transactional_id, m.timeout_ms, m.producer_id, m.producer_epoch, now_ms(),
            m.reply, fresh_id), m)

    def _add(self, m: AddTxnPartitions) -> None:
        self._run(self.table.add_partitions(m.transactional_id, m.producer_id,
                                            m.producer_epoch, m.partitions, now_ms(), m.reply))

    def _add_offsets(self, m: AddTxnOffsets) -> None:
        """AddOffsetsToTxn is AddPartitionsToTxn of the group's offsets partition: its
        marker then ends the transaction's offsets there (Kafka's handleAddOffsetsToTxn)."""
        partition = (OFFSETS_TOPIC, self._partition_of(m.group_id))
        self._run(self.table.add_partitions(m.transactional_id, m.producer_id,
                                            m.producer_epoch, [partition], now_ms(), m.reply))

    def _end(self, m: EndTransaction) -> None:
        self._run(self.table.end_txn(m.transactional_id, m.producer_id, m.producer_epoch,
                                     m.commit, now_ms(), m.reply))

    def _describe(self, m: DescribeTxns) -> None:
        described = []
        for transactional_id in m.transactional_ids:
            if self._incarnation(transactional_id) is None:
                described.append(TxnDescription(transactional_id, ErrorCode.NOT_COORDINATOR))
                continue
            meta = self.table.entries.get(transactional_id)
            if meta is None:
                described.append(TxnDescription(transactional_id,
                                                ErrorCode.TRANSACTIONAL_ID_NOT_FOUND))
                continue
            described.append(TxnDescription(
                transactional_id, ErrorCode.NONE, meta.state.value, meta.timeout_ms,
                meta.start_ms, meta.producer_id, meta.producer_epoch, sorted(meta.partitions)))
        m.reply(described)

    def _list(self, m: ListTxns) -> None:
        now = now_ms()
        states = set(m.states)
        producer_ids = set(m.producer_ids)
        listed = []
        for transactional_id, meta in self.table.entries.items():
            if states and meta.state.value not in states:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if m.min_duration_ms >= 0 and (
                    meta.start_ms < 0 or now - meta.start_ms < m.min_duration_ms):
                continue
            listed.append(TxnListing(transactional_id, meta.producer_id, meta.state.value))
        m.reply(listed)

    def refuse(self, message: Any, error: ErrorCode) -> None:
        """Answer a transaction request that cannot be served here (now)."""
        if isinstance(message, InitTransactional):
            message.reply(error, -1, -1)
        elif isinstance(message, AddTxnPartitions | AddTxnOffsets | EndTransaction):
            message.reply(error)
        elif isinstance(message, DescribeTxns):
            message.reply([TxnDescription(t, error) for t in message.transactional_ids])
        elif isinstance(message, ListTxns):
            message.reply([])

    # Effects ----------------------------------------------------------------------------------

    def _run(self, effects: list[Any], request: InitTransactional | None = None) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                effect.to(*effect.args)
            elif isinstance(effect, Persist):
                self._persist(effect)
            elif isinstance(effect, WriteMarkers):
                self._start_markers(effect)
            elif isinstance(effect, NeedProducerId):
                assert request is not None, "a producer id needed outside InitProducerId"
                self._allocate(request)
            else:
                raise AssertionError(f"unknown effect {effect!r}")
        self._schedule()

    def _persist(self, effect: Persist) -> None:
        transactional_id, meta = effect.transactional_id, effect.metadata
        value = None if meta is None else encode_transaction_value(meta)
        incarnation = self._incarnation(transactional_id)

        def done(error: ErrorCode) -> None:
            if self._incarnation(transactional_id) != incarnation:
                return  # unloaded meanwhile: `unload` answered whoever waited
            if error != ErrorCode.NONE:
                log.warning("transactional id %r: its record was not appended: %s",
                            transactional_id, error.name)
            self._run(self.table.persisted(transactional_id, self._append_error(error),
                                           now_ms()))
            if error != ErrorCode.NONE and meta is not None and meta.state in (
                    TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                self._actor.call_later(limits.txn_persist_retry_ms / 1000,
                                       lambda: self._complete_again(transactional_id))

        self._append(transactional_id, [(encode_transaction_key(transactional_id), value)], done)

    def _complete_again(self, transactional_id: str) -> None:
        if self._incarnation(transactional_id) is not None:
            self._run(self.table.markers_written(transactional_id, now_ms()))

    def _allocate(self, request: InitTransactional) -> None:
        me = self._actor.actor_ref

        def allocated(producer_id: int) -> None:
            _tell(me, _Allocated(request, producer_id))

        self.services.controller().tell(AllocateProducerId(allocated))

    def receive(self, message: Any) -> None:
        """One of `TXN_MESSAGES`, come back to the coordinator."""
        if isinstance(message, _Allocated):
            request = message.request
            if message.producer_id < 0:
                request.reply(ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, -1)
            elif self._incarnation(request.transactional_id) is None:
                request.reply(ErrorCode.NOT_COORDINATOR, -1, -1)
            else:
                self._init(request, message.producer_id)
        else:
            self._marker_answer(message)

    # Markers ----------------------------------------------------------------------------------

    def _start_markers(self, effect: WriteMarkers) -> None:
        transactional_id = effect.transactional_id
        old = self._jobs.pop(transactional_id, None)
        if old is not None:
            old.cancel()
        self._job_ids += 1
        epoch = self._epochs.get(self._partition_of(transactional_id), 0)
        job = _MarkerJob(self._job_ids, effect, epoch, set(effect.partitions))
        self._jobs[transactional_id] = job
        if not job.left:
            self._markers_done(transactional_id)
            return
        for topic, partition in sorted(job.left):
            self._send_marker(job, topic, partition)

    def _send_marker(self, job: _MarkerJob, topic: str, partition: int) -> None:
        job.timers.pop((topic, partition), None)
        marker = job.marker
        me = self._actor.actor_ref

        def reply(error: ErrorCode) -> None:
            _tell(me, _MarkerAnswer(marker.transactional_id, job.job_id, topic, partition,
                                    error))

        if topic not in self.services.topics().topics:
            reply(ErrorCode.NONE)  # deleted: nothing left to mark
            return
        writer = self.services.partition_writer(topic, partition)
        message = WriteTxnMarker(marker.producer_id, marker.producer_epoch, marker.commit,
                                 job.coordinator_epoch, reply)
        if writer is None or not _tell(writer, message):
            reply(ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def _marker_answer(self, m: _MarkerAnswer) -> None:
        job = self._jobs.get(m.transactional_id)
        if job is None or job.job_id != m.job_id:
            return
        tp = (m.topic, m.partition)
        if m.error == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
            log.warning("transactional id %r: a newer coordinator wrote to %s-%d; its markers "
                        "stop here", m.transactional_id, m.topic, m.partition)
            job.cancel()
            del self._jobs[m.transactional_id]
            return
        if m.error not in (ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH) and (
                m.topic in self.services.topics().topics):
            backoff_ms = job.backoff_ms.get(tp, limits.marker_retry_backoff_ms_min)
            job.backoff_ms[tp] = min(backoff_ms * 2, limits.marker_retry_backoff_ms_max)
            log.debug("transactional id %r: marker to %s-%d: %s; again in %d ms",
                      m.transactional_id, m.topic, m.partition, m.error.name, backoff_ms)
            job.timers[tp] = self._actor.call_later(
                backoff_ms / 1000, lambda: self._send_marker(job, m.topic, m.partition))
            return
        if m.error == ErrorCode.INVALID_PRODUCER_EPOCH:
            log.warning("transactional id %r: %s-%d has a newer producer epoch; marker moot",
                        m.transactional_id, m.topic, m.partition)
        job.left.discard(tp)
        if not job.left:
            self._markers_done(m.transactional_id)

    def _markers_done(self, transactional_id: str) -> None:
        del self._jobs[transactional_id]
        self._run(self.table.markers_written(transactional_id, now_ms()))

    # Loading and unloading ----------------------------------------------------------------------

    def loaded(self, partition: int, coordinator_epoch: int, transactions: dict[str, Any]) -> None:
        """An offsets partition is served from now on, with the ids replayed from it."""
        self._epochs[partition] = coordinator_epoch
        self._run(self.table.resume(transactions))
        prepared = sum(1 for m in transactions.values()
                       if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT))
        if transactions:
            log.info("partition %d: %d transactional ids, %d to complete", partition,
                     len(transactions), prepared)

    def unload(self, partition: int) -> None:
        """An offsets partition is no longer ours: forget its ids and stop their markers."""
        self._epochs.pop(partition, None)
        gone = [t for t in self.table.entries.keys() | self._jobs.keys()
                if self._partition_of(t) == partition]
        for transactional_id in gone:
            job = self._jobs.pop(transactional_id, None)
            if job is not None:
                job.cancel()
        pending = self.table.pending_in(lambda t: self._partition_of(t) == partition)
        self._run(self.table.forget(set(gone) | set(pending)))

    def stop(self) -> None:
        for job in self._jobs.values():
            job.cancel()
        self._jobs.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # The timer --------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """Wake at the table's next deadline (or after the check interval, at the latest)."""
        now = now_ms()
        deadline = self.table.next_deadline_ms()
        latest = now + limits.txn_check_interval_ms_max
        wake = latest if deadline is None else max(min(deadline, latest), now)
        if self._timer is not None and self._timer_at_ms is not None and (
                self._timer_at_ms <= wake):
            return
        if self._timer is not None:
            self._timer.cancel()
        if deadline is None and not self.table.entries:
            self._timer = self._timer_at_ms = None
            return
        self._timer_at_ms = wake
        self._timer = self._actor.call_later((wake - now + 1) / 1000, self._tick)

    def _tick(self) -> None:
        self._timer = self._timer_at_ms = None
        if self._actor.actor_stopped.is_set():
            return
        effects = self.table.tick(now_ms())
        for effect in effects:
            if isinstance(effect, Persist) and effect.metadata is not None:
                log.info("transactional id %r: timed out; aborting", effect.transactional_id)
        self._run(effects)


def _tell(ref: Any, message: Any) -> bool:
    try:
        ref.tell(message)
    except ActorDeadError:
        return False
    return True
