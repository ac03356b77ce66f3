"""MemoryLog: the `Log` interface held in memory, with the same segments and offsets as DiskLog.

It exists for tests of the layers above storage and as the model the DiskLog fuzzer compares
against, so it follows the same roll rules (a read stops at a segment end in both) but keeps
each batch as its own bytes and finds things by plain binary search. Nothing is ever lost,
so a flush ticket's `run` does nothing, and neither does a cut ticket's (storage/replica.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from storage.epochs import EpochCache
from storage.flush import FlushAccounting, FlushTicket
from storage.log import (
    AppendResult,
    LogConfig,
    OffsetOutOfRange,
    append_result,
    assign_offsets,
    needs_roll,
)
from storage.replica import CutTicket, ReplicaAccounting, replicated_batches
from storage.segment import BatchInfo, Segment, header_at_position
from wire.record_batch import BatchHeader, read_header

__all__ = ["MemoryLog"]


@dataclass(slots=True)
class _MemorySegment:
    base_offset: int
    first_append_ms: int | None = None
    batches: list[bytes] = field(default_factory=list)
    headers: list[BatchHeader] = field(default_factory=list)  # positions within the segment
    ends: list[int] = field(default_factory=list)  # next offset of each batch, for bisect
    size: int = 0

    @property
    def next_offset(self) -> int:
        return self.ends[-1] if self.ends else self.base_offset

    def first_index(self, offset: int) -> int:
        """Index of the batch holding `offset` or the first after it (len if none)."""
        return bisect_right(self.ends, offset)

    def append(self, data: bytes) -> None:
        header = header_at_position(read_header(data), self.size)
        self.batches.append(data)
        self.headers.append(header)
        self.ends.append(header.next_offset)
        self.size += header.size

    @property
    def last_epoch(self) -> int | None:
        return self.headers[-1].partition_leader_epoch if self.headers else None

    def keep(self, count: int) -> None:
        del self.batches[count:], self.headers[count:], self.ends[count:]
        self.size = sum(h.size for h in self.headers)
        if not self.batches:
            self.first_append_ms = None


class MemoryLog(FlushAccounting, ReplicaAccounting):
    def __init__(self, config: LogConfig = LogConfig(), log_start_offset: int = 0) -> None:  # noqa: B008
        self.config = config
        self._segments = [_MemorySegment(log_start_offset)]
        self._ticket: FlushTicket | None = None
        self._truncated_to: int | None = None  # lowest truncation while a ticket is out
        self._epochs = EpochCache()
        self._cut: CutTicket | None = None
        self.log_start_offset = log_start_offset
        self.next_offset = self.written_offset = self.flushed_offset = log_start_offset
        self._states: dict[str, Any] = {}  # state_writer's files, in memory

    def state_writer(self, name: str, value: Any) -> Callable[[], None]:
        def write() -> None:
            self._states[name] = value

        return write

    def read_state(self, name: str, default: Any = None) -> Any:
        return self._states.get(name, default)

    @property
    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._segments]

    def _check_offsets(self) -> None:
        assert self.flushed_offset <= self.written_offset <= self.next_offset, self
        assert self.next_offset == self._segments[-1].next_offset

    def append(
        self, records: bytearray, headers: list[BatchHeader], leader_epoch: int, now_ms: int
    ) -> AppendResult:
        self._check_no_cut()
        batches = assign_offsets(records, headers, leader_epoch, self.next_offset)
        return self._append(records, headers, batches, now_ms)

    def roll_ahead(self, base_offset: int, last_offset: int, size: int, epoch: int,
                   now_ms: int) -> Callable[[], Segment] | None:
        """Never: a memory segment has no files to make (storage/log.py)."""
        return None

    def install_segment(self, segment: Segment) -> bool:
        raise AssertionError("a memory log never rolls ahead")

    def append_replicated(
        self, records: bytearray, headers: list[BatchHeader], now_ms: int
    ) -> AppendResult:
        self._check_no_cut()
        base = self._replicated_base(headers[0])
        batches = replicated_batches(headers, base, self._epochs.last_epoch)
        if base < self.next_offset:
            self._start_afresh(base)
        return self._append(records, headers, batches, now_ms)

    def _holds_no_batch(self) -> bool:
        return len(self._segments) == 1 and not self._segments[0].batches

    def _start_afresh(self, base_offset: int) -> None:
        """DiskLog._start_afresh."""
        self._segments = [_MemorySegment(base_offset)]
        self.next_offset = self.written_offset = base_offset
        self._cap_flushed()
        self.flushed_offset = base_offset

    def _append(self, records: bytearray, headers: list[BatchHeader], batches: list[BatchInfo],
                now_ms: int) -> AppendResult:
        self._check_offsets()
        for batch, header in zip(batches, headers, strict=True):
            active = self._segments[-1]
            if needs_roll(self.config, active.size, active.base_offset, active.first_append_ms,
                          batch, now_ms, last_epoch=active.last_epoch):
                active = _MemorySegment(batch.base_offset)
                self._segments.append(active)
            if active.first_append_ms is None:
                active.first_append_ms = now_ms
            active.append(bytes(records[header.position:header.position + header.size]))
            self._epochs.append(batch.epoch, max(batch.base_offset, self.log_start_offset))
        self.next_offset = self.written_offset = batches[-1].last_offset + 1
        self._check_offsets()
        return append_result(batches)

    def flush_prepare(self) -> FlushTicket | None:
        self._check_offsets()
        assert self._ticket is None, "one flush ticket at a time"
        if self.flushed_offset == self.written_offset:
            return None
        self._ticket = FlushTicket(self.written_offset, [])
        self._truncated_to = None
        return self._ticket

    def _segment_index(self, offset: int) -> int:
        i = max(bisect_right([s.base_offset for s in self._segments], offset) - 1, 0)
        while i + 1 < len(self._segments) and self._segments[i].next_offset <= offset:
            i += 1
        return i

    def read(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> memoryview | None:
        if not self.log_start_offset <= offset <= self.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} outside {self.log_start_offset}..{self.next_offset}")
        segment = self._segments[self._segment_index(offset)]
        chosen: list[bytes] = []
        total = 0
        for i in range(segment.first_index(offset), len(segment.batches)):
            header = segment.headers[i]
            if header.last_offset >= max_offset:
                break
            if chosen and total + header.size > max_bytes:
                break
            chosen.append(segment.batches[i])
            total += header.size
        return memoryview(b"".join(chosen)) if chosen else None

    def read_bytes(
        self, offset: int, max_bytes: int, max_offset: int, nowait: bool = False
    ) -> bytes:
        region = self.read(offset, max_bytes, max_offset)
        return b"" if region is None else bytes(region)

    def offset_for_timestamp(
        self, timestamp_ms: int, nowait: bool = False
    ) -> tuple[int, int] | None:
        for header in self.iter_batch_headers(self.log_start_offset):
            if header.max_timestamp >= timestamp_ms:
                return header.base_offset, header.max_timestamp
        return None

    def max_timestamp(self, nowait: bool = False) -> tuple[int, int] | None:
        best: BatchHeader | None = None
        for header in self.iter_batch_headers(self.log_start_offset):
            if not header.is_control and header.max_timestamp >= 0 and (
                best is None or header.max_timestamp > best.max_timestamp
            ):
                best = header
        return None if best is None else (best.base_offset, best.max_timestamp)

    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        from_offset = max(from_offset, self.log_start_offset)
        i = self._segment_index(from_offset)
        yield from self._segments[i].headers[self._segments[i].first_index(from_offset):]
        for segment in self._segments[i + 1:]:
            yield from segment.headers

    def truncate(self, offset: int) -> None:
        self._check_offsets()
        if offset >= self.next_offset:
            return
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            self._segments.pop()
        active = self._segments[-1]
        # Keep batches with base < offset: the batch holding `offset` stays whole.
        active.keep(sum(1 for h in active.headers if h.base_offset < offset))
        self.next_offset = self.written_offset = active.next_offset
        if self.next_offset < self.log_start_offset and self._holds_no_batch():
            self._start_afresh(self.log_start_offset)  # DiskLog.truncate
        self._epochs.truncate(self.next_offset)
        self._cap_flushed()

    def truncate_to(self, next_offset: int) -> CutTicket:
        """DiskLog.truncate_to; the ticket syncs nothing."""
        self._check_cut_point(next_offset)
        self.truncate(next_offset)
        self._cut = CutTicket(self.next_offset, [])
        return self._cut

    def reset(self, start_offset: int, epoch: int) -> CutTicket:
        """DiskLog.reset; the ticket syncs nothing."""
        assert self._cut is None and start_offset >= 0, (self._cut, start_offset)
        self._start_afresh(start_offset)
        self.log_start_offset = start_offset
        self._epochs.reset(epoch)
        self._cut = CutTicket(start_offset, [])
        return self._cut

    def forget_volatile_state(self) -> None:
        """Become what a DiskLog is after close and reopen: nothing counted as flushed until
        the next flush ticket (the recovery sync, storage/log.py), and the active segments'
        first-append times unknown (the time-based roll clock restarts)."""
        assert self._ticket is None
        self.flushed_offset = self.log_start_offset
        for segment in self._segments:
            segment.first_append_ms = None

    def close(self) -> None:
        pass
