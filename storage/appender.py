"""Direct-mode writes (`storage_mode: direct`): a segment's new bytes kept in the shard's
aligned chunks and written with O_DIRECT on the I/O pool; the page cache is not used for them.

In buffered mode an append is an `os.pwrite` on the shard's loop: a copy into the page cache,
which the kernel writes back on its own schedule. Under sustained load that write-back falls
behind, and the kernel throttles the writer: the `pwrite` itself blocks, tens to hundreds of
ms, on the loop (bench/README.md, the 10-minute run). The design's answer (Redpanda's
`segment_appender`, Seastar's DMA files) is to keep the bytes in memory of our own and write
them with O_DIRECT, off the loop:

    append(data)             loop: copied into the segment's chunks; `size` moves
    job = take_write()       loop, at flush_prepare: what is not yet in the file, a WriteJob
    job.run()                I/O thread: pwrite(O_DIRECT) of whole 4 KiB blocks, the tail
                             block padded with zeros; then the flush ticket's fdatasync
    wrote(job)               loop, at flush_complete: `written` moves; full chunks below it
                             become cache (evictable)

Chunks come from one `ChunkPool` per shard: `chunk_bytes` each, page-aligned (one anonymous
mmap, allocated once), `budget_bytes` in all: the shard's write memory. A chunk covers a fixed
range of its segment's file, [k * chunk_bytes, (k + 1) * chunk_bytes). The chunk holding the
end is rewritten in place as it fills: each write starts at the block where the last one
ended. A chunk whose bytes are all in the file stays as cache: reads of a segment's recent
bytes (a tailing consumer, a follower's append) come from memory, not from the disk, until the
pool needs the chunk for new bytes and evicts the oldest written one (a FIFO: within a
segment, lower chunks are written first, so what a segment holds stays one range,
`cache_start`..`size`). Chunks not yet written cannot be evicted; if every chunk is such,
the pool makes one more outside the budget and counts it (`overflow`): then the disk is slower
than what is produced, and the memory above the budget is what the produce path has taken
in meanwhile (its own budget, shards/memory.py, bounds that). The pool is the loop's: a
segment out of the log (retention, a cut, compaction) gives its chunks back on the loop
(`Segment.release_memory`) before it is closed on an I/O thread.

The file's length: an O_DIRECT write ends on a block boundary, so the file is longer than the
segment's bytes (zeros, or the start of a batch appended while the write ran) until its last
write, at the seal, cuts it to the segment's size. Recovery cuts the same tail of an unsealed
segment (a batch that is not whole, or fails its CRC). Space ahead of the end is reserved with
`fallocate(FALLOC_FL_KEEP_SIZE)` in steps that grow while the segment is written fast, so a
write rarely allocates blocks (Redpanda's adaptive fallocation).

A cut (a truncation, a flush failure's cut-back) and a write in flight: each writer has a lock
that a job holds while it writes and a cut holds while it cuts. A cut moves the writer's
generation; a job made before it writes nothing above the lowest cut since (so no cut batch
comes back from a write that started before the cut but ran after it), and a job that wrote
before it is cut back by it. A cut into bytes no longer held (their chunks evicted) reads the
cut's block back from the file: the next write rewrites that block whole.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import threading
import time
from collections import deque

from storage import limits
from storage.direct_read import ReadWindows

__all__ = ["ALIGN", "ChunkPool", "DirectWriter", "WriteJob", "direct_io_supported"]

ALIGN = 4096  # O_DIRECT's alignment of buffer, position and length (a page; >= the block)
# A pool has at least this many chunks: one segment's tail being written, one more to fill.
POOL_CHUNKS_MIN = 2
# The written-chunks queue is rid of chunks given back meanwhile once it holds this many
# entries per chunk of the pool (it stays within that bound, and the sweep is rare).
QUEUE_ENTRIES_PER_CHUNK_MAX = 2
_FALLOC_FL_KEEP_SIZE = 1


def _align_down(n: int) -> int:
    return n - n % ALIGN


def _align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def direct_io_supported(directory: str) -> str | None:
    """None if files in `directory` take O_DIRECT writes, else why not (tmpfs refuses)."""
    probe = os.path.join(directory, ".krill-direct-probe")
    buffer = mmap.mmap(-1, ALIGN)
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            os.pwrite(fd, memoryview(buffer), 0)
        finally:
            os.close(fd)
    except OSError as e:
        return f"{directory} does not take O_DIRECT writes: {e.strerror or e}"
    finally:
        buffer.close()
        try:
            os.unlink(probe)
        except OSError:
            pass
    return None


class _Libc:
    """fallocate(2) with flags (os.posix_fallocate would move the file's size)."""

    def __init__(self) -> None:
        self.fallocate = None
        name = ctypes.util.find_library("c")
        if name:
            libc = ctypes.CDLL(name, use_errno=True)
            fallocate = getattr(libc, "fallocate", None)
            if fallocate is not None:
                fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
                fallocate.restype = ctypes.c_int
                self.fallocate = fallocate

    def reserve(self, fd: int, offset: int, length: int) -> bool:
        """Blocks for [offset, offset + length) without moving the size; False if the file
        system cannot (the write then allocates as it goes)."""
        if self.fallocate is None:
            return False
        if self.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
            return True
        error = ctypes.get_errno()
        if error in (errno.EOPNOTSUPP, errno.ENOSYS):
            self.fallocate = None
            return False
        raise OSError(error, os.strerror(error))


_LIBC = _Libc()


class Chunk:
    __slots__ = ("view", "pooled")

    def __init__(self, view: memoryview, pooled: bool) -> None:
        self.view = view
        self.pooled = pooled  # from the pool's area (else made beyond the budget)


class ChunkPool:
    """A shard's write memory in direct mode (module docstring). Loop thread only."""

    def __init__(self, chunk_bytes: int, budget_bytes: int,
                 read_budget_bytes: int = limits.direct_read_memory_bytes) -> None:
        if chunk_bytes <= 0 or chunk_bytes % ALIGN:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ALIGN}")
        self.chunk_bytes = chunk_bytes
        self.count = max(budget_bytes // chunk_bytes, POOL_CHUNKS_MIN)
        self._area = mmap.mmap(-1, chunk_bytes * self.count)  # page-aligned, zeroed
        area = memoryview(self._area)
        self._free = [Chunk(area[i * chunk_bytes:(i + 1) * chunk_bytes], True)
                      for i in range(self.count)]
        # Written chunks, oldest first: (writer, chunk number, chunk); stale entries (the
        # writer let the chunk go already) are skipped when met.
        self._written: deque[tuple[DirectWriter, int, Chunk]] = deque()
        self.overflow = 0  # chunks ever made beyond the budget
        self.evictions = 0  # written chunks taken back for new bytes
        self.cache_hits = 0  # reads served from chunks
        self.cache_misses = 0  # reads of a direct-mode segment that went to the file
        # Those reads' memory (storage/direct_read.py), beside this write memory.
        self.reads = ReadWindows(read_budget_bytes)

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self) -> Chunk:
        if self._free:
            return self._free.pop()
        while self._written:
            writer, k, chunk = self._written.popleft()
            if writer.forget(k, chunk):
                self.evictions += 1
                return chunk
        self.overflow += 1
        return Chunk(memoryview(mmap.mmap(-1, self.chunk_bytes)), False)

    def give(self, chunk: Chunk) -> None:
        if chunk.pooled:
            self._free.append(chunk)

    def written(self, writer: DirectWriter, k: int, chunk: Chunk) -> None:
        """Chunk `k` of `writer` is all in the file: it may be evicted from now on."""
        self._written.append((writer, k, chunk))
        if len(self._written) > QUEUE_ENTRIES_PER_CHUNK_MAX * self.count:
            self._written = deque(entry for entry in self._written
                                  if entry[0].holds_chunk(entry[1], entry[2]))

    def stats(self) -> dict[str, int]:
        return {"chunks": self.count, "free": len(self._free), "overflow": self.overflow,
                "evictions": self.evictions, "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses, **self.reads.stats()}


class WriteJob:
    """What a segment had not yet in its file when a flush ticket was made: written by the
    ticket's `run` on an I/O thread, before its fdatasync."""

    __slots__ = ("writer", "start", "end", "generation", "seal", "pieces")

    def __init__(self, writer: DirectWriter, start: int, end: int, generation: int,
                 seal: bool, pieces: list[tuple[int, Chunk]]) -> None:
        self.writer = writer
        self.start = start  # the file holds everything below (block-aligned down: rewritten)
        self.end = end  # the segment's size when the job was made
        self.generation = generation
        self.seal = seal  # the segment is sealed: cut the file to `end` after the write
        self.pieces = pieces  # (chunk number, chunk) covering start..end

    def run(self) -> None:
        self.writer.write(self)

    def __repr__(self) -> str:
        return f"WriteJob({self.writer.path}, {self.start}..{self.end})"


class DirectWriter:
    """One segment's bytes on their way to its file with O_DIRECT (module docstring)."""

    def __init__(self, pool: ChunkPool, path: str, size: int, read_fd: int) -> None:
        """`size`: the segment's bytes (all in the file already); `read_fd` reads back the
        partial block at the end, which the first write rewrites."""
        self.pool = pool
        self.path = path
        self._read_fd = read_fd  # the segment's own, open as long as the segment (and we)
        self.fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        self.size = size  # bytes appended
        self.written = size  # bytes the file holds (below: not needed in memory)
        self._chunks: dict[int, Chunk] = {}  # chunk number -> chunk, numbers contiguous
        self._low: int | None = None  # the lowest chunk number held (None: to be found)
        self._queued = 0  # chunks below this number are in the pool's written FIFO (or gone)
        self.lock = threading.Lock()  # a job's writes, a cut's cut (module docstring)
        self._generation = 0
        self._cut_floor = size  # the lowest cut since the last job was made
        self.sealed = False
        self._finished = False  # sealed, and its file cut to its size
        self._reserved = size  # the file has blocks up to here (fallocate)
        self._step = limits.direct_reserve_min_bytes
        self._step_since = time.monotonic()
        self._queued = size // pool.chunk_bytes
        self._read_back(size)

    def _read_back(self, end: int) -> None:
        """The file's bytes of the chunk holding `end`, up to it, into a chunk (unless held):
        the next write starts at `end`'s block and rewrites it whole."""
        c = self.pool.chunk_bytes
        k, within = divmod(end, c)
        if not within or k in self._chunks:
            return
        chunk = self._chunks[k] = self.pool.take()
        self._low = None
        data = os.pread(self._read_fd, within, k * c)
        chunk.view[:len(data)] = data

    def __repr__(self) -> str:
        return (f"DirectWriter({self.path}, size={self.size}, written={self.written}, "
                f"chunks={len(self._chunks)})")

    @property
    def cache_start(self) -> int:
        """Every byte from here to `size` is in memory."""
        if not self._chunks:
            return self.size
        if self._low is None:
            self._low = min(self._chunks)
        return self._low * self.pool.chunk_bytes

    def holds_chunk(self, k: int, chunk: Chunk) -> bool:
        return self._chunks.get(k) is chunk

    @property
    def unwritten(self) -> int:
        return self.size - self.written

    # The loop's side ----------------------------------------------------------------------

    def append(self, data: memoryview) -> None:
        c = self.pool.chunk_bytes
        position = self.size
        while len(data):
            k, within = divmod(position, c)
            chunk = self._chunks.get(k)
            if chunk is None:
                chunk = self._chunks[k] = self.pool.take()
                self._low = None
            n = min(c - within, len(data))
            chunk.view[within:within + n] = data[:n]
            data = data[n:]
            position += n
        self.size = position

    def holds(self, position: int) -> bool:
        return position >= self.cache_start

    def read(self, position: int, length: int) -> bytes:
        """Bytes [position, position + length), which must be held (`holds`)."""
        assert self.cache_start <= position and position + length <= self.size, (
            self, position, length)
        c = self.pool.chunk_bytes
        parts = []
        end = position + length
        while position < end:
            k, within = divmod(position, c)
            n = min(c - within, end - position)
            parts.append(self._chunks[k].view[within:within + n])
            position += n
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def take_write(self) -> WriteJob | None:
        """The job that writes what the file lacks (None if nothing): its pieces, and the
        tail block's bytes past the end zeroed first (no stale bytes go out with it)."""
        if self.written >= self.size and not (self.sealed and not self._finished):
            return None
        c = self.pool.chunk_bytes
        start = _align_down(self.written)
        end = self.size
        k_end, within = divmod(end, c)
        if within:  # zero the rest of the tail block: a write ends on a block boundary
            tail = self._chunks[k_end].view
            tail[within:min(_align_up(within), c)] = bytes(min(_align_up(within), c) - within)
        pieces = [(k, self._chunks[k]) for k in range(start // c, -(-end // c))]
        self._cut_floor = end
        return WriteJob(self, start, end, self._generation, self.sealed, pieces)

    def wrote(self, job: WriteJob) -> None:
        """The job's write is done (its flush ticket came back, well or not: the bytes are
        in the file either way, and a failed ticket's cut follows)."""
        end = job.end if job.generation == self._generation else min(job.end, self._cut_floor)
        self.written = max(self.written, min(end, self.size))
        if job.seal and job.generation == self._generation:
            self._finished = True
        self._queue_written()

    def _evictable_end(self) -> int:
        """Chunks wholly below this may be evicted: those written, and a finished (sealed,
        written) segment's last one too, which nothing will append to."""
        c = self.pool.chunk_bytes
        return -(-self.written // c) * c if self._finished else self.written

    def _queue_written(self) -> None:
        c = self.pool.chunk_bytes
        while (self._queued + 1) * c <= self._evictable_end():
            chunk = self._chunks.get(self._queued)
            if chunk is not None:
                self.pool.written(self, self._queued, chunk)
            self._queued += 1

    def forget(self, k: int, chunk: Chunk) -> bool:
        """The pool takes chunk `k` back (eviction); False if it is not ours any more."""
        if self._chunks.get(k) is not chunk or (
                (k + 1) * self.pool.chunk_bytes > self._evictable_end()):
            return False
        # Only the lowest chunk goes: what is held stays one range.
        if self.cache_start != k * self.pool.chunk_bytes:
            return False
        del self._chunks[k]
        self._low = None
        return True

    def cut(self, position: int) -> None:
        """The segment is cut to `position` bytes: the file too, and the chunks above it
        go back to the pool; waits for a write in flight (module docstring)."""
        c = self.pool.chunk_bytes
        with self.lock:
            self._generation += 1
            self._cut_floor = min(self._cut_floor, position)
            os.ftruncate(self.fd, position)
            old = self.size
            self.size = position
            self.written = min(self.written, position)
            self._queued = min(self._queued, position // c)
            k, within = divmod(position, c)
            if within and k in self._chunks:
                zero_to = min(c, max(within, old - k * c))
                view = self._chunks[k].view
                view[within:zero_to] = bytes(zero_to - within)
            for kk in [kk for kk in self._chunks if kk * c >= position]:
                self.pool.give(self._chunks.pop(kk))
            self._low = None
            self._read_back(position)  # a cut below what is held (evicted chunks)
            self._reserved = position  # a cut frees the blocks past the end

    def reopen(self) -> None:
        """The segment takes appends again (a cut dropped the segments after it): no longer
        sealed, and its last chunk, which a finished segment lets go, is held again."""
        if self.sealed or self._finished:
            self.sealed = self._finished = False
            self._queued = min(self._queued, self.size // self.pool.chunk_bytes)
            self._read_back(self.size)

    def release_chunks(self) -> None:
        """Every chunk goes back to the pool (on the loop: the pool is the loop's); nothing
        is held or written from here on. No job of this writer may be out."""
        chunks, self._chunks = list(self._chunks.values()), {}
        self._low = None
        for chunk in chunks:
            self.pool.give(chunk)

    def release(self) -> None:
        """The segment is closed: the fd too (this part may run on an I/O thread, after
        `release_chunks` on the loop)."""
        if self._chunks:
            self.release_chunks()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    # The I/O thread's side ----------------------------------------------------------------

    def write(self, job: WriteJob) -> None:
        c = self.pool.chunk_bytes
        with self.lock:
            end = job.end
            if job.generation != self._generation:
                end = min(end, self._cut_floor)
            if end > job.start:
                stop = _align_up(end)
                for k, chunk in job.pieces:
                    lo = max(job.start, k * c)
                    hi = min(stop, (k + 1) * c)
                    if lo >= hi:
                        continue
                    view = chunk.view[lo - k * c:hi - k * c]
                    done = 0
                    while done < len(view):
                        done += os.pwrite(self.fd, view[done:], lo + done)
            if job.seal and job.generation == self._generation:
                self._trim(job.end)
            elif end > job.start:
                self._reserve(end)

    def _trim(self, end: int) -> None:
        """The file ends at `end` exactly: the padding and the blocks reserved past it go
        (grown by a byte first: a truncate to the size a file has may keep them)."""
        os.ftruncate(self.fd, end + 1)
        os.ftruncate(self.fd, end)
        self._reserved = end

    def trim(self) -> None:
        """At a clean close, everything written: the file ends where the segment does."""
        if self.fd >= 0 and self.written == self.size:
            with self.lock:
                self._trim(self.size)

    def _reserve(self, end: int) -> None:
        """Keep blocks reserved ahead of `end`: a step at a time, the step doubling while
        each lasts less than `direct_reserve_grow_s` (up to the largest), else halving."""
        if self._reserved - end >= self._step // 2:
            return
        now = time.monotonic()
        if now - self._step_since < limits.direct_reserve_grow_s:
            self._step = min(self._step * 2, limits.direct_reserve_max_bytes)
        elif now - self._step_since > 4 * limits.direct_reserve_grow_s:
            self._step = max(self._step // 2, limits.direct_reserve_min_bytes)
        self._step_since = now
        start = max(self._reserved, _align_down(end))
        if _LIBC.reserve(self.fd, start, self._step):
            self._reserved = start + self._step
        else:
            self._reserved = 1 << 62  # the file system cannot: do not ask again
