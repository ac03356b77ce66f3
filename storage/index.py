"""The two sparse indexes of a segment: offset -> file position, and max timestamp -> offset.

Both are append-only files of fixed-size big-endian entries, mirrored in memory as two arrays
that are binary-searched. They are hints, never the truth: recovery rebuilds an index from the
log whenever it disagrees with it, and always rebuilds the tail segment's from its batches. So
the active segment's new entries stay in memory; once it is sealed (a roll), the next flush
ticket writes them with one `pwrite` and syncs them alongside the log (as Kafka flushes a
segment's indexes when it rolls), and a close writes them. An fdatasync of each index file at
every flush would double the syncs of a partition's flush: one node's fdatasync call p50 was
0.7 ms with them, 0.3 ms without (bench/README.md). A write a full disk refuses is tried again
at the next ticket; the file stays a prefix of whole entries.

    .index      entry = relative offset int32, file position int32    (one per ~4 KiB of log)
    .timeindex  entry = max timestamp int64, relative offset int32    (when the max grew)

Example (segment base 100, batches of 3 records, 4 KiB apart):

    offset index: (0, 0) (3, 4096) (6, 8192)    lookup(7) -> 8192, scan headers from there
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_right
from pathlib import Path

from storage import limits

__all__ = ["OffsetIndex", "TimeIndex"]

log = logging.getLogger("krill.storage")


class _EntryFile:
    """An append-only file of (key, value) entries with both columns kept in memory."""

    _entry: struct.Struct
    _key_code: str
    _value_code: str

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys = array(self._key_code)
        self.values = array(self._value_code)
        self._fd: int | None = None
        self._persisted = 0  # entries handed to the file (the rest are in memory only)
        self.deleted = False  # unlinked: a new segment may reuse the path, never write it
        self.dirty = False  # changed since the last flush ticket took its fd

    def __len__(self) -> int:
        return len(self.keys)

    def load(self) -> bool:
        """Read the file into memory; False (and empty) if it is missing or not whole entries."""
        self.keys = array(self._key_code)
        self.values = array(self._value_code)
        try:
            size = self.path.stat().st_size
            if size % self._entry.size or size > limits.index_file_bytes_max:
                return False
            data = self.path.read_bytes()
        except FileNotFoundError:
            return False
        for key, value in self._entry.iter_unpack(data):
            self.keys.append(key)
            self.values.append(value)
        self._persisted = len(self.keys)
        return True

    def encode(self, start: int = 0) -> bytes:
        pairs = zip(self.keys[start:], self.values[start:], strict=True)
        return b"".join(self._entry.pack(k, v) for k, v in pairs)

    def replace(self, keys: array, values: array) -> None:
        """Adopt rebuilt entries, rewriting the file (temp file + rename) if its bytes differ."""
        self.keys, self.values = keys, values
        data = self.encode()
        self._persisted = len(keys)
        try:
            if self.path.read_bytes() == data:
                return
        except FileNotFoundError:
            pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.dirty = True

    def write_pending(self) -> None:
        """Hand the entries appended since the last call to the file."""
        if self._persisted == len(self.keys) or self.deleted:
            return
        data = self.encode(self._persisted)
        end = self._persisted * self._entry.size
        try:
            written = os.pwrite(self._open(), data, end)
        except OSError as e:  # a full disk: the entries stay in memory, the file a prefix
            log.debug("%s: entries not written: %s", self.path, e)
            return
        if written != len(data):  # the disk filled part way: keep the file whole entries
            os.ftruncate(self._open(), end)
            return
        self._persisted = len(self.keys)

    def truncate_entries(self, count: int) -> None:
        """Keep the first `count` entries."""
        assert 0 <= count <= len(self.keys)
        if count == len(self.keys):
            return
        del self.keys[count:]
        del self.values[count:]
        if count < self._persisted and not self.deleted:
            os.ftruncate(self._open(), count * self._entry.size)
            self._persisted = count
        self.dirty = True

    @property
    def fd(self) -> int | None:
        """The file's fd, if it has been opened (for a cut ticket's fdatasync)."""
        return self._fd

    def take_sync_fd(self) -> int | None:
        """The fd to fdatasync if entries were written since the last call."""
        if not self.dirty:
            return None
        self.write_pending()
        self.dirty = False
        return self._fd

    def close(self) -> None:
        self.write_pending()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        """Unlink the file; the fd stays open until close (a flush ticket may hold it)."""
        self.deleted = True
        self.path.unlink(missing_ok=True)

    def open(self) -> None:
        """Create (or open) the file now, not when entries are first written."""
        self._open()

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd


class OffsetIndex(_EntryFile):
    """Relative offset of a batch's base -> its file position; strictly increasing in both."""

    _entry = struct.Struct(">ii")
    _key_code = "i"
    _value_code = "i"

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or below `relative_offset`,
        else (0, 0)."""
        i = bisect_right(self.keys, relative_offset) - 1
        if i < 0:
            return 0, 0
        return self.keys[i], self.values[i]

    def last_entry_at_or_before(self, relative_offset: int, position: int) -> tuple[int, int]:
        """The last entry with key <= relative_offset and position <= position, else (0, 0)."""
        i = min(bisect_right(self.keys, relative_offset), bisect_right(self.values, position)) - 1
        if i < 0:
            return 0, 0
        return self.keys[i], self.values[i]

    def truncate_from(self, relative_offset: int) -> None:
        """Drop every entry for a batch at or after `relative_offset`."""
        self.truncate_entries(bisect_right(self.keys, relative_offset - 1))

    def is_consistent(self, file_bytes: int) -> bool:
        """Entries strictly increase, start at (0, 0) and point inside a file of `file_bytes`."""
        if not self.keys:
            return file_bytes == 0
        if self.keys[0] != 0 or self.values[0] != 0 or self.values[-1] >= file_bytes:
            return False
        return _strictly_increasing(self.keys) and _strictly_increasing(self.values)


class TimeIndex(_EntryFile):
    """Running max timestamp -> relative offset of the batch that first reached it.

    An entry is appended at an offset-index point (and when the segment is sealed) if the max
    timestamp of the batches before that point grew past the last entry. So the last entry is
    the max over every batch before the last offset-index point; later batches need a scan.
    """

    _entry = struct.Struct(">qi")
    _key_code = "q"
    _value_code = "i"

    @property
    def last_timestamp(self) -> int:
        return self.keys[-1] if self.keys else -1

    def first_at_or_after(self, timestamp_ms: int) -> int:
        """Index of the first entry whose timestamp is >= timestamp_ms (len(self) if none)."""
        return bisect_right(self.keys, timestamp_ms - 1)

    def truncate_from(self, relative_offset: int) -> None:
        """Drop every entry naming a batch at or after `relative_offset`."""
        self.truncate_entries(bisect_right(self.values, relative_offset - 1))

    def is_consistent(self, relative_offset_end: int) -> bool:
        """Both columns strictly increase and every offset is below `relative_offset_end`."""
        if not self.keys:
            return True
        if self.values[0] < 0 or self.values[-1] >= relative_offset_end:
            return False
        return _strictly_increasing(self.keys) and _strictly_increasing(self.values)


def _strictly_increasing(column: array) -> bool:
    return all(a < b for a, b in zip(column, column[1:], strict=False))
