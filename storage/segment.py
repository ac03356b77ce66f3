"""One segment: a `.log` file of whole v2 batches plus its offset and time indexes.

A segment owns its file descriptors for its whole life (a `FileSlice` handed to a socket keeps
pointing at them), tracks how far it has been written (`size`, `next_offset`) and which of its
files hold data not yet handed to a flush ticket. It never syncs anything itself.

    00000000000000000100.log        batches with base offsets 100, 103, 110, ...
    00000000000000000100.index      (0, 0) (10, 4113) ...   relative offset -> position
    00000000000000000100.timeindex  (1700000000123, 3) ...  max timestamp -> relative offset

Lookup: `index.lookup(offset - base)` gives a position at or before the batch holding the
offset, then batch headers are read forward from there (at most ~index_interval_bytes).
With `nowait` (reads on a shard's loop) a header not in the page cache raises
`page_cache.NotCached` instead of waiting for the disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from storage import limits
from storage.appender import ChunkPool, DirectWriter
from storage.direct_read import ReadWindows, SegmentReader
from storage.index import OffsetIndex, TimeIndex
from storage.page_cache import read_nowait
from wire.record_batch import BatchHeader, read_header

__all__ = ["BatchInfo", "OpenFile", "Segment", "header_at_position", "segment_path"]


# A segment removed by retention or DeleteRecords waits under this suffix (Kafka's).
DELETED_SUFFIX = ".deleted"


class BatchInfo(NamedTuple):
    """What a segment needs to know about a batch it stores (base offset already assigned)."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int
    epoch: int = -1  # partitionLeaderEpoch (-1 where nobody needs it: recovery, compaction)


class OpenFile:
    """A file descriptor closed when its last holder lets go of it: the segment, and every
    `FileSlice` read from it. A response waiting in a connection's queue keeps its segment
    file open after retention or compaction removed the segment, so `sendfile` never meets
    a closed fd, nor a number the process has since reused for another file. CPython frees
    an object as its last reference goes, so the close is prompt."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:  # pragma: no cover - closed already at interpreter exit
            pass

    def __repr__(self) -> str:
        return f"OpenFile({self.fd})"


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:0{limits.segment_name_digits}d}{suffix}"


class Segment:
    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int,
                 open_indexes: bool = False) -> None:
        """`open_indexes`: create the index files now too (a segment made off the loop,
        storage/log.py's rolling ahead), not at the first flush that writes them."""
        self.base_offset = base_offset
        self.log_path = segment_path(directory, base_offset, ".log")
        self.index = OffsetIndex(segment_path(directory, base_offset, ".index"))
        self.time_index = TimeIndex(segment_path(directory, base_offset, ".timeindex"))
        if open_indexes:
            self.index.open()
            self.time_index.open()
        self.index_interval_bytes = index_interval_bytes
        self.file: OpenFile | None = OpenFile(
            os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644))
        self.fd = self.file.fd  # valid while `file` (or a FileSlice holding it) lives
        stat = os.fstat(self.fd)
        self.size = stat.st_size  # bytes of whole batches (recovery cuts the rest)
        self.inode = stat.st_ino  # tells this file from a later one at the same path
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.first_append_ms: int | None = None  # set by the first append since open
        self.roll_jitter_ms = 0  # rolls this much before segment.ms (segment.jitter.ms)
        self.dirty = False  # log bytes written since the last flush ticket took the fd
        self._bytes_since_index = 0
        # Direct mode (storage/appender.py): where appends go, and recent bytes are read
        # from; None in buffered mode, and for a segment that took no append since open.
        self.writer: DirectWriter | None = None
        # Direct mode, once served: reads of what `writer` does not hold, with O_DIRECT
        # (storage/direct_read.py); None before (recovery reads through the page cache).
        self.reader: SegmentReader | None = None

    def attach_writer(self, pool: ChunkPool) -> None:
        """From now on appends go through a DirectWriter (direct mode's active segment)."""
        if self.writer is None:
            self.writer = DirectWriter(pool, str(self.log_path), self.size, self.fd)

    def attach_reader(self, windows: ReadWindows) -> None:
        """From now on reads of what the writer does not hold use O_DIRECT (direct mode,
        once the log is served)."""
        if self.reader is None:
            self.reader = SegmentReader(windows, str(self.log_path))

    @property
    def file_end(self) -> int:
        """Where the bytes in the file end: the segment's size, or in direct mode what its
        writer has written (the rest is in memory only)."""
        return self.size if self.writer is None else self.writer.written

    def __repr__(self) -> str:
        return f"Segment({self.base_offset}..{self.next_offset}, {self.size} bytes)"

    @property
    def index_bytes(self) -> int:
        """Bytes of the larger index file, entries in memory included (segment.index.bytes)."""
        return max(len(self.index) * limits.offset_index_entry_bytes,
                   len(self.time_index) * limits.time_index_entry_bytes)

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    # Reading -------------------------------------------------------------------------------

    def header_at(self, position: int, nowait: bool = False) -> BatchHeader:
        assert 0 <= position < self.size, (self, position)
        size = limits.batch_header_bytes
        writer = self.writer
        if writer is not None and writer.holds(position):
            return header_at_position(read_header(writer.read(position, size)), position)
        reader = self.reader
        if reader is not None:
            if not reader.holds(position, size):
                miss = reader.miss(position, size, self.file_end)
                if nowait:
                    raise miss
                miss.warm()  # here and now: the headers after it come from the window too
            data = reader.read(position, size)
            return header_at_position(read_header(data), position)
        if nowait:
            data = read_nowait(self.fd, size, position, limits.cold_read_ahead_bytes)
        else:
            data = os.pread(self.fd, size, position)
        return header_at_position(read_header(data), position)

    def headers_from(self, position: int, nowait: bool = False) -> Iterator[BatchHeader]:
        while position < self.size:
            header = self.header_at(position, nowait)
            yield header
            position += header.size

    def find(self, offset: int, nowait: bool = False) -> BatchHeader | None:
        """The batch holding `offset`, else the first batch after it, else None."""
        _, position = self.index.lookup(offset - self.base_offset)
        for header in self.headers_from(position, nowait):
            if header.next_offset > offset:
                return header
        return None

    def end_position(self, start: int, max_bytes: int, max_offset: int,
                     nowait: bool = False) -> tuple[int, int]:
        """End of the run of whole batches from `start` that fit in max_bytes and end
        below max_offset (== start when not even the first batch fits), and the offset the
        run ends at: the base offset of the first batch left out."""
        limit = start + max_bytes
        if max_offset >= self.next_offset and limit >= self.size:
            # The tailing consumer's case: everything to the end fits.
            return self.size, self.next_offset
        _, position = self.index.last_entry_at_or_before(max_offset - self.base_offset, limit)
        # Every batch before an entry with base <= max_offset and position <= limit qualifies.
        position = max(position, start)
        while position < self.size:
            header = self.header_at(position, nowait)
            if header.last_offset >= max_offset or position + header.size > limit:
                return position, header.base_offset
            position += header.size
        return position, self.next_offset

    def offset_for_timestamp(
        self, timestamp_ms: int, nowait: bool = False, from_offset: int = 0
    ) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch whose max timestamp >= timestamp_ms
        and that holds an offset at or above `from_offset` (the log start: what DeleteRecords
        removed from a segment's head is not looked at)."""
        if self.is_empty or self.max_timestamp < timestamp_ms or from_offset >= self.next_offset:
            return None
        i = self.time_index.first_at_or_after(timestamp_ms)
        # Every batch up to entry i-1's batch has a max timestamp below the target.
        start_relative = self.time_index.values[i - 1] if i > 0 else 0
        start_relative = max(start_relative, from_offset - self.base_offset)
        _, position = self.index.lookup(start_relative)
        for header in self.headers_from(position, nowait):
            if header.max_timestamp >= timestamp_ms and header.next_offset > from_offset:
                return header.base_offset, header.max_timestamp
        if from_offset > self.base_offset:
            return None  # what had a later stamp lies below the log start
        raise AssertionError(f"{self}: max timestamp {self.max_timestamp} not found by scan")

    def max_data_timestamp(self, nowait: bool = False,
                           from_offset: int = 0) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first data batch (not a control batch) with
        the largest max timestamp here that holds an offset at or above `from_offset` (the
        log start), None if there is none. The batch `max_timestamp` names is one header
        read; only a segment whose latest stamp is a control batch's (a new term's
        LEADER_CHANGE opens its segment), or a batch below the log start, is scanned."""
        if self.max_timestamp < 0 or from_offset >= self.next_offset:
            return None
        header = self.find(self.offset_of_max_timestamp, nowait)
        if header is not None and not header.is_control and (
                header.max_timestamp == self.max_timestamp) and (  # else compaction took it
                header.next_offset > from_offset):
            return header.base_offset, header.max_timestamp
        best: tuple[int, int] | None = None
        _, position = self.index.lookup(max(0, from_offset - self.base_offset))
        for header in self.headers_from(position, nowait):
            if header.next_offset <= from_offset or header.is_control:
                continue
            if header.max_timestamp > (-1 if best is None else best[1]):
                best = header.base_offset, header.max_timestamp
        return best

    # Writing -------------------------------------------------------------------------------

    def append(self, data: memoryview, batches: list[BatchInfo], now_ms: int) -> None:
        """Write `data` (exactly the bytes of `batches`) at the end of the segment; if the
        write fails, the file is as it was and the error raised."""
        assert batches and sum(b.size for b in batches) == len(data), (self, batches)
        assert batches[0].base_offset >= self.next_offset, (self, batches[0])
        if self.writer is not None:
            self.writer.append(data)  # to memory: a flush ticket writes it
        else:
            self._pwrite(data)
        if self.first_append_ms is None:
            self.first_append_ms = now_ms
        position = self.size
        for batch in batches:
            self._index_batch(batch, position, write=True)
            position += batch.size
        self.size = position
        self.next_offset = batches[-1].last_offset + 1
        self.dirty = True

    def _pwrite(self, data: memoryview) -> None:
        try:
            _pwrite_all(self.fd, data, self.size)
        except OSError:
            # ENOSPC or EIO part way: whatever went in is cut, the file ends with the last
            # whole batch (a cut needs no free space). If the cut fails too, that raises.
            os.ftruncate(self.fd, self.size)
            raise

    def seal(self) -> None:
        """Record the final max timestamp in the time index: this segment takes no more appends."""
        if self.max_timestamp > self.time_index.last_timestamp:
            relative = self.offset_of_max_timestamp - self.base_offset
            self.time_index.append(self.max_timestamp, relative)
        if self.writer is not None:
            self.writer.sealed = True  # its last write cuts the file's padding

    def truncate(self, offset: int) -> None:
        """Drop every batch with base offset >= offset (a batch holding `offset` stays).
        The segment is the log's active one after it, sealed before or not."""
        if self.writer is not None:
            self.writer.reopen()
        header = self.find(offset)
        if header is None:
            return
        cut = header.position if header.base_offset >= offset else header.position + header.size
        if cut == self.size:
            return
        if self.writer is not None:
            self.writer.cut(cut)  # waits for a write of it in flight
        else:
            os.ftruncate(self.fd, cut)
        if self.reader is not None:
            self.reader.cut()
        self.size = cut
        self.dirty = True
        if cut == 0:
            self.first_append_ms = None
        self.index.truncate_from(offset - self.base_offset)
        self.time_index.truncate_from(offset - self.base_offset)
        ok = self.load_tail_state()
        assert ok, self

    def cut_fds(self) -> list[int]:
        """The fds a truncation changed, for a cut ticket: the log's and the open indexes'."""
        return [self.fd] + [fd for fd in (self.index.fd, self.time_index.fd) if fd is not None]

    def take_sync_fds(self, indexes: bool = True) -> list[int]:
        """Fds holding data written since the last call (for a flush ticket). Without
        `indexes` (the log's active segment) the index entries stay in memory, neither written
        nor synced: recovery rebuilds the tail segment's indexes from its batches whatever the
        files hold (storage/index.py)."""
        fds = []
        if indexes:
            fds = [fd for fd in (self.index.take_sync_fd(), self.time_index.take_sync_fd())
                   if fd]
        if self.dirty:
            self.dirty = False
            fds.append(self.fd)
        return fds

    def release_memory(self) -> None:
        """Direct mode: the writer's chunks go back to the shard's pool. On the loop, before
        a segment out of the log is closed on an I/O thread (the pool is the loop's)."""
        if self.writer is not None:
            self.writer.release_chunks()
        if self.reader is not None:
            self.reader.forget()

    def close(self) -> None:
        """Close the index fds and let go of the log fd (closed once no FileSlice holds it);
        in direct mode on the loop, or after `release_memory`."""
        self.index.close()
        self.time_index.close()
        if self.writer is not None:
            self.writer.release()
        if self.reader is not None:
            self.reader.close()
        self.file = None

    def delete(self) -> None:
        """Remove the files; the fds stay open until close (a FileSlice or a flush ticket in
        flight may still use them)."""
        self.log_path.unlink(missing_ok=True)
        self.index.delete()
        self.time_index.delete()

    def mark_deleted(self) -> None:
        """Rename the files to `<name>.deleted` (Kafka's marker): gone from the log, still
        on disk until `delete_marked` (file.delete.delay.ms later); start-up removes any
        left behind. The open fds follow the files."""
        self.index.deleted = self.time_index.deleted = True  # never write the old paths
        for path in (self.log_path, self.index.path, self.time_index.path):
            try:
                os.rename(path, f"{path}{DELETED_SUFFIX}")
            except FileNotFoundError:  # an index never written
                pass

    def delete_marked(self) -> None:
        for path in (self.log_path, self.index.path, self.time_index.path):
            Path(f"{path}{DELETED_SUFFIX}").unlink(missing_ok=True)

    # Recovery ------------------------------------------------------------------------------

    def load_tail_state(self) -> bool:
        """Derive next offset and max timestamp from the indexes plus a header scan from the
        last index entry to the end. False if that tail is not a clean chain of batches."""
        self.next_offset = self.base_offset
        self.max_timestamp = self.time_index.last_timestamp
        self.offset_of_max_timestamp = self.base_offset + (
            self.time_index.values[-1] if self.time_index else 0
        )
        relative, position = self.index.lookup(limits.relative_offset_max)
        if position >= self.size:
            return position == self.size == 0
        self._bytes_since_index = 0
        expected = self.base_offset + relative
        exact = True  # the batch at an index entry has exactly the entry's offset
        while position < self.size:
            if self.size - position < limits.batch_header_bytes:
                return False
            try:
                header = self.header_at(position)
            except ValueError:
                return False
            if position + header.size > self.size:
                return False
            if header.base_offset < expected or (exact and header.base_offset != expected):
                return False
            exact = False
            self._note_max_timestamp(header.base_offset, header.max_timestamp)
            self._bytes_since_index += header.size
            expected = header.next_offset
            position += header.size
        self.next_offset = expected
        return True

    def rebuild_indexes(self, batches: Iterable[BatchInfo], sealed: bool) -> int:
        """Replace both indexes (memory and files) with ones built from `batches`, which start
        at position 0 and follow each other; return where the last one ends. A sealed
        segment's time index ends with its max timestamp, as `seal()` leaves it."""
        for index in (self.index, self.time_index):
            del index.keys[:], index.values[:]
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        position = 0
        for batch in batches:
            self._index_batch(batch, position, write=False)
            position += batch.size
            self.next_offset = batch.last_offset + 1
        if sealed and self.max_timestamp > self.time_index.last_timestamp:
            self.time_index.keys.append(self.max_timestamp)
            self.time_index.values.append(self.offset_of_max_timestamp - self.base_offset)
        self.index.replace(self.index.keys, self.index.values)
        self.time_index.replace(self.time_index.keys, self.time_index.values)
        return position

    def _index_batch(self, batch: BatchInfo, position: int, write: bool) -> None:
        if position == 0 or self._bytes_since_index >= self.index_interval_bytes:
            relative = batch.base_offset - self.base_offset
            assert 0 <= relative <= limits.relative_offset_max, (self, batch)
            if self.max_timestamp > self.time_index.last_timestamp:
                max_relative = self.offset_of_max_timestamp - self.base_offset
                if write:
                    self.time_index.append(self.max_timestamp, max_relative)
                else:
                    self.time_index.keys.append(self.max_timestamp)
                    self.time_index.values.append(max_relative)
            if write:
                self.index.append(relative, position)
            else:
                self.index.keys.append(relative)
                self.index.values.append(position)
            self._bytes_since_index = 0
        self._bytes_since_index += batch.size
        self._note_max_timestamp(batch.base_offset, batch.max_timestamp)

    def _note_max_timestamp(self, base_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset


def header_at_position(h: BatchHeader, position: int) -> BatchHeader:
    """`h` as if read at `position` (dataclasses.replace costs 5 us, this 1)."""
    return BatchHeader(
        position, h.base_offset, h.batch_length, h.partition_leader_epoch, h.magic, h.crc,
        h.attributes, h.last_offset_delta, h.base_timestamp, h.max_timestamp, h.producer_id,
        h.producer_epoch, h.base_sequence, h.record_count)


def _pwrite_all(fd: int, data: memoryview, position: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], position + done)
