"""A partition's flushes: the ack window's decisions carried out, and the recovery sync.

A produce runs in two phases (DESIGN.md §2):

    Produce  -> idempotence check, offsets assigned, appended (written to the page cache)
             -> dispatched: order is fixed
    flush    -> one fdatasync on the I/O pool covers every append that arrived while the
                previous one ran (flush coalescing)
             -> produced: the high watermark moves, waiting acks are answered

Which produce to answer when, when to start a flush and where the high watermark is, a pure
machine decides (actors/ack_window.py, where Raft's commit plugs in); `Flushes` does what it
decides: publishes, answers, starts the fdatasync on the I/O pool and hands its result back.
With `write.caching=true` the high watermark follows the written offset and acks are answered
at once; the flush still runs in the background.

A failed fdatasync (the rule, after fsyncgate): nothing that waited on it is acknowledged.
The log is cut back to its flushed offset, the last offset an fdatasync made durable
(`DiskLog.flush_failed`), so the bytes whose durability is unknown are gone from the log, not
left to be served or synced later; the partition's producer state forgets the batches cut
(each producer then expects the first sequence cut, so its retries come back in order and are
neither duplicated nor refused); every waiter is answered KAFKA_STORAGE_ERROR; and the
partition takes writes again at once (if the disk still fails, so does their flush). Consumers
never saw the cut bytes: the high watermark is the flushed offset. With `write.caching=true`
it is the written offset, so a cut may take records a consumer read: that topic setting trades
this away, as Redpanda's write caching does. A replica's log is also its Raft log: after a cut
it leaves its group until a restart (the partition's `log_cut_back`).

The recovery sync: what recovery kept may be only in the page cache (a kill -9), so the log's
first flush ticket fdatasyncs every segment file and the directory on the I/O pool; until it
is back the partition advertises nothing. A failed one has no durable offset to cut back to
(nothing says how far the log was synced before): it is tried again
(`recovery_sync_retry_ms`) while clients wait, as a restart would, which reads the same page
cache back and syncs it.

A flush or the recovery sync runs with the log's fds, so the log is closed only once neither
is out (`in_io`): a topic deleted, or a shard stopped, while one runs closes the log when it
returns. The `Partition` (actors/partition.py) owns one `Flushes` and is what `FlushHost`
describes.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError

from actors import limits
from actors.ack_window import Acks, AckWindow, CommitSource, Step
from actors.partition_messages import ProduceResult
from actors.services import Services
from actors.trace import ProduceTrace
from storage import DiskLog, FlushTicket
from wire.errors import ErrorCode

__all__ = ["FlushDone", "FlushHost", "Flushes", "Synced", "Waiter", "acks_of"]

log = logging.getLogger("actors.partition")  # the partition's lines, as they have always been


class Waiter(NamedTuple):
    """A produce waiting in the ack window: its reply, and what to answer once it may."""

    reply: Callable[[ProduceResult], None]
    result: ProduceResult
    trace: ProduceTrace | None = None  # a sampled request's (actors/trace.py)


class FlushDone(NamedTuple):
    """A flush is back from the I/O pool, to the partition's mailbox."""

    ticket: Any
    error: BaseException | None


class Synced(NamedTuple):
    """The recovery sync (the log's first flush ticket) is back from the I/O pool."""

    ticket: FlushTicket
    error: BaseException | None


def acks_of(acks: int) -> Acks:
    """What a produce that gets an answer waits for (acks=0 waits for nothing)."""
    return Acks.LEADER if acks == 1 else Acks.ALL


class FlushHost(Protocol):
    """What the flushes need of their partition (actors/partition.py's Partition)."""

    services: Services

    @property
    def actor_ref(self) -> Any: ...  # FlushDone and Synced come back to its mailbox
    @property
    def actor_stopped(self) -> Any: ...
    @property
    def disk_log(self) -> DiskLog | None: ...
    @property
    def deleted(self) -> bool: ...
    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Any: ...
    def publish(self) -> None: ...
    def close_log(self) -> None: ...
    def finish_delete(self) -> None: ...
    def storage_failed(self) -> None: ...
    def maybe_started(self) -> None: ...
    def log_cut_back(self, durable: int) -> None: ...
    def flushed(self, ok: bool, term: int | None) -> None: ...


class Flushes:
    def __init__(self, host: FlushHost, name: str, write_caching: bool) -> None:
        self._host = host
        self._name = name
        # Produces waiting for their flush, flushes out, the high watermark: what to do when
        # (actors/ack_window.py); `open` makes it anew at the log's end once it is synced.
        self.window: AckWindow[Waiter] = AckWindow(0, write_caching)
        self._unflushed_bytes = 0  # appended since the last flush started
        self._failures = 0  # failed flushes in a row (one log line per run of them)
        self._term: int | None = None  # the term of the last batch the flush out covers
        self._recovery_sync: FlushTicket | None = None
        # While produces are traced (actors/trace.py): the last flushes, [offset covered up
        # to, when handed to the pool, when back], for a traced produce's flush stamps.
        self._recent_flushes: collections.deque[list[float]] | None = None
        if host.services.settings.trace_produce_every:
            self._recent_flushes = collections.deque(maxlen=limits.traced_flushes_kept)

    def __str__(self) -> str:
        return self._name

    @property
    def in_io(self) -> bool:
        """Whether a job on the I/O pool holds the log's fds (a flush, the recovery sync)."""
        return self.window.flush_in_flight or self._recovery_sync is not None

    @property
    def recovery_synced(self) -> bool:
        return self._recovery_sync is None

    def open(self, log_: DiskLog, write_caching: bool, quorum: bool) -> None:
        """The log is synced: the window opens at its end. A replicated one's (`quorum`)
        commit comes from Raft: nothing is readable until a leader says what a quorum has."""
        if quorum:
            self.window = AckWindow(log_.flushed_offset, write_caching, CommitSource.QUORUM,
                                    log_.log_start_offset)
        else:
            self.window = AckWindow(log_.flushed_offset, write_caching)

    # The window's decisions ---------------------------------------------------------------

    def appended(self, last_offset: int, size: int, waiter: Waiter | None = None,
                 acks: Acks = Acks.ALL) -> None:
        """`size` bytes were appended up to `last_offset`; `waiter` waits for them."""
        self._unflushed_bytes += size
        self.carry_out(self.window.appended(last_offset, waiter, acks))

    def carry_out(self, step: Step[Waiter]) -> None:
        """Do what the window decided, in its order: publish, answer, start a flush."""
        if step.high_watermark is not None:
            self._host.publish()
        for waiter in step.acked:
            if waiter.trace is not None:
                self._stamp(waiter.trace)
            waiter.reply(waiter.result)
        for waiter in step.failed:  # their offsets were cut: never acknowledge them
            waiter.reply(ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR))
        if step.start_flush:
            self.start_flush()

    def _stamp(self, trace: ProduceTrace) -> None:
        """A traced produce is answered: its flush's times, from the first flush that
        covered its last offset (none under write caching), and now."""
        for covered, started, back in self._recent_flushes or ():
            if covered > trace.last_offset:
                trace.flush_started, trace.flushed = started, back
                break
        trace.committed = trace.now()

    def fail_waiters(self, error: ErrorCode) -> None:
        for waiter in self.window.fail_all():
            waiter.reply(ProduceResult(error))

    # What a replicated partition's Replication (actors/partition_replication.py) says ------

    def written_offset(self) -> int:
        return self.window.written_offset

    def quorum_committed(self, high_watermark: int) -> None:
        if high_watermark > self.window.committed_offset:
            self.carry_out(self.window.committed(high_watermark))

    def insync_moved(self, offset: int | None) -> None:
        """What min.insync.replicas replicas have flushed (None: only the commit is asked)."""
        if offset != self.window.insync_offset:
            self.carry_out(self.window.insync(offset))

    def in_sync_changed(self, in_sync: int, wanted: int) -> None:
        """The leader's in-sync replicas are now `in_sync` many (or min.insync.replicas,
        `wanted`, changed): under it, every acks=all produce still waiting is answered
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, as Kafka answers (its records may still commit: a
        retry of an idempotent producer then finds its offset)."""
        if in_sync >= wanted:
            return
        failed = self.window.fail_acks(Acks.ALL)
        if failed:
            log.info("%s: %d replica(s) in sync, fewer than min.insync.replicas=%d: %d acks=all "
                     "produce(s) answered NOT_ENOUGH_REPLICAS_AFTER_APPEND", self, in_sync,
                     wanted, len(failed))
        for waiter in failed:
            waiter.reply(ProduceResult(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND))

    def cut_complete(self) -> None:
        """A cut is durable: start the flush it held back, if one is wanted."""
        if self.window.flush_covers is None and self.window.flush_wanted:
            self.start_flush()

    # Flushes ------------------------------------------------------------------------------

    def start_flush(self) -> None:
        log_ = self._host.disk_log
        if log_ is None or log_.cut_pending:
            return  # a cut's end starts the flush it held back (the partition's cut_complete)
        ticket = log_.flush_prepare()
        covers = self.window.flush_started()
        assert ticket is not None and ticket.offset == covers, (ticket, self.window)
        flushed_bytes, self._unflushed_bytes = self._unflushed_bytes, 0
        self._term = log_.term_at(ticket.offset - 1)
        if self._recent_flushes is not None:
            self._recent_flushes.append([ticket.offset, ProduceTrace.now(), 0.0])

        def timed() -> float:
            started = time.monotonic()
            ticket.run()
            return time.monotonic() - started

        self._host.services.run_blocking(
            timed, lambda seconds, error: self._returned(ticket, error, seconds, flushed_bytes)
        )

    def _returned(
        self, ticket: Any, error: BaseException | None, seconds: float, flushed_bytes: int
    ) -> None:
        """On the loop thread, as the I/O pool hands the flush back."""
        if self._recent_flushes:
            self._recent_flushes[-1][2] = ProduceTrace.now()  # one flush out at a time
        metrics = self._host.services.metrics
        if metrics is not None and error is None:
            metrics.fdatasync_latency.observe(seconds)
            metrics.flush_bytes.observe(flushed_bytes)
        try:
            self._host.actor_ref.tell(FlushDone(ticket, error))
        except ActorDeadError:  # stopped while it ran: the log waited for it to close
            if self._host.disk_log is not None:
                self._settle(ticket, error)
            self._host.close_log()

    def done(self, m: FlushDone) -> None:
        log_ = self._host.disk_log
        if log_ is None:
            return
        step = self._settle(m.ticket, m.error)
        if self._host.deleted:  # its waiters were answered at the delete
            self._host.finish_delete()
            return
        metrics = self._host.services.metrics
        if m.error is not None and metrics is not None:
            metrics.fdatasync_errors += 1
        if m.error is None and self._failures:
            log.warning("%s: fdatasync works again after %d failures", self, self._failures)
            self._failures = 0
        self._host.flushed(m.error is None, self._term)
        self.carry_out(step)

    def _settle(self, ticket: Any, error: BaseException | None) -> Step[Waiter]:
        """Hand the returned ticket to the log, then to the window. A failed flush cuts the
        log back to its flushed offset, and the producer state with it."""
        log_ = self._host.disk_log
        assert log_ is not None
        if error is None:
            log_.flush_complete(ticket)
            return self.window.flush_done(log_.flushed_offset)
        written = log_.written_offset
        try:
            log_.flush_failed(ticket)
        except OSError as e:
            log.critical("%s: cannot cut the log back after a failed fdatasync: %r; "
                         "partition offline", self, e)
            self._host.storage_failed()
            return self.window.flush_failed()
        durable = log_.next_offset
        self._unflushed_bytes = 0
        self._failures += 1
        if self._failures == 1:
            log.error("%s: fdatasync failed: %r; offsets %d..%d cut, their produces answered "
                      "KAFKA_STORAGE_ERROR", self, error, durable, written - 1)
        else:
            log.debug("%s: fdatasync failed again (%d in a row): %r", self, self._failures,
                      error)
        step = self.window.flush_failed()
        assert self.window.written_offset == durable, (durable, self.window)
        self._host.log_cut_back(durable)
        return step

    def dropped(self, message: FlushDone | Synced) -> None:
        """A flush or the recovery sync that returned as the actor stopped: the partition's
        stop left the log open for it, so it closes the log now."""
        if isinstance(message, Synced):
            self._recovery_sync = None
        if self._host.disk_log is not None:
            if isinstance(message, FlushDone):
                self._settle(message.ticket, message.error)
            else:
                self._settle_recovery_sync(message.ticket, message.error)
        self._host.close_log()

    # The recovery sync --------------------------------------------------------------------

    def start_recovery_sync(self) -> None:
        """Sync what recovery kept (module docstring): until it is back nothing is
        advertised, no high watermark, no Raft machine (it would acknowledge its log as
        synced), no answer to a client."""
        log_ = self._host.disk_log
        assert log_ is not None
        ticket = self._recovery_sync = log_.flush_prepare()
        if ticket is None:  # an empty log
            return
        ref = self._host.actor_ref

        def synced(_result: Any, error: BaseException | None) -> None:
            try:
                ref.tell(Synced(ticket, error))
            except ActorDeadError:  # stopped while it ran: the log waited for it to close
                self._recovery_sync = None
                if self._host.disk_log is not None:
                    self._settle_recovery_sync(ticket, error)
                self._host.close_log()

        self._host.services.run_blocking(ticket.run, synced)

    def _settle_recovery_sync(self, ticket: FlushTicket, error: BaseException | None) -> bool:
        """Hand the returned sync to the log; whether it succeeded. A failed one cuts nothing:
        no offset is known durable to cut back to (the flushed offset is the log start)."""
        log_ = self._host.disk_log
        assert log_ is not None
        if error is None:
            log_.flush_complete(ticket)
            if self._failures:
                log.warning("%s: the recovery sync works after %d failures", self,
                            self._failures)
                self._failures = 0
            return True
        log_.flush_abandoned(ticket)
        self._failures += 1
        if self._failures == 1:
            log.error("%s: the recovery sync failed: %r; tried again every %d ms while clients "
                      "wait", self, error, limits.recovery_sync_retry_ms)
        return False

    def synced(self, m: Synced) -> None:
        self._recovery_sync = None
        if self._host.disk_log is None:
            return
        synced = self._settle_recovery_sync(m.ticket, m.error)
        if self._host.deleted:
            self._host.finish_delete()
        elif synced:
            self._host.maybe_started()
        else:
            # A restart would do no better: it reads the same page cache back and syncs it.
            self._host.call_later(limits.recovery_sync_retry_ms / 1000, self._retry_sync)

    def _retry_sync(self) -> None:
        host = self._host
        if not host.actor_stopped.is_set() and not host.deleted and host.disk_log is not None:
            self.start_recovery_sync()
