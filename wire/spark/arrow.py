"""Fetched record batches -> Arrow record batches with the schema of Spark's Kafka source.

Runs in the Spark executor's Python worker. A fetch reply holds whole RecordBatch v2 batches
as the segment file has them. `RowBuilder.add` checks each batch (size, CRC-32C, record
count), decompresses its record area (every codec) and decodes the areas of the whole fetch
together with `wire.spark.record_columns`: numpy and Arrow passes, a field at a time for all
records, no Python per record. `RowBuilder.build` makes one `pyarrow.RecordBatch` of what it
gathered. Arrow, not Python tuples: Spark takes Arrow batches as they are, tuples cost ~3x
more (DESIGN.md §11).

The per-record decoder (`wire.records`, and a copy of its loop that skips headers and Record
objects) is kept: batches the vectorised pass does not read (see record_columns.py) go
through it, and so does everything when `KRILL_SPARK_DECODER=records` is in the worker's
environment (a way out, and the bench's "before").

What a consumer would not see is dropped here: control batches (transaction markers), records
before the range's start offset (a fetch returns the whole batch holding it) and at or after
its end, and — once the broker reports them — records of aborted transactions
(`TransactionFilter`, the read_committed logic of Kafka's consumer, fed an empty list today).

Schema (Spark's Kafka source; `headers` only with includeHeaders=true):

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int, headers array<struct<key string, value binary>>
"""

from __future__ import annotations

import collections
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from wire import compression, limits
from wire.errors import DecodeError
from wire.record_batch import CRC_START, HEADER_BYTES, BatchHeader, batch_length_at, read_header

# The varint readers of wire.records' hot loop (one-byte case inline), shared on purpose.
from wire.records import _read_varint, _read_varlong, decode_batch
from wire.spark import record_columns

__all__ = [
    "SCHEMA",
    "SCHEMA_WITH_HEADERS",
    "DECODER_ENV",
    "AbortedTransaction",
    "TransactionFilter",
    "RowBuilder",
    "schema_for",
]

_HEADER_TYPE = record_columns.HEADER_TYPE
SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
])
SCHEMA_WITH_HEADERS = SCHEMA.append(pa.field("headers", _HEADER_TYPE))

# "records": the per-record decoder for every batch (RowBuilder's `vectorised`).
DECODER_ENV = "KRILL_SPARK_DECODER"
_CREATE_TIME = 0
_LOG_APPEND_TIME = 1
# A control record's key: version int16, type int16 (0 abort, 1 commit).
_CONTROL_KEY = struct.Struct(">hh")
_ABORT_MARKER = 0


def schema_for(include_headers: bool) -> pa.Schema:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """As a Fetch response lists it: a producer's transaction that began at first_offset
    and ended with an abort marker."""

    producer_id: int
    first_offset: int


class TransactionFilter:
    """Which batches a read_committed consumer skips, fed batch headers in offset order.

    A transactional batch is skipped while its producer has an aborted transaction open: one
    that began at or before the batch (from the fetch's aborted list) and whose abort marker
    has not been passed yet. Control batches are always skipped. With no aborted
    transactions (read_uncommitted, or today's broker) only control batches are skipped.
    """

    def __init__(self, aborted: Iterable[AbortedTransaction] = ()) -> None:
        self._upcoming = collections.deque(sorted(aborted, key=lambda a: a.first_offset))
        self._open: set[int] = set()

    def skip(self, header: BatchHeader, control_type: int | None = None) -> bool:
        upcoming = self._upcoming
        while upcoming and upcoming[0].first_offset <= header.last_offset:
            self._open.add(upcoming.popleft().producer_id)
        if header.is_control:
            if control_type == _ABORT_MARKER:
                self._open.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self._open


class RowBuilder:
    """Columns gathered from fetched batches of one topic partition, for one offset range.

    `vectorised`: decode with record_columns (True) or record by record (False); None: as
    `KRILL_SPARK_DECODER` says (`records` for the latter), else vectorised.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        start_offset: int,
        end_offset: int,
        include_headers: bool = False,
        transactions: TransactionFilter | None = None,
        vectorised: bool | None = None,
    ) -> None:
        assert 0 <= start_offset <= end_offset, (start_offset, end_offset)
        self.topic = topic
        self.partition = partition
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.include_headers = include_headers
        if vectorised is None:
            vectorised = os.environ.get(DECODER_ENV, "vector") != "records"
        self.vectorised = vectorised
        self._transactions = transactions or TransactionFilter()
        self.next_offset = start_offset  # where the next fetch starts
        self._pending: list[_Pending] = []  # batches for one vectorised pass
        self._pending_bytes = 0
        self._chunks: list[_Chunk] = []
        self._chunk_rows = 0
        self._clear_lists()

    def _clear_lists(self) -> None:
        """The per-record decoder's columns, turned into a chunk before the next one."""
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._types: list[int] = []
        self._headers: list[list[tuple[str, bytes | None]]] = []

    @property
    def rows(self) -> int:
        return self._chunk_rows + len(self._offsets)

    @property
    def done(self) -> bool:
        return self.next_offset >= self.end_offset

    def skip_to(self, offset: int) -> None:
        """Go on from `offset` (records before it were deleted: failOnDataLoss=false)."""
        assert offset >= self.next_offset, (offset, self.next_offset)
        self.next_offset = min(offset, self.end_offset)
        # The batch holding `offset` still starts below it: those records are gone as far as
        # the log is concerned (below its start), so they are left out, as a consumer does.
        self.start_offset = max(self.start_offset, self.next_offset)

    def add(self, records: bytes | bytearray | memoryview,
            aborted: Iterable[AbortedTransaction] | None = None) -> int:
        """Take the whole batches in `records`; returns how many batches were taken. A trailing
        partial batch is left (the next fetch starts at `next_offset`). `aborted`: the
        fetch's aborted transactions (read_committed), which the filter follows for these
        batches, as a Kafka consumer does per fetch."""
        if aborted is not None:
            self._transactions = TransactionFilter(aborted)
        view = memoryview(records)
        position, end, taken = 0, len(view), 0
        try:
            while not self.done:
                size = batch_length_at(view, position)
                if size is None or position + size > end:
                    break
                header = read_header(view, position)
                if header.next_offset <= self.next_offset:
                    raise DecodeError(
                        f"batch at offset {header.base_offset} does not pass {self.next_offset}")
                self._add_batch(header, view[position : position + size])
                self.next_offset = header.next_offset
                position += size
                taken += 1
        finally:
            # Also when a batch fails: those before it are taken, as one by one they were.
            self._decode_pending()
        return taken

    def _add_batch(self, header: BatchHeader, batch: memoryview) -> None:
        if header.is_control:
            _, records = decode_batch(batch)
            control_type = None
            if records and records[0].key is not None and len(records[0].key) >= 4:
                control_type = _CONTROL_KEY.unpack_from(records[0].key)[1]
            self._transactions.skip(header, control_type)
            return
        if self._transactions.skip(header) or header.last_offset < self.start_offset:
            return
        if not self.vectorised:
            self._add_records(header, batch)
            return
        area = _record_area(header, batch)
        if self._pending_bytes + len(area) > record_columns.area_bytes_max:
            self._decode_pending()
        whole = header.base_offset >= self.start_offset and header.last_offset < self.end_offset
        self._pending.append(_Pending(header, batch, self.next_offset, record_columns.Area(
            area, header.record_count, header.base_offset, header.base_timestamp,
            header.max_timestamp if header.log_append_time else None, _timestamp_type(header),
            None if whole else (self.start_offset, self.end_offset))))
        self._pending_bytes += len(area)

    def _decode_pending(self) -> None:
        """The pending batches in one vectorised pass; if that fails, each on its own, and
        those that fail alone record by record."""
        batches, self._pending, self._pending_bytes = self._pending, [], 0
        if not batches:
            return
        include = self.include_headers
        columns = record_columns.decode([b.area for b in batches], include)
        if columns is not None:
            self._add_chunk(_Chunk.of(columns))
            return
        for one in batches:
            columns = record_columns.decode([one.area], include) if len(batches) > 1 else None
            if columns is not None:
                self._add_chunk(_Chunk.of(columns))
                continue
            try:
                self._add_records(one.header, one.batch)
            except DecodeError:
                self.next_offset = one.resume_offset  # as if it had failed as it came
                raise

    def _add_chunk(self, chunk: _Chunk) -> None:
        self._lists_to_chunk()
        self._chunks.append(chunk)
        self._chunk_rows += len(chunk.offsets)

    def _lists_to_chunk(self) -> None:
        if not self._offsets:
            return
        chunk = _Chunk(
            pa.array(self._keys, pa.binary()),
            pa.array(self._values, pa.binary()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._timestamps, pa.int64()),
            pa.array(self._types, pa.int32()),
            pa.array(self._headers, _HEADER_TYPE) if self.include_headers else None,
        )
        self._clear_lists()
        self._chunks.append(chunk)
        self._chunk_rows += len(chunk.offsets)

    def _add_records(self, header: BatchHeader, batch: memoryview) -> None:
        """The per-record decoder."""
        kind = _timestamp_type(header)
        if (header.base_offset >= self.start_offset and header.last_offset < self.end_offset
                and not self.include_headers):
            # The hot path: the whole batch, straight into the columns, no Record objects.
            before = len(self._offsets)
            _decode_columns(batch, header, self._keys, self._values, self._offsets,
                            self._timestamps)
            self._types += [kind] * (len(self._offsets) - before)
            return
        _, records = decode_batch(batch)
        if records and (records[0].offset < self.start_offset
                        or records[-1].offset >= self.end_offset):
            low, high = self.start_offset, self.end_offset
            records = [r for r in records if low <= r.offset < high]
        self._keys += [r.key for r in records]
        self._values += [r.value for r in records]
        self._offsets += [r.offset for r in records]
        self._timestamps += [r.timestamp for r in records]
        self._types += [kind] * len(records)
        if self.include_headers:
            self._headers += [list(r.headers) for r in records]

    def build(self) -> pa.RecordBatch:
        """One Arrow batch of every row gathered since the last build; starts afresh."""
        self._lists_to_chunk()
        chunks, self._chunks, self._chunk_rows = self._chunks, [], 0
        count = sum(len(chunk.offsets) for chunk in chunks)
        millis = _concat([c.millis for c in chunks], pa.int64())
        columns = [
            _concat([c.keys for c in chunks], pa.binary()),
            _concat([c.values for c in chunks], pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            _concat([c.offsets for c in chunks], pa.int64()),
            pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
            _concat([c.types for c in chunks], pa.int32()),
        ]
        if self.include_headers:
            columns.append(_concat([c.headers for c in chunks], _HEADER_TYPE))
        return pa.RecordBatch.from_arrays(columns, schema=schema_for(self.include_headers))


@dataclass(frozen=True, slots=True)
class _Pending:
    """A batch waiting for the vectorised pass, kept whole for the per-record decoder."""

    header: BatchHeader
    batch: memoryview
    resume_offset: int  # next_offset before it
    area: record_columns.Area


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Rows of some batches, as Arrow arrays; timestamps in ms."""

    keys: pa.Array
    values: pa.Array
    offsets: pa.Array
    millis: pa.Array
    types: pa.Array
    headers: pa.Array | None

    @classmethod
    def of(cls, columns: record_columns.Columns) -> _Chunk:
        return cls(columns.keys, columns.values, pa.array(columns.offsets),
                   pa.array(columns.timestamps), pa.array(columns.timestamp_types),
                   columns.headers)


def _concat(arrays: list[Any], type_: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.array([], type_)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _timestamp_type(header: BatchHeader) -> int:
    return _LOG_APPEND_TIME if header.log_append_time else _CREATE_TIME


def _record_area(header: BatchHeader, batch: memoryview) -> bytes | memoryview:
    """The batch's record area, checked and decompressed (DecodeError as wire.records)."""
    if header.size > limits.batch_bytes_max:
        raise DecodeError(f"record batch of {header.size} bytes over {limits.batch_bytes_max}")
    if crc32c.crc32c(batch[CRC_START:]) != header.crc:
        raise DecodeError(f"record batch at offset {header.base_offset} fails its CRC-32C")
    count = header.record_count
    if count > limits.batch_records_max:
        raise DecodeError(f"record batch of {count} records over {limits.batch_records_max}")
    area = batch[HEADER_BYTES:]
    codec = header.codec
    return compression.decompress(codec, area, limits.decompressed_bytes_max) if codec else area


def _decode_columns(
    batch: memoryview,
    header: BatchHeader,
    keys: list[bytes | None],
    values: list[bytes | None],
    offsets: list[int],
    timestamps: list[int],
) -> None:
    """Append the batch's records to the columns: wire.records' loop (same checks, same
    errors) minus the Record objects, which cost a third of the time. Headers are skipped."""
    area = bytes(_record_area(header, batch))
    count = header.record_count
    base_offset, base_timestamp = header.base_offset, header.base_timestamp
    stamped = header.max_timestamp if header.log_append_time else None
    varint, varlong = _read_varint, _read_varlong
    add_key, add_value = keys.append, values.append
    add_offset, add_timestamp = offsets.append, timestamps.append
    end = len(area)
    pos = 0
    try:
        for _ in range(count):
            length, pos = varint(area, pos)
            record_end = pos + length
            if length < 6 or record_end > end:
                raise DecodeError(f"record length {length} at byte {pos} overruns the batch")
            timestamp_delta, pos = varlong(area, pos + 1)  # + 1: attributes, unused
            offset_delta, pos = varint(area, pos)
            size, pos = varint(area, pos)
            if size < 0:
                add_key(None)
            elif pos + size > record_end:
                raise DecodeError(f"record key of {size} bytes overruns its record")
            else:
                add_key(area[pos : pos + size])
                pos += size
            size, pos = varint(area, pos)
            if size < 0:
                add_value(None)
            elif pos + size > record_end:
                raise DecodeError(f"record value of {size} bytes overruns its record")
            else:
                add_value(area[pos : pos + size])
                pos += size
            pos = record_end  # headers: not asked for
            add_offset(base_offset + offset_delta)
            add_timestamp(base_timestamp + timestamp_delta if stamped is None else stamped)
    except IndexError:
        raise DecodeError("record batch truncated inside a record") from None
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last of {count} records")
