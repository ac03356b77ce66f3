"""A partition's log over time: retention, DeleteRecords, compaction, and removing what
they drop.

The `Partition` actor owns one `LogLifecycle` and hands it the work that moves the log's
start; every method runs on the shard's loop thread, in the partition's turn.

    every log_cleanup_interval_ms (a timer per partition, started at a random phase so a
    shard's partitions do not all look at once):
        storage.retention.deletable_prefix -> segments past retention.ms / retention.bytes,
        or below a log start DeleteRecords set -> DiskLog.remove_head (log start moves,
        published at once: fetches below it get OFFSET_OUT_OF_RANGE)
        -> I/O pool: the log-start checkpoint written (the new start and the epoch before it)
        -> read pool: rename the files to `.deleted`
        -> file.delete.delay.ms later, read pool: unlink, close
    DeleteRecords(offset): log start moved in memory (reads below it are out of range at
        once), then written to the partition's checkpoint on the I/O pool; answered once
        durable and, on a replicated partition's leader, once every live follower has taken
        it (actors/partition_replication.py, Kafka's low watermark).
    the leader's log start, on a follower (actors/raft/follower.py): moved and written as
        DeleteRecords does, with no one to answer.
    compaction (cleanup.policy has `compact`), on the same pass:
        storage.compaction.cleanable_range (below the last stable offset) -> due (dirty
        ratio, max lag, or a tombstone's delete horizon passed) -> the shard's cleaner
        thread: clean_log (throttled; aborted transactions' records removed; files swapped
        in crash-safe) -> DiskLog.replace_segments on the loop; the old segments
        close on the read pool once no flush holds them; the cleaner checkpoint is written
        on the I/O pool. While a clean runs, retention waits (both would touch the head).

Every move of the log start is written to the checkpoint with the epoch just below the new
start, and the files of removed segments go only once it is durable: a log reopened after a
crash knows that epoch, which Raft's log matching anchors on (a log whose first segment
starts at its start cannot tell it otherwise). One checkpoint write at a time; moves made
meanwhile share the next one, which writes the start as it is then.

Nothing here waits on the disk on the loop: renames, unlinks and closes of removed segments
run on the shard's read pool (they must not queue behind fdatasyncs, nor hold them up), and a
segment file still being sent by a connection stays open until that send lets go of it
(storage.segment.OpenFile).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from actors.partition_messages import DeleteRecordsReply
from storage.compaction import CleanerConfig, CleanResult, clean_log, cleanable_range
from storage.retention import deletable_prefix
from storage.segment import Segment
from wire.errors import ErrorCode

if TYPE_CHECKING:
    from actors.services import Services
    from actors.topic_config import TopicSettings
    from actors.txn_state import AbortedTxn
    from storage import DiskLog

__all__ = ["DeleteRecordsReply", "LifecycleHost", "LogLifecycle"]

log = logging.getLogger(__name__)

# What waits for the next log-start checkpoint write: its error (STOPPED: none was made).
AfterWrite = Callable[[BaseException | None], None]

HIGH_WATERMARK = -1  # DeleteRecords offset -1: up to the high watermark (Kafka)


class PartitionStopped(Exception):
    """The partition stopped (or its topic went) before the checkpoint could be written."""


STOPPED = PartitionStopped()


class LifecycleHost(Protocol):
    """What a LogLifecycle needs of its partition (actors/partition.py's Partition): its log,
    settings and services, its watermarks and transactions, a timer, and where to say that
    the log start moved or the disk failed."""

    services: Services
    settings: TopicSettings

    @property
    def high_watermark(self) -> int: ...
    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Any: ...
    def log_or_none(self) -> DiskLog | None: ...
    def now_ms(self) -> int: ...
    def log_start_moved(self) -> None: ...
    def log_start_replicated(self, offset: int, reply: DeleteRecordsReply) -> None: ...
    def producer_last_batches(self) -> set[int]: ...
    def aborted_transactions(self) -> list[AbortedTxn]: ...
    def last_stable_offset(self) -> int: ...
    def storage_failed(self) -> None: ...


class LogLifecycle:
    def __init__(self, partition: LifecycleHost) -> None:
        self._partition = partition
        self._timer: Any = None
        # Removed segments awaiting file.delete.delay.ms: timer -> the job that deletes them.
        self._disposals: dict[Any, Callable[[], None]] = {}
        self._stopped = False
        self._writing = False  # a log-start checkpoint write is out
        self._write_wanted = False  # the log start moved since the write out began
        self._after_write: list[AfterWrite] = []  # what waits for the next write
        self.segments_removed = 0  # for PartitionInfo and tests
        self._cleaning: threading.Event | None = None  # set to stop the clean running
        self._horizon_ms: int | None = None  # a tombstone's delete horizon: clean from then
        self.cleans = 0  # cleans completed, for PartitionInfo and tests

    # Housekeeping ---------------------------------------------------------------------------

    def start(self) -> None:
        interval_s = self._interval_s()
        self._schedule(random.uniform(0, interval_s))

    def stop(self) -> None:
        """The partition stops: timers go; removed segments still waiting for their delay
        are deleted and closed now (their fds would outlive the partition otherwise)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cleaning is not None:
            self._cleaning.set()  # the clean ends at its next read; its files stay whole
        disposals, self._disposals = self._disposals, {}
        for timer, delete_now in disposals.items():
            timer.cancel()
            delete_now()
        # A start moved just before: written all the same if the log is still here (the
        # write has its own handle on the directory), else what waits for it is told now.
        self._write_log_start()

    def _interval_s(self) -> float:
        return self._partition.services.settings.log_cleanup_interval_ms / 1000

    def _schedule(self, delay_s: float) -> None:
        self._timer = self._partition.call_later(delay_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._partition.log_or_none() is None:
            return
        try:
            self.housekeep()
        finally:
            self._schedule(self._interval_s())

    def housekeep(self, now_ms: int | None = None) -> int:
        """Remove the segments retention (or the log start) no longer keeps, and start a
        clean if one is due; how many segments went."""
        p = self._partition
        log_ = p.log_or_none()
        if log_ is None or self._cleaning is not None:
            return 0
        now = p.now_ms() if now_ms is None else now_ms
        removed = self._apply_retention(now)
        if p.settings.compact:
            self._maybe_clean(now)
        return removed

    def _apply_retention(self, now_ms: int) -> int:
        p = self._partition
        log_ = p.log_or_none()
        assert log_ is not None
        settings = p.settings
        count, reason = deletable_prefix(
            log_.summaries(), log_.log_start_offset, p.high_watermark, now_ms,
            settings.retention_ms, settings.retention_bytes, settings.delete,
        )
        count = log_.removable_head(count)
        if count == 0:
            return 0
        removed = log_.remove_head(count)
        self.segments_removed += count
        metrics = p.services.metrics
        if metrics is not None:
            metrics.lifecycle.segments_removed += count
            metrics.lifecycle.bytes_removed += sum(s.size for s in removed)
        log.info("%s: removing %d segment(s) up to offset %d (%s); log start now %d",
                 p, count, removed[-1].next_offset, _REASONS[reason], log_.log_start_offset)
        p.log_start_moved()
        p.services.segments_removed([str(s.log_path) for s in removed])
        delay_ms = settings.file_delete_delay_ms
        # The files go once the new start is written down (module docstring).
        self._persist_log_start(lambda _error: self._dispose(removed, delay_ms))
        return count

    def _dispose(self, segments: list[Segment], delay_ms: int) -> None:
        services = self._partition.services

        def mark() -> None:
            for segment in segments:
                segment.mark_deleted()

        def delete() -> None:
            for segment in segments:
                segment.delete_marked()
                segment.close()

        def delete_now() -> None:
            services.read_blocking(delete, deleted)

        def marked(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.error("%s: marking removed segments failed: %r", self._partition, error)
            if self._stopped:
                delete_now()
                return
            timer: Any = None

            def fire() -> None:
                self._disposals.pop(timer, None)
                delete_now()

            timer = self._partition.call_later(delay_ms / 1000, fire)
            self._disposals[timer] = delete_now

        def deleted(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.error("%s: deleting removed segments failed: %r", self._partition, error)

        services.read_blocking(mark, marked)

    def close_retired(self) -> None:
        """Close, on the read pool, the segments the log let go of (compaction, truncate)
        once no flush ticket holds their fds."""
        log_ = self._partition.log_or_none()
        segments = [] if log_ is None else log_.take_closable()
        if segments:
            self._partition.services.read_blocking(
                lambda: _close_all(segments), _log_error("closing old segments"))

    # Compaction -----------------------------------------------------------------------------

    def _cleaner_config(self) -> CleanerConfig:
        s = self._partition.settings
        return CleanerConfig(
            segment_bytes=s.segment_bytes, segment_index_bytes=s.segment_index_bytes,
            index_interval_bytes=s.index_interval_bytes,
            delete_retention_ms=s.delete_retention_ms,
            min_compaction_lag_ms=s.min_compaction_lag_ms,
            max_compaction_lag_ms=s.max_compaction_lag_ms,
            min_cleanable_dirty_ratio=s.min_cleanable_dirty_ratio,
        )

    def _maybe_clean(self, now_ms: int) -> None:
        p = self._partition
        log_ = p.log_or_none()
        assert log_ is not None and self._cleaning is None
        config = self._cleaner_config()
        # Below the last stable offset only (Kafka's first uncleanable offset): a record of a
        # transaction not yet decided never supersedes a committed one.
        span = cleanable_range(log_.summaries(), log_.log_start_offset, log_.cleaner_checkpoint,
                               p.last_stable_offset(), now_ms, config)
        horizon_passed = self._horizon_ms is not None and now_ms >= self._horizon_ms
        if not span.due and not horizon_passed:
            return
        segments = log_.sealed_segments(span.end_offset)
        if not segments:
            return
        stop = self._cleaning = threading.Event()
        last_batches = p.producer_last_batches()
        aborted = p.aborted_transactions()
        directory, first_dirty = log_.directory, span.first_dirty_offset

        def clean() -> CleanResult:
            return clean_log(directory, segments, first_dirty, now_ms, config, last_batches,
                             aborted=aborted, stop=stop)

        log.debug("%s: cleaning %d segment(s) below %d (dirty ratio %.2f%s)", p,
                  len(segments), span.end_offset, span.dirty_ratio,
                  ", forced" if span.forced else "")
        p.services.clean_blocking(clean, self._cleaned)

    def _cleaned(self, result: CleanResult | None, error: BaseException | None) -> None:
        """On the loop, as the cleaner thread hands the clean back."""
        self._cleaning = None
        p = self._partition
        log_ = p.log_or_none()
        if error is not None:
            # A swap failed past its commit point: the files no longer match the log's
            # segments. Recovery finishes the swap at the next start; until then the
            # partition takes no writes, as after a failed fdatasync.
            log.critical("%s: compaction failed after a swap committed: %r", p, error)
            p.storage_failed()
            return
        assert result is not None
        if log_ is None:  # stopped or deleted meanwhile: the files on disk are whole
            for segment in result.new_segments:
                segment.close()
            return
        log_.replace_segments(result.old_segments, result.new_segments)
        p.services.segments_removed([str(s.log_path) for s in result.old_segments])
        self.close_retired()
        self.cleans += 1
        metrics = p.services.metrics
        if metrics is not None:  # every pass reads; only some replace segments
            counts = metrics.lifecycle
            counts.cleans += 1 if result.old_segments else 0
            counts.clean_bytes_read += result.bytes_read
            counts.clean_bytes_written += result.bytes_written
            counts.clean_records_removed += result.records_removed
        self._horizon_ms = result.delete_horizon_ms
        if result.error is not None:
            log.warning("%s: compaction stopped early: %r", p, result.error)
        elif result.first_dirty_offset != log_.cleaner_checkpoint:
            p.services.run_blocking(log_.cleaner_checkpoint_writer(result.first_dirty_offset),
                                    _log_error("writing the cleaner checkpoint"))
        log.log(logging.INFO if result.old_segments else logging.DEBUG,
                "%s: compacted %d segment(s) into %d: %d of %d records removed, %.1f MB "
                 "read, %.1f MB written in %.2f s", p, len(result.old_segments),
                 len(result.new_segments), result.records_removed, result.records_read,
                 result.bytes_read / 1e6, result.bytes_written / 1e6, result.seconds)

    # DeleteRecords --------------------------------------------------------------------------

    def delete_records(self, offset: int, reply: DeleteRecordsReply) -> None:
        """Move the log start up to `offset` (-1: the high watermark), as Kafka's
        DeleteRecords: refused below 0 or above the high watermark, and on a topic whose
        cleanup.policy lacks `delete`."""
        p = self._partition
        log_ = p.log_or_none()
        if log_ is None:
            reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))
            return
        if not p.settings.delete:
            reply((ErrorCode.POLICY_VIOLATION, -1))
            return
        if offset == HIGH_WATERMARK:
            offset = p.high_watermark
        if not 0 <= offset <= p.high_watermark:
            reply((ErrorCode.OFFSET_OUT_OF_RANGE, -1))
            return
        if log_.advance_log_start(offset):
            p.log_start_moved()
        elif not self._writing:  # there already, and durable
            p.log_start_replicated(offset, reply)
            return

        def written(error: BaseException | None) -> None:
            if error is STOPPED:
                reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))
            elif error is not None:
                reply((ErrorCode.KAFKA_STORAGE_ERROR, -1))
            else:
                p.log_start_replicated(offset, reply)

        self._persist_log_start(written)

    def follow_log_start(self, offset: int) -> None:
        """A follower takes its leader's log start (actors/raft/follower.py): moved and
        written as DeleteRecords does, with no one to answer."""
        p = self._partition
        log_ = p.log_or_none()
        if log_ is None:
            return
        # Within the log, always: the writes before it in the Raft Ready are in it (a
        # failed fdatasync's cut is the one exception, and that replica takes no more).
        if log_.advance_log_start(min(offset, log_.next_offset)):
            p.log_start_moved()
            self._persist_log_start()

    def _persist_log_start(self, then: AfterWrite | None = None) -> None:
        """Write the log start to the checkpoint (module docstring); `then(error)` after."""
        if then is not None:
            self._after_write.append(then)
        self._write_wanted = True
        self._write_log_start()

    def _write_log_start(self) -> None:
        if self._writing or not self._write_wanted:
            return
        p = self._partition
        log_ = p.log_or_none()
        self._write_wanted = False
        waiting, self._after_write = self._after_write, []
        if log_ is None:  # stopped, or the topic went
            for then in waiting:
                then(STOPPED)
            return
        self._writing = True
        start = log_.log_start_offset

        def written(_result: Any, error: BaseException | None) -> None:
            self._writing = False
            if error is not None:
                log.error("%s: writing log start %d failed: %r", p, start, error)
            for then in waiting:
                then(error)
            if not self._stopped:
                self.housekeep()  # whole segments below the new start go now
            self._write_log_start()

        p.services.run_blocking(log_.log_start_writer(start), written)


def _close_all(segments: list[Segment]) -> None:
    for segment in segments:
        segment.close()


def _log_error(what: str) -> Callable[[Any, BaseException | None], None]:
    def done(_result: Any, error: BaseException | None) -> None:
        if error is not None:
            log.error("%s failed: %r", what, error)

    return done


_REASONS = {"start": "below the log start", "time": "retention.ms", "size": "retention.bytes"}
