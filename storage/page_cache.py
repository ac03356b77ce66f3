"""Is a file range in the page cache? Reads that must not wait on the disk ask first.

A shard's loop serves every partition and connection of its core, so a read that waits on
the disk stalls all of them. Reads on the loop therefore never touch a page that is not in
memory (DESIGN.md §3, the Seastar way: try without blocking, hand a miss to the I/O pool):

    DiskLog.read(..., nowait=True)   # batch headers read with preadv2(RWF_NOWAIT);
                                     # the slice it returns checked with cachestat(2)
      -> NotCached(fd, position, length)   # what to bring in
    miss.warm()                      # on the I/O pool: read it, so the kernel caches it
    DiskLog.read(...) again          # now from memory; sendfile will not wait either

`cachestat(2)` (Linux 6.5+) counts the cached pages of a range in one call, ~1 µs for 16 KiB
and ~9 µs for 1 MiB here, against ~350 µs to send that MiB. Older kernels fall back to
`mmap` + `mincore`, ~10–30 µs.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

from storage import limits

__all__ = ["NotCached", "cached", "cached_pages", "drop_file", "file_cached_pages", "no_readahead",
           "read_nowait", "warm"]

_PAGE = mmap.PAGESIZE
_SYS_CACHESTAT = 451  # x86_64 and aarch64 share the generic number


class NotCached(Exception):
    """A read on the loop would have waited on the disk: warm this range and try again."""

    def __init__(self, fd: int, position: int, length: int) -> None:
        super().__init__(f"fd {fd}: {length} bytes at {position} not in the page cache")
        self.fd = fd
        self.position = position
        self.length = length

    def warm(self) -> None:
        """Bring the range in (blocking: on the read pool)."""
        warm(self.fd, self.position, self.length)


def read_nowait(fd: int, size: int, position: int, warm_bytes: int) -> bytes:
    """`size` bytes at `position` if the page cache has them all; else NotCached, asking to
    warm `warm_bytes` from there (what the caller will read next, not just these bytes)."""
    buffer = bytearray(size)
    try:
        got = os.preadv(fd, [buffer], position, os.RWF_NOWAIT)
    except BlockingIOError:
        # Also for a cached page carrying the kernel's readahead marker; the warm read that
        # follows is then cheap and clears it. Asking cachestat instead would not do: the
        # refused read has already started reading the range in, and those pages count as
        # cached before they hold the bytes.
        raise NotCached(fd, position, max(size, warm_bytes)) from None
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:
            raise
        # A filesystem without RWF_NOWAIT reads (tmpfs on this kernel: in memory anyway).
        got = os.preadv(fd, [buffer], position)
    if got < size:
        # Short: the end of the file, or only part of the range is cached. Only the caller
        # knows how long the file is; a read past its end is their bug, reported as such.
        if position + got >= os.fstat(fd).st_size:
            return bytes(buffer[:got])
        raise NotCached(fd, position, max(size, warm_bytes))
    return bytes(buffer)


def no_readahead(fd: int) -> None:
    """No kernel readahead on this file: what a read needs is brought in by `warm`, on the
    I/O pool, in bounded steps. Left on, a read from the loop that meets the kernel's
    readahead marker queues `read_ahead_kb` (8 MiB on some disks) of reads, which the disk
    serves ahead of the writes of every partition's fdatasync."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Probe(threading.local):
    """Per-thread argument structs for cachestat (the loop and tests may both ask)."""

    def __init__(self) -> None:
        self.stat = _CacheStat()
        self.range = _Range()
        self.byte = bytearray(1)


_probe = _Probe()
_has_cachestat = True


def cached(fd: int, position: int, length: int) -> bool:
    """Whether every page of `length` bytes at `position` is in the page cache."""
    global _has_cachestat
    if length <= 0:
        return True
    pages = (position + length - 1) // _PAGE - position // _PAGE + 1
    if _has_cachestat:
        probe = _probe
        probe.range.off, probe.range.len = position, length
        if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(probe.range),
                         ctypes.byref(probe.stat), 0) == 0:
            # cachestat counts pages whose read is still in flight (the kernel's readahead
            # running ahead of a sequential reader). That readahead completes in order, and
            # RWF_NOWAIT refuses a page not yet read: ask it about the last page.
            return probe.stat.nr_cache >= pages and _readable(fd, position + length - 1)
        if ctypes.get_errno() != errno.ENOSYS:
            return False  # a bad fd or range: let the read itself fail with the real error
        _has_cachestat = False
    return _mincore(fd, position, length, pages)  # mincore counts only pages read in


def cached_pages(fd: int, position: int, length: int) -> int:
    """How many pages of the range the page cache holds (those being read in included)."""
    global _has_cachestat
    if length <= 0:
        return 0
    if _has_cachestat:
        probe = _probe
        probe.range.off, probe.range.len = position, length
        if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(probe.range),
                         ctypes.byref(probe.stat), 0) == 0:
            return int(probe.stat.nr_cache)
        if ctypes.get_errno() != errno.ENOSYS:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        _has_cachestat = False
    first, last = position // _PAGE, (position + length - 1) // _PAGE
    return sum(_mincore(fd, page * _PAGE, 1, 1) for page in range(first, last + 1))


def _readable(fd: int, position: int) -> bool:
    try:
        return os.preadv(fd, [_probe.byte], position, os.RWF_NOWAIT) == 1
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:
            raise
        return True  # no RWF_NOWAIT here (tmpfs): cachestat's count is all there is to ask


def _mincore(fd: int, position: int, length: int, pages: int) -> bool:
    start = position - position % _PAGE
    size = position + length - start
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if address in (None, _MAP_FAILED):
        return False
    try:
        vector = ctypes.create_string_buffer(pages)
        if _libc.mincore(address, size, vector) != 0:
            return False
        return all(byte & 1 for byte in vector.raw)
    finally:
        _libc.munmap(address, size)


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffer = bytearray(limits.warm_read_bytes)


_scratch = _Scratch()


def warm(fd: int, position: int, length: int) -> None:
    """Read the range so the kernel caches it (blocking: run it on the I/O pool). Stops
    early at the end of the file; the bytes themselves are thrown away."""
    buffer = _scratch.buffer
    end = position + length
    while position < end:
        view = memoryview(buffer)[: min(len(buffer), end - position)]
        got = os.preadv(fd, [view], position)
        if got <= 0:
            return
        position += got


def drop_file(path: str | os.PathLike[str]) -> None:
    """Write the file's dirty pages back, then ask the kernel to drop its cached ones (a
    cold read's starting point, in tests and benches)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def file_cached_pages(path: str | os.PathLike[str]) -> int:
    """How many pages of the whole file the page cache holds."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return cached_pages(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
