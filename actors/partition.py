"""The Partition actor: owns one partition's log, and the order in which it is written, read
and advertised.

Every produce, fetch and offset lookup for a partition is a message to its actor, so the log
has exactly one owner and needs no lock. The actor keeps its mailbox, its log and the order of
steps; what it decides is in pieces it drives, each of which sees it through a Protocol:

    Appends       actors/partition_produce.py      a produce's or a marker's checks, append
    Flushes       actors/partition_flush.py        the ack window carried out: fdatasyncs,
                                                   answers, the recovery sync
    Producers     actors/partition_producers.py    producer and transaction state: noted,
                                                   saved, rebuilt off the loop
    HeldMessages  actors/partition_held.py         client messages held until it serves
    Reads         actors/partition_reads.py        Fetch, ListOffsets, OffsetForLeaderEpoch
    LogLifecycle  actors/log_lifecycle.py          retention, DeleteRecords, compaction
    Replication   actors/partition_replication.py  its Raft group (DESIGN.md §7)

Every move of the high watermark is published to the shard's watermark table
(`Services.long_polls.publish`, actors/watermarks.py), which wakes the long polls waiting on
it and answers reads at the high watermark of an idle partition without a message here.

Start: the directory is claimed for this topic id (storage/partition_dir.py: another
incarnation's goes to trash), the log opened (recovered) on the loop, then synced (the
recovery sync) while the producer state is rebuilt on the read pool. Until both are back it
advertises nothing: no high watermark, no Raft machine (which takes its starting log as synced
and would acknowledge it), no answer to a client (they are held). A failed rebuild (the log
cannot be read) leaves the partition offline, KAFKA_STORAGE_ERROR, until a restart.

A partition with more than one replica is a Raft group: its Replication drives the group's
Replica beside the log, the ack window takes its commit from Raft (QUORUM), followers append
the leader's batches through the same flush path and refuse clients NOT_LEADER_OR_FOLLOWER,
and the leader epoch is the term. A cluster's partition of replication factor 1 is a lone copy
that leads at epoch 0 and says so to the cluster (`LoneLeader`).

A `Read` with `committed` (read_committed) stops at the last stable offset (actors/
txn_state.py) and lists the aborted transactions that overlap what it could read. The
messages are in actors/partition_messages.py.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from actors.log_lifecycle import LogLifecycle
from actors.partition_flush import FlushDone, Flushes, Synced
from actors.partition_held import WAIT_FOR_STATE, WRITES, HeldMessages
from actors.partition_messages import (
    Delete,
    DeleteRecords,
    DeleteRecordsReply,
    EpochEndOffset,
    ListOffset,
    PartitionInfo,
    Produce,
    RaftReceive,
    RaftUnreachable,
    Read,
    ReadResult,
    TransferLeadership,
    UpdateReplicas,
    UpdateSettings,
    WriteTxnMarker,
    refuse,
)
from actors.partition_produce import Appends, SegmentMade
from actors.partition_producers import Producers, RebuildDone
from actors.partition_reads import Reads, Warmed
from actors.partition_replication import Address, GroupKey, LoneLeader, Replication
from actors.runtime import LoopActor
from actors.services import Services, now_ms
from actors.topic_config import TopicSettings
from actors.txn_state import AbortedTxn, TxnState
from actors.watermarks import Published
from storage import DiskLog, LogConfig
from storage.partition_dir import Claim, claim
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader

__all__ = ["Partition"]

log = logging.getLogger(__name__)


class _ReleaseHeld(NamedTuple):
    """Handle the next messages held while the partition started or rebuilt its state."""


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
        voters: tuple[Address, ...] | None = None,
        target: tuple[Address, ...] | None = None,
    ) -> None:
        """`topic_id`: the topic's id (its incarnation: storage/partition_dir.py);
        `replicas`: every replica's (node, shard) on a cluster; more than one make a Raft
        group (actors/partition_replication.py); () on a node of its own: the only copy.
        `voters`: the group's first membership (the replicas before a move under way: the
        log's own changes win); `target`: that move's target (actors/cluster/moves.py)."""
        super().__init__()
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.directory = directory
        self.settings = settings
        self.services = services
        self.leader_epoch = 0  # a lone copy's never moves; a replicated one's is the Raft term
        # Until the recovery sync and the first producer-state rebuild are back (on_start),
        # and while a rebuild after a cut runs, client messages wait (actors/partition_held.py).
        self._starting = True
        self._held = HeldMessages()
        self._offline = False  # a producer-state rebuild failed: refuse until a restart
        self._deleted: Path | None = None  # the directory to remove once no flush is out
        self._failed: ErrorCode | None = None
        self._log: DiskLog | None = None
        name = str(self)
        self._producer_state = Producers(self, name, self._directory_fd)
        self._flushes = Flushes(self, name, settings.write_caching)
        self._appends = Appends(self, name, self._producer_state, self._flushes)
        self._lifecycle = LogLifecycle(self)
        self._reads = Reads(self)
        raft = getattr(services, "raft", None)
        self._replication: Replication | None = None
        if len(replicas) > 1:
            assert raft is not None, f"{topic}-{index}: replicas {replicas} on a single node"
            self._replication = Replication(self, replicas, raft, self._flushes,
                                            voters or replicas, target)
        # A cluster's partition of replication factor 1: no Raft group, it leads, and says so
        # to every shard of the cluster, as a group's leader does (Metadata, coordinators).
        self._lone: LoneLeader | None = None
        if len(replicas) == 1:
            assert raft is not None, f"{topic}-{index}: replicas {replicas} on a single node"
            self._lone = LoneLeader(raft, GroupKey(topic, index, topic_id), replicas)
        self._leading = self._replication is None  # a lone copy always leads
        self._published: Published | None = None  # what this partition last published
        self._adopted = False  # its directory was made before topic ids (storage/partition_dir)
        self._handlers: dict[type, Callable[[Any], None]] = {
            Produce: self._appends.produce,
            Read: self._reads.read,
            ListOffset: self._reads.list_offset,
            EpochEndOffset: self._reads.epoch_end_offset,
            PartitionInfo: self._info,
            FlushDone: self._flushes.done,
            Warmed: self._reads.warmed,
            Delete: self._delete,
            UpdateSettings: self._update_settings,
            UpdateReplicas: self._update_replicas,
            DeleteRecords: self._delete_records,
            RaftReceive: lambda m: self.raft_input(m.messages),
            RaftUnreachable: self._raft_unreachable,
            TransferLeadership: self._transfer_leadership,
            WriteTxnMarker: self._appends.write_txn_marker,
            Synced: self._flushes.synced,
            RebuildDone: self._producer_state.rebuilt,
            _ReleaseHeld: self._release_held,
            SegmentMade: self._appends.segment_made,
        }

    def __str__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    @property
    def high_watermark(self) -> int:
        return self._flushes.window.high_watermark

    @property
    def _txns(self) -> TxnState:
        return self._producer_state.txns

    @property
    def disk_log(self) -> DiskLog | None:
        """The open log, also while a deleted topic's waits for its flush to close it."""
        return self._log

    @property
    def deleted(self) -> bool:
        return self._deleted is not None

    # Lifecycle ----------------------------------------------------------------------------

    def on_start(self) -> None:
        claimed = claim(self.directory, self.topic_id)
        self._adopted = claimed.claim is Claim.ADOPTED  # a directory from before topic ids
        if claimed.trash is not None:  # another incarnation's: never opened as ours
            trash = claimed.trash
            self.services.read_blocking(lambda: shutil.rmtree(trash, ignore_errors=True),
                                        lambda _r, _e: None)
        self._log = DiskLog.open(self.directory, self._log_config(), self.services.chunks)
        self._producer_state.opened(self._log)  # forgets the snapshots a power loss outlived
        self._flushes.start_recovery_sync()
        self._producer_state.rebuild()

    def maybe_started(self) -> None:
        log_ = self._log
        assert log_ is not None
        synced = self._flushes.recovery_synced and log_.flushed_offset == log_.next_offset
        if (self._starting and synced and not self._producer_state.rebuilding
                and not self._offline):
            self._started()

    def _started(self) -> None:
        """The log is synced and the producer state rebuilt: serve, replicate, advertise."""
        assert self._log is not None and self._log.flushed_offset == self._log.next_offset
        self._starting = False
        self._log.serve()  # reads come from the loop from here on
        self._flushes.open(self._log, self.settings.write_caching,
                           quorum=self._replication is not None)
        if self._replication is not None:
            self._replication.start(self._log, adopted=self._adopted)
        if self._lone is not None:
            self._lone.start()
        self.publish()
        self._lifecycle.start()
        self._release_held()

    def on_stop(self) -> None:
        self._lifecycle.stop()
        if self._replication is not None:
            self._replication.stop()
        if self._lone is not None:
            self._lone.stop()
        self._flushes.fail_waiters(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._held.refuse_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._withdraw()
        if not self._flushes.in_io:
            self.close_log()
        # else the flush or recovery sync in flight closes it when it returns

    def _directory_fd(self) -> int | None:
        return None if self._log is None else self._log.directory_fd()

    def close_log(self) -> None:
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
        if isinstance(message, FlushDone | Synced):
            self._flushes.dropped(message)  # on_stop left the log open for it
            return
        if isinstance(message, SegmentMade):
            if message.segment is not None:
                message.segment.close()  # its empty files stay: recovery takes them
            return
        # Told after the stop (its topic was deleted): the sender still waits for an answer,
        # and a cross-core producer holds the batch's arena region until phase one.
        refuse(message, ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            return super().on_receive(message)
        if type(message) in WAIT_FOR_STATE and self._waiting(message):
            self._held.hold(message, self._offline)
            return None
        return handler(message)

    # Messages held while the log is not ready to answer ------------------------------------

    def _waiting(self, message: Any) -> bool:
        """Whether a client message waits: the partition starts, rebuilds its producer state
        or is offline; a write waits too behind the messages held before it (a producer's
        batches keep their order), and while `_ready_for` says so."""
        if type(message) in WRITES and self._held:
            return True
        return self._offline or not self._ready_for(message)

    def _handle(self, message: Any) -> None:
        self._handlers[type(message)](message)

    def _serving(self) -> bool:
        return not self._starting and not self._producer_state.rebuilding

    def _ready_for(self, message: Any) -> bool:
        """Whether the partition may handle `message` now. A write waits while its log's
        next segment is made off the loop, once one was refused by this new leader's
        producer state until the leader settles, and while Raft's own writes wait for the
        log (a membership change's file: actors/replica.py) (actors/partition_produce.py)."""
        if not self._serving():
            return False
        if type(message) not in WRITES:
            return True
        appends = self._appends
        if appends.rolling:
            return False
        if appends.awaiting_settle:
            if self.settling():
                return False
            appends.awaiting_settle = False
        if appends.awaiting_log:
            if self.log_writes_waiting():
                return False
            appends.awaiting_log = False
        return True

    def settling(self) -> bool:
        """A replicated leader that has yet to commit an entry of its term (placing its
        no-op if it has none: actors/partition_replication.py)."""
        return self._replication is not None and self._replication.settling()

    def hold_first(self, message: Produce | WriteTxnMarker) -> None:
        """A write taken, to be taken again first: once the segment it waits for is made,
        or once this new leader settles."""
        self._held.hold_first(message)

    def retry_held(self) -> None:
        """Held writes look again (this new leader settled, or no longer leads: it refuses
        them), after this turn: a window step may be under way."""
        if self._held and self._serving():
            self.actor_ref.tell(_ReleaseHeld())

    def _release_held(self, _m: _ReleaseHeld | None = None) -> None:
        """Handle held messages in order, a turn's share at a time (the rest behind a
        `_ReleaseHeld` to itself, so other actors get the loop meanwhile)."""
        if self._held.release(self._handle, self._ready_for, lambda: self._offline):
            self.actor_ref.tell(_ReleaseHeld())

    def _log_config(self) -> LogConfig:
        s = self.settings
        return LogConfig(
            segment_bytes=s.segment_bytes, segment_ms=s.segment_ms,
            index_interval_bytes=s.index_interval_bytes, segment_jitter_ms=s.segment_jitter_ms,
            segment_index_bytes=s.segment_index_bytes,
        )

    # What the producer state (actors/partition_producers.py) tells its partition -----------

    def producer_state_rebuilt(self) -> None:
        if self._starting:
            self.maybe_started()
            return
        self.publish()  # the last stable offset may have moved
        self._release_held()

    def producer_state_lost(self) -> None:
        """The producer state cannot be known (its rebuild failed: the log cannot be read):
        answer KAFKA_STORAGE_ERROR until a restart, and leave the Raft group."""
        self._offline = True
        if self._replication is not None:
            self._replication.stop()
        self.storage_failed()
        self._held.refuse_all(ErrorCode.KAFKA_STORAGE_ERROR)
        if self._log is not None and not self._starting:
            self.services.long_polls.gone((self.topic, self.index))

    # What the appends (actors/partition_produce.py) ask of their partition -----------------

    def write_refused(self) -> ErrorCode | None:
        """Why this partition takes no write now, or None: it failed, is deleted or stopping,
        or is a replica that does not lead."""
        if self._log is None or self._failed is not None:
            return self._failed or ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None if self._replication is None else self._replication.refuse_append()

    def log_writes_waiting(self) -> bool:
        return self._replication is not None and self._replication.writes_waiting()

    def in_sync_count(self) -> int:
        """The replicas in sync: a replicated leader's ISR, else this one copy."""
        return 1 if self._replication is None else len(self._replication.in_sync_replicas())

    def proposed(self, base_offset: int, count: int, data: memoryview) -> None:
        if self._replication is not None:
            self._replication.proposed(base_offset, count, data)

    # What the flushes (actors/partition_flush.py) tell their partition ----------------------

    def publish(self) -> None:
        """Tell the shard's watermark table (long polls, idle reads) what changed. A replica
        that does not lead has nothing to publish: reads go to it and are refused."""
        assert self._log is not None
        self._txns.committed(self.high_watermark)  # every replica's: markers below are final
        self.retry_held()
        if not self._leading:
            self._withdraw()
            return
        hwm, start = self.high_watermark, self._log.log_start_offset
        # The last stable offset moves only with the high watermark (a marker counts once
        # it is committed), so a read_committed long poll waits on the same notices.
        at_end = ReadResult(ErrorCode.NONE, hwm, start, None, self.last_stable_offset())
        state = self._published = Published(hwm, start, self.leader_epoch, at_end)
        self.services.long_polls.publish((self.topic, self.index), state)

    def _withdraw(self) -> None:
        self.services.long_polls.withdraw((self.topic, self.index), self._published)
        self._published = None

    def log_cut_back(self, durable: int) -> None:
        """A failed fdatasync cut the log back to `durable`: the producer state follows."""
        self._producer_state.cut(durable)
        if self._producer_state.rebuilding:  # it reads what was cut: start it again
            self._producer_state.rebuild()
        if self._replication is not None:
            # The log is also the replica's Raft log, and its machine was told of appends now
            # cut: the replica leaves its group (it acknowledged nothing it had not flushed)
            # and takes no writes; a restart recovers the log and the leader repairs it.
            log.critical("%s: replica offline after a failed fdatasync until a restart", self)
            self._replication.stop()
            self.storage_failed()

    def flushed(self, ok: bool, term: int | None) -> None:
        """A flush is back (`ok`: it succeeded, up to a batch of `term`)."""
        if ok and self._replication is not None:
            assert self._log is not None
            self._replication.flushed(self._log.flushed_offset - 1, term)
        self._lifecycle.close_retired()

    def storage_failed(self) -> None:
        """The log's files and its state disagree: take no more writes (Kafka takes the log
        directory offline)."""
        self._failed = ErrorCode.KAFKA_STORAGE_ERROR
        self._flushes.fail_waiters(ErrorCode.KAFKA_STORAGE_ERROR)

    # What the log's lifecycle (actors/log_lifecycle.py) and the reads ask ------------------

    def log_or_none(self) -> DiskLog | None:
        """The open log; None once the partition is stopping or its topic is deleted."""
        return None if self._deleted is not None else self._log

    def now_ms(self) -> int:
        return now_ms()

    def log_start_moved(self) -> None:
        if self._log is not None:
            self._producer_state.log_start_moved(self._log.log_start_offset)
        if self._replication is not None and self._log is not None:
            self._replication.log_start_moved(self._log.log_start_offset)
        self.publish()

    def log_start_replicated(self, offset: int, reply: DeleteRecordsReply) -> None:
        """DeleteRecords moved the log start to `offset` and it is durable here: answer once
        every live replica's start has followed (a replicated partition's leader), else now."""
        if self._replication is not None:
            self._replication.answer_when_replicas_start_at(offset, reply)
        else:
            reply((ErrorCode.NONE, -1 if self._log is None else self._log.log_start_offset))

    def producer_last_batches(self) -> set[int]:
        return self._producer_state.producers.last_batch_offsets()

    def aborted_transactions(self) -> list[AbortedTxn]:
        """(producer id, first offset, ABORT marker offset) of each aborted transaction the
        log still holds: compaction removes their records."""
        return self._txns.aborted()

    def last_stable_offset(self) -> int:
        """Where read_committed reads stop (actors/txn_state.py). The markers below the high
        watermark are made final first: a rebuild after a cut does not move it."""
        assert self._log is not None
        hwm = self.high_watermark
        self._txns.committed(hwm)
        return self._txns.last_stable_offset(hwm, self._log.log_start_offset)

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
                "producers": len(self._producer_state.producers),
                "segments": len(log_.segment_base_offsets),
                "size_bytes": log_.size,
                "segments_removed": self._lifecycle.segments_removed,
                "cleans": self._lifecycle.cleans,
                "cleaner_checkpoint": log_.cleaner_checkpoint,
                "last_stable_offset": self.last_stable_offset(),
                "open_transactions": self._txns.open_count,
                "aborted_transactions": len(self._txns.aborted()),
                "leader_epoch": self.leader_epoch,
            }
        )

    # Replication (actors/partition_replication.py) ----------------------------------------

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

    def replicated_append(self, last_offset: int, headers: list[BatchHeader],
                          data: bytes | bytearray | memoryview) -> None:
        """The Replica wrote batches at the log's end (a follower's, or the leader's no-op;
        `headers` place them in `data`): producers and transactions recorded, the ack window
        told, a flush started."""
        view = memoryview(data)
        for header in headers:
            self._producer_state.note(header, header.base_offset,
                                      lambda h: view[h.position:h.position + h.size])
        self._producer_state.maybe_snapshot(headers[-1], view)
        self._flushes.appended(last_offset, sum(header.size for header in headers))

    def follow_log_start(self, offset: int) -> None:
        """A follower takes its leader's log start (actors/log_lifecycle.py)."""
        self._lifecycle.follow_log_start(offset)

    def log_rewritten(self) -> None:
        """A cut or a reset changed what the log holds: producer state and the window follow.
        The tables are rebuilt off the loop (client messages wait for them); meanwhile they
        forget what was cut, so what is published stays close."""
        log_ = self._log
        assert log_ is not None
        end = log_.next_offset
        self._producer_state.cut(end, log_.log_start_offset)  # a reset: every snapshot goes
        self._producer_state.rebuild()
        self._flushes.carry_out(self._flushes.window.rewritten(end))

    def role_changed(self, leading: bool, term: int, was_leading: bool) -> None:
        self.leader_epoch = term
        self._leading = leading
        if was_leading and not leading:
            # Whether they commit is the next leader's to say (module docstring of
            # partition_replication): retriable, and an idempotent retry finds its offset.
            self._flushes.fail_waiters(ErrorCode.REQUEST_TIMED_OUT)
        if self._log is not None:
            self.publish()

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

    def _update_replicas(self, m: UpdateReplicas) -> None:
        """The controller moved this partition's replicas, or completed a move of them."""
        if self._replication is not None:
            self._replication.reassign(m.replicas, m.target)

    def _update_settings(self, m: UpdateSettings) -> None:
        """A topic setting changed (AlterConfigs): it holds from the next append, read and
        housekeeping pass on."""
        self.settings = m.settings
        if self._log is not None:
            self._log.set_config(self._log_config())
            if not self._starting:  # else the window is made from the settings at the start
                flushes = self._flushes
                flushes.carry_out(flushes.window.set_write_caching(m.settings.write_caching))
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
        self._flushes.fail_waiters(gone)
        self._held.refuse_all(gone)
        self._failed = gone  # produces still in the inbox are refused
        self._deleted = m.trash
        self._lifecycle.stop()
        if not self._flushes.in_io:
            self.finish_delete()
        # else the flush or the recovery sync out finishes it: the job holds the log's fds

    def finish_delete(self) -> None:
        self.close_log()
        self.stop_now()

