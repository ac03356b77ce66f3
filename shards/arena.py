"""Shared-memory arenas: how a cross-core produce hands its batches to the owner by reference.

Every shard has one arena: a `memfd` the supervisor creates before it starts the shards and
hands to all of them, so every shard maps every arena. Shard i writes only into its own arena;
shard j reads (and patches) the regions i names in a pipe message. A cross-core produce then
costs one `memcpy` on the source shard, not ZeroMQ's path (a copy into the kernel, another out
of it, a fresh buffer on the owner, ZeroMQ's I/O thread woken on both sides and a socket
buffer of a few hundred KiB moved a piece at a time), and the owner `pwrite`s the batch to its
segment straight from the arena. It is the nearest a process can come to what Seastar does
between threads: hand over a pointer to the batch. The pipe message stays the ordering and the
signal; only the bytes move out of band (DESIGN.md §5; the fetch path already does the same
with file positions).

Lifetime. The source allocates a region, copies the batch in, and sends (offset, length) on
the pipe. The owner appends the batch in the loop turn in which it takes the message, so its
phase-one answer ("dispatched"), which leaves after that turn, also says the region is free;
the source releases it then (or on the first answer, if the owner refused the batch). Between
send and release the source never touches the region and the owner is its only user.

Allocation is a ring: regions are taken at the head and released in any order, and the tail
moves past released regions in order. When nothing is live the head goes back to the start,
so a lightly loaded node keeps touching the same first pages (an arena's pages stay resident
once touched). A batch that does not fit returns None and the caller sends it the old way,
as a payload frame on the pipe: the arena is a fast path, never a limit.
"""

from __future__ import annotations

import collections
import mmap
import os
from collections.abc import Sequence

__all__ = ["Arena", "ArenaSet", "create_arena_fds"]


class Arena:
    """A ring allocator over one shared buffer (this shard's own arena)."""

    def __init__(self, buffer: mmap.mmap | bytearray) -> None:
        self._buffer = buffer
        self._view = memoryview(buffer)
        self.size = len(buffer)
        self._head = 0  # where the next region starts, unless it must wrap
        # Live regions in allocation order: [start, end, released].
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

    def release(self, start: int) -> None:
        """The region at `start` is free again (it may not be the oldest)."""
        region = self._by_start.pop(start)
        assert not region[2], f"arena region {start} released twice"
        region[2] = 1
        self.used -= region[1] - region[0]
        live = self._live
        while live and live[0][2]:
            live.popleft()
        if not live:
            self._head = 0

    def _allocate(self, nbytes: int) -> int | None:
        if nbytes <= 0 or nbytes > self.size:
            return None
        live = self._live
        if not live:
            start = 0
        else:
            tail = live[0][0]
            head = self._head
            # The oldest live region is never a released one, so head == tail means full.
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
        region = [start, start + nbytes, 0]
        live.append(region)
        self._by_start[start] = region
        self._head = start + nbytes
        self.used += nbytes
        return start


class ArenaSet:
    """Every arena of the node as one shard sees them: its own to write, the peers' to read."""

    def __init__(self, shard_id: int, buffers: Sequence[mmap.mmap | bytearray]) -> None:
        assert 0 <= shard_id < len(buffers)
        self.shard_id = shard_id
        self._buffers = list(buffers)
        self._views = [memoryview(b) for b in buffers]
        self.own = Arena(buffers[shard_id])

    @classmethod
    def from_fds(cls, shard_id: int, fds: Sequence[int]) -> ArenaSet:
        """Map the arenas the supervisor made (`create_arena_fds`), one per shard, in order."""
        buffers = [mmap.mmap(fd, os.fstat(fd).st_size) for fd in fds]
        for fd in fds:
            os.close(fd)  # the mappings keep the memory; the fds are no longer needed
        return cls(shard_id, buffers)

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
