"""Fetched record batches -> Arrow record batches with the schema of Spark's Kafka source.

Runs in the Spark executor's Python worker. A fetch reply holds whole RecordBatch v2 batches
as the segment file has them; `RowBuilder.add` decodes them with `wire.records` (every codec)
and gathers columns, `RowBuilder.build` makes one `pyarrow.RecordBatch` from them. Arrow, not
Python tuples: Spark takes Arrow batches as they are, tuples cost ~3× more (DESIGN.md §11).

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
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from wire import compression, limits
from wire.errors import DecodeError
from wire.record_batch import CRC_START, HEADER_BYTES, BatchHeader, batch_length_at, read_header

# The varint readers of wire.records' hot loop (one-byte case inline), shared on purpose.
from wire.records import _read_varint, _read_varlong, decode_batch

__all__ = [
    "SCHEMA",
    "SCHEMA_WITH_HEADERS",
    "AbortedTransaction",
    "TransactionFilter",
    "RowBuilder",
    "schema_for",
]

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
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
    """Columns gathered from fetched batches of one topic partition, for one offset range."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start_offset: int,
        end_offset: int,
        include_headers: bool = False,
        transactions: TransactionFilter | None = None,
    ) -> None:
        assert 0 <= start_offset <= end_offset, (start_offset, end_offset)
        self.topic = topic
        self.partition = partition
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.include_headers = include_headers
        self._transactions = transactions or TransactionFilter()
        self.next_offset = start_offset  # where the next fetch starts
        self._clear()

    def _clear(self) -> None:
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._types: list[int] = []
        self._headers: list[list[tuple[str, bytes | None]]] = []

    @property
    def rows(self) -> int:
        return len(self._offsets)

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

    def add(self, records: bytes | bytearray | memoryview) -> int:
        """Take the whole batches in `records`; returns how many batches were taken. A trailing
        partial batch is left (the next fetch starts at `next_offset`)."""
        view = memoryview(records)
        position, end, taken = 0, len(view), 0
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
        kind = _LOG_APPEND_TIME if header.log_append_time else _CREATE_TIME
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
        count = len(self._offsets)
        millis = pa.array(self._timestamps, pa.int64())
        columns = [
            pa.array(self._keys, pa.binary()),
            pa.array(self._values, pa.binary()),
            pa.array([self.topic] * count, pa.string()),
            pa.array([self.partition] * count, pa.int32()),
            pa.array(self._offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self._types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self._headers, _HEADER_TYPE))
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=schema_for(self.include_headers))


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
    if header.size > limits.batch_bytes_max:
        raise DecodeError(f"record batch of {header.size} bytes over {limits.batch_bytes_max}")
    if crc32c.crc32c(batch[CRC_START:]) != header.crc:
        raise DecodeError(f"record batch at offset {header.base_offset} fails its CRC-32C")
    count = header.record_count
    if count > limits.batch_records_max:
        raise DecodeError(f"record batch of {count} records over {limits.batch_records_max}")
    area_view = batch[HEADER_BYTES:]
    codec = header.codec
    area = (compression.decompress(codec, area_view, limits.decompressed_bytes_max) if codec
            else area_view.tobytes())
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
