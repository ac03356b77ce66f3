"""Log compaction: keep, in a log's sealed segments, only the latest record of every key.

Kafka's log cleaner for one partition directory. A clean reads the dirty part of the log (from
the cleaner checkpoint, `first_dirty_offset`) into a key map, key digest -> latest offset; then
rewrites the sealed segments from the log start through the mapped range, batch by batch,
keeping the records that no later record of their key supersedes; then swaps each rewritten
segment in with Kafka's crash-safe protocol. Offsets never change: a batch keeps its base
offset, last offset delta, producer id/epoch/base sequence, leader epoch, codec and timestamp
type; its records keep their offset deltas and timestamps; the CRC is computed again.

How the partition actor drives it (one clean per partition at a time):

    # loop thread
    rng = cleanable_range(log.summaries(), log.log_start_offset, checkpoint,
                          high_watermark, now_ms, config)
    if rng.due:
        segments = the sealed segments with next_offset <= rng.end_offset
        last = base offsets of each producer id's last batch in the whole log
        # I/O pool thread (it sleeps there, in its throttle)
        result = clean_log(log.directory, segments, rng.first_dirty_offset, now_ms,
                           config, last)
        # loop thread again
        log.replace_segments(result.old_segments, result.new_segments)
        checkpoint = result.first_dirty_offset      # persist it: Kafka's cleaner checkpoint

While a clean runs, nothing may remove or truncate the segments it was given (retention,
DeleteRecords' remove_head, truncate): it swaps their files. Appends go on. Only segments wholly
below the high watermark are cleaned, so no truncation can take away the record that made an
older one redundant. A returned `result.error` (a corrupt or unreadable batch, a failed
write, `stop` set) means the clean ended before a swap committed: its temporary files are
gone, the groups swapped before are in the result (replace them as usual) and the checkpoint
stays where it was; Kafka then marks the partition uncleanable until restart. An exception
raised by `clean_log` means a swap failed after its commit point: the files no longer match
the log's segment objects, so the partition must stop and reopen the log, whose recovery
finishes the swap.

Each cleaned segment replaces its group of old ones with Kafka's swap protocol: files written
as `.cleaned`, fsynced, renamed `.swap`, the directory fsynced (the commit), the old files
removed, the `.swap` files renamed into place (storage/segment_swap.py).

Where Kafka leaves a choice, or Krill differs:
- Records without a key are removed, as Kafka's cleaner does (it counts them invalid; Kafka's
  produce path refuses them on compacted topics).
- Tombstones (KIP-534): the first clean that keeps a batch's tombstone stamps the batch with a
  delete horizon, now + delete_retention_ms (attributes bit 6; baseTimestamp holds it); a clean
  at or after the horizon drops the tombstones.
- A full key map ends the clean at the last whole segment it mapped (old Kafka); if not even
  the first dirty segment fits, the map ends at the first record that did not fit and later
  records are kept as they are (new Kafka), so every clean makes progress.
- An emptied batch is dropped unless it is a producer's last batch (kept empty, so producer
  state survives a restart, as Kafka does), the first or last batch of a cleaned segment, or
  the first batch of a leader epoch: those stay, empty, so the segment still starts at its
  name's offset (recovery requires it) and ends where the next segment starts (a swap covers
  exactly what it replaces), and the epoch cache rebuilt from the headers on open finds each
  epoch where it began (a cleaned segment may hold several: storage/epochs.py). An empty
  batch is Kafka's: no codec, no base timestamp, no horizon, its original max timestamp.
- Control batches and batches wholly past the key map's end are copied as they are.
- A group of one segment in which nothing changes is left alone: no write, no swap.
- max.compaction.lag.ms looks at the oldest dirty segment's max timestamp (Kafka: its first
  batch's timestamp), which the log knows without reading.
- Transactions, as Kafka's cleaner: a clean covers only what is below the last stable offset
  (the caller's `cleanable_range` bound), so no undecided transaction is ever mapped; the
  records of aborted transactions (`aborted`: producer id, first offset, ABORT marker offset)
  are left out of the key map, so an aborted record never supersedes a committed one, and are
  removed from their batches (emptied batches follow the rules above). Markers are control
  batches: copied as they are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from storage import limits
from storage.retention import SegmentSummary
from storage.segment import OpenFile, Segment, header_at_position
from storage.segment_swap import (
    CleanedWriter,
    StepHook,
    SwapIncomplete,
    open_swapped,
    swap,
)
from wire.errors import DecodeError
from wire.record_batch import HEADER_BYTES, BatchHeader, batch_crc, batch_length_at, read_header
from wire.records import Record, decode_batch, rebuild_batch

__all__ = [
    "CleanableRange",
    "CleanerConfig",
    "CleanerError",
    "CleanResult",
    "AbortedRanges",
    "KeyMap",
    "SwapIncomplete",
    "Throttle",
    "build_key_map",
    "clean_log",
    "cleanable_range",
    "group_segments",
]

log = logging.getLogger("krill.storage")


class CleanerError(Exception):
    """A clean that could not go on: corrupt batch, I/O error, stop requested."""


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    segment_bytes: int = limits.segment_bytes_default  # a cleaned segment stays within it
    segment_index_bytes: int = limits.segment_index_bytes_default  # and its indexes within this
    index_interval_bytes: int = limits.index_interval_bytes_default
    delete_retention_ms: int = limits.delete_retention_ms_default
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = limits.max_compaction_lag_ms_default
    min_cleanable_dirty_ratio: float = limits.min_cleanable_dirty_ratio_default
    key_map_entries_max: int = limits.cleaner_key_map_entries_max
    io_bytes_per_second: int = limits.cleaner_io_bytes_per_second_default

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= limits.segment_bytes_max:
            raise ValueError(f"segment_bytes {self.segment_bytes} outside "
                             f"1..{limits.segment_bytes_max}")
        if self.key_map_entries_max < 1 or self.io_bytes_per_second <= 0:
            raise ValueError("key_map_entries_max and io_bytes_per_second must be positive")
        if min(self.delete_retention_ms, self.min_compaction_lag_ms,
               self.max_compaction_lag_ms) < 0:
            raise ValueError("delete retention and compaction lags must not be negative")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise ValueError(f"min_cleanable_dirty_ratio {self.min_cleanable_dirty_ratio}")


# What to clean (pure) ---------------------------------------------------------------------


class CleanableRange(NamedTuple):
    """What a clean would cover: the sealed segments below `end_offset`, mapping the dirty
    records from `first_dirty_offset`. Segments wholly below it are clean, the others dirty;
    `dirty_ratio` = dirty bytes / (clean + dirty bytes), Kafka's cleanable ratio."""

    first_dirty_offset: int
    end_offset: int  # the first uncleanable offset (a segment's base)
    clean_bytes: int
    dirty_bytes: int
    dirty_ratio: float
    forced: bool  # max.compaction.lag.ms passed for the oldest dirty segment
    due: bool  # dirty bytes, and the ratio passes min.cleanable.dirty.ratio or it is forced


def cleanable_range(
    segments: Sequence[SegmentSummary],
    log_start_offset: int,
    first_dirty_offset: int,
    high_watermark: int,
    now_ms: int,
    config: CleanerConfig,
) -> CleanableRange:
    """Kafka's LogCleanerManager.cleanableOffsets and LogToClean, over every segment of the
    log, oldest first, the active one last (DiskLog.summaries()).

    The dirty range ends at the first dirty segment that is the active one, reaches past the
    high watermark, or is newer than min.compaction.lag.ms (its max timestamp above now -
    lag). A checkpoint below the log start, or past the log end (a truncation went below it),
    starts over from the log start, as Kafka does. Example: sizes 100, 100, 100 + active,
    checkpoint at the second segment's base, nothing too new: clean 100, dirty 200, ratio 2/3.
    """
    assert segments, "a log has at least its active segment"
    log_end = segments[-1].next_offset
    if not log_start_offset <= first_dirty_offset <= log_end:
        first_dirty_offset = log_start_offset
    sealed = segments[:-1]
    clean = [s for s in sealed if s.next_offset <= first_dirty_offset]
    end_offset = segments[-1].base_offset
    newest_allowed_ms = now_ms - config.min_compaction_lag_ms
    for segment in sealed[len(clean):]:
        too_new = config.min_compaction_lag_ms > 0 and segment.max_timestamp > newest_allowed_ms
        if segment.next_offset > high_watermark or too_new:
            end_offset = segment.base_offset
            break
    dirty = [s for s in sealed[len(clean):] if s.next_offset <= end_offset]
    clean_bytes = sum(s.size for s in clean)
    dirty_bytes = sum(s.size for s in dirty)
    total = clean_bytes + dirty_bytes
    ratio = dirty_bytes / total if total else 0.0
    oldest = dirty[0].max_timestamp if dirty else -1
    forced = 0 <= oldest < now_ms - config.max_compaction_lag_ms
    due = dirty_bytes > 0 and (forced or ratio > config.min_cleanable_dirty_ratio)
    return CleanableRange(first_dirty_offset, end_offset, clean_bytes, dirty_bytes, ratio,
                          forced, due)


def group_segments(
    segments: Sequence[Segment], segment_bytes: int, segment_index_bytes: int
) -> list[list[Segment]]:
    """Runs of consecutive segments, each to become one cleaned segment: within segment_bytes
    and segment_index_bytes before cleaning (a clean only shrinks them) and within the int32
    relative offset range (Kafka's groupSegmentsBySize). A segment larger alone is a group."""
    groups: list[list[Segment]] = []
    log_bytes = index_bytes = time_index_bytes = 0
    for segment in segments:
        own_index_bytes = len(segment.index) * limits.offset_index_entry_bytes
        own_time_index_bytes = len(segment.time_index) * limits.time_index_entry_bytes
        if groups and (
            log_bytes + segment.size <= segment_bytes
            and index_bytes + own_index_bytes <= segment_index_bytes
            and time_index_bytes + own_time_index_bytes <= segment_index_bytes
            and segment.next_offset - 1 - groups[-1][0].base_offset <= limits.relative_offset_max
        ):
            groups[-1].append(segment)
            log_bytes += segment.size
            index_bytes += own_index_bytes
            time_index_bytes += own_time_index_bytes
        else:
            groups.append([segment])
            log_bytes, index_bytes = segment.size, own_index_bytes
            time_index_bytes = own_time_index_bytes
    return groups


# I/O rate ---------------------------------------------------------------------------------

# A record's bytes besides its key and value, roughly (length, attributes, deltas, lengths).
_RECORD_OVERHEAD_BYTES = 8


class Throttle:
    """Holds a clean to `bytes_per_second` by sleeping in the clean's own thread, as Kafka's
    Throttler does; idle time earns no credit. Bytes read and written count, and so do the
    bytes a compressed batch decodes to beyond its size on disk: a clean's cost is mostly
    decoding records under the GIL its shard's loop needs too, which disk bytes understate
    many times over when the batches are compressed."""

    def __init__(
        self,
        bytes_per_second: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        assert bytes_per_second > 0, bytes_per_second
        self._rate = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._paid_until = clock()  # when the bytes taken so far are paid for
        self.slept_s = 0.0
        self.bytes_read = 0
        self.bytes_written = 0

    def read(self, byte_count: int) -> None:
        self.bytes_read += byte_count
        self._take(byte_count)

    def wrote(self, byte_count: int) -> None:
        self.bytes_written += byte_count
        self._take(byte_count)

    def decoded(self, batch: BatchHeader, records: list[Record]) -> None:
        if batch.codec:
            decoded_bytes = sum(_RECORD_OVERHEAD_BYTES + len(r.key or b"") + len(r.value or b"")
                                for r in records)
            self._take(max(decoded_bytes - batch.size, 0))

    def _take(self, byte_count: int) -> None:
        now = self._clock()
        self._paid_until = max(self._paid_until, now) + byte_count / self._rate
        ahead_s = self._paid_until - now
        if ahead_s * 1000 >= limits.cleaner_sleep_min_ms:
            self._sleep(ahead_s)
            self.slept_s += ahead_s


# Reading segments -------------------------------------------------------------------------


def _read_batches(
    fd: int, start: int, end: int, throttle: Throttle, stop: threading.Event | None
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The batches of a segment file between two batch boundaries, CRC checked; the header's
    position is the batch's position in the file."""
    position = start
    while position < end:
        if stop is not None and stop.is_set():
            raise CleanerError("stop requested")
        view = memoryview(_pread(fd, min(limits.cleaner_read_bytes, end - position), position))
        throttle.read(len(view))
        at = 0
        while (size := batch_length_at(view, at)) is not None and at + size <= len(view):
            yield _checked(view[at : at + size], position + at), view[at : at + size]
            at += size
        if at == 0:  # a batch longer than a chunk: read it whole
            size = batch_length_at(view, 0) or 0
            if not HEADER_BYTES <= size <= min(limits.batch_bytes_max, end - position):
                raise CleanerError(f"batch of {size} bytes at {position} of {end}")
            view = memoryview(_pread(fd, size, position))
            throttle.read(size)
            yield _checked(view, position), view
            at = size
        position += at


def _checked(batch: memoryview, position: int) -> BatchHeader:
    try:
        header = read_header(batch)
    except DecodeError as e:
        raise CleanerError(f"batch at position {position}: {e}") from e
    if header.size != len(batch) or batch_crc(batch, header) != header.crc:
        raise CleanerError(f"batch at position {position} is corrupt (length or CRC)")
    return header_at_position(header, position)


def _records(header: BatchHeader, batch: memoryview, throttle: Throttle) -> list[Record]:
    try:
        records = decode_batch(batch, check_crc=False)[1]  # _checked did
    except DecodeError as e:
        raise CleanerError(f"batch {header.base_offset}: {e}") from e
    throttle.decoded(header, records)
    return records


def _pread(fd: int, size: int, position: int) -> bytes:
    data = os.pread(fd, size, position)
    if len(data) != size:
        raise CleanerError(f"read {len(data)} of {size} bytes at {position}")
    return data


def _file_of(segment: Segment) -> OpenFile:
    """The segment's open log file; holding it keeps the fd open, though the segment close."""
    if segment.file is None:
        raise CleanerError(f"{segment} was closed")
    return segment.file


# The key map ------------------------------------------------------------------------------


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(slots=True)
class KeyMap:
    """Key digest -> offset of the key's latest record in [start_offset, end_offset). Records
    at or past end_offset were not mapped; a clean keeps them as they are."""

    start_offset: int
    end_offset: int
    offsets: dict[bytes, int] = field(default_factory=dict)
    full: bool = False  # stopped early: the next clean goes on from end_offset

    def survives(self, record: Record, now_ms: int, horizon_ms: int | None) -> bool:
        if record.offset >= self.end_offset:
            return True
        if record.key is None:
            return False
        latest = self.offsets.get(_digest(record.key))
        if latest is not None and record.offset < latest:
            return False
        return record.value is not None or horizon_ms is None or now_ms < horizon_ms


class AbortedRanges:
    """Which batches belong to an aborted transaction: a transactional batch of a producer
    whose aborted transaction spans its base offset (first offset .. ABORT marker)."""

    def __init__(self, aborted: Sequence[tuple[int, int, int]] = ()) -> None:
        self._by_producer: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first, last in aborted:
            self._by_producer.setdefault(producer_id, []).append((first, last))

    def __contains__(self, header: BatchHeader) -> bool:
        if not header.is_transactional or header.is_control:
            return False
        ranges = self._by_producer.get(header.producer_id)
        return ranges is not None and any(
            first <= header.base_offset <= last for first, last in ranges)


def build_key_map(
    segments: Sequence[Segment],
    first_dirty_offset: int,
    entries_max: int,
    throttle: Throttle,
    stop: threading.Event | None = None,
    aborted: AbortedRanges | None = None,
) -> KeyMap:
    """Map the keyed records of `segments` from first_dirty_offset on (control batches and
    aborted transactions' batches aside).

    When a new key finds the map full, the map ends at the base of the segment being read if
    an earlier dirty segment was mapped whole, else at that record."""
    key_map = KeyMap(first_dirty_offset, first_dirty_offset)
    offsets = key_map.offsets
    for segment in segments:
        if segment.next_offset <= first_dirty_offset:
            continue
        position = _position_of(segment, first_dirty_offset)
        file = _file_of(segment)
        for header, batch in _read_batches(file.fd, position, segment.size, throttle, stop):
            if header.next_offset <= first_dirty_offset or header.is_control:
                continue
            if aborted is not None and header in aborted:
                continue
            for record in _records(header, batch, throttle):
                if record.offset < first_dirty_offset or record.key is None:
                    continue
                digest = _digest(record.key)
                if digest not in offsets and len(offsets) >= entries_max:
                    key_map.full = True
                    if key_map.end_offset == first_dirty_offset:
                        key_map.end_offset = record.offset
                    return key_map
                offsets[digest] = record.offset
        key_map.end_offset = segment.next_offset
    return key_map


def _position_of(segment: Segment, offset: int) -> int:
    """Where the batch holding `offset` starts (0 if before the segment)."""
    if offset <= segment.base_offset:
        return 0
    _, position = segment.index.lookup(offset - segment.base_offset)
    return position  # at or before that batch: the scan skips what is below


# Cleaning one group -----------------------------------------------------------------------


@dataclass(slots=True)
class CleanResult:
    """What a clean did. `old_segments` (still open, in the log) are replaced by
    `new_segments` (opened, sealed): pass both to DiskLog.replace_segments."""

    old_segments: list[Segment] = field(default_factory=list)
    new_segments: list[Segment] = field(default_factory=list)
    first_dirty_offset: int = 0  # the new cleaner checkpoint
    key_map_full: bool = False
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    batches_removed: int = 0
    seconds: float = 0.0
    throttled_seconds: float = 0.0
    # The earliest delete horizon of a batch still holding tombstones: a clean from then on
    # removes them (Kafka only cleans when dirty bytes call for it).
    delete_horizon_ms: int | None = None
    error: Exception | None = None  # a group that failed before its swap committed


class _Filter:
    """Decides, batch by batch, what of it a clean keeps."""

    def __init__(self, key_map: KeyMap, now_ms: int, config: CleanerConfig,
                 producer_last_batches: set[int], throttle: Throttle, result: CleanResult,
                 aborted: AbortedRanges) -> None:
        self.key_map = key_map
        self.aborted = aborted
        self.throttle = throttle
        self.now_ms = now_ms
        self.config = config
        self.producer_last_batches = producer_last_batches
        self.result = result

    def batch(self, header: BatchHeader, batch: memoryview, boundary: bool
              ) -> tuple[bytes | bytearray | memoryview | None, bool]:
        """(what to write, None to drop; whether that differs from `batch`). A `boundary`
        batch (first or last of its cleaned segment, first of its epoch) is kept, empty if
        need be."""
        if header.is_control or header.base_offset >= self.key_map.end_offset:
            return batch, False
        records = _records(header, batch, self.throttle)
        horizon = header.delete_horizon_ms
        if header in self.aborted:
            kept: list[Record] = []
        else:
            kept = [r for r in records if self.key_map.survives(r, self.now_ms, horizon)]
        self.result.records_read += len(records)
        self.result.records_removed += len(records) - len(kept)
        tombstones = any(r.value is None for r in kept)
        if tombstones and horizon is None:
            horizon = self.now_ms + self.config.delete_retention_ms
            out: bytes | bytearray | memoryview | None = rebuild_batch(
                header, kept, delete_horizon_ms=horizon)
        elif len(kept) == len(records):
            out = batch
        elif kept or boundary or self._producer_last(header):
            out = rebuild_batch(header, kept)
        else:
            out = None
            self.result.batches_removed += 1
        if tombstones and horizon is not None:
            earliest = self.result.delete_horizon_ms
            self.result.delete_horizon_ms = horizon if earliest is None else min(earliest,
                                                                                 horizon)
        return out, out is not batch

    def _producer_last(self, header: BatchHeader) -> bool:
        return header.producer_id >= 0 and header.base_offset in self.producer_last_batches


def _clean_group(
    dir_fd: int, directory: Path, group: list[Segment], cleaner: _Filter, config: CleanerConfig,
    throttle: Throttle, stop: threading.Event | None, step: StepHook,
) -> Segment | None:
    """Clean `group` into one segment and swap it in; None if it is one segment in which
    nothing changed (nothing is written then)."""
    base, end = group[0].base_offset, group[-1].next_offset

    def new_writer() -> CleanedWriter:
        return CleanedWriter(dir_fd, directory, base, config.index_interval_bytes,
                             throttle.wrote)

    writer = None if len(group) == 1 else new_writer()
    epoch: int | None = None  # the previous batch's: the first of each epoch is a boundary
    try:
        for segment in group:
            file = _file_of(segment)
            for header, batch in _read_batches(file.fd, 0, segment.size, throttle, stop):
                boundary = (header.position == 0 and segment is group[0]) or (
                    header.next_offset == end) or header.partition_leader_epoch != epoch
                epoch = header.partition_leader_epoch
                out, changed = cleaner.batch(header, batch, boundary)
                if writer is None:
                    if not changed:
                        continue  # so far the segment stays as it is
                    writer = new_writer()
                    for _, same in _read_batches(file.fd, 0, header.position, throttle, stop):
                        writer.add(same)
                if out is not None:
                    writer.add(out)
        if writer is None:
            return None
        assert writer.next_offset == end, (group, writer.next_offset)
        writer.finish()
        step("cleaned files written")
    except Exception:
        if writer is not None:
            writer.abandon()
        raise
    swap(dir_fd, base, [s.base_offset for s in group], step)
    return open_swapped(dir_fd, directory, base, config.index_interval_bytes)


# The entry point --------------------------------------------------------------------------


def clean_log(
    directory: str | Path,
    segments: Sequence[Segment],
    first_dirty_offset: int,
    now_ms: int,
    config: CleanerConfig,
    producer_last_batches: set[int],
    *,
    aborted: Sequence[tuple[int, int, int]] = (),
    stop: threading.Event | None = None,
    step: StepHook | None = None,
) -> CleanResult:
    """Clean `segments` (sealed, consecutive, oldest first, from the log start) against the
    keys of their dirty part, from `first_dirty_offset`. Blocking: run it on an I/O thread.

    `producer_last_batches`: base offsets of the last batch of each producer id in the whole
    log, kept even when emptied. `aborted`: (producer id, first offset, ABORT marker offset)
    of the aborted transactions, whose records go. `stop`, once set, ends the clean at its
    next read (as an `error`). `step` is called after each step of a swap (tests crash
    there). The contract is in the module docstring."""
    started = time.monotonic()
    directory = Path(directory)
    throttle = Throttle(config.io_bytes_per_second)
    result = CleanResult(first_dirty_offset=first_dirty_offset)
    for before, after in zip(segments, segments[1:], strict=False):
        assert before.next_offset <= after.base_offset, (before, after)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        _clean(dir_fd, directory, segments, now_ms, config, producer_last_batches,
               AbortedRanges(aborted), throttle, stop, step or _no_step, result)
    finally:
        os.close(dir_fd)
    result.bytes_read, result.bytes_written = throttle.bytes_read, throttle.bytes_written
    result.seconds = time.monotonic() - started
    result.throttled_seconds = throttle.slept_s
    return result


def _clean(
    dir_fd: int, directory: Path, segments: Sequence[Segment], now_ms: int,
    config: CleanerConfig, producer_last_batches: set[int], aborted: AbortedRanges,
    throttle: Throttle, stop: threading.Event | None, step: StepHook, result: CleanResult,
) -> None:
    if not segments:
        return
    first_dirty_offset = max(result.first_dirty_offset, segments[0].base_offset)
    try:
        key_map = build_key_map(segments, first_dirty_offset, config.key_map_entries_max,
                                throttle, stop, aborted)
    except Exception as e:
        log.warning("%s: building the key map of a clean failed: %s", directory, e)
        result.error = e
        return
    result.key_map_full = key_map.full
    cleaner = _Filter(key_map, now_ms, config, producer_last_batches, throttle, result,
                      aborted)
    chosen = [s for s in segments if s.base_offset < key_map.end_offset]
    for group in group_segments(chosen, config.segment_bytes, config.segment_index_bytes):
        try:
            new = _clean_group(dir_fd, directory, group, cleaner, config, throttle, stop, step)
        except SwapIncomplete:
            raise
        except Exception as e:
            log.warning("%s: cleaning segments %s failed: %s", directory, group, e)
            result.error = e
            return
        if new is not None:
            result.old_segments += group
            result.new_segments.append(new)
    result.first_dirty_offset = key_map.end_offset


def _no_step(_: str) -> None:
    pass
