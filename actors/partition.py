"""The Partition actor: owns one partition's log, its high watermark and producer state.

Every produce, fetch and offset lookup for a partition is a message to its actor, so the log
has exactly one owner and needs no lock. A produce runs in two phases (DESIGN.md §2):

    Produce  -> idempotence check, offsets assigned, appended (written to the page cache)
             -> dispatched: order is fixed
    flush    -> one fdatasync on the I/O pool covers every append that arrived while the
                previous one ran (flush coalescing)
             -> produced: the high watermark moves, waiting acks are answered

With `write.caching=true` the high watermark follows the written offset and acks are answered
at once; the flush still runs in the background. Which produce to answer when, when to start a
flush and where the high watermark is, a pure machine decides (actors/ack_window.py, where
Raft's commit plugs in); this actor does the I/O. Fetches see only offsets below the high
watermark. Every move is published to the shard's watermark table
(`Services.long_polls.publish`, actors/watermarks.py), which wakes the long polls waiting on
it and answers reads at the high watermark of an idle partition without a message here.

A full disk: the shard's free-space guard (storage/free_space.py, `storage_min_free_bytes`)
is asked before anything is appended; under the threshold a produce is answered
KAFKA_STORAGE_ERROR (retriable) and nothing of it is written, and the next produce after space
returns is taken as usual. `__consumer_offsets` is let through, as Redpanda lets its internal
writes through: commits and group state are a few hundred bytes, and groups go on. A segment
write that still fails (ENOSPC or EIO: the guard is off, or the disk filled between looks) is
undone to the last whole batch by the log and answered KAFKA_STORAGE_ERROR; the partition goes
on. Only a log that cannot even be cut back takes no more writes.

A failed fdatasync (the rule, after fsyncgate): nothing that waited on it is acknowledged.
The log is cut back to its flushed offset, the last offset an fdatasync made durable
(`DiskLog.flush_failed`), so the bytes whose durability is unknown are gone from the log, not
left to be served or synced later; the producer table forgets the batches cut (each producer
then expects the first sequence cut, so its retries come back in order and are neither
duplicated nor refused); every waiter is answered KAFKA_STORAGE_ERROR; and the partition takes
writes again at once (if the disk still fails, so does their flush). Consumers never saw the
cut bytes: the high watermark is the flushed offset. With `write.caching=true` it is the
written offset, so a cut may take records a consumer read: that topic setting trades this
away, as Redpanda's write caching does.

A flush runs on the I/O pool with the log's fds, so the log is closed only once no flush is
out: a topic deleted, or a shard stopped, while one runs closes the log when it returns.

Start: the log is opened (recovered) on the loop; what recovery kept may be only in the page
cache (a kill -9), so the log's first flush ticket, the recovery sync, fdatasyncs every
segment file on the I/O pool, while the producer state is rebuilt on the read pool. Until both
are back the partition advertises nothing: no high watermark, no Raft machine (which takes its
starting log as synced and would acknowledge it), no answer to a client; client messages are
held in order (`partition_held_messages_max`) and handled once it serves. A failed recovery
sync has no durable offset to cut back to (nothing says how far the log was synced before):
it is tried again (`recovery_sync_retry_ms`) while clients wait, as a restart would, which
reads the same page cache back and syncs it. A rebuild that fails (the log cannot be read)
leaves the partition offline, KAFKA_STORAGE_ERROR, until a restart.

Producer state (actors/producer_rebuild.py, actors/producer_snapshot.py): saved in a
snapshot file at each segment roll; on start, and after a Raft cut or reset
(`log_rewritten`), rebuilt off the loop from the last snapshot at or below the log's end and
the batch headers after it, while client messages wait. Batches appended meanwhile (a
follower's) are noted on the live tables, which forget what a cut took, and again on the
rebuild's run, to be played on the rebuilt tables.

Reads never wait on the disk (storage/page_cache.py): the log is read with `nowait`, and a
read that would touch a page not in memory is answered later, after the shard's read pool
has read that range in; every other partition and connection of the shard goes on meanwhile.
Fetch, ListOffsets and OffsetForLeaderEpoch are answered by actors/partition_reads.py, which
the partition hands those messages and which reads it through a Protocol.

The partition's directory carries its topic id (storage/partition_dir.py): one left by another
incarnation of the topic name goes to trash before the log opens, never taken as this one's.

A partition with more than one replica is a Raft group (DESIGN.md §7): its Replication
(actors/partition_replication.py) drives the group's Replica beside the log, the ack window
takes its commit from Raft (QUORUM), followers append the leader's batches through the same
flush path and refuse clients NOT_LEADER_OR_FOLLOWER, and the leader epoch is the term. A
cluster's partition of replication factor 1 is a lone copy that leads at epoch 0 and says so to
the cluster (`LoneLeader`).

min.insync.replicas, as Kafka enforces it: an acks=all append (a client's produce, the group
coordinator's write, a transaction marker) is refused NOT_ENOUGH_REPLICAS before anything is
written while fewer replicas are in sync (this one copy without replication; with it, the
leader's in-sync replicas, actors/isr.py), and one waiting when they become fewer is answered
NOT_ENOUGH_REPLICAS_AFTER_APPEND; above a majority, acks=all also waits for that many
replicas' flushes (actors/partition_replication.py). acks=0 and acks=1 are not affected.

What moves the log's start (retention, DeleteRecords) and compaction live in
actors/log_lifecycle.py, which the partition drives from a timer and its messages. The messages
themselves are in actors/partition_messages.py (imported from here as well).

Transactions (actors/txn_state.py holds the theory): transactional batches open their
producer's transaction here, and the coordinator's `WriteTxnMarker` appends a COMMIT or ABORT
control batch through the same append path as a produce (so Raft replicates it, and followers
read it back from what they append), answered once it is committed. The marker of a producer
with no transaction open here is written all the same (as Kafka does; it lists nothing); one
from a coordinator older than the producer's last marker's is refused (Kafka's coordinator
epoch fencing, actors/producer_state.py). A `Read` with `committed` (read_committed) stops at
the last stable offset and lists the aborted transactions that overlap what it could read.
"""

from __future__ import annotations

import collections
import errno
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pykka import ActorDeadError

from actors import limits
from actors.ack_window import Acks, AckWindow, CommitSource, Step
from actors.group import OFFSETS_TOPIC
from actors.group.messages import TxnOffsetsMarker
from actors.log_lifecycle import LogLifecycle
from actors.partition_messages import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    Delete,
    DeleteRecords,
    DeleteRecordsReply,
    EpochEndOffset,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    RaftReceive,
    RaftUnreachable,
    Read,
    ReadResult,
    RecordError,
    TransferLeadership,
    UpdateSettings,
    WriteTxnMarker,
    refuse,
)
from actors.partition_reads import Reads, Warmed
from actors.partition_replication import Address, GroupKey, LoneLeader, Replication
from actors.producer_rebuild import (
    ProducerState,
    RebuildRun,
    Rebuilt,
    marker_kind,
    rebuild,
    replay,
)
from actors.producer_snapshot import Boundary, SnapshotFiles
from actors.producer_state import ProducerStateTable
from actors.record_checks import keyless_records
from actors.runtime import LoopActor
from actors.services import Services, now_ms
from actors.topic_config import TopicSettings
from actors.txn_state import AbortedTxn, TxnState, marker_batch
from actors.watermarks import Published
from storage import DiskLog, FlushTicket, LogConfig
from storage.log import AppendFailed
from storage.partition_dir import Claim, claim
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader, iter_batches, read_header, set_log_append_time

# The messages are re-exported: the actor and its messages are imported from here.
__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "Partition",
    "Produce",
    "ProduceResult",
    "Read",
    "ReadResult",
    "RecordError",
    "FetchBudget",
    "ListOffset",
    "ListOffsetResult",
    "EpochEndOffset",
    "PartitionInfo",
    "Delete",
    "DeleteRecords",
    "UpdateSettings",
    "WriteTxnMarker",
]

log = logging.getLogger(__name__)


# Private messages ------------------------------------------------------------------------


class _Waiter(NamedTuple):
    """A produce waiting in the ack window: its reply, and what to answer once it may."""

    reply: Callable[[ProduceResult], None]
    result: ProduceResult


class _FlushDone(NamedTuple):
    ticket: Any
    error: BaseException | None


class _Synced(NamedTuple):
    """The recovery sync (the log's first flush ticket) is back from the I/O pool."""

    ticket: FlushTicket
    error: BaseException | None


class _Rebuilt(NamedTuple):
    """A producer-state rebuild (actors/producer_rebuild.py) is back from the read pool."""

    run: RebuildRun
    result: Rebuilt | None
    error: BaseException | None


class _ReleaseHeld(NamedTuple):
    """Handle the next messages held while the partition started or rebuilt its state."""


# The actor --------------------------------------------------------------------------------


class Partition(LoopActor):
    def __init__(
        self,
        topic: str,
        index: int,
        topic_id: bytes,
        directory: Path,
        settings: TopicSettings,
        services: Services,
        replicas: tuple[Address, ...] = (),
    ) -> None:
        """`topic_id`: the topic's id (its incarnation: storage/partition_dir.py);
        `replicas`: every replica's (node, shard) on a cluster; more than one make a Raft
        group (actors/partition_replication.py); () on a node of its own: the only copy."""
        super().__init__()
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.directory = directory
        self.settings = settings
        self.services = services
        self.leader_epoch = 0  # a lone copy's never moves; a replicated one's is the Raft term
        # Producers and transactions (open and aborted), fed batch by batch from the log.
        self._state = ProducerState()
        # Until the recovery sync and the first producer-state rebuild are back (on_start),
        # and while a rebuild after a cut runs, client messages wait here (`_hold`).
        self._starting = True
        self._recovery_sync: FlushTicket | None = None
        self._rebuild: RebuildRun | None = None
        self._held: collections.deque[Any] = collections.deque()
        self._offline = False  # a producer-state rebuild failed: refuse until a restart
        self._snapshots = SnapshotFiles(services.run_blocking, self._directory_fd, str(self))
        self._snapshot_base = -1  # the active segment's base offset at the last snapshot
        # Produces waiting for their flush, flushes out, the high watermark: what to do when
        # (actors/ack_window.py); on_start opens it at the log's end.
        self._window: AckWindow[_Waiter] = AckWindow(0, settings.write_caching)
        self._deleted: Path | None = None  # the directory to remove once no flush is out
        self._unflushed_bytes = 0  # appended since the last flush started
        metrics = services.metrics
        self._stats = None if metrics is None else metrics.partition(topic, index)
        self._failed: ErrorCode | None = None
        # The shard's free-space guard, for the partitions that take clients' writes.
        self._disk_space = None if topic == OFFSETS_TOPIC else services.disk_space
        self._flush_failures = 0  # failed flushes in a row (one log line per run of them)
        self._log: DiskLog | None = None
        self._lifecycle = LogLifecycle(self)
        self._reads = Reads(self)
        raft = getattr(services, "raft", None)
        self._replication: Replication | None = None
        if len(replicas) > 1:
            assert raft is not None, f"{topic}-{index}: replicas {replicas} on a single node"
            self._replication = Replication(self, replicas, raft)
        # A cluster's partition of replication factor 1: no Raft group, it leads, and says so
        # to every shard of the cluster, as a group's leader does (Metadata, coordinators).
        self._lone: LoneLeader | None = None
        if len(replicas) == 1:
            assert raft is not None, f"{topic}-{index}: replicas {replicas} on a single node"
            self._lone = LoneLeader(raft, GroupKey(topic, index, topic_id), replicas)
        self._leading = self._replication is None  # a lone copy always leads
        self._flush_term: int | None = None  # the term of the last batch the flush out covers
        self._published: Published | None = None  # what this partition last published
        self._adopted = False  # its directory was made before topic ids (storage/partition_dir)
        self._handlers: dict[type, Callable[[Any], None]] = {
            Produce: self._produce,
            Read: self._reads.read,
            ListOffset: self._reads.list_offset,
            EpochEndOffset: self._reads.epoch_end_offset,
            PartitionInfo: self._info,
            _FlushDone: self._flush_done,
            Warmed: self._reads.warmed,
            Delete: self._delete,
            UpdateSettings: self._update_settings,
            DeleteRecords: self._delete_records,
            RaftReceive: self._raft_receive,
            RaftUnreachable: self._raft_unreachable,
            TransferLeadership: self._transfer_leadership,
            WriteTxnMarker: self._write_txn_marker,
            _Synced: self._synced,
            _Rebuilt: self._rebuilt,
            _ReleaseHeld: self._release_held,
        }

    def __str__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    @property
    def high_watermark(self) -> int:
        return self._window.high_watermark

    @property
    def _producers(self) -> ProducerStateTable:
        return self._state.producers

    @property
    def _txns(self) -> TxnState:
        return self._state.txns

    # Lifecycle ----------------------------------------------------------------------------

    def on_start(self) -> None:
        claimed = claim(self.directory, self.topic_id)
        self._adopted = claimed.claim is Claim.ADOPTED  # a directory from before topic ids
        if claimed.trash is not None:  # another incarnation's: never opened as ours
            trash = claimed.trash
            self.services.read_blocking(lambda: shutil.rmtree(trash, ignore_errors=True),
                                        lambda _r, _e: None)
        self._log = DiskLog.open(self.directory, self._log_config())
        self._snapshot_base = self._log.active_base_offset
        self._snapshots.truncated(self._log.next_offset)  # those a power loss outlived
        self._start_recovery_sync()
        self._rebuild_producer_state()

    def _start_recovery_sync(self) -> None:
        """What recovery kept may be only in the page cache (a kill -9): the log's first
        flush ticket syncs every segment file and the directory (storage/log.py), on the I/O
        pool. Until it is back nothing is advertised: no high watermark, no Raft machine (it
        would acknowledge its log as synced), no answer to a client (`_hold`)."""
        assert self._log is not None
        ticket = self._recovery_sync = self._log.flush_prepare()
        if ticket is None:  # an empty log
            return
        ref = self.actor_ref

        def synced(_result: Any, error: BaseException | None) -> None:
            try:
                ref.tell(_Synced(ticket, error))
            except ActorDeadError:  # stopped while it ran: the log waited for it to close
                self._recovery_sync = None
                if self._log is not None:
                    self._settle_recovery_sync(ticket, error)
                self._close_log()

        self.services.run_blocking(ticket.run, synced)

    def _settle_recovery_sync(self, ticket: FlushTicket, error: BaseException | None) -> bool:
        """Hand the returned sync to the log; whether it succeeded. A failed one cuts nothing:
        no offset is known durable to cut back to (the flushed offset is the log start)."""
        assert self._log is not None
        if error is None:
            self._log.flush_complete(ticket)
            if self._flush_failures:
                log.warning("%s: the recovery sync works after %d failures", self,
                            self._flush_failures)
                self._flush_failures = 0
            return True
        self._log.flush_abandoned(ticket)
        self._flush_failures += 1
        if self._flush_failures == 1:
            log.error("%s: the recovery sync failed: %r; tried again every %d ms while clients "
                      "wait", self, error, limits.recovery_sync_retry_ms)
        return False

    def _synced(self, m: _Synced) -> None:
        self._recovery_sync = None
        if self._log is None:
            return
        synced = self._settle_recovery_sync(m.ticket, m.error)
        if self._deleted is not None:
            self._finish_delete()
        elif synced:
            self._maybe_started()
        else:
            # A restart would do no better: it reads the same page cache back and syncs it.
            self.call_later(limits.recovery_sync_retry_ms / 1000, self._retry_recovery_sync)

    def _retry_recovery_sync(self) -> None:
        if not self.actor_stopped.is_set() and self._deleted is None and self._log is not None:
            self._start_recovery_sync()

    def _maybe_started(self) -> None:
        log_ = self._log
        assert log_ is not None
        synced = self._recovery_sync is None and log_.flushed_offset == log_.next_offset
        if self._starting and synced and self._rebuild is None and not self._offline:
            self._started()

    def _started(self) -> None:
        """The log is synced and the producer state rebuilt: serve, replicate, advertise."""
        assert self._log is not None and self._log.flushed_offset == self._log.next_offset
        self._starting = False
        self._log.serve()  # reads come from the loop from here on
        if self._replication is None:
            self._window = AckWindow(self._log.flushed_offset, self.settings.write_caching)
        else:
            # What a quorum has is known once a leader says: nothing is readable until then.
            self._window = AckWindow(self._log.flushed_offset, self.settings.write_caching,
                                     CommitSource.QUORUM, self._log.log_start_offset)
            self._replication.start(self._log, adopted=self._adopted)
        if self._lone is not None:
            self._lone.start()
        self._publish()
        self._lifecycle.start()
        self._release_held()

    def on_stop(self) -> None:
        self._lifecycle.stop()
        if self._replication is not None:
            self._replication.stop()
        if self._lone is not None:
            self._lone.stop()
        self._fail_waiters(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._refuse_held(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._withdraw()
        if not self._log_in_io():
            self._close_log()
        # else the flush or recovery sync in flight closes it when it returns

    def _log_in_io(self) -> bool:
        """Whether a job on the I/O pool holds the log's fds (a flush, the recovery sync)."""
        return self._window.flush_in_flight or self._recovery_sync is not None

    def _directory_fd(self) -> int | None:
        return None if self._log is None else self._log.directory_fd()

    def _close_log(self) -> None:
        """Flush what is left, close every fd; and for a deleted topic remove the files."""
        log_ = self._log
        if log_ is None:
            return
        self._log = None
        if self._deleted is None:
            try:
                log_.flush()  # shutting down: whatever was written is made durable
            except OSError as e:  # nothing waits for it now; start-up recovery checks
                log.error("%s: last flush failed: %r", self, e)
        log_.close()
        if self._deleted is not None:
            trash = self._deleted
            self.services.read_blocking(  # not behind anyone's flush, nor in front of it
                lambda: shutil.rmtree(trash, ignore_errors=True), lambda _r, _e: None
            )

    def on_dropped(self, message: Any) -> None:
        # A flush or the recovery sync that returned as the actor stopped: on_stop left the
        # log open for it, so it closes the log now.
        if isinstance(message, _FlushDone | _Synced):
            if isinstance(message, _Synced):
                self._recovery_sync = None
            if self._log is not None:
                if isinstance(message, _FlushDone):
                    self._settle_ticket(message.ticket, message.error)
                else:
                    self._settle_recovery_sync(message.ticket, message.error)
            self._close_log()
            return
        # Told after the stop (its topic was deleted): the sender still waits for an answer,
        # and a cross-core producer holds the batch's arena region until phase one.
        refuse(message, ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            return super().on_receive(message)
        if type(message) in _WAIT_FOR_STATE and self._waiting():
            self._hold(message)
            return None
        return handler(message)

    # Messages held while the log is not ready to answer ------------------------------------

    def _waiting(self) -> bool:
        """Whether client messages wait: the partition starts, rebuilds its producer state,
        has held messages still to handle (they go first), or is offline."""
        return self._starting or self._rebuild is not None or bool(self._held) or self._offline

    def _hold(self, message: Any) -> None:
        if self._offline:
            _refuse(message, ErrorCode.KAFKA_STORAGE_ERROR)
        elif len(self._held) >= limits.partition_held_messages_max:
            _refuse(message, ErrorCode.REQUEST_TIMED_OUT)
        else:
            self._held.append(message)

    def _release_held(self, _m: _ReleaseHeld | None = None) -> None:
        """Handle held messages in order, a turn's share at a time (the rest behind a
        `_ReleaseHeld` to itself, so other actors get the loop meanwhile)."""
        for _ in range(limits.inbox_drain_messages_max):
            if not self._held or self._starting or self._rebuild is not None:
                return
            message = self._held.popleft()
            if self._offline:
                _refuse(message, ErrorCode.KAFKA_STORAGE_ERROR)
            else:
                self._handlers[type(message)](message)
        if self._held:
            self.actor_ref.tell(_ReleaseHeld())

    def _refuse_held(self, error: ErrorCode) -> None:
        held, self._held = self._held, collections.deque()
        for message in held:
            _refuse(message, error)

    def _go_offline(self) -> None:
        """The producer state cannot be known (its rebuild failed: the log cannot be read):
        answer KAFKA_STORAGE_ERROR until a restart, and leave the Raft group."""
        self._offline = True
        if self._replication is not None:
            self._replication.stop()
        self.storage_failed()
        self._refuse_held(ErrorCode.KAFKA_STORAGE_ERROR)
        if self._log is not None and not self._starting:
            self.services.long_polls.gone((self.topic, self.index))

    def _log_config(self) -> LogConfig:
        s = self.settings
        return LogConfig(
            segment_bytes=s.segment_bytes, segment_ms=s.segment_ms,
            index_interval_bytes=s.index_interval_bytes, segment_jitter_ms=s.segment_jitter_ms,
            segment_index_bytes=s.segment_index_bytes,
        )

    # What the log's lifecycle (actors/log_lifecycle.py) asks of its partition ---------------

    def log_or_none(self) -> DiskLog | None:
        """The open log; None once the partition is stopping or its topic is deleted."""
        return None if self._deleted is not None else self._log

    def now_ms(self) -> int:
        return now_ms()

    def log_start_moved(self) -> None:
        if self._log is not None:
            self._txns.log_start_moved(self._log.log_start_offset)
            self._snapshots.log_start_moved(self._log.log_start_offset)
        if self._replication is not None and self._log is not None:
            self._replication.log_start_moved(self._log.log_start_offset)
        self._publish()

    def log_start_replicated(self, offset: int, reply: DeleteRecordsReply) -> None:
        """DeleteRecords moved the log start to `offset` and it is durable here: answer once
        every live replica's start has followed (a replicated partition's leader), else now."""
        if self._replication is not None:
            self._replication.answer_when_replicas_start_at(offset, reply)
        else:
            reply((ErrorCode.NONE, self._log_start_offset()))

    def producer_last_batches(self) -> set[int]:
        return self._producers.last_batch_offsets()

    def aborted_transactions(self) -> list[AbortedTxn]:
        """(producer id, first offset, ABORT marker offset) of each aborted transaction the
        log still holds: compaction removes their records."""
        return self._txns.aborted()

    def last_stable_offset(self) -> int:
        return self._last_stable_offset()

    def storage_failed(self) -> None:
        """The log's files and its state disagree: take no more writes (Kafka takes the log
        directory offline)."""
        self._failed = ErrorCode.KAFKA_STORAGE_ERROR
        self._fail_waiters(ErrorCode.KAFKA_STORAGE_ERROR)

    def _rebuild_producer_state(self) -> None:
        """Producer and transaction state from the log, off the loop: from its last usable
        snapshot, then the batch headers after it (actors/producer_rebuild.py). Until it is
        back, client messages wait (`_hold`), and batches appended meanwhile are noted on the
        run as well, to be played on the rebuilt tables; a rebuild already under way is
        forgotten (its log was cut again)."""
        log_ = self._log
        assert log_ is not None
        run = self._rebuild = RebuildRun(log_.next_offset)
        scan, dir_fd, name = log_.header_scan(run.end_offset), log_.directory_fd(), str(self)
        self._submit_rebuild(run, lambda: rebuild(dir_fd, scan, name))

    def _submit_rebuild(self, run: RebuildRun, job: Callable[[], Rebuilt]) -> None:
        ref = self.actor_ref

        def done(result: Rebuilt | None, error: BaseException | None) -> None:
            try:
                ref.tell(_Rebuilt(run, result, error))
            except ActorDeadError:
                pass  # stopped meanwhile: nothing to rebuild for

        self.services.read_blocking(job, done)

    def _rebuilt(self, m: _Rebuilt) -> None:
        log_ = self._log
        if m.run is not self._rebuild or log_ is None:
            return  # the log was cut again meanwhile: a later run is out
        if m.error is not None or m.result is None:
            self._rebuild = None
            log.critical("%s: producer state rebuild failed: %r; partition offline until a "
                         "restart", self, m.error)
            self._go_offline()
            return
        rebuilt = m.result
        if m.run.overflowed:  # more came meanwhile than a run keeps: read them back too
            run = self._rebuild = RebuildRun(log_.next_offset)
            scan, start = log_.header_scan(run.end_offset), m.run.end_offset
            self._submit_rebuild(run, lambda: rebuilt._replace(
                replayed=rebuilt.replayed + replay(rebuilt.state, scan, start)))
            return
        self._rebuild = None
        for header, base_offset, kind in m.run.notes:
            rebuilt.state.note(header, base_offset, kind)
        self._state = rebuilt.state
        self._txns.log_start_moved(log_.log_start_offset)
        log.debug("%s: producer state rebuilt from %s, %d batch headers read", self,
                  "the log start" if rebuilt.snapshot_offset is None
                  else f"the snapshot at {rebuilt.snapshot_offset}", rebuilt.replayed)
        if self._starting:
            self._maybe_started()
            return
        self._publish()  # the last stable offset may have moved
        self._release_held()

    def _note_batch(self, header: BatchHeader, base_offset: int,
                    batch: Callable[[BatchHeader], bytes | memoryview]) -> None:
        """Feed the producer and transaction tables a batch appended at `base_offset` (the
        leader's own or a follower's); `batch(header)` gives its bytes, asked only for a
        transaction marker. During a rebuild the run notes it too, for the rebuilt tables."""
        if header.producer_id < 0:
            return
        kind = marker_kind(header, batch)
        self._state.note(header, base_offset, kind)
        if self._rebuild is not None:
            self._rebuild.note(header, base_offset, kind)

    def _maybe_snapshot(self, last: BatchHeader, data: bytearray | memoryview) -> None:
        """After an append whose last batch is `last` (at its position in `data`): if the log
        rolled, save the tables as of its end (actors/producer_snapshot.py). Not while a
        rebuild runs: the tables are not exact until it is back. `last` was parsed before the
        log set its offset and epoch (a new leader's no-op, a produce) and before a
        LogAppendTime stamp changed its CRC: those come from the log and the bytes."""
        log_ = self._log
        assert log_ is not None
        if log_.active_base_offset == self._snapshot_base:
            return
        self._snapshot_base = log_.active_base_offset
        epoch = log_.last_epoch
        if self._rebuild is None and epoch is not None:
            end = log_.next_offset
            crc = read_header(data, last.position).crc
            boundary = Boundary(end - 1 - last.last_offset_delta, epoch, crc)
            self._snapshots.write(self._state.snapshot(end, boundary))

    # Produce ------------------------------------------------------------------------------

    def _produce(self, m: Produce) -> None:
        # Phase one is answered as the partition takes the message: from here its place in the
        # log is fixed (messages are handled one at a time). It runs after the append, in the
        # same turn: its caller may then reuse the bytes (an arena region).
        try:
            self._append(m)
        finally:
            if m.on_dispatched is not None:
                m.on_dispatched()

    def _append(self, m: Produce) -> None:
        log_ = self._log
        if log_ is None or self._failed is not None:
            self._answer(m, ProduceResult(self._failed or ErrorCode.NOT_LEADER_OR_FOLLOWER))
            return
        if self._replication is not None:
            refused = self._replication.refuse_append()
            if refused is not None:
                self._answer(m, ProduceResult(refused))
                return
        if m.acks == _ACKS_ALL and self._in_sync_count() < self.settings.min_insync_replicas:
            message = (f"{self._in_sync_count()} replica(s) in sync, fewer than "
                       f"min.insync.replicas={self.settings.min_insync_replicas}")
            log.debug("%s: acks=all produce refused: %s", self, message)
            self._answer(m, ProduceResult(ErrorCode.NOT_ENOUGH_REPLICAS, message=message))
            return
        first, last = m.headers[0], m.headers[-1]
        size = last.position + last.size - first.position
        guard = self._disk_space
        if guard is not None and not guard.admits(size):
            message = (f"free space on the data disk ({guard.free_bytes} bytes) is under "
                       f"storage_min_free_bytes ({guard.min_free_bytes})")
            self._answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=message))
            return
        limit = self.settings.max_message_bytes
        for header in m.headers:
            if header.size > limit:
                message = f"batch of {header.size} bytes is over max.message.bytes={limit}"
                self._answer(m, ProduceResult(ErrorCode.MESSAGE_TOO_LARGE, message=message))
                return
        if self.settings.compact:
            keyless = keyless_records(m.records, m.headers, f"{self.topic}-{self.index}")
            if keyless is not None:
                log.info("%s: produce refused: %s", self, keyless.message)
                self._answer(m, keyless)
                return
        duplicate = self._check_sequences(m)
        if duplicate is not None:
            return
        now = now_ms()
        append_time = -1
        if self.settings.log_append_time:
            append_time = now
            for header in m.headers:
                set_log_append_time(m.records, header, now)
        first_base = log_.next_offset
        try:
            result = log_.append(
                m.records, m.headers, self.leader_epoch, now)  # type: ignore[arg-type]
        except AppendFailed as e:
            self._append_failed(m, e)
            return
        except OSError as e:  # the undo failed too: the files cannot be trusted
            log.critical("%s: append failed and cannot be undone: %r; partition offline",
                         self, e)
            self.storage_failed()
            self._answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR))
            return
        if self._replication is not None:
            self._replication.proposed(result.base_offset,
                                       result.last_offset + 1 - result.base_offset)
        self._record_producers(m.records, m.headers, first_base)
        self._maybe_snapshot(m.headers[-1], m.records)
        self._unflushed_bytes += size
        if self._disk_space is not None:
            self._disk_space.appended(size)
        stats = self._stats
        if stats is not None:
            stats.produced_bytes += size
            stats.produced_records += result.last_offset + 1 - result.base_offset
        produced = ProduceResult(
            ErrorCode.NONE, result.base_offset, append_time, log_.log_start_offset
        )
        waiter = None if m.reply is None else _Waiter(m.reply, produced)
        self._carry_out(self._window.appended(result.last_offset, waiter, _acks(m.acks)))

    def _append_failed(self, m: Produce, failure: AppendFailed) -> None:
        """A segment write failed; the log undid the append: refuse it, take the next."""
        log.error("%s: append failed, undone: %s", self, failure.error)
        if failure.error.errno == errno.ENOSPC and self.services.disk_space is not None:
            self.services.disk_space.write_failed()  # refuse the rest until a look finds room
        metrics = self.services.metrics
        if metrics is not None:
            metrics.write_errors += 1
        message = f"write failed: {failure.error.strerror or failure.error}"
        self._answer(m, ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=message))

    def _check_sequences(self, m: Produce) -> bool | None:
        """Answer and return True if the request is a duplicate or out of order; else None."""
        for header in m.headers:
            if header.producer_id < 0 or header.is_control:
                continue  # a control batch here is a marker, checked by _write_txn_marker
            txn_error = self._txn_check(header)
            if txn_error is None and m.from_coordinator:
                txn_error = self._producers.check_epoch(header.producer_id,
                                                        header.producer_epoch)
                if txn_error is None:
                    continue
            if txn_error is not None:
                self._answer(m, ProduceResult(txn_error))
                return True
            check = self._producers.check(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.last_offset_delta,
            )
            if check.error is not None:
                log.debug("%s: producer %d: %s", self, header.producer_id, check.error.name)
                self._answer(m, ProduceResult(check.error))
                return True
            if check.duplicate is not None:
                # Already appended: answer with the original offset once that is durable.
                batch = check.duplicate
                result = ProduceResult(
                    ErrorCode.NONE, batch.first_offset, -1, self._log_start_offset()
                )
                if m.reply is not None:
                    waiter = _Waiter(m.reply, result)
                    self._carry_out(self._window.wait(batch.last_offset, waiter, _acks(m.acks)))
                return True
        return None

    def _txn_check(self, header: BatchHeader) -> ErrorCode | None:
        """A transactional batch needs room for its transaction; a plain batch of a producer
        whose transaction is open here is refused (Kafka's InvalidTxnStateException)."""
        producer_id = header.producer_id
        if header.is_transactional:
            if not self._txns.may_open(producer_id):
                log.warning("%s: %d transactions open, refusing producer %d's", self,
                            self._txns.open_count, producer_id)
                return ErrorCode.CONCURRENT_TRANSACTIONS
        elif self._txns.is_open(producer_id):
            return ErrorCode.INVALID_TXN_STATE
        return None

    def _record_producers(self, records: memoryview, headers: list[BatchHeader],
                          first_base: int) -> None:
        base = first_base
        for header in headers:
            self._note_batch(header, base, lambda h: records[h.position:h.position + h.size])
            base += header.last_offset_delta + 1

    def _write_txn_marker(self, m: WriteTxnMarker) -> None:
        """Append the COMMIT or ABORT marker through the produce path (acks=all: answered
        once committed). A producer epoch older than the producer's here, or a coordinator
        epoch older than its last marker's, is fenced (actors/producer_state.py)."""
        fenced = self._producers.check_marker(m.producer_id, m.producer_epoch,
                                              m.coordinator_epoch)
        if fenced is not None:
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
        def written(result: ProduceResult) -> None:
            if result.error == ErrorCode.NONE and self.topic == OFFSETS_TOPIC:
                coordinator = self.services.local_group_coordinator()
                marker = TxnOffsetsMarker(self.index, m.producer_id, m.commit,
                                          result.base_offset)
                try:
                    if coordinator is not None:
                        coordinator.tell(marker)
                except ActorDeadError:
                    pass  # the shard is stopping: the next load replays the marker
            m.reply(result.error)

        return written

    def _answer(self, m: Produce, result: ProduceResult) -> None:
        if m.reply is not None:
            m.reply(result)

    def _log_start_offset(self) -> int:
        return self._log.log_start_offset if self._log is not None else -1

    # Flush: the I/O of the ack window's decisions (actors/ack_window.py) -----------------

    def _carry_out(self, step: Step[_Waiter]) -> None:
        """Do what the window decided, in its order: publish, answer, start a flush."""
        if step.high_watermark is not None:
            self._publish()
        for waiter in step.acked:
            waiter.reply(waiter.result)
        for waiter in step.failed:  # their offsets were cut: never acknowledge them
            waiter.reply(ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR))
        if step.start_flush:
            self._start_flush()

    def _start_flush(self) -> None:
        if self._log is None or self._log.cut_pending:
            return  # a cut's end starts the flush it held back (cut_complete)
        ticket = self._log.flush_prepare()
        covers = self._window.flush_started()
        assert ticket is not None and ticket.offset == covers, (ticket, self._window)
        flushed_bytes, self._unflushed_bytes = self._unflushed_bytes, 0
        self._flush_term = self._log.term_at(ticket.offset - 1)

        def timed() -> float:
            started = time.monotonic()
            ticket.run()
            return time.monotonic() - started

        self.services.run_blocking(
            timed, lambda seconds, error: self._flush_returned(ticket, error, seconds,
                                                               flushed_bytes)
        )

    def _flush_returned(
        self, ticket: Any, error: BaseException | None, seconds: float, flushed_bytes: int
    ) -> None:
        """On the loop thread, as the I/O pool hands the flush back."""
        metrics = self.services.metrics
        if metrics is not None and error is None:
            metrics.fdatasync_latency.observe(seconds)
            metrics.flush_bytes.observe(flushed_bytes)
        try:
            self.actor_ref.tell(_FlushDone(ticket, error))
        except ActorDeadError:  # stopped while it ran: the log waited for it to close
            if self._log is not None:
                self._settle_ticket(ticket, error)
            self._close_log()

    def _settle_ticket(self, ticket: Any, error: BaseException | None) -> Step[_Waiter]:
        """Hand the returned ticket to the log, then to the window. A failed flush cuts the
        log back to its flushed offset, and the producer table with it."""
        assert self._log is not None
        if error is None:
            self._log.flush_complete(ticket)
            return self._window.flush_done(self._log.flushed_offset)
        written = self._log.written_offset
        try:
            self._log.flush_failed(ticket)
        except OSError as e:
            log.critical("%s: cannot cut the log back after a failed fdatasync: %r; "
                         "partition offline", self, e)
            self.storage_failed()
            return self._window.flush_failed()
        durable = self._log.next_offset
        self._producers.forget_from(durable)
        self._txns.forget_from(durable)
        self._snapshots.truncated(durable)
        if self._rebuild is not None:  # it reads what was cut: start it again
            self._rebuild_producer_state()
        self._unflushed_bytes = 0
        self._flush_failures += 1
        if self._flush_failures == 1:
            log.error("%s: fdatasync failed: %r; offsets %d..%d cut, their produces answered "
                      "KAFKA_STORAGE_ERROR", self, error, durable, written - 1)
        else:
            log.debug("%s: fdatasync failed again (%d in a row): %r", self,
                      self._flush_failures, error)
        step = self._window.flush_failed()
        assert self._window.written_offset == durable, (durable, self._window)
        if self._replication is not None:
            # The log is also the replica's Raft log, and its machine was told of appends now
            # cut: the replica leaves its group (it acknowledged nothing it had not flushed)
            # and takes no writes; a restart recovers the log and the leader repairs it.
            log.critical("%s: replica offline after a failed fdatasync until a restart", self)
            self._replication.stop()
            self.storage_failed()
        return step

    def _flush_done(self, m: _FlushDone) -> None:
        if self._log is None:
            return
        step = self._settle_ticket(m.ticket, m.error)
        if self._deleted is not None:  # its waiters were answered at the delete
            self._finish_delete()
            return
        metrics = self.services.metrics
        if m.error is not None and metrics is not None:
            metrics.fdatasync_errors += 1
        if m.error is None and self._flush_failures:
            log.warning("%s: fdatasync works again after %d failures", self,
                        self._flush_failures)
            self._flush_failures = 0
        if m.error is None and self._replication is not None:
            self._replication.flushed(self._log.flushed_offset - 1, self._flush_term)
        self._lifecycle.close_retired()
        self._carry_out(step)

    def _publish(self) -> None:
        """Tell the shard's watermark table (long polls, idle reads) what changed. A replica
        that does not lead has nothing to publish: reads go to it and are refused."""
        assert self._log is not None
        self._txns.committed(self.high_watermark)  # every replica's: markers below are final
        if not self._leading:
            self._withdraw()
            return
        hwm, start = self.high_watermark, self._log.log_start_offset
        # The last stable offset moves only with the high watermark (a marker counts once
        # it is committed), so a read_committed long poll waits on the same notices.
        at_end = ReadResult(ErrorCode.NONE, hwm, start, None, self._last_stable_offset())
        state = self._published = Published(hwm, start, self.leader_epoch, at_end)
        self.services.long_polls.publish((self.topic, self.index), state)

    def _withdraw(self) -> None:
        self.services.long_polls.withdraw((self.topic, self.index), self._published)
        self._published = None

    def _fail_waiters(self, error: ErrorCode) -> None:
        for waiter in self._window.fail_all():
            waiter.reply(ProduceResult(error))

    def _last_stable_offset(self) -> int:
        """Where read_committed reads stop (actors/txn_state.py). The markers below the high
        watermark are made final first: a rebuild after a cut does not move it."""
        assert self._log is not None
        hwm = self.high_watermark
        self._txns.committed(hwm)
        return self._txns.last_stable_offset(hwm, self._log.log_start_offset)

    # What the reads (actors/partition_reads.py) ask of their partition ------------------------

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def txns(self) -> TxnState:
        return self._txns

    @property
    def replicated(self) -> bool:
        return self._replication is not None

    def replica_ready(self) -> bool:
        """Not a replicated leader that has yet to commit its election-time log (KIP-207)."""
        return self._replication is None or self._replication.leader_ready()

    def _info(self, m: PartitionInfo) -> None:
        log_ = self._log
        assert log_ is not None
        m.reply(
            {
                "log_start_offset": log_.log_start_offset,
                "high_watermark": self.high_watermark,
                "next_offset": log_.next_offset,
                "written_offset": log_.written_offset,
                "flushed_offset": log_.flushed_offset,
                "producers": len(self._producers),
                "segments": len(log_.segment_base_offsets),
                "segments_removed": self._lifecycle.segments_removed,
                "cleans": self._lifecycle.cleans,
                "cleaner_checkpoint": log_.cleaner_checkpoint,
                "last_stable_offset": self._last_stable_offset(),
                "open_transactions": self._txns.open_count,
                "aborted_transactions": len(self._txns.aborted()),
                "leader_epoch": self.leader_epoch,
            }
        )

    # Replication (actors/partition_replication.py) ----------------------------------------

    def _raft_receive(self, m: RaftReceive) -> None:
        self.raft_input(m.messages)

    def raft_input(self, messages: list[Any]) -> None:
        """Raft messages from peers. The shard calls this on the loop as they arrive, without
        a message to this actor, as it ticks the Replica: the Replica takes its input at once
        and does its work in its own loop callback, never inside another message's handling
        (actors/replica.py)."""
        if self._replication is not None and self._log is not None:
            self._replication.receive(messages)

    def _raft_unreachable(self, m: RaftUnreachable) -> None:
        if self._replication is not None:
            self._replication.unreachable(m.peer)

    def _transfer_leadership(self, m: TransferLeadership) -> None:
        started = self._replication is not None and self._replication.transfer_leadership()
        m.reply(started)

    def written_offset(self) -> int:
        return self._window.written_offset

    def replicated_append(self, last_offset: int, headers: list[BatchHeader],
                          data: bytes | bytearray | memoryview) -> None:
        """The Replica wrote batches at the log's end (a follower's, or the leader's no-op;
        `headers` place them in `data`): producers and transactions recorded, the ack window
        told, a flush started."""
        view = memoryview(data)
        for header in headers:
            self._note_batch(header, header.base_offset,
                             lambda h: view[h.position:h.position + h.size])
            self._unflushed_bytes += header.size
        self._maybe_snapshot(headers[-1], view)
        self._carry_out(self._window.appended(last_offset))

    def follow_log_start(self, offset: int) -> None:
        """A follower takes its leader's log start (actors/log_lifecycle.py)."""
        self._lifecycle.follow_log_start(offset)

    def _in_sync_count(self) -> int:
        """The replicas in sync: a replicated leader's ISR, else this one copy."""
        return 1 if self._replication is None else len(self._replication.in_sync_replicas())

    def insync_moved(self, offset: int | None) -> None:
        """What min.insync.replicas replicas have flushed (None: only the commit is asked)."""
        if offset != self._window.insync_offset:
            self._carry_out(self._window.insync(offset))

    def in_sync_changed(self, in_sync: int) -> None:
        """The leader's in-sync replicas are now `in_sync` many (or min.insync.replicas
        changed): under min.insync.replicas, every acks=all produce still waiting is answered
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, as Kafka answers (its records may still commit: a
        retry of an idempotent producer then finds its offset)."""
        wanted = self.settings.min_insync_replicas
        if in_sync >= wanted:
            return
        failed = self._window.fail_acks(Acks.ALL)
        if failed:
            log.info("%s: %d replica(s) in sync, fewer than min.insync.replicas=%d: %d acks=all "
                     "produce(s) answered NOT_ENOUGH_REPLICAS_AFTER_APPEND", self, in_sync,
                     wanted, len(failed))
        for waiter in failed:
            waiter.reply(ProduceResult(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND))

    def quorum_committed(self, high_watermark: int) -> None:
        if high_watermark > self._window.committed_offset:
            self._carry_out(self._window.committed(high_watermark))

    def log_rewritten(self) -> None:
        """A cut or a reset changed what the log holds: producer state and the window follow.
        The tables are rebuilt off the loop (client messages wait for them); meanwhile they
        forget what was cut, so what is published stays close."""
        log_ = self._log
        assert log_ is not None
        end = log_.next_offset
        self._producers.forget_from(end)
        self._txns.forget_from(end)
        self._snapshots.truncated(end)
        self._snapshots.log_start_moved(log_.log_start_offset)  # a reset: every one goes
        self._rebuild_producer_state()
        self._carry_out(self._window.rewritten(end))

    def cut_complete(self) -> None:
        """A cut is durable: start the flush it held back, if one is wanted."""
        if self._window.flush_covers is None and self._window.flush_wanted:
            self._start_flush()

    def role_changed(self, leading: bool, term: int, was_leading: bool) -> None:
        self.leader_epoch = term
        self._leading = leading
        if was_leading and not leading:
            # Whether they commit is the next leader's to say (module docstring of
            # partition_replication): retriable, and an idempotent retry finds its offset.
            self._fail_waiters(ErrorCode.REQUEST_TIMED_OUT)
        if self._log is not None:
            self._publish()

    @property
    def leader_epoch_is_leader(self) -> bool:
        return self._leading and self._replication is not None

    @property
    def leads_in_cluster(self) -> bool:
        """Whether this is a cluster's partition and this replica leads it (a lone one does)."""
        return self._leading and (self._replication is not None or self._lone is not None)

    def raft_status(self) -> list[Any] | None:
        """For the shard's stats: [topic, index, role, leader, term, hwm, log end, followers,
        quiesced, in-sync replica nodes (a leader's), replica nodes, min.insync.replicas]."""
        if self._replication is None or self._log is None:
            return None
        role, leader, term, followers, quiesced, isr = self._replication.status()
        replicas = [node for node, _ in self._replication.replicas]
        return [self.topic, self.index, role, leader, term, self.high_watermark,
                self._log.next_offset, followers, quiesced, isr, replicas,
                self.settings.min_insync_replicas]

    # Topic changes ------------------------------------------------------------------------

    def _update_settings(self, m: UpdateSettings) -> None:
        """A topic setting changed (AlterConfigs): it holds from the next append, read and
        housekeeping pass on."""
        self.settings = m.settings
        if self._log is not None:
            self._log.set_config(self._log_config())
            if not self._starting:  # else the window is made from the settings at the start
                self._carry_out(self._window.set_write_caching(m.settings.write_caching))
            if self._replication is not None:
                self._replication.settings_changed()

    def _delete_records(self, m: DeleteRecords) -> None:
        if not self._leading:
            m.reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))
            return
        self._lifecycle.delete_records(m.offset, m.reply)

    def _delete(self, m: Delete) -> None:
        gone = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self._replication is not None:
            self._replication.stop()
            self._replication.forget()
        if self._lone is not None:
            self._lone.stop()
        self._fail_waiters(gone)
        self._refuse_held(gone)
        self._failed = gone  # produces still in the inbox are refused
        self._deleted = m.trash
        self._lifecycle.stop()
        if not self._log_in_io():
            self._finish_delete()
        # else _flush_done or _synced finishes it: the job holds the log's fds

    def _finish_delete(self) -> None:
        self._close_log()
        self.stop_now()


_ACKS_ALL = -1

# What waits while the partition starts or rebuilds its producer state (`_hold`).
_WAIT_FOR_STATE = frozenset({Produce, Read, ListOffset, EpochEndOffset, PartitionInfo,
                             DeleteRecords, WriteTxnMarker, TransferLeadership, Warmed})


def _refuse(message: Any, error: ErrorCode) -> None:
    """`refuse`, and a read back from the read pool is its own read refused."""
    refuse(message.message if isinstance(message, Warmed) else message, error)


def _acks(acks: int) -> Acks:
    """What a produce that gets an answer waits for (acks=0 waits for nothing)."""
    return Acks.LEADER if acks == 1 else Acks.ALL
