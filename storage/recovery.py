"""Open a partition directory and bring its segments back to a state the log can trust.

The tail segment may end in a torn or corrupt batch (a crash mid-write, or a write the disk
lost), so it is scanned batch by batch: length prefix, magic, CRC-32C, offsets increasing. The
file is cut at the first bad batch and its indexes are rebuilt from the scan. A sealed segment
is trusted if its indexes agree with it (entries increasing and inside the file, the last
entry naming the batch it points at, a clean chain of headers from there to the end);
otherwise it gets the same full scan, and if that cuts it, every later segment is dropped
(offsets must stay contiguous). So is a segment that does not start where the one before it
ends, overlapping it or leaving a gap: a truncation or reset that a crash cut short (the
segment's removal not yet on disk) leaves one, and the log is then the part before it.
Temp files, index files without a log and files retention marked `.deleted` are removed.
`load_epochs` then builds the epoch cache (storage/epochs.py) from the recovered segments.
What recovery keeps may never have been synced (a kill -9 leaves it in the page cache): the
DiskLog it opens counts none of it as flushed until its first flush ticket has synced every
segment file (storage/log.py).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import crc32c

from storage import limits
from storage.epochs import EpochCache
from storage.metadata_file import fsync_directory
from storage.segment import DELETED_SUFFIX, BatchInfo, Segment
from storage.segment_swap import complete_swaps
from wire.errors import DecodeError
from wire.record_batch import LENGTH_PREFIX_BYTES, batch_length_at, read_header

__all__ = ["load_epochs", "open_segments"]

log = logging.getLogger("krill.storage")

_SEGMENT_NAME = re.compile(rf"^(\d{{{limits.segment_name_digits}}})\.log$")
_INDEX_NAME = re.compile(rf"^(\d{{{limits.segment_name_digits}}})\.(index|timeindex)$")
_CRC_START = 21  # the CRC covers the batch from `attributes` to its end


def open_segments(directory: Path, index_interval_bytes: int) -> list[Segment]:
    """The directory's segments in offset order, recovered; one empty segment at 0 if none.

    An empty segment is dropped unless it is the only one: a crash right after a roll leaves
    one, and a log whose tail is empty is the same log without it."""
    directory.mkdir(parents=True, exist_ok=True)
    complete_swaps(directory)  # a clean's swap that a crash cut short: finish or undo it
    segments = [Segment(directory, base, index_interval_bytes)
                for base in _clean_directory(directory)]
    empty = [s for s in segments[:-1] if s.is_empty]
    if empty:
        log.warning("%s: removing empty segments %s", directory, empty)
        _drop(directory, empty)
    segments = [s for s in segments if s not in empty]
    segments = _check_sealed(directory, segments)
    while True:  # the tail gets a full scan; a tail cut to nothing goes, and so on
        if not segments:
            return [Segment(directory, 0, index_interval_bytes)]
        tail = segments[-1]
        _scan_and_rebuild(tail, sealed=False)
        if not tail.is_empty or len(segments) == 1:
            return segments
        log.warning("%s: removing %s, empty after the cut", directory, tail)
        _drop(directory, [segments.pop()])


def _check_sealed(directory: Path, segments: list[Segment]) -> list[Segment]:
    """Keep the sealed segments up to the first one that does not start where its
    predecessor ends or had to be cut (the tail, last in the list, is left to the caller)."""
    for i, segment in enumerate(segments):
        previous = segments[i - 1] if i > 0 else None
        if previous is not None and segment.base_offset != previous.next_offset:
            how = "overlaps" if segment.base_offset < previous.next_offset else "does not follow"
            log.warning("%s: %s %s %s; dropping it and what follows",
                        directory, segment, how, previous)
            _drop(directory, segments[i:])
            return segments[:i]
        if i == len(segments) - 1 or _indexes_agree(segment):
            continue
        log.warning("%s: rebuilding the indexes of %s", directory, segment)
        if _scan_and_rebuild(segment, sealed=True) is not None:
            log.warning("%s: dropping segments %s after the cut in %s",
                        directory, segments[i + 1:], segment)
            _drop(directory, segments[i + 1:])
            return segments[: i + 1]
    return segments


def _clean_directory(directory: Path) -> list[int]:
    """Remove temp files and orphan indexes; return the base offsets of the .log files."""
    bases: list[int] = []
    for path in directory.iterdir():
        if path.name.endswith(".tmp"):
            log.warning("%s: removing stray temp file", path)
            path.unlink()
        elif path.name.endswith(DELETED_SUFFIX):  # retention took it; the delay died with us
            path.unlink()
        elif match := _SEGMENT_NAME.match(path.name):
            bases.append(int(match.group(1)))
    for path in directory.iterdir():
        match = _INDEX_NAME.match(path.name)
        if match and int(match.group(1)) not in bases:
            log.warning("%s: removing index without a segment", path)
            path.unlink()
    return sorted(bases)


def _indexes_agree(segment: Segment) -> bool:
    """Cheap trust check of a sealed segment (loads its indexes and tail state on success)."""
    if segment.is_empty:
        return False
    if not segment.index.load() or not segment.index.is_consistent(segment.size):
        return False
    if not segment.time_index.load() or not segment.load_tail_state():
        return False
    return segment.time_index.is_consistent(segment.next_offset - segment.base_offset)


def _scan_and_rebuild(segment: Segment, sealed: bool) -> str | None:
    """Check every batch, cut the file at the first bad one, rebuild the indexes.
    Return what was cut (None if the whole file was good)."""
    scan = _Scan(segment)
    end = segment.rebuild_indexes(scan, sealed)
    if scan.problem is None:
        return None
    cut = f"{segment.size - end} bytes from position {end}: {scan.problem}"
    log.warning("%s: cutting %s", segment.log_path, cut)
    os.ftruncate(segment.fd, end)
    os.fsync(segment.fd)  # the cut must not come back after another crash
    segment.size = end
    return cut


class _Scan:
    """Yields the good batches of a segment from position 0; `problem` says why it stopped early."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.problem: str | None = None

    def __iter__(self) -> Iterator[BatchInfo]:
        fd, size = self.segment.fd, self.segment.size
        position = 0
        base = expected = self.segment.base_offset
        while position < size:
            batch = _check_batch(fd, position, size, base, expected)
            if isinstance(batch, str):
                self.problem = batch
                return
            yield batch
            position += batch.size
            expected = batch.last_offset + 1


def _check_batch(
    fd: int, position: int, file_bytes: int, base: int, expected: int
) -> BatchInfo | str:
    """The batch at `position`, or what is wrong with it."""
    remaining = file_bytes - position
    batch_bytes = batch_length_at(os.pread(fd, LENGTH_PREFIX_BYTES, position), 0)
    if batch_bytes is None:
        return f"torn length prefix ({remaining} bytes left)"
    if not limits.batch_header_bytes <= batch_bytes <= limits.batch_bytes_max:
        return f"impossible batch length {batch_bytes}"
    if batch_bytes > remaining:
        return f"torn batch ({remaining} of {batch_bytes} bytes)"
    data = os.pread(fd, batch_bytes, position)
    try:
        header = read_header(data)
    except DecodeError as e:
        return str(e)
    if crc32c.crc32c(memoryview(data)[_CRC_START:]) != header.crc:
        return "CRC-32C mismatch"
    if header.base_offset < expected or (position == 0 and header.base_offset != expected):
        return f"base offset {header.base_offset} where {expected} was expected"
    if header.last_offset - base > limits.relative_offset_max:
        return f"last offset {header.last_offset} too far from segment base {base}"
    return BatchInfo(header.base_offset, header.last_offset, header.max_timestamp, header.size)


def _drop(directory: Path, segments: list[Segment]) -> None:
    for segment in segments:
        segment.delete()
        segment.close()
    if segments:
        fsync_directory(directory)


def load_epochs(segments: list[Segment], log_start: int, next_offset: int) -> EpochCache:
    """The epoch cache of recovered segments: a segment whose first and last batches share
    an epoch holds only that one (segments roll on an epoch change, and a Raft log's epochs
    never go down); another one (written before, or merged by a clean) has its headers read."""
    cache = EpochCache()
    for segment in segments:
        if segment.is_empty:
            continue
        first = segment.header_at(0)
        last = segment.find(segment.next_offset - 1)
        assert last is not None, segment
        if first.partition_leader_epoch == last.partition_leader_epoch:
            cache.append(first.partition_leader_epoch, first.base_offset)
            continue
        for header in segment.headers_from(0):
            cache.append(header.partition_leader_epoch, header.base_offset)
    cache.advance_start(log_start, next_offset)
    return cache
