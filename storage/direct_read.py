"""Direct-mode reads (`storage_mode: direct`) of what a segment's writer no longer holds:
O_DIRECT reads on the read pool into windows of our own, with a readahead of our own for
sequential readers; the page cache is not used for them.

Direct mode writes around the page cache (storage/appender.py), and recent bytes are read
from the writer's chunks. Older bytes (a consumer catching up, a follower far behind, a
segment from before a restart) were read through the page cache, which then filled with
file data nothing else wanted, and the kernel's readahead (off on served files:
storage/page_cache.py) was ours to steer only crudely. Here each served segment has a
`SegmentReader`:

    DiskLog.read(..., nowait=True)       loop: the range is in the segment's window? a copy
      -> DirectMiss(reader, position, n)  else: what to read, readahead included, and a
                                          buffer from the shard's free ones to read it into
    miss.warm()                          read pool: pread(O_DIRECT) of whole 4 KiB blocks
                                         into that buffer: the segment's new window
    DiskLog.read(...) again              loop: from the window

A window is one contiguous range of a segment's file, from a block boundary, held in memory
until the next miss of that segment replaces it or the shard's budget (`ReadWindows`, loop
thread) evicts it, least recently read first. It never reaches past what the file held when
the miss was met (`limit`: a direct-mode file's tail is padding until written), and a cut of
the segment drops it, and makes a fill begun before the cut make none (`generation`), so a
window never serves bytes that a truncation replaced.

Readahead: a miss at or just past the segment's window or last read (a sequential reader)
reads twice as far ahead as the last one did, up to `direct_read_ahead_max_bytes`; any other
miss starts again from `direct_read_ahead_min_bytes`. A read misses as a whole: the miss
starts where its lookup's header scan starts (DiskLog.read), so the retry finds its headers
and its batches in one window. The budget is counted on the loop, when a window is first
read: fills in flight (at most one per read-pool thread) may take it over by their size until
then.

Buffers: page-aligned (O_DIRECT wants it), in power-of-two sizes from the smallest readahead up
to `WINDOW_BYTES_MAX`, and used again: a fresh mapping costs ~0.4 ms of CPU per MiB here in
page faults, more than the read itself. Only the loop hands them out (at a miss) and takes them
back (a window replaced, evicted, cut or its segment gone), so a buffer is never written by a
fill while the loop copies from it: a window's bytes leave as a copy, never as a view.

Reads that may wait (not `nowait`): header scans on the loop (the Raft leader sizing a
far-behind follower's append, a cut's lookup) fill the window in place, one O_DIRECT read for
the headers that follow, as a buffered read would wait for the page cache; a batch read that
may wait (a ListOffsets that missed too often, tests) reads its bytes with O_DIRECT without
making a window. Recovery, producer-state rebuilding and compaction read before serving or
beside it, through the page cache, as in buffered mode.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict

from storage import limits
from storage.page_cache import NotCached

__all__ = ["DirectMiss", "ReadWindows", "SegmentReader"]

ALIGN = 4096  # O_DIRECT's alignment of buffer, position and length (storage/appender.py)
# Buffers are kept for use again up to this size (a larger read, rare, maps its own).
WINDOW_BYTES_MAX = 4 * limits.direct_read_ahead_max_bytes


def _align_down(n: int) -> int:
    return n - n % ALIGN


def _align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _buffer_bytes(size: int) -> int:
    """The buffer size class that holds `size` bytes."""
    return max(limits.direct_read_ahead_min_bytes, 1 << (size - 1).bit_length())


class Window:
    """A segment file's bytes from `start` (a block boundary): `view`, in `buffer`."""

    __slots__ = ("start", "view", "buffer")

    def __init__(self, start: int, view: memoryview, buffer: mmap.mmap) -> None:
        self.start = start
        self.view = view
        self.buffer = buffer

    @property
    def end(self) -> int:
        return self.start + len(self.view)


class ReadWindows:
    """A shard's read-window memory in direct mode: the windows of its segments, least
    recently read first, evicted past `budget_bytes`, and the buffers free for the next
    misses (held and free within the budget). Loop thread only."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0  # buffers of the windows counted here
        self.free_bytes = 0
        self._held: OrderedDict[SegmentReader, Window] = OrderedDict()
        self._free: dict[int, list[mmap.mmap]] = {}  # size -> buffers
        self.hits = 0  # reads served from a window
        self.fills = 0  # windows read in (misses warmed)
        self.fill_bytes = 0
        self.evictions = 0
        self.buffers_made = 0

    def buffer(self, size: int) -> mmap.mmap:
        """A page-aligned buffer of at least `size` bytes, for a miss to fill."""
        want = _buffer_bytes(size)
        free = self._free.get(want)
        if free:
            self.free_bytes -= want
            buffer = free.pop()
            if not free:
                del self._free[want]
            return buffer
        self.buffers_made += 1
        return mmap.mmap(-1, want)

    def give(self, buffer: mmap.mmap) -> None:
        """`buffer` is no window's any more: kept for the next miss while within budget."""
        size = len(buffer)
        if size <= WINDOW_BYTES_MAX and self.bytes + self.free_bytes + size <= self.budget_bytes:
            self._free.setdefault(size, []).append(buffer)
            self.free_bytes += size

    def read(self, reader: SegmentReader, window: Window) -> None:
        """`reader`'s `window` was read from: most recent now; others evicted past the
        budget (never the one being read), free buffers first."""
        self.hits += 1
        held = self._held.pop(reader, None)
        if held is not window:  # a window this budget has not counted yet
            self.fills += 1
            self.fill_bytes += len(window.view)
            self.bytes += len(window.buffer)
            if held is not None:
                self.bytes -= len(held.buffer)
                self.give(held.buffer)
        self._held[reader] = window
        while self.bytes + self.free_bytes > self.budget_bytes and self._free:
            size, buffers = next(iter(self._free.items()))
            buffers.pop()
            self.free_bytes -= size
            if not buffers:
                del self._free[size]
        while self.bytes > self.budget_bytes and len(self._held) > 1:
            oldest, oldest_window = next(iter(self._held.items()))
            del self._held[oldest]
            self.bytes -= len(oldest_window.buffer)
            oldest.drop_window(oldest_window)
            self.evictions += 1

    def forget(self, reader: SegmentReader) -> None:
        """`reader`'s window is no longer to be read (a cut, its segment left the log)."""
        window = self._held.pop(reader, None)
        if window is not None:
            self.bytes -= len(window.buffer)
            self.give(window.buffer)

    def stats(self) -> dict[str, int]:
        return {"window_bytes": self.bytes, "window_free_bytes": self.free_bytes,
                "window_hits": self.hits, "window_fills": self.fills,
                "window_fill_bytes": self.fill_bytes, "window_evictions": self.evictions,
                "window_buffers_made": self.buffers_made}


class DirectMiss(NotCached):
    """A read on the loop of bytes its segment's window lacks: `warm` reads them in."""

    def __init__(self, reader: SegmentReader, position: int, length: int, asked_end: int,
                 limit: int, ahead: int, generation: int) -> None:
        super().__init__(-1, position, length)
        self.reader = reader
        self.asked_end = asked_end  # the end of what the read asked for (length: readahead)
        self.limit = limit  # the end of what the file held
        self.ahead = ahead  # the readahead this miss chose: the reader's once warmed
        self.generation = generation  # the reader's, when the miss was met
        start = _align_down(position)
        self.buffer = reader.windows.buffer(_align_up(position + length) - start)
        self.args = (f"{reader.path}: {length} bytes at {position} not in its read window",)

    def warm(self) -> None:
        self.reader.fill(self)

    def from_(self, position: int) -> DirectMiss:
        """The same read, begun at `position` (below this one's), on the loop before it is
        warmed: a read that missed a header past its first batch needs its bytes from the
        start of its lookup on."""
        if position >= self.position:
            return self
        self.reader.windows.give(self.buffer)
        return self.reader.miss(position, self.asked_end - position, self.limit)


class SegmentReader:
    """One segment's O_DIRECT reads (module docstring). `holds`, `read`, `miss`, `cut`,
    `forget` on the loop; `fill`, `pread`, `close` on any thread."""

    def __init__(self, windows: ReadWindows, path: str) -> None:
        self.windows = windows
        self.path = path
        self._fd = -1  # O_RDONLY | O_DIRECT, opened by the first read (on the read pool)
        self._lock = threading.Lock()  # the fd's opening, use and closing
        self._closed = False
        # Replaced whole by a fill, so the loop reads one consistent window while one runs.
        self._window: Window | None = None
        self._ahead = limits.direct_read_ahead_min_bytes
        self._last_end = -1  # where the last read on the loop ended
        self._generation = 0  # moved by each cut: a fill begun before one makes no window

    def __repr__(self) -> str:
        window = self._window
        held = f"{window.start}..{window.end}" if window is not None else "none"
        return f"SegmentReader({self.path}, window {held})"

    # The loop's side ----------------------------------------------------------------------

    def holds(self, position: int, length: int) -> bool:
        window = self._window
        return window is not None and window.start <= position and position + length <= window.end

    def read(self, position: int, length: int) -> bytes:
        """Bytes [position, position + length), which the window must hold (`holds`): a
        copy (the window's buffer is used again once the window goes)."""
        window = self._window
        assert window is not None and self.holds(position, length), (self, position, length)
        self.windows.read(self, window)
        self._last_end = position + length
        start = position - window.start
        return window.view[start:start + length].tobytes()

    def miss(self, position: int, length: int, limit: int) -> DirectMiss:
        """What to read in for [position, position + length), up to `limit` (the end of what
        the file holds: the segment's size, or what its writer has written). A sequential
        reader's miss (at its last read's end, or in or just past its window) reads ahead
        beyond what it asks, twice as far as the last one did; any other reads at least the
        smallest readahead."""
        window = self._window
        if position == self._last_end or (window is not None and (
                window.start <= position <= window.end + self._ahead)):
            ahead = min(self._ahead * 2, limits.direct_read_ahead_max_bytes)
            wanted = length + ahead
        else:
            ahead = limits.direct_read_ahead_min_bytes
            wanted = max(length, ahead)
        return DirectMiss(self, position, max(min(wanted, limit - position), length),
                          position + length, limit, ahead, self._generation)

    def cut(self) -> None:
        """The segment was cut: bytes a window holds may be replaced by later appends."""
        self._generation += 1
        self.forget()

    def drop_window(self, window: Window) -> None:
        """`window` is evicted (by `ReadWindows`), unless a fill replaced it meanwhile."""
        if self._window is window:
            self._window = None
        self.windows.give(window.buffer)

    def forget(self) -> None:
        """No more reads of the window (a cut; the segment leaves the log)."""
        self._window = None
        self.windows.forget(self)

    # Any thread ---------------------------------------------------------------------------

    def fill(self, miss: DirectMiss) -> None:
        """Read the miss's range into its buffer, the new window (blocking: the read pool),
        unless the segment was cut since the miss or closed. Stops at the end of the file."""
        start = _align_down(miss.position)
        got = self._read(start, _align_up(miss.position + miss.length) - start, miss.buffer)
        if got is not None and miss.generation == self._generation:
            end = min(start + got, miss.position + miss.length)
            self._window = Window(start, memoryview(miss.buffer)[:end - start], miss.buffer)
            self._ahead = miss.ahead

    def pread(self, position: int, length: int) -> bytes:
        """`length` bytes at `position` (fewer at the end of the file), read with O_DIRECT
        without making a window (blocking)."""
        start = _align_down(position)
        size = _align_up(position + length) - start
        buffer = mmap.mmap(-1, size)
        got = self._read(start, size, buffer)
        if got is None:
            raise OSError(f"{self.path}: read after close")
        return buffer[position - start:min(position - start + length, got)]

    def _read(self, start: int, size: int, buffer: mmap.mmap) -> int | None:
        """Bytes read into `buffer` from `start` (block-aligned), None if closed."""
        view = memoryview(buffer)[:size]
        got = 0
        with self._lock:
            if self._closed:
                return None
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            while got < size:
                n = os.preadv(self._fd, [view[got:]], start + got)
                if n <= 0:
                    break
                got += n
                if got % ALIGN:  # the file's end: O_DIRECT reads of a partial block stop there
                    break
        return got

    def close(self) -> None:
        """The segment is closed: the fd too, after any read in flight; the window goes."""
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, -1
            self._window = None
        if fd >= 0:
            os.close(fd)
