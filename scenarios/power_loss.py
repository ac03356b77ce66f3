"""Power loss on a stopped node's files, as its page cache says: what is still dirty is lost.

A kill -9 keeps what a process wrote: its pages stay in the kernel's page cache, dirty until
an fdatasync (or the kernel's own writeback, ~30 s later) puts them on the disk. A power cut
takes the dirty ones. `cachestat(2)` (Linux 6.5) tells, page by page, which pages of a file
are still dirty or under writeback, so a test can cut each file where a power loss would:
at its first page not yet on the disk (the pages after it may hold bytes of the same batch,
or of later ones; a log must not keep either). The kernel writes large folios back whole, so
a page reads dirty when anything in its folio is: the cut may come a little early, never
late.

Appending to a log rewrites its last page, so the first dirty page of a segment may also hold
the tail of a batch an fdatasync covered (a real disk still has that page as synced).
`lose_unsynced(directory, synced_offset)` keeps a partition log through the batch holding
`synced_offset` where the cut would come before it: the replica's match as its leader counts
it (acknowledged only once synced), or the partition's high watermark. Keeping bytes that a
power cut could have taken is always a possible outcome (the kernel may have written them
back); losing synced ones never is. The scenario runner's `power_loss` fault
(scenarios/chaos.py) and the cluster tests share this module.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from scenarios.replicas import whole_batches

__all__ = ["cachestat_available", "first_unsynced_position", "lose_unsynced", "unsynced_files"]

_SYS_CACHESTAT = 451  # the same number on x86-64 and arm64
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def _not_on_disk(fd: int, offset: int, length: int) -> int:
    """Pages of the range still dirty or being written back."""
    stat = _Stat()
    if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(_Range(offset, length)),
                     ctypes.byref(stat), 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return int(stat.nr_dirty + stat.nr_writeback)


def cachestat_available() -> bool:
    fd = os.open("/", os.O_RDONLY)
    try:
        _not_on_disk(fd, 0, 0)
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return False
    finally:
        os.close(fd)
    return True


def first_unsynced_position(path: Path) -> int | None:
    """Where the first page of the file not yet on the disk starts; None if all are."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if not _not_on_disk(fd, 0, 0):  # length 0: the whole file
            return None
        for position in range(0, size, _PAGE_BYTES):
            if _not_on_disk(fd, position, _PAGE_BYTES):
                return position
        return None
    finally:
        os.close(fd)


def unsynced_files(directory: Path) -> dict[str, int]:
    """The files of `directory` with pages not on the disk: where each first one starts."""
    found = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and (position := first_unsynced_position(path)) is not None:
            found[path.name] = position
    return found


def lose_unsynced(directory: Path, synced_offset: int | None = None) -> dict[str, int]:
    """A power cut on the files of `directory` (their node stopped): each is cut at its first
    page not on the disk, a segment (`*.log`) never before the end of the batch that holds
    `synced_offset` (known synced) when it has that batch. What was cut where, by file
    name."""
    cut = unsynced_files(directory)
    for name, position in list(cut.items()):
        if synced_offset is not None and name.endswith(".log"):
            position = max(position, _synced_end(directory / name, synced_offset))
            if position >= (directory / name).stat().st_size:
                del cut[name]
                continue
            cut[name] = position
        os.truncate(directory / name, position)
    return cut


def _synced_end(path: Path, synced_offset: int) -> int:
    """Where the batches of a segment up to the one holding `synced_offset` end (0 when the
    segment starts after it)."""
    data = path.read_bytes()
    end = 0
    for header in whole_batches(data):
        if header.base_offset > synced_offset:
            break
        end = header.position + header.size
    return end
