"""Writing a cleaned segment and swapping it in for the segments it replaces, crash-safe.

Kafka's protocol, for one segment `<base>` replacing a run of sealed segments (the `.log`
renamed last each time, so that `<base>.log.swap` existing says the swap committed):

    CleanedWriter: <base>.index/.timeindex/.log.cleaned written, each fsynced
    swap():   rename the three to .swap -> fsync the directory (the commit point)
              -> remove every replaced segment's files -> rename the .swap files to their
              names -> fsync the directory

After a crash, `complete_swaps` (the first thing recovery does) removes `.cleaned` files
(never committed), finishes each committed swap — removes the segments whose base offset lies
in [base, the .swap log's end offset), renames what is still `.swap` into place — and removes
`.swap` indexes whose log never got there. The suffixes end neither in `.tmp` nor `.deleted`
and do not match a segment file's name, so recovery's other rules leave them to this.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from storage import limits
from storage.index import OffsetIndex, TimeIndex
from storage.metadata_file import fsync_directory
from storage.segment import Segment, segment_path
from wire.errors import DecodeError
from wire.record_batch import HEADER_BYTES, read_header

__all__ = [
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "CleanedWriter",
    "StepHook",
    "SwapIncomplete",
    "complete_swaps",
    "open_swapped",
    "remove_temporaries",
    "swap",
]

log = logging.getLogger("krill.storage")

CLEANED_SUFFIX = ".cleaned"  # a cleaned segment being written
SWAP_SUFFIX = ".swap"  # a cleaned segment written and committed, not yet in place
_SUFFIXES = (".index", ".timeindex", ".log")  # the .log last: its .swap commits the swap
_SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")
_SWAP_NAME = re.compile(rf"^(\d{{{limits.segment_name_digits}}})\.log{re.escape(SWAP_SUFFIX)}$")
_FILE_NAME = re.compile(rf"^(\d{{{limits.segment_name_digits}}})\.(log|index|timeindex)$")

# Called with the name of each step of a swap once it is done (tests crash there).
StepHook = Callable[[str], None]


class SwapIncomplete(Exception):
    """A swap failed after its commit point: the log's files no longer match its segment
    objects. Stop the partition and reopen the log; recovery finishes the swap."""


class CleanedWriter:
    """Writes `<base>.log.cleaned` from whole batches, and its two indexes as
    Segment.rebuild_indexes builds them for a sealed segment. `on_write(bytes)` is told of
    every write (the cleaner's throttle)."""

    def __init__(self, dir_fd: int, directory: Path, base_offset: int, interval_bytes: int,
                 on_write: Callable[[int], None]) -> None:
        self._dir_fd = dir_fd
        self._base = base_offset
        self._interval = interval_bytes
        self._on_write = on_write
        self._names = [_name(base_offset, suffix) + CLEANED_SUFFIX for suffix in _SUFFIXES]
        self._fd = os.open(self._names[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644,
                           dir_fd=dir_fd)
        self._pending = bytearray()
        self.size = 0  # bytes added, pending ones included
        self.next_offset = base_offset
        self._index = OffsetIndex(directory / self._names[0])  # entries in memory only
        self._time_index = TimeIndex(directory / self._names[1])
        self._since_index_bytes = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset

    def add(self, batch: bytes | bytearray | memoryview) -> None:
        header = read_header(batch)
        assert header.size == len(batch), header
        assert header.base_offset >= self.next_offset, (header, self.next_offset)
        assert self.size or header.base_offset == self._base, (header, self._base)
        if self.size + header.size > limits.segment_bytes_max:
            raise ValueError(f"cleaned segment {self._base} would pass "
                             f"{limits.segment_bytes_max} bytes")
        if self.size == 0 or self._since_index_bytes >= self._interval:
            self._add_time_entry()
            self._index.append(header.base_offset - self._base, self.size)
            self._since_index_bytes = 0
        self._since_index_bytes += header.size
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset
        self._pending += batch
        self.size += header.size
        self.next_offset = header.next_offset
        if len(self._pending) >= limits.cleaner_write_bytes:
            self._write_pending()

    def finish(self) -> None:
        """Write the rest and both indexes; fsync all three files."""
        self._write_pending()
        self._add_time_entry()  # the sealed segment's max timestamp, as Segment.seal adds it
        for name, data in ((self._names[0], self._index.encode()),
                           (self._names[1], self._time_index.encode())):
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dir_fd)
            try:
                _write_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._on_write(len(data))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        remove_temporaries(self._dir_fd, self._base)

    def _add_time_entry(self) -> None:
        if self._max_timestamp > self._time_index.last_timestamp:
            self._time_index.append(self._max_timestamp,
                                    self._offset_of_max_timestamp - self._base)

    def _write_pending(self) -> None:
        if self._pending:
            _write_all(self._fd, self._pending, self.size - len(self._pending))
            self._on_write(len(self._pending))
            self._pending = bytearray()


def swap(dir_fd: int, base: int, replaced: list[int], step: StepHook) -> None:
    """Put the finished `<base>.*.cleaned` files in place of the segments named by their
    base offsets in `replaced`. Before the commit a failure removes the new files and raises
    as it was; after it, SwapIncomplete."""
    try:
        for suffix in _SUFFIXES:
            name = _name(base, suffix)
            os.rename(name + CLEANED_SUFFIX, name + SWAP_SUFFIX, src_dir_fd=dir_fd,
                      dst_dir_fd=dir_fd)
            step(f"renamed {name}{CLEANED_SUFFIX} to {SWAP_SUFFIX}")
        os.fsync(dir_fd)
    except Exception:
        remove_temporaries(dir_fd, base)
        raise
    step("swap committed")
    try:
        for replaced_base in replaced:
            for suffix in _SEGMENT_SUFFIXES:
                try:
                    os.unlink(_name(replaced_base, suffix), dir_fd=dir_fd)
                except FileNotFoundError:  # an index never written
                    pass
                step(f"removed {_name(replaced_base, suffix)}")
        for suffix in _SUFFIXES:
            name = _name(base, suffix)
            os.rename(name + SWAP_SUFFIX, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            step(f"renamed {name}{SWAP_SUFFIX} into place")
        os.fsync(dir_fd)
        step("swap done")
    except Exception as e:
        raise SwapIncomplete(f"swap of segment {base} failed after its commit: {e}") from e


def open_swapped(dir_fd: int, directory: Path, base: int, interval_bytes: int) -> Segment:
    """The segment a swap put in place, opened with its indexes loaded."""
    try:
        # Segment opens by path: make sure the path still names the directory cleaned.
        here, there = os.fstat(dir_fd), os.stat(directory)
        if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
            raise FileNotFoundError(f"{directory} was replaced while it was cleaned")
        segment = Segment(directory, base, interval_bytes)
    except Exception as e:
        raise SwapIncomplete(f"opening cleaned segment {base}: {e}") from e
    loaded = segment.index.load() and segment.time_index.load() and segment.load_tail_state()
    assert loaded, segment
    return segment


def remove_temporaries(dir_fd: int, base_offset: int) -> None:
    for suffix in _SUFFIXES:
        for temporary in (CLEANED_SUFFIX, SWAP_SUFFIX):
            try:
                os.unlink(_name(base_offset, suffix) + temporary, dir_fd=dir_fd)
            except FileNotFoundError:
                pass


def complete_swaps(directory: Path) -> None:
    """Finish the swaps a crash interrupted after their commit, undo the others (see the
    module docstring). Called by recovery before it looks at the segments."""
    names = sorted(os.listdir(directory))
    changed = False
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            log.warning("%s: removing an unfinished cleaned file", directory / name)
            (directory / name).unlink()
            changed = True
    bases = sorted({int(m.group(1)) for n in names if (m := _FILE_NAME.match(n))})
    for base in [int(m.group(1)) for n in names if (m := _SWAP_NAME.match(n))]:
        end = _end_offset(directory / (_name(base, ".log") + SWAP_SUFFIX), base)
        log.warning("%s: finishing the swap of cleaned segment %d (offsets %d..%d)",
                    directory, base, base, end)
        for old in bases:
            if base < old < end:
                for suffix in _SEGMENT_SUFFIXES:
                    (directory / _name(old, suffix)).unlink(missing_ok=True)
        # <base>.log and an index whose .swap is still there are the old ones: replaced.
        # An index without its .swap is the new one, renamed before the crash.
        for suffix in _SUFFIXES:
            swapped = directory / (_name(base, suffix) + SWAP_SUFFIX)
            if swapped.exists():
                os.replace(swapped, directory / _name(base, suffix))
        changed = True
    for name in os.listdir(directory):
        if name.endswith(SWAP_SUFFIX):  # an index whose log never reached .swap
            log.warning("%s: removing an uncommitted swap file", directory / name)
            (directory / name).unlink()
            changed = True
    if changed:
        fsync_directory(directory)


def _end_offset(path: Path, base: int) -> int:
    """One past the last offset of the whole batches at the start of a segment file."""
    end = base
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        position = 0
        while size - position >= HEADER_BYTES:
            try:
                header = read_header(os.pread(f.fileno(), HEADER_BYTES, position))
            except DecodeError:
                break
            if position + header.size > size:
                break
            end, position = header.next_offset, position + header.size
    return end


def _write_all(fd: int, data: bytes | bytearray, position: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], position + done)


def _name(base_offset: int, suffix: str) -> str:
    return segment_path(Path(), base_offset, suffix).name
