"""Records inside v2 batches: decode them for consumers, build batches as a producer would.

The broker itself never looks inside a batch (wire.record_batch walks headers only); this
module is for the readers that do — the Spark executor's fetch path, log compaction
(storage/compaction.py), tools and tests.
`decode_batch` turns one whole batch into its header and records, `iter_records` walks the
`records` blob of a Fetch response the way a Kafka consumer does (control batches hidden,
records before the fetch offset dropped, a trailing cut-off batch ignored), and
`build_batch` writes a batch byte for byte as a Kafka producer would, and `rebuild_batch`
what log compaction leaves of one (some records, same offsets). Layout:
shared/kafka-protocol/RECORD_BATCH.md.

    Record   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
             | keyLength varint | key | valueLength varint | value | headerCount varint
             | headers
    Header   keyLength varint | key (UTF-8) | valueLength varint | value

Decoding is a hot loop (hundreds of thousands of records a second), so `_decode_records`
reads from one `bytes` object with locally bound helpers, and allocates nothing per record
beyond the Record and its key, value and headers. Record offsets are not required to be
0, 1, 2, ...: compaction leaves gaps inside a batch, so offsetDelta is taken as written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from wire import compression, limits
from wire.errors import DecodeError
from wire.primitives import read_varint, read_varlong, write_varint, write_varlong
from wire.record_batch import (
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    HEADER_BYTES,
    LENGTH_PREFIX_BYTES,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    batch_length_at,
    read_header,
)

__all__ = ["Record", "decode_batch", "iter_records", "build_batch", "rebuild_batch"]

Header = tuple[str, bytes | None]
_Buffer = bytes | bytearray | memoryview

_CRC_START = 21
_MAGIC = 2
# No partition leader epoch: what a producer sends; the broker writes its own on append.
_NO_LEADER_EPOCH = -1
_NO_TIMESTAMP = -1
_HEADER = struct.Struct(">qiibIhiqqqhii")
# A record is at least 6 bytes after its length: attributes, timestampDelta, offsetDelta,
# keyLength, valueLength, headerCount, one byte each. A header is at least 2.
_RECORD_BODY_BYTES_MIN = 6
_HEADER_BYTES_MIN = 2


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a consumer sees it: absolute offset and timestamp, raw key and value."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


_RECORD_SLOT_SETTERS = tuple(
    getattr(Record, name).__set__ for name in ("offset", "timestamp", "key", "value", "headers")
)


# Decoding ------------------------------------------------------------------------------


def decode_batch(batch: _Buffer, *, check_crc: bool = True) -> tuple[BatchHeader, list[Record]]:
    """Decode one whole batch (exactly one: trailing bytes are an error) into its records."""
    header = read_header(batch, 0)
    if header.size != len(batch):
        raise DecodeError(f"record batch is {len(batch)} bytes, its header says {header.size}")
    return header, _decode_body(batch, header, check_crc)


def iter_records(
    data: _Buffer, *, start_offset: int = 0, check_crc: bool = True
) -> Iterator[Record]:
    """Records of the batches in a Fetch response's `records` blob, as a consumer sees them.

    Control batches (transaction markers) are skipped, as are records below `start_offset`
    (a fetch returns whole batches, so the first one may start before the fetch offset). A
    trailing partial batch — the broker cuts the blob at the fetch's byte limit — is ignored.
    """
    view = memoryview(data)
    position = 0
    end = len(view)
    while True:
        size = batch_length_at(view, position)
        if size is None or position + size > end:
            return  # the cut-off tail; a batch whose bytes are all here must be sound
        header = read_header(view, position)
        if not header.is_control and header.last_offset >= start_offset:
            records = _decode_body(view, header, check_crc)
            if records and records[0].offset < start_offset:
                records = [r for r in records if r.offset >= start_offset]
            yield from records
        position += size


def _decode_body(buf: _Buffer, header: BatchHeader, check_crc: bool) -> list[Record]:
    if header.size > limits.batch_bytes_max:
        raise DecodeError(f"record batch of {header.size} bytes over {limits.batch_bytes_max}")
    start = header.position
    end = start + header.size
    view = memoryview(buf)
    if check_crc and crc32c.crc32c(view[start + _CRC_START : end]) != header.crc:
        raise DecodeError(f"record batch at offset {header.base_offset} fails its CRC-32C")
    count = header.record_count
    if count > limits.batch_records_max:
        raise DecodeError(f"record batch of {count} records over {limits.batch_records_max}")
    area = view[start + HEADER_BYTES : end]
    codec = header.codec
    if codec:
        area_bytes = compression.decompress(codec, area, limits.decompressed_bytes_max)
    else:
        area_bytes = area.tobytes()
    if count * (1 + _RECORD_BODY_BYTES_MIN) > len(area_bytes):
        raise DecodeError(f"record batch claims {count} records in {len(area_bytes)} bytes")
    stamped_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_BIT else None
    return _decode_records(
        area_bytes, count, header.base_offset, header.base_timestamp, stamped_time
    )


def _decode_records(
    area: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    stamped_time: int | None,
) -> list[Record]:
    """The `count` records filling `area`; `stamped_time` overrides every timestamp."""
    records: list[Record] = []
    append = records.append
    # Filling the slots directly skips the frozen dataclass's __init__, which goes through
    # object.__setattr__ once per field: a third of the per-record cost.
    record_type = Record
    new_record = object.__new__
    set_offset, set_timestamp, set_key, set_value, set_headers = _RECORD_SLOT_SETTERS
    varint = _read_varint
    varlong = _read_varlong
    read_headers = _decode_headers
    end = len(area)
    pos = 0
    try:
        for _ in range(count):
            length, pos = varint(area, pos)
            record_end = pos + length
            if length < _RECORD_BODY_BYTES_MIN or record_end > end:
                raise DecodeError(f"record length {length} at byte {pos} overruns the batch")
            timestamp_delta, pos = varlong(area, pos + 1)  # + 1: attributes, unused
            offset_delta, pos = varint(area, pos)
            size, pos = varint(area, pos)
            if size < 0:
                key = None
            elif pos + size > record_end:
                raise DecodeError(f"record key of {size} bytes overruns its record")
            else:
                key = area[pos : pos + size]
                pos += size
            size, pos = varint(area, pos)
            if size < 0:
                value = None
            elif pos + size > record_end:
                raise DecodeError(f"record value of {size} bytes overruns its record")
            else:
                value = area[pos : pos + size]
                pos += size
            header_count, pos = varint(area, pos)
            if header_count:
                headers, pos = read_headers(area, pos, record_end, header_count)
            else:
                headers = ()
            if pos != record_end:
                raise DecodeError(f"record ends at byte {pos}, its length says {record_end}")
            record = new_record(record_type)
            set_offset(record, base_offset + offset_delta)
            set_timestamp(
                record, base_timestamp + timestamp_delta if stamped_time is None else stamped_time
            )
            set_key(record, key)
            set_value(record, value)
            set_headers(record, headers)
            append(record)
    except IndexError:
        raise DecodeError("record batch truncated inside a record") from None
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last of {count} records")
    return records


def _decode_headers(
    area: bytes, pos: int, record_end: int, count: int
) -> tuple[tuple[Header, ...], int]:
    if count < 0 or count > limits.record_headers_max:
        raise DecodeError(f"record with {count} headers")
    if count * _HEADER_BYTES_MIN > record_end - pos:
        raise DecodeError(f"{count} record headers cannot fit in {record_end - pos} bytes")
    headers: list[Header] = []
    for _ in range(count):
        size, pos = _read_varint(area, pos)
        if size < 0 or pos + size > record_end:
            raise DecodeError(f"record header key of {size} bytes overruns its record")
        try:
            name = area[pos : pos + size].decode()
        except UnicodeDecodeError as exc:
            raise DecodeError(f"record header key is not UTF-8: {exc}") from None
        pos += size
        size, pos = _read_varint(area, pos)
        if size < 0:
            value = None
        elif pos + size > record_end:
            raise DecodeError(f"record header value of {size} bytes overruns its record")
        else:
            value = area[pos : pos + size]
            pos += size
        headers.append((name, value))
    return tuple(headers), pos


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varint; the one-byte case (most lengths and deltas) without a further call."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    b2 = buf[pos + 1]
    if b2 < 0x80:  # two bytes: record lengths and values of 64..8191 bytes
        u = (b & 0x7F) | (b2 << 7)
        return (u >> 1) ^ -(u & 1), pos + 2
    return read_varint(buf, pos)  # type: ignore[arg-type]  # works on any indexable buffer


def _read_varlong(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    return read_varlong(buf, pos)  # type: ignore[arg-type]


# Building --------------------------------------------------------------------------------

# What build_batch accepts per record: (key, value, headers), or anything with .key, .value,
# .headers (and optionally .timestamp), such as a Record.
RecordInput = tuple[bytes | None, bytes | None, Sequence[tuple[str | bytes, bytes | None]]] | Any


def build_batch(
    records: Sequence[RecordInput],
    *,
    codec: int = compression.CODEC_NONE,
    base_offset: int = 0,
    base_timestamp: int | None = None,
    timestamps: Sequence[int] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
) -> bytearray:
    """One v2 batch holding `records`, byte for byte as a Kafka producer writes it.

    Offset deltas run 0..n-1. Timestamps: `timestamps` (one per record) if given, else each
    Record-like's own `.timestamp`, else `base_timestamp`, else -1 (no timestamp) — this
    module reads no clock. baseTimestamp is `base_timestamp` if given, else the first
    record's timestamp.
    """
    keys_values_headers, record_times = _normalize(records, base_timestamp, timestamps)
    if base_timestamp is None:
        base_timestamp = record_times[0] if record_times else _NO_TIMESTAMP
    area = bytearray()
    for delta, ((key, value, headers), timestamp) in enumerate(
        zip(keys_values_headers, record_times, strict=True)
    ):
        _encode_record(area, delta, timestamp - base_timestamp, key, value, headers)
    if codec != compression.CODEC_NONE:
        area = bytearray(compression.compress(codec, area))
    attributes = codec & 0x07
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_BIT
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if control:
        attributes |= CONTROL_BIT
    count = len(record_times)
    batch = bytearray(HEADER_BYTES)
    _HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_BYTES - LENGTH_PREFIX_BYTES + len(area),
        _NO_LEADER_EPOCH,
        _MAGIC,
        0,  # crc, below
        attributes,
        max(count - 1, 0),
        base_timestamp,
        max(record_times, default=_NO_TIMESTAMP),
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    batch += area
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[_CRC_START:]))
    return batch


def rebuild_batch(
    header: BatchHeader, records: Sequence[Record], *, delete_horizon_ms: int | None = None
) -> bytearray:
    """The batch `header` describes, holding only `records` (some of its own, in order): what
    log compaction writes (Kafka's MemoryRecords.filterTo).

    Kept from the original: baseOffset, lastOffsetDelta (so the producer's last sequence
    survives), partitionLeaderEpoch, producer id, epoch and base sequence, the codec, the
    timestamp type and the transactional and control bits. Each record keeps its offset (its
    offsetDelta) and its timestamp. baseTimestamp is the original's, so the timestamp deltas
    stay as written, unless the batch has a delete horizon (KIP-534: attributes bit 6, the
    horizon in baseTimestamp, deltas taken from it): `delete_horizon_ms` sets one, a horizon
    the batch had is kept. maxTimestamp is the largest kept timestamp (with LogAppendTime, the
    original's). With no records it is Kafka's empty batch: no codec, no base timestamp, no
    horizon, the original maxTimestamp; it only carries producer state.
    """
    attributes = header.attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT)
    area = bytearray()
    if not records:
        base_timestamp, max_timestamp = _NO_TIMESTAMP, header.max_timestamp
    else:
        horizon = header.delete_horizon_ms if delete_horizon_ms is None else delete_horizon_ms
        base_timestamp = header.base_timestamp if horizon is None else horizon
        if horizon is not None:
            attributes |= DELETE_HORIZON_BIT
        previous = header.base_offset - 1
        for record in records:
            if not previous < record.offset <= header.last_offset:
                raise ValueError(f"record offset {record.offset} out of order or outside "
                                 f"{header.base_offset}..{header.last_offset}")
            previous = record.offset
            _encode_record(area, record.offset - header.base_offset,
                           record.timestamp - base_timestamp, record.key, record.value,
                           record.headers)
        if header.log_append_time:
            max_timestamp = header.max_timestamp
        else:
            max_timestamp = max(record.timestamp for record in records)
        if header.codec != compression.CODEC_NONE:
            area = bytearray(compression.compress(header.codec, area))
        attributes |= header.codec
    batch = bytearray(HEADER_BYTES)
    _HEADER.pack_into(
        batch,
        0,
        header.base_offset,
        HEADER_BYTES - LENGTH_PREFIX_BYTES + len(area),
        header.partition_leader_epoch,
        _MAGIC,
        0,  # crc, below
        attributes,
        header.last_offset_delta,
        base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        len(records),
    )
    batch += area
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[_CRC_START:]))
    return batch


def _normalize(
    records: Sequence[RecordInput],
    base_timestamp: int | None,
    timestamps: Sequence[int] | None,
) -> tuple[list[tuple[Any, Any, Any]], list[int]]:
    """Split the inputs into (key, value, headers) triples and one timestamp per record."""
    triples: list[tuple[Any, Any, Any]] = []
    own_times: list[int] = []
    fallback = _NO_TIMESTAMP if base_timestamp is None else base_timestamp
    for item in records:
        if isinstance(item, tuple) and not hasattr(item, "key"):
            triples.append((item[0], item[1], item[2] if len(item) > 2 else ()))
            own_times.append(fallback)
        else:
            triples.append((item.key, item.value, item.headers))
            own_times.append(getattr(item, "timestamp", fallback))
    if timestamps is not None:
        if len(timestamps) != len(triples):
            raise ValueError(f"{len(timestamps)} timestamps for {len(triples)} records")
        own_times = list(timestamps)
    return triples, own_times


def _encode_record(
    out: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str | bytes, bytes | None]],
) -> None:
    body = bytearray(b"\x00")  # attributes: unused, 0
    write_varlong(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_nullable(body, key)
    _write_nullable(body, value)
    write_varint(body, len(headers))
    for name, header_value in headers:
        name_bytes = name.encode() if isinstance(name, str) else bytes(name)
        write_varint(body, len(name_bytes))
        body += name_bytes
        _write_nullable(body, header_value)
    write_varint(out, len(body))
    out += body


def _write_nullable(out: bytearray, data: bytes | None) -> None:
    if data is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(data))
        out += data
