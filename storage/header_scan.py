"""A log's batch headers, read on an I/O thread while the log's owner goes on with the log.

Rebuilding a partition's producer state reads every batch header from some offset to the
log's end (actors/producer_snapshot.py). That is file I/O, so it runs off the shard's loop,
while the loop goes on appending to the log, removing its head (retention) or swapping in
cleaned segments. A `HeaderScan`, taken on the loop by `DiskLog.header_scan(end)`, holds what
the reader needs and the loop may change: the segments the log had then, each with its open
file (so its fd stays open, and never becomes another file's number, however the log lets go
of the segment), and the offset to stop at, the log's end then. The scan reads offsets below
that end only, which no append changes. A cut below it (a truncation) can pull bytes from
under the reader; the caller, which starts a new rebuild for the cut log, discards the result
or the error of this one.

    scan = log.header_scan(log.next_offset)          # loop
    for header in scan.headers(from_offset):         # I/O thread
        if header.is_control: data = scan.read(header)   # the batch just yielded

In direct mode the last bytes of a segment may be in memory only (storage/appender.py): the
scan takes a copy of them when it is made (`unwritten`: where they start, and the bytes), and
reads them from there, never from the writer's chunks, which the loop reuses.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator

from storage import limits
from storage.segment import OpenFile, Segment, header_at_position
from wire.record_batch import BatchHeader, read_header

__all__ = ["HeaderScan"]


class HeaderScan:
    def __init__(
        self, parts: list[tuple[Segment, OpenFile | None, tuple[int, bytes] | None]],
        log_start_offset: int, end_offset: int,
    ) -> None:
        """`parts`: the log's segments, oldest first, each with the open file that keeps its
        fd open while the scan lives, and its bytes not yet in that file (module docstring)."""
        self._parts = parts
        self.log_start_offset = log_start_offset
        self.end_offset = end_offset
        self._fd = -1  # the file of the header yielded last
        self._unwritten: tuple[int, bytes] | None = None  # its segment's bytes in memory

    def __repr__(self) -> str:
        return (f"HeaderScan({self.log_start_offset}..{self.end_offset}, "
                f"{len(self._parts)} segments)")

    def headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one holding `from_offset` (or the first after it;
        never below the log start) to the last one below the end offset, in order; each
        header's position is within its segment file."""
        offset = max(from_offset, self.log_start_offset)
        if offset >= self.end_offset:
            return
        bases = [segment.base_offset for segment, _, _ in self._parts]
        first = max(bisect_right(bases, offset) - 1, 0)
        for segment, _file, unwritten in self._parts[first:]:
            self._fd, self._unwritten = segment.fd, unwritten
            position = 0
            if segment.base_offset <= offset:
                _, position = segment.index.lookup(offset - segment.base_offset)
            size = segment.size if unwritten is None else unwritten[0] + len(unwritten[1])
            while position < size:
                header = header_at_position(
                    read_header(self._bytes(position, limits.batch_header_bytes)), position)
                position += header.size
                if header.next_offset <= offset:
                    continue  # before the batch holding from_offset
                if header.base_offset >= self.end_offset:
                    return
                yield header
                if header.next_offset >= self.end_offset:
                    return

    def _bytes(self, position: int, length: int) -> bytes:
        unwritten = self._unwritten
        if unwritten is not None and position >= unwritten[0]:
            start = position - unwritten[0]
            return unwritten[1][start:start + length]
        return os.pread(self._fd, length, position)

    def read(self, header: BatchHeader) -> bytes:
        """The whole batch of the header `headers()` yielded last."""
        data = self._bytes(header.position, header.size)
        if len(data) != header.size:  # cut from under the scan: its caller discards it
            raise OSError(f"batch at {header.base_offset}: {len(data)} of {header.size} bytes")
        return data
