"""Test helper: build valid RecordBatch v2 bytes (records encoded, CRC-32C set)."""

from __future__ import annotations

import struct

import crc32c

from storage.log import FileSlice
from storage.segment import Segment
from wire.record_batch import BatchHeader, iter_batches, patch_base_offset, read_header

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = (
        b"\x00"
        + _varint(timestamp_delta)
        + _varint(offset_delta)
        + _varint(-1)  # null key
        + _varint(len(value))
        + value
        + _varint(0)  # no headers
    )
    return _varint(len(body)) + body


def make_batch(timestamps: list[int], value_bytes: int = 10, fill: int = 0x61) -> bytes:
    """One uncompressed batch, one record per timestamp, base offset 0, epoch -1."""
    assert timestamps
    base_ts = timestamps[0]
    records = b"".join(
        _record(i, ts - base_ts, bytes([fill]) * value_bytes) for i, ts in enumerate(timestamps)
    )
    after_crc = (
        _AFTER_CRC.pack(
            0, len(timestamps) - 1, base_ts, max(timestamps), -1, -1, -1, len(timestamps)
        )
        + records
    )
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # epoch + magic + crc + rest
    return struct.pack(">qiibI", 0, batch_length, -1, 2, crc) + after_crc


def make_records(*batches: bytes) -> tuple[bytearray, list[BatchHeader]]:
    """A produce `records` buffer of `batches` and its checked headers, as append() takes."""
    records = bytearray(b"".join(batches))
    return records, iter_batches(records)


def batch_of_size(total_bytes: int, timestamp: int = 1000) -> bytes:
    """A one-record batch of exactly `total_bytes` (at least ~75)."""
    overhead = len(make_batch([timestamp], 0))
    value_bytes = total_bytes - overhead
    for _ in range(3):  # the value's length varint grows with it
        batch = make_batch([timestamp], value_bytes)
        value_bytes += total_bytes - len(batch)
    assert len(batch) == total_bytes, (len(batch), total_bytes)
    return batch


def leader_records(
    base_offset: int, epochs: list[int], records_per_batch: int = 2, value_bytes: int = 10
) -> tuple[bytearray, list[BatchHeader]]:
    """Batches as a leader wrote them, for append_replicated: one per entry of `epochs`, with
    that partitionLeaderEpoch, `records_per_batch` records each, offsets from `base_offset`."""
    records = bytearray(b"".join(
        make_batch([1000 + i] * records_per_batch, value_bytes) for i in range(len(epochs))))
    position, offset = 0, base_offset
    for epoch in epochs:
        header = read_header(records, position)
        patch_base_offset(records, position, offset, epoch)
        offset += header.last_offset_delta + 1
        position += header.size
    return records, iter_batches(records)


def as_file_slice(region: object, segment: Segment, position: int = 0) -> FileSlice:
    """`region` as a slice of `segment`'s file: a direct-mode read of recent batches is a
    copy of the writer's memory, and a test of what a slice's fd does needs the file's."""
    if isinstance(region, FileSlice):
        return region
    assert isinstance(region, memoryview), region
    return FileSlice(segment.fd, position, len(region), str(segment.log_path), 0,
                     segment.inode, segment.file)


def every_batch(log: object) -> list[bytes]:
    """Every batch of `log` (a DiskLog or MemoryLog) from its start, read segment by segment
    as a consumer reads: each batch's bytes, in order."""
    out: list[bytes] = []
    offset = log.log_start_offset  # type: ignore[attr-defined]
    while offset < log.next_offset:  # type: ignore[attr-defined]
        data = log.read_bytes(offset, 1 << 62, 1 << 62)  # type: ignore[attr-defined]
        headers = iter_batches(data)
        out += [data[h.position:h.position + h.size] for h in headers]
        offset = headers[-1].next_offset
    return out
