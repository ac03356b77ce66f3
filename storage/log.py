"""The partition log: the `Log` interface the partition actor uses, and `DiskLog`.

A log is a list of segments; only the last (active) one takes appends. Three offsets say how
far data has come, and must stay ordered: flushed_offset <= written_offset <= next_offset.
In buffered mode `append` pwrites at once (written == next after it returns); durability comes
from a flush ticket whose blocking `run()` (fdatasync of every fd with unflushed data) the
caller runs on an I/O thread while appends continue:

    ticket = log.flush_prepare()     # actor: captures fds, ticket.offset = written_offset
    ticket.run()                     # I/O thread: os.fdatasync on the captured fds only
    log.flush_complete(ticket)       # actor: flushed_offset = ticket.offset

Opening recovers the directory (storage/recovery.py) and counts nothing as flushed: a kill -9
leaves unsynced bytes in the page cache, where recovery finds them whole, and a power loss
after the restart would still take them. Every segment file and the directory are handed to
the first flush ticket, which the caller runs (on its I/O pool) before it advertises
anything; only its `flush_complete` moves flushed_offset from the log start to the log end:

    log = DiskLog.open(d)            # recovered: flushed = start, written = next
    ticket = log.flush_prepare()     # every segment file, the directory and its parent
    ticket.run(); log.flush_complete(ticket)   # flushed = next

Offsets: batch i of an append gets base offset next_offset, then each batch starts right after
the previous batch's last offset. Example: next_offset 10, batches of 3 and 2 records ->
bases 10 and 13, AppendResult(base_offset=10, last_offset=14), next_offset 15.

Rolling ahead: a roll creates a segment's three files, and a file's creation is a journal
operation that can wait for a commit in progress (an fdatasync elsewhere): tens of ms seen
on a shard's loop. So the partition asks `roll_ahead` before an append whether it would roll
before its first batch; if so it gets a job that creates the next segment's files, runs it
on the I/O pool while its writes wait, and `install_segment`s the result, which the append
then goes to. A roll the check cannot foresee (a request larger than a segment) is made
inline, as before.

Epochs: a batch carries the leader epoch (Raft term) it was written in, and a batch whose epoch
differs from the active segment's last one rolls a new segment first, so every segment written
since holds one epoch. The log keeps an epoch cache (storage/epochs.py), where each epoch
begins: built on open from each segment's first and last batch headers (from all of them when
those two differ: a segment written before, or one a clean merged), then kept as batches come
and go. A follower's writes, `append_replicated`, `truncate_to` and `reset`, and the cut
tickets that make the last two durable are storage/replica.py's.

A flush that fails (an fdatasync raising EIO, or anything else) promises nothing about what
it covered: after a failed fdatasync the kernel may have dropped the dirty pages, and a later
fdatasync would succeed without them (fsyncgate). So `flush_failed` cuts the log back to
`flushed_offset`, the last offset a flush did make durable; the caller fails everything that
waited on the flush and rewinds what it derived from the cut batches:

    flushed 100, written 150, next 180; ticket(150) fails
    log.flush_failed(ticket)         # next = written = flushed = 100; bytes 100.. are gone

An append that fails (ENOSPC or EIO from a segment write) is undone the same way before it
raises `AppendFailed`: the files are cut back to the last whole batch before it, so a full
disk never leaves a torn batch behind, and the log takes appends again at once.

Reads return whole batches from one segment, starting with the batch that holds the offset.
DiskLog returns a FileSlice for os.sendfile; the slice's fd stays open until `close()`. A read
with `nowait` (a shard's loop) never waits on the disk: a header it needs or the slice it
would return that is not in the page cache raises `NotCached`, naming what to warm first
(storage/page_cache.py).
"""

from __future__ import annotations

import json
import logging
import os
import random
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from storage import limits
from storage.appender import ChunkPool, WriteJob
from storage.direct_read import DirectMiss
from storage.flush import FlushAccounting, FlushTicket
from storage.header_scan import HeaderScan
from storage.metadata_file import read_json, write_atomic_at
from storage.page_cache import NotCached, cached, no_readahead
from storage.partition_dir import FILE_NAME as PARTITION_METADATA
from storage.recovery import load_epochs, open_segments
from storage.replica import CutTicket, ReplicaAccounting, replicated_batches
from storage.retention import SegmentSummary
from storage.segment import BatchInfo, OpenFile, Segment
from wire.record_batch import BatchHeader, patch_base_offset

log = logging.getLogger("krill.storage")

__all__ = [
    "AppendFailed",
    "AppendResult",
    "DiskLog",
    "FileSlice",
    "FlushTicket",
    "Log",
    "LogConfig",
    "OffsetOutOfRange",
    "assign_offsets",
    "needs_roll",
]


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = limits.segment_bytes_default  # roll when the next batch would pass it
    segment_ms: int = limits.segment_ms_default  # roll when the first append is this old
    index_interval_bytes: int = limits.index_interval_bytes_default
    segment_jitter_ms: int = 0  # each segment rolls up to this much before segment_ms
    segment_index_bytes: int = limits.segment_index_bytes_default  # roll when an index is full

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= limits.segment_bytes_max:
            raise ValueError(
                f"segment_bytes {self.segment_bytes} outside 1..{limits.segment_bytes_max}")
        if self.segment_ms <= 0 or self.index_interval_bytes <= 0:
            raise ValueError("segment_ms and index_interval_bytes must be positive")
        if self.segment_jitter_ms < 0 or self.segment_index_bytes < limits.time_index_entry_bytes:
            raise ValueError("segment_jitter_ms must not be negative, segment_index_bytes must "
                             f"hold an entry ({limits.time_index_entry_bytes} bytes)")


@dataclass(frozen=True, slots=True)
class FileSlice:
    """A byte range of a segment file, to send with os.sendfile (`length` marks a region)."""

    fd: int
    position: int
    length: int
    # The segment file, so another shard process can open it and send the same bytes
    # (an fd means nothing outside the process that opened it).
    path: str = ""
    # Offsets the slice spans: its records, with control records and compacted gaps.
    records: int = 0
    # The file's inode: a deleted topic's segment and a new one at the same path differ.
    inode: int = 0
    # Keeps `fd` open while the slice lives, though its segment be removed meanwhile.
    file: OpenFile | None = None

    def read(self) -> bytes:
        data = os.pread(self.fd, self.length, self.position)
        assert len(data) == self.length, (self, len(data))
        return data


class OffsetOutOfRange(Exception):
    """A read below log_start_offset or above next_offset (Kafka OFFSET_OUT_OF_RANGE)."""


class AppendFailed(Exception):
    """A segment write failed (`error`: ENOSPC, EIO, ...); the log is as it was before the
    append, nothing of it on disk."""

    def __init__(self, error: OSError) -> None:
        super().__init__(f"append failed: {error}")
        self.error = error


class AppendResult(NamedTuple):
    base_offset: int  # first record of the first batch
    last_offset: int  # last record of the last batch
    max_timestamp: int
    offset_of_max_timestamp: int  # base offset of the batch holding it (batch granularity)


class Log(Protocol):
    log_start_offset: int
    next_offset: int
    written_offset: int
    flushed_offset: int

    def append(
        self, records: bytearray, headers: list[BatchHeader], leader_epoch: int, now_ms: int
    ) -> AppendResult: ...
    def flush_prepare(self) -> FlushTicket | None: ...
    def flush_complete(self, ticket: FlushTicket) -> None: ...
    def flush(self) -> None: ...
    def read(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> FileSlice | memoryview | None: ...
    def read_bytes(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> bytes: ...
    def offset_for_timestamp(
        self, timestamp_ms: int, nowait: bool = False
    ) -> tuple[int, int] | None: ...
    def max_timestamp(self, nowait: bool = False) -> tuple[int, int] | None: ...
    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]: ...
    def truncate(self, offset: int) -> None: ...
    def close(self) -> None: ...
    @property
    def segment_base_offsets(self) -> list[int]: ...
    # Replication (storage/replica.py) and the epoch cache (storage/epochs.py)
    def append_replicated(
        self, records: bytearray, headers: list[BatchHeader], now_ms: int
    ) -> AppendResult: ...
    def truncate_to(self, next_offset: int) -> CutTicket: ...
    def reset(self, start_offset: int, epoch: int) -> CutTicket: ...
    def cut_complete(self, ticket: CutTicket) -> None: ...
    @property
    def cut_pending(self) -> bool: ...
    def epochs(self) -> list[tuple[int, int]]: ...
    def term_at(self, offset: int) -> int | None: ...
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...
    @property
    def last_epoch(self) -> int | None: ...
    @property
    def epoch_before_start(self) -> int | None: ...
    # A caller's own state beside the log (actors/replica_memberships.py)
    def state_writer(self, name: str, value: Any) -> Callable[[], None]: ...
    def read_state(self, name: str, default: Any = None) -> Any: ...
    # Rolling ahead, off the loop (module docstring)
    def roll_ahead(self, base_offset: int, last_offset: int, size: int, epoch: int,
                   now_ms: int) -> Callable[[], Segment] | None: ...
    def install_segment(self, segment: Segment) -> bool: ...


# In a partition directory: the log start offset wherever it moved (DeleteRecords, retention,
# a follower taking its leader's), with the epoch just below it (Kafka keeps the start in a
# log-start-offset-checkpoint file per data directory).
LOG_START_FILE = "log-start-offset.json"
# In a partition directory: the first offset compaction has not cleaned yet.
CLEANER_FILE = "cleaner-offset.json"


def assign_offsets(
    records: bytearray, headers: list[BatchHeader], leader_epoch: int, next_offset: int
) -> list[BatchInfo]:
    """Patch baseOffset and partitionLeaderEpoch of each batch in place, consecutively from
    next_offset; the batches must lie back to back in `records`."""
    assert headers, "append of no batches"
    batches: list[BatchInfo] = []
    position = headers[0].position
    for header in headers:
        assert header.position == position, (header, position)
        patch_base_offset(records, position, next_offset, leader_epoch)
        last_offset = next_offset + header.last_offset_delta
        batches.append(BatchInfo(next_offset, last_offset, header.max_timestamp, header.size,
                                 leader_epoch))
        next_offset = last_offset + 1
        position += header.size
    assert position <= len(records), (position, len(records))
    return batches


def needs_roll(
    config: LogConfig,
    segment_bytes: int,
    segment_base_offset: int,
    first_append_ms: int | None,
    batch: BatchInfo,
    now_ms: int,
    index_bytes: int = 0,
    jitter_ms: int = 0,
    last_epoch: int | None = None,
) -> bool:
    """Whether `batch` must go to a new segment (an empty segment never rolls): its epoch is
    not `last_epoch`, the segment's last batch's, it would pass segment.bytes or the
    relative-offset range, an index is full (`index_bytes`, the larger of the two index
    files, has no room for an entry: segment.index.bytes), or the segment's first append is
    segment.ms (less its jitter) old."""
    if segment_bytes == 0:
        return False
    if last_epoch is not None and batch.epoch != last_epoch:
        return True
    if segment_bytes + batch.size > config.segment_bytes:
        return True
    if batch.last_offset - segment_base_offset > limits.relative_offset_max:
        return True
    if index_bytes + limits.time_index_entry_bytes > config.segment_index_bytes:
        return True
    return (first_append_ms is not None
            and now_ms - first_append_ms >= config.segment_ms - jitter_ms)


def _unwritten(segment: Segment) -> tuple[int, bytes] | None:
    """Direct mode: where a segment's file ends for sure, and the bytes after it (in memory
    only), for a reader off the loop (storage/header_scan.py); None if the file has all."""
    writer = segment.writer
    if writer is None or writer.written >= writer.size:
        return None
    start = max(writer.written, writer.cache_start)
    return start, writer.read(start, writer.size - start)


def append_result(batches: list[BatchInfo]) -> AppendResult:
    best = max(batches, key=lambda b: b.max_timestamp)  # max() keeps the first of equals
    return AppendResult(batches[0].base_offset, batches[-1].last_offset, best.max_timestamp,
                        best.base_offset)


class DiskLog(FlushAccounting, ReplicaAccounting):
    """The segment log: in buffered mode page cache, os.pwrite and os.fdatasync in flush
    tickets; in direct mode (`chunks`, a shard's ChunkPool) appends go to memory and the
    flush tickets write them with O_DIRECT first (storage/appender.py)."""

    def __init__(self, directory: Path, config: LogConfig, segments: list[Segment],
                 chunks: ChunkPool | None = None) -> None:
        self.directory = directory
        self.config = config
        self.chunks = chunks
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        # Out of the log (truncate, compaction), not yet closed: `take_closable` hands them
        # over once no flush ticket holds their fds.
        self._retired: list[Segment] = []
        self._unsynced: set[Segment] = set()
        self._dir_fd = os.open(directory, os.O_RDONLY)
        self._dir_dirty = False  # segment files created or removed since the last ticket
        self._parent_dirty = False  # the directory's own entry is to be synced (after open)
        # The directory's partition.metadata (storage/partition_dir.py), written without an
        # fsync: open while the log is, and synced by the first ticket.
        self._metadata_fd: int | None = None
        self._metadata_dirty = False
        self._ticket: FlushTicket | None = None
        self._ticket_segments: set[Segment] = set()  # whose fds the ticket out syncs
        self._truncated_to: int | None = None  # lowest truncation while a ticket is out
        self.next_offset = self.written_offset = segments[-1].next_offset
        # DeleteRecords may have moved the start inside the first segment (its checkpoint);
        # a reset records the epoch before the start with it.
        saved = read_json(directory / LOG_START_FILE, {})
        saved_start = saved.get("log_start_offset", 0)
        self.log_start_offset = min(max(segments[0].base_offset, saved_start), self.next_offset)
        self._recovery_unsynced(segments)
        self._epochs = load_epochs(segments, self.log_start_offset, self.next_offset)
        if self._epochs.epoch_before_start is None and saved_start == self.log_start_offset:
            self._epochs.epoch_before_start = saved.get("epoch_before_start")
        self._cut: CutTicket | None = None  # a truncate_to or reset not yet durable
        # Where compaction's dirty part starts (Kafka's cleaner-offset-checkpoint).
        self.cleaner_checkpoint = read_json(directory / CLEANER_FILE, {}).get("offset", 0)
        self._closed = False
        self._serving = False  # reads come from a shard's loop: no kernel readahead
        self._activate()

    @classmethod
    def open(cls, directory: str | Path, config: LogConfig = LogConfig(),  # noqa: B008
             chunks: ChunkPool | None = None) -> DiskLog:
        """Open (creating or recovering) the log in `directory`. What recovery kept is not yet
        counted as flushed: the first flush ticket syncs it (see `_recovery_unsynced`).
        `chunks`: direct mode, with the shard's write memory (storage/appender.py)."""
        directory = Path(directory)
        return cls(directory, config, open_segments(directory, config.index_interval_bytes),
                   chunks)

    def _activate(self) -> None:
        """In direct mode the active segment appends through a DirectWriter."""
        if self.chunks is not None:
            self._segments[-1].attach_writer(self.chunks)

    def _recovery_unsynced(self, segments: list[Segment]) -> None:
        """A kill -9 leaves what its process wrote in the page cache, where recovery finds it
        whole and keeps it; a power loss after the restart would still take it. No file says
        which bytes an fdatasync covered, so every segment counts as unsynced (an fdatasync
        of a clean file costs little) and so does the directory, with its parent, where the
        partition's own directory entry is: flushed_offset stays at the log start until the
        first flush ticket, which syncs them all, completes. The indexes are left out: they
        are hints that recovery rebuilds when they disagree with the log. The directory's
        partition.metadata (storage/partition_dir.py, written without an fsync on the loop) is
        synced by that ticket too, so no flushed offset ever precedes it."""
        self.flushed_offset = self.log_start_offset
        for segment in segments:
            segment.dirty = True
            self._unsynced.add(segment)
        self._dir_dirty = True
        self._parent_dirty = True
        try:
            self._metadata_fd = os.open(self.directory / PARTITION_METADATA, os.O_RDONLY)
            self._metadata_dirty = True
        except FileNotFoundError:
            self._metadata_fd = None

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def active_base_offset(self) -> int:
        """The active segment's base offset: it changes when the log rolls."""
        return self._bases[-1]

    def header_scan(self, end_offset: int) -> HeaderScan:
        """The log's batch headers below `end_offset`, to read off the loop while the log
        goes on (storage/header_scan.py)."""
        return HeaderScan([(s, s.file, _unwritten(s)) for s in self._segments],
                          self.log_start_offset, end_offset)

    def directory_fd(self) -> int:
        """A handle of the caller's own on this log's directory, for a job off the loop (the
        caller closes it): a topic deleted or made again meanwhile is not touched."""
        return os.dup(self._dir_fd)

    def _check_offsets(self) -> None:
        assert self.flushed_offset <= self.written_offset <= self.next_offset, self
        assert self.next_offset == self._segments[-1].next_offset, (self, self._segments[-1])

    def __repr__(self) -> str:
        return (f"DiskLog({self.directory}, start={self.log_start_offset}, "
                f"flushed={self.flushed_offset}, written={self.written_offset}, "
                f"next={self.next_offset}, segments={len(self._segments)})")

    # Appending -----------------------------------------------------------------------------

    def append(
        self, records: bytearray, headers: list[BatchHeader], leader_epoch: int, now_ms: int
    ) -> AppendResult:
        """The leader's append: each batch gets its offset and `leader_epoch` here."""
        assert not self._closed
        self._check_no_cut()
        batches = assign_offsets(records, headers, leader_epoch, self.next_offset)
        return self._append(records, headers[0].position, batches, now_ms)

    def append_replicated(
        self, records: bytearray, headers: list[BatchHeader], now_ms: int
    ) -> AppendResult:
        """A follower's append of the leader's batches, offsets and epochs as they are; they
        must continue the log (else NotContiguous, nothing written). A log that holds no
        batch takes a first one that holds its start: its segment restarts at the batch's
        base offset, the start staying (storage/replica.py)."""
        assert not self._closed
        self._check_no_cut()
        base = self._replicated_base(headers[0])
        batches = replicated_batches(headers, base, self._epochs.last_epoch)
        if base == self.next_offset:
            return self._append(records, headers[0].position, batches, now_ms)
        self._start_afresh(base)
        try:
            return self._append(records, headers[0].position, batches, now_ms)
        finally:
            if self.next_offset < self.log_start_offset:  # it failed: empty at the start again
                self._start_afresh(self.log_start_offset)

    def _holds_no_batch(self) -> bool:
        return len(self._segments) == 1 and self._segments[0].is_empty

    def _append(
        self, records: bytearray, start: int, batches: list[BatchInfo], now_ms: int
    ) -> AppendResult:
        self._check_offsets()
        first_offset = self.next_offset
        try:
            self._write_batches(memoryview(records), start, batches, now_ms)
        except OSError as e:
            self._undo_append(first_offset)  # OSError if even the cut fails
            raise AppendFailed(e) from e
        for batch in batches:  # a follower's first batch may hold the start (append_replicated)
            self._epochs.append(batch.epoch, max(batch.base_offset, self.log_start_offset))
        self.next_offset = self.written_offset = batches[-1].last_offset + 1
        self._check_offsets()
        return append_result(batches)

    def _write_batches(
        self, view: memoryview, start: int, batches: list[BatchInfo], now_ms: int
    ) -> None:
        group: list[BatchInfo] = []  # batches for the active segment, written in one pwrite
        group_bytes = 0
        # The active segment's last batch's epoch (the log's last, if the segment has any).
        last_epoch = None if self._segments[-1].is_empty else self._epochs.last_epoch
        for batch in batches:
            active = self._segments[-1]
            if needs_roll(self.config, active.size + group_bytes, active.base_offset,
                          active.first_append_ms, batch, now_ms, active.index_bytes,
                          active.roll_jitter_ms, last_epoch):
                start = self._write(view, start, group, now_ms)
                group, group_bytes = [], 0
                self._roll(batch.base_offset)
            group.append(batch)
            group_bytes += batch.size
            last_epoch = batch.epoch
        self._write(view, start, group, now_ms)

    def _undo_append(self, offset: int) -> None:
        """An append from `offset` failed part way: the groups written before the failure
        (and a segment rolled for them) go; the failed write cut its own bytes already."""
        self.next_offset = self.written_offset = self._segments[-1].next_offset
        self.truncate(offset)
        self._drop_segments_from(offset)  # one rolled for the append, still empty
        self._check_offsets()

    def _write(self, view: memoryview, start: int, group: list[BatchInfo], now_ms: int) -> int:
        if not group:
            return start
        end = start + sum(b.size for b in group)
        active = self._segments[-1]
        active.append(view[start:end], group, now_ms)
        self._unsynced.add(active)
        return end

    def serve(self) -> None:
        """From now on reads come from a shard's loop, with `nowait`: no kernel readahead
        on the segment files (storage/page_cache.py `no_readahead`). Start-up scans before
        this (recovery, rebuilding producer state) keep it: they read whole files in order."""
        self._serving = True
        for segment in self._segments:
            self._serve_segment(segment)

    def _serve_segment(self, segment: Segment) -> None:
        """`segment` is read from the loop from now on: through the page cache without the
        kernel's readahead, or in direct mode with O_DIRECT (storage/direct_read.py)."""
        no_readahead(segment.fd)
        if self.chunks is not None:
            segment.attach_reader(self.chunks.reads)

    def roll_ahead(self, base_offset: int, last_offset: int, size: int, epoch: int,
                   now_ms: int) -> Callable[[], Segment] | None:
        """Whether an append of `size` bytes, offsets `base_offset`..`last_offset` in
        `epoch`, would roll before its first batch: then the job that creates the new
        segment's files (for the I/O pool), else None (module docstring)."""
        active = self._segments[-1]
        if self._closed or active.is_empty or base_offset != self.next_offset:
            return None
        whole = BatchInfo(base_offset, last_offset, -1, size, epoch)
        if not needs_roll(self.config, active.size, active.base_offset, active.first_append_ms,
                          whole, now_ms, active.index_bytes, active.roll_jitter_ms,
                          self._epochs.last_epoch):
            return None
        directory, interval = self.directory, self.config.index_interval_bytes
        return lambda: Segment(directory, base_offset, interval, open_indexes=True)

    def install_segment(self, segment: Segment) -> bool:
        """Roll to `segment`, made by `roll_ahead`'s job; False (and its files gone) if the
        log moved meanwhile (a cut, a failed flush), so that it no longer continues it."""
        active = self._segments[-1]
        if (self._closed or self.cut_pending or segment.base_offset != self.next_offset
                or active.is_empty or segment.base_offset in self._bases):
            segment.close()
            if not self._closed and segment.base_offset not in self._bases:
                segment.delete()
            return False
        self._roll(segment.base_offset, segment)
        return True

    def _roll(self, base_offset: int, segment: Segment | None = None) -> None:
        active = self._segments[-1]
        assert base_offset == active.next_offset, (active, base_offset)
        active.seal()
        self._unsynced.add(active)
        if segment is None:  # not rolled ahead: its files are made here, on the caller
            segment = Segment(self.directory, base_offset, self.config.index_interval_bytes)
        if self.config.segment_jitter_ms:
            segment.roll_jitter_ms = random.randrange(self.config.segment_jitter_ms)
        if self._serving:
            self._serve_segment(segment)
        self._segments.append(segment)
        self._bases.append(base_offset)
        self._dir_dirty = True
        self._activate()

    def set_config(self, config: LogConfig) -> None:
        """A topic setting changed: the next append rolls (and indexes) by the new values."""
        self.config = config
        self._segments[-1].index_interval_bytes = config.index_interval_bytes

    # Flushing ------------------------------------------------------------------------------

    def flush_prepare(self) -> FlushTicket | None:
        self._check_offsets()
        assert self._ticket is None, "one flush ticket at a time"
        if self.flushed_offset == self.written_offset:
            return None
        active = self._segments[-1]  # its indexes wait for its seal (storage/index.py)
        fds = [fd for segment in self._unsynced
               for fd in segment.take_sync_fds(indexes=segment is not active)]
        writes: list[WriteJob] = []
        if self.chunks is not None:  # oldest first: a flushed offset never skips a segment
            for segment in sorted(self._unsynced, key=lambda s: s.base_offset):
                job = segment.writer.take_write() if segment.writer is not None else None
                if job is not None:
                    writes.append(job)
        self._ticket_segments = set(self._unsynced)
        self._unsynced.clear()
        if self._dir_dirty:
            fds.append(self._dir_fd)
            self._dir_dirty = False
        parents = [self.directory.parent] if self._parent_dirty else []
        self._parent_dirty = False
        if self._metadata_dirty and self._metadata_fd is not None:
            fds.append(self._metadata_fd)
            self._metadata_dirty = False
        self._ticket = FlushTicket(self.written_offset, fds, parents, writes)
        self._truncated_to = None
        return self._ticket

    def _ticket_failed(self) -> None:
        kept = set(self._segments)  # retired ones are closed once no ticket holds them
        for segment in self._ticket_segments & kept:  # what the cut leaves is synced again
            segment.dirty = True
            self._unsynced.add(segment)
        self._ticket_segments = set()
        self._dir_dirty = True
        self._parent_dirty = True  # in case the ticket was the first: rare, and costs little
        self._metadata_dirty = self._metadata_fd is not None

    # Reading -------------------------------------------------------------------------------

    def _check_range(self, offset: int) -> None:
        if not self.log_start_offset <= offset <= self.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} outside {self.log_start_offset}..{self.next_offset}")

    def _segment_index(self, offset: int) -> int:
        """Index of the segment holding `offset` (or the first one after it)."""
        i = max(bisect_right(self._bases, offset) - 1, 0)
        while i + 1 < len(self._segments) and self._segments[i].next_offset <= offset:
            i += 1
        return i

    def read(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> FileSlice | memoryview | None:
        self._check_range(offset)
        max_offset = min(max_offset, self.next_offset)
        if offset >= max_offset:
            return None
        segment = self._segments[self._segment_index(offset)]
        try:
            return self._read_segment(segment, offset, max_bytes, max_offset, nowait)
        except DirectMiss as miss:
            # One window for the whole read: from where its lookup's header scan begins (a
            # header past the window, or its batches, missed).
            _, scan_from = segment.index.lookup(offset - segment.base_offset)
            raise miss.from_(scan_from) from None

    def _read_segment(self, segment: Segment, offset: int, max_bytes: int, max_offset: int,
                      nowait: bool) -> FileSlice | memoryview | None:
        first = segment.find(offset, nowait)
        if first is None or first.last_offset >= max_offset:
            return None
        writer = segment.writer
        if writer is not None and writer.holds(first.position):
            return self._read_held(segment, first, max_bytes, max_offset)
        if writer is not None:  # direct mode: from the file, up to what it holds
            max_bytes = min(max_bytes, writer.written - first.position)
            writer.pool.cache_misses += 1
        end, end_offset = segment.end_position(first.position, max_bytes, max_offset, nowait)
        if end == first.position:  # KIP-74: an oversized first batch goes out alone
            end, end_offset = first.position + first.size, first.next_offset
        length = end - first.position
        reader = segment.reader
        if reader is not None:  # direct mode, served: a copy from the read window
            if reader.holds(first.position, length):
                return memoryview(reader.read(first.position, length))
            if nowait:
                raise reader.miss(first.position, length, segment.file_end)
            return memoryview(reader.pread(first.position, length))
        if nowait and not cached(segment.fd, first.position, length):
            raise NotCached(segment.fd, first.position, length)
        records = end_offset - first.base_offset
        return FileSlice(segment.fd, first.position, length, str(segment.log_path), records,
                         segment.inode, segment.file)

    def _read_held(self, segment: Segment, first: BatchHeader, max_bytes: int,
                   max_offset: int) -> memoryview:
        """Direct mode: whole batches from `first` that the segment's writer holds in
        memory (a copy: the chunks are reused once evicted)."""
        writer = segment.writer
        assert writer is not None
        end, _ = segment.end_position(first.position, max_bytes, max_offset)
        if end == first.position:  # KIP-74, as `read`
            end = first.position + first.size
        writer.pool.cache_hits += 1
        return memoryview(writer.read(first.position, end - first.position))

    def read_bytes(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> bytes:
        region = self.read(offset, max_bytes, max_offset, nowait)
        if region is None:
            return b""
        return bytes(region) if isinstance(region, memoryview) else region.read()

    def offset_for_timestamp(
        self, timestamp_ms: int, nowait: bool = False
    ) -> tuple[int, int] | None:
        start = self.log_start_offset  # what DeleteRecords removed is not looked at
        for segment in self._segments:
            found = segment.offset_for_timestamp(timestamp_ms, nowait, start)
            if found is not None:
                return found
        return None

    def max_timestamp(self, nowait: bool = False) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first data batch with the largest max
        timestamp (ListOffsets MAX_TIMESTAMP: control batches name no record a consumer
        reads). Segments are looked at latest stamp first, until none can beat what was
        found: usually the first one answers."""
        best: tuple[int, int] | None = None
        by_stamp = sorted(self._segments, key=lambda s: -s.max_timestamp)  # stable: log order
        for segment in by_stamp:
            if segment.max_timestamp < (0 if best is None else best[1]):
                break
            found = segment.max_data_timestamp(nowait, self.log_start_offset)
            if found is not None and (best is None or found[1] > best[1]
                                      or found[1] == best[1] and found[0] < best[0]):
                best = found
        return best

    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers (positions within their segment file) from the batch holding from_offset."""
        from_offset = max(from_offset, self.log_start_offset)
        i = self._segment_index(from_offset)
        first = self._segments[i].find(from_offset)
        position = first.position if first is not None else self._segments[i].size
        yield from self._segments[i].headers_from(position)
        for segment in self._segments[i + 1:]:
            yield from segment.headers_from(0)

    # Retention and DeleteRecords ----------------------------------------------------------

    def summaries(self) -> list[SegmentSummary]:
        """Every segment, oldest first, the active one last (storage/retention.py)."""
        return [SegmentSummary(s.base_offset, s.next_offset, s.size, s.max_timestamp)
                for s in self._segments]

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def advance_log_start(self, offset: int) -> bool:
        """Move the log start up to `offset` (DeleteRecords, or a follower taking its
        leader's): reads below it are out of range at once; whole segments below it go at
        the next `remove_head`. The caller makes it durable with `log_start_writer`. False
        if it was there already."""
        assert offset <= self.next_offset, (self, offset)
        if offset <= self.log_start_offset:
            return False
        self._epochs.advance_start(offset, self.next_offset)
        self.log_start_offset = offset
        return True

    def log_start_writer(self, offset: int) -> Callable[[], None]:
        """A blocking job (for the I/O pool) that makes a log start moved by DeleteRecords
        or retention survive a crash, with the epoch just below it if that is known."""
        return self.state_writer(LOG_START_FILE, self._log_start_state(offset))

    def _log_start_state(self, offset: int) -> dict[str, int]:
        state = {"log_start_offset": offset}
        epoch = self._epochs.epoch_before_start
        if offset == self.log_start_offset and epoch is not None:
            state["epoch_before_start"] = epoch
        return state

    def read_state(self, name: str, default: Any = None) -> Any:
        """What `state_writer` last wrote as `name` (a read at start, off the serving path)."""
        return read_json(self.directory / name, default)

    def cleaner_checkpoint_writer(self, offset: int) -> Callable[[], None]:
        """A blocking job that records where compaction's dirty part now starts."""
        self.cleaner_checkpoint = offset
        return self.state_writer(CLEANER_FILE, {"offset": offset})

    def state_writer(self, name: str, value: Any) -> Callable[[], None]:
        """A blocking job that writes `value` as the JSON file `name` beside the segments,
        atomically and durably (a caller's own state: actors/replica_memberships.py). Written
        through a handle of our own on this log's directory: a topic deleted (its directory
        renamed away) or made again meanwhile is not touched."""
        dir_fd = os.dup(self._dir_fd)
        data = json.dumps(value).encode()

        def write() -> None:
            try:
                write_atomic_at(dir_fd, name, data)
            finally:
                os.close(dir_fd)

        return write

    def sealed_segments(self, end_offset: int) -> list[Segment]:
        """The closed segments wholly below `end_offset`, oldest first (what a clean takes)."""
        return [s for s in self._segments[:-1] if s.next_offset <= end_offset
                and (s.writer is None or s.writer.unwritten == 0)]  # direct: in the file

    def take_closable(self) -> list[Segment]:
        """Segments out of the log whose fds no flush ticket holds: the caller closes them
        (off the loop: the last close of a removed file frees its blocks)."""
        if not self._retired:
            return []
        closable = [s for s in self._retired if s not in self._ticket_segments]
        self._retired = [s for s in self._retired if s in self._ticket_segments]
        for segment in closable:
            segment.release_memory()  # here, on the loop: the pool is the loop's
        return closable

    def removable_head(self, count: int) -> int:
        """How many of the first `count` segments may leave now: closed, with nothing a
        flush has still to sync (a flush ticket out holds their fds)."""
        for i, segment in enumerate(self._segments[: min(count, len(self._segments) - 1)]):
            if segment in self._unsynced or segment in self._ticket_segments:
                return i
            if segment.dirty or segment.next_offset > self.flushed_offset:
                return i
        return min(count, len(self._segments) - 1)

    def remove_head(self, count: int) -> list[Segment]:
        """Take the first `count` segments out of the log (see `removable_head`); the log
        start moves to the first one left. The caller writes the new start down
        (`log_start_writer`: a log reopened at its first file would not know the epoch
        before it), then disposes of the files off the loop: `Segment.mark_deleted`, later
        `delete_marked` and `close`."""
        assert 0 <= count <= self.removable_head(count), (self, count)
        removed, self._segments = self._segments[:count], self._segments[count:]
        del self._bases[:count]
        if removed:
            start = max(self.log_start_offset, self._segments[0].base_offset)
            self._epochs.advance_start(start, self.next_offset)
            self.log_start_offset = start
            self._dir_dirty = True
        for segment in removed:
            segment.release_memory()  # here, on the loop: the pool is the loop's
        return removed

    # Truncation and closing ----------------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Drop every batch with base offset >= offset; next_offset becomes the end of the last
        batch kept (an offset at or below log_start_offset empties the log)."""
        self._check_offsets()
        if offset >= self.next_offset:
            return
        self._drop_segments_from(offset)
        active = self._segments[-1]
        active.truncate(offset)
        self._activate()
        self._unsynced.add(active)
        self.next_offset = self.written_offset = active.next_offset
        if self.next_offset < self.log_start_offset and self._holds_no_batch():
            # The batch that held the start went (a follower's first, its head below the
            # start: append_replicated): the log is empty at its start again.
            self._start_afresh(self.log_start_offset)
        self._epochs.truncate(self.next_offset)
        self._cap_flushed()

    def truncate_to(self, next_offset: int) -> CutTicket:
        """Cut a divergent tail: every batch at or after `next_offset`, a batch boundary
        between the log start and end (else NotBatchBoundary), goes, with the segments past
        it; the epoch cache and flushed_offset follow. The files are cut at once (ftruncate
        and unlink wait on no disk); the returned ticket's `run`, on the I/O pool, makes the
        cut durable, and no append is taken until `cut_complete` (storage/replica.py says
        why that keeps cut batches from coming back)."""
        assert not self._closed
        self._check_cut_point(next_offset)
        self.truncate(next_offset)
        active = self._segments[-1]
        self._cut = CutTicket(self.next_offset, active.cut_fds(), self._dir_fd)
        return self._cut

    def reset(self, start_offset: int, epoch: int) -> CutTicket:
        """Drop every segment and start an empty log at `start_offset` (log start and next
        offset), the offset before it of `epoch`: a follower taking the leader's log start
        (Raft's snapshot install). The files go at once; the ticket's `run` makes the reset
        durable (storage/replica.py), and no append is taken until `cut_complete`. The caller
        has stopped any clean of this log first (its segments go)."""
        assert not self._closed and start_offset >= 0
        assert self._cut is None, f"{self}: a reset while {self._cut} is out"
        self._check_offsets()
        self._start_afresh(start_offset)
        self.log_start_offset = start_offset
        self._epochs.reset(epoch)
        state = json.dumps(self._log_start_state(start_offset)).encode()
        self._cut = CutTicket(start_offset, [], self._dir_fd, (LOG_START_FILE, state))
        return self._cut

    def _start_afresh(self, base_offset: int) -> None:
        """Every segment goes; the log goes on from one empty segment at `base_offset`, with
        nothing in it to flush (the log start is the caller's to set)."""
        self._drop_segments_from(-1, keep_first=False)
        segment = Segment(self.directory, base_offset, self.config.index_interval_bytes)
        if self._serving:
            self._serve_segment(segment)
        self._segments, self._bases = [segment], [base_offset]
        self._activate()
        self.next_offset = self.written_offset = base_offset
        self._cap_flushed()  # and a flush ticket out covers none of the new segment
        self.flushed_offset = base_offset

    def _drop_segments_from(self, offset: int, keep_first: bool = True) -> None:
        """Remove the segments that start at or after `offset` (the first one stays, unless
        not `keep_first`)."""
        keep = 1 if keep_first else 0
        while len(self._segments) > keep and self._segments[-1].base_offset >= offset:
            segment = self._segments.pop()
            self._bases.pop()
            segment.delete()
            self._unsynced.discard(segment)
            self._retired.append(segment)
            self._dir_dirty = True

    def close(self) -> None:
        """Close every fd. No flush ticket may be outstanding (its fds would be closed)."""
        if self._closed:
            return
        assert self._ticket is None, "close() with a flush ticket outstanding"
        self._closed = True
        if self.chunks is not None:
            self._write_out()
        for segment in self._segments + self._retired:
            segment.close()
        os.close(self._dir_fd)
        if self._metadata_fd is not None:
            os.close(self._metadata_fd)

    def _write_out(self) -> None:
        """Direct mode's close: what is only in memory goes to the files (not synced), as a
        buffered log's appends are in the page cache when it closes, and the active file is
        cut to its size (nothing left for recovery to cut). Blocks: a stop, not a turn."""
        try:
            for segment in self._segments:
                writer = segment.writer
                job = writer.take_write() if writer is not None else None
                if writer is not None and job is not None:
                    job.run()
                    writer.wrote(job)
            active = self._segments[-1].writer
            if active is not None:
                active.trim()
        except OSError as e:  # what no flush covered is lost, as in a crash
            log.warning("%s: writing out at close failed: %s", self, e)

    # Compaction ----------------------------------------------------------------------------

    def replace_segments(self, old: list[Segment], new: list[Segment]) -> None:
        """Put the segments a clean wrote (storage/compaction.py, its files swapped in
        already) in place of the sealed ones they replace; appends went on meanwhile.

        Each new segment covers a run of consecutive old ones: from its base offset (the
        first one's) to its next offset (the last one's). Before: segments 0, 100, 200,
        300 (active); old [0, 100], new [0..200). After: 0 (the new one), 200, 300. The old
        objects retire: a FileSlice or flush ticket holding their fds stays valid until
        close(), and their indexes never write again (their paths are the new files')."""
        assert not self._closed
        if not old:
            assert not new, new
            return
        replaced = {id(segment) for segment in old}
        by_base = {segment.base_offset: segment for segment in new}
        assert len(replaced) == len(old) and len(by_base) == len(new), (old, new)
        segments: list[Segment] = []
        covering: Segment | None = None  # the new segment standing for the old ones now
        for segment in self._segments:
            if id(segment) not in replaced:
                segments.append(segment)
                continue
            assert segment is not self._segments[-1], "the active segment is never cleaned"
            if segment.base_offset in by_base:
                covering = by_base.pop(segment.base_offset)
                segments.append(covering)
                if self._serving:
                    self._serve_segment(covering)
            assert covering is not None and segment.next_offset <= covering.next_offset, (
                segment, covering)
            replaced.discard(id(segment))
            segment.index.deleted = segment.time_index.deleted = True
            self._unsynced.discard(segment)
            self._retired.append(segment)
        assert not replaced and not by_base, (old, new, self._segments)
        for before, after in zip(segments, segments[1:], strict=False):
            assert before.next_offset <= after.base_offset, (before, after)
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._check_offsets()

