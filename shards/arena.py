"""Shared-memory arenas: large produce frames land here, and cross-core batches go by reference.

Every shard has one arena: a `memfd` the supervisor creates before it starts the shards and
hands to all of them, so every shard maps every arena (a node of one shard gets a private
one). Shard i writes only into its own arena; shard j reads (and patches) the regions i
names in a pipe message.

Two uses. A connection receives a large produce frame (over the 256 KiB scratch buffer of
wire/frame.py) straight into a region (`lease`) instead of a fresh `bytearray`, whose pages
this machine's kernel would have to fault in and zero for every request. And a batch for a
partition owned by another shard crosses by reference: the pipe message carries (offset,
length) and the owner appends the batch from the mapping (`pwrite`), instead of ZeroMQ
copying it into the kernel and out again in socket-buffer-sized pieces, waking both shards'
I/O threads and loops for each piece, and the owner copying it once more out of the
read-only frame. A batch from a small frame is copied into a region first (`put`). It is the
nearest a process can come to what Seastar does between threads: hand over a pointer to the
batch. The pipe message stays the ordering and the signal; only the bytes move out of band
(DESIGN.md §5; the fetch path already does the same with file positions).

Lifetime. A region has holders. The connection holds a leased frame while its request is
handled; each partition's produce made from it holds it until its phase one
(`Produce.on_dispatched`), when the bytes are in the log or refused. A forwarded produce
passes that hold on: the owner appends in the loop turn in which it takes the message, and
its phase-one answer ("dispatched"), which leaves after that turn, releases it on the
source. Between send and release the source never writes to the region.

Allocation is a ring: regions are taken at the head and released in any order, and the tail
moves past released regions in order. When nothing is live the head goes back to the start,
so a lightly loaded node keeps touching the same first pages (an arena's pages stay resident
once touched). When there is no room the caller does what it did before arenas: a frame gets
a fresh `bytearray`, a forwarded batch goes as a payload frame on the pipe. The arena is a
fast path, never a limit.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
from collections.abc import Sequence

__all__ = ["Arena", "ArenaLease", "ArenaSet", "create_arena_fds"]


class Arena:
    """A ring allocator over one shared buffer (this shard's own arena)."""

    def __init__(self, buffer: mmap.mmap | bytearray) -> None:
        self._view = memoryview(buffer)  # keeps the mapping alive
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        self.size = len(buffer)
        self._head = 0  # where the next region starts, unless it must wrap
        # Regions in allocation order: [start, end, references]; 0 references: free again.
        self._live: collections.deque[list[int]] = collections.deque()
        self._by_start: dict[int, list[int]] = {}
        self.used = 0  # bytes in live regions

    @property
    def live_regions(self) -> int:
        return len(self._live)

    def put(self, data: memoryview | bytes | bytearray) -> int | None:
        """Copy `data` into a new region and return its offset; None if there is no room."""
        nbytes = len(data) if not isinstance(data, memoryview) else data.nbytes
        start = self._allocate(nbytes)
        if start is None:
            return None
        self._view[start : start + nbytes] = data
        return start

    def lease(self, nbytes: int) -> ArenaLease | None:
        """A new region of `nbytes` to fill in place (a frame received straight into it)."""
        start = self._allocate(nbytes)
        return None if start is None else ArenaLease(self, start, nbytes)

    def retain(self, start: int) -> None:
        """One more holder of the region at `start`; each calls `release` once."""
        self._by_start[start][2] += 1

    def release(self, start: int) -> None:
        """One holder is done with the region at `start`; the last one frees it (it may not
        be the oldest)."""
        region = self._by_start[start]
        assert region[2] > 0, f"arena region {start} released more than retained"
        region[2] -= 1
        if region[2]:
            return
        del self._by_start[start]
        self.used -= region[1] - region[0]
        live = self._live
        while live and not live[0][2]:
            live.popleft()
        if not live:
            self._head = 0

    def offset_of(self, view: memoryview) -> int | None:
        """Where `view` starts in this arena, or None if it is not inside it."""
        if not view.nbytes or view.readonly:
            return None
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        offset = address - self._address
        if 0 <= offset and offset + view.nbytes <= self.size:
            return offset
        return None

    def _allocate(self, nbytes: int) -> int | None:
        if nbytes <= 0 or nbytes > self.size:
            return None
        live = self._live
        if not live:
            start = 0
        else:
            tail = live[0][0]
            head = self._head
            # The oldest region is never a free one, so head == tail means full.
            if head > tail:  # not wrapped; free: [head, size) and [0, tail)
                if self.size - head >= nbytes:
                    start = head
                elif tail >= nbytes:
                    start = 0  # wrap; the end of the buffer stays unused this round
                else:
                    return None
            elif tail - head >= nbytes:  # wrapped; free: [head, tail)
                start = head
            else:
                return None
        region = [start, start + nbytes, 1]
        live.append(region)
        self._by_start[start] = region
        self._head = start + nbytes
        self.used += nbytes
        return start


class ArenaLease:
    """A region taken to receive one frame: `view` to fill, held until every holder released.

    The connection holds it while the request is handled; each produce made from it holds it
    until its phase one (`Produce.on_dispatched`), when its bytes are in the log or were
    refused. A forwarded produce passes the region to the owner by reference, no copy.
    """

    __slots__ = ("_arena", "start", "view")

    def __init__(self, arena: Arena, start: int, nbytes: int) -> None:
        self._arena = arena
        self.start = start
        self.view = arena._view[start : start + nbytes]

    def retain(self) -> None:
        self._arena.retain(self.start)

    def release(self) -> None:
        self._arena.release(self.start)


class ArenaSet:
    """Every arena of the node as one shard sees them: its own to write, the peers' to read."""

    def __init__(self, shard_id: int, buffers: Sequence[mmap.mmap | bytearray]) -> None:
        assert 0 <= shard_id < len(buffers)
        self.shard_id = shard_id
        self._views = [memoryview(b) for b in buffers]  # they keep the mappings alive
        self.own = Arena(buffers[shard_id])

    @classmethod
    def from_fds(cls, shard_id: int, fds: Sequence[int]) -> ArenaSet:
        """Map the arenas the supervisor made (`create_arena_fds`), one per shard, in order."""
        buffers = [mmap.mmap(fd, os.fstat(fd).st_size) for fd in fds]
        for fd in fds:
            os.close(fd)  # the mappings keep the memory; the fds are no longer needed
        return cls(shard_id, buffers)

    @classmethod
    def private(cls, size: int) -> ArenaSet:
        """A node of one shard: an arena only for frames received straight into it."""
        return cls(0, [mmap.mmap(-1, size)])

    @staticmethod
    def in_memory(shards: int, size: int) -> list[ArenaSet]:
        """The arenas of `shards` shards living in one process (tests, simulations)."""
        buffers = [bytearray(size) for _ in range(shards)]
        return [ArenaSet(shard_id, buffers) for shard_id in range(shards)]

    def peer_view(self, source: int, start: int, nbytes: int) -> memoryview:
        """The region a peer named, writable: the owner patches batch headers in place."""
        assert source != self.shard_id, "a shard's own batches never cross a pipe"
        view = self._views[source]
        assert 0 <= start and start + nbytes <= len(view), (source, start, nbytes)
        return view[start : start + nbytes]


def create_arena_fds(shards: int, size: int) -> list[int]:
    """One anonymous shared-memory file per shard, `size` bytes each (pages made on touch).

    The memory goes away with the last process that maps it: a node killed with -9 leaves
    nothing behind, unlike a file in /dev/shm.
    """
    fds: list[int] = []
    try:
        for shard_id in range(shards):
            fd = os.memfd_create(f"krill-arena-{shard_id}")
            fds.append(fd)
            os.ftruncate(fd, size)
    except (OSError, AttributeError) as e:  # AttributeError: a platform without memfd
        for fd in fds:
            os.close(fd)
        raise OSError(f"cannot create the shared-memory arenas: {e}") from e
    return fds
