"""RecordBatch v2 header view: read, check and patch a batch without decoding its records.

The produce path keeps record sets opaque. It walks the batches in a `records` blob by their
61-byte headers, checks magic, lengths and the CRC-32C, and patches `baseOffset` and
`partitionLeaderEpoch` in place when the log assigns offsets. Neither field is covered by the
CRC, so patching never invalidates a batch. Layout: shared/kafka-protocol/RECORD_BATCH.md.

    offset  size  field
         0     8  baseOffset              (patched by the broker)
         8     4  batchLength             (bytes after this field)
        12     4  partitionLeaderEpoch    (patched by the broker)
        16     1  magic = 2
        17     4  crc (CRC-32C of bytes 21..end)
        21     2  attributes
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordCount
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from wire import limits
from wire.errors import DecodeError

__all__ = [
    "HEADER_BYTES",
    "LENGTH_PREFIX_BYTES",
    "BatchHeader",
    "iter_batches",
    "read_header",
    "patch_base_offset",
    "set_log_append_time",
    "batch_crc",
    "offsets_spanned",
    "CODEC_MASK",
    "TIMESTAMP_TYPE_BIT",
    "TRANSACTIONAL_BIT",
    "CONTROL_BIT",
    "DELETE_HORIZON_BIT",
]

HEADER_BYTES = limits.batch_header_bytes
# baseOffset + batchLength: the part of the header before the length-counted region.
LENGTH_PREFIX_BYTES = 12
CRC_START = 21

CODEC_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# KIP-534: baseTimestamp holds the compaction delete horizon, not the first record's time.
DELETE_HORIZON_BIT = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_LENGTH = struct.Struct(">qi")


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded 61-byte header of one batch, plus where it sits in its buffer."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Whole batch size in bytes, header included."""
        return self.batch_length + LENGTH_PREFIX_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When compaction may drop this batch's tombstones (KIP-534), if a clean set it."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Decode the header at `position`; raise DecodeError if it is short or not magic v2."""
    if len(buf) - position < HEADER_BYTES:
        raise DecodeError(f"record batch header truncated at {position}")
    fields = _HEADER.unpack_from(buf, position)
    if fields[3] != 2:
        raise DecodeError(f"record batch magic {fields[3]} is not 2")
    header = BatchHeader(position, *fields)
    if header.batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES:
        raise DecodeError(f"record batch length {header.batch_length} below the header size")
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise DecodeError("record batch with a negative offset delta or record count")
    return header


def batch_length_at(buf: bytes | bytearray | memoryview, position: int) -> int | None:
    """Whole size of the batch starting at `position`, or None if fewer than 12 bytes remain."""
    if len(buf) - position < LENGTH_PREFIX_BYTES:
        return None
    _, length = _LENGTH.unpack_from(buf, position)
    return int(length) + LENGTH_PREFIX_BYTES


def offsets_spanned(buf: bytes | bytearray | memoryview) -> int:
    """Offsets the whole batches in `buf` span, from the first one's base offset to the last
    one's last offset (control records and compacted gaps included): a FileSlice's `records`
    for bytes read from memory. Walks the length prefixes only."""
    position, last = 0, None
    while (size := batch_length_at(buf, position)) is not None and position + size <= len(buf):
        last = position
        position += size
    if last is None:
        return 0
    first_base = int.from_bytes(buf[0:8], "big")
    last_base = int.from_bytes(buf[last:last + 8], "big")
    delta = int.from_bytes(buf[last + 23:last + 27], "big")
    return last_base + delta + 1 - first_base


def batch_crc(buf: bytes | bytearray | memoryview, header: BatchHeader) -> int:
    """CRC-32C of the CRC'd region of the batch `header` describes."""
    start = header.position + CRC_START
    end = header.position + header.size
    return crc32c.crc32c(memoryview(buf)[start:end])


def iter_batches(
    buf: bytes | bytearray | memoryview,
    *,
    check_crc: bool = True,
    batch_bytes_max: int = limits.batch_bytes_max,
) -> list[BatchHeader]:
    """Every batch in a produce `records` blob, checked; DecodeError on the first bad one.

    A produce request must hold whole batches only: a trailing partial batch is an error here
    (a fetch response may end with one, but that is the reader's concern, not the broker's).
    """
    headers: list[BatchHeader] = []
    position = 0
    end = len(buf)
    while position < end:
        header = read_header(buf, position)
        if header.size > batch_bytes_max:
            raise DecodeError(f"record batch of {header.size} bytes over {batch_bytes_max}")
        if position + header.size > end:
            raise DecodeError("record batch truncated")
        if check_crc and batch_crc(buf, header) != header.crc:
            raise DecodeError(f"record batch at {position} fails its CRC-32C check")
        headers.append(header)
        position += header.size
    return headers


def patch_base_offset(
    buf: bytearray | memoryview, position: int, base_offset: int, leader_epoch: int
) -> None:
    """Write `baseOffset` and `partitionLeaderEpoch` into the batch at `position` in place."""
    _BASE_OFFSET.pack_into(buf, position, base_offset)
    _EPOCH.pack_into(buf, position + 12, leader_epoch)


_TIMESTAMP = struct.Struct(">q")
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")


def set_log_append_time(buf: bytearray | memoryview, header: BatchHeader, now_ms: int) -> None:
    """Stamp a batch with the broker's append time (topic `message.timestamp.type=LogAppendTime`).

    Sets the timestamp-type bit and maxTimestamp, both inside the CRC'd region, so the CRC is
    computed again. Consumers read every record's timestamp as `maxTimestamp`.
    """
    position = header.position
    _ATTRIBUTES.pack_into(buf, position + 21, header.attributes | TIMESTAMP_TYPE_BIT)
    _TIMESTAMP.pack_into(buf, position + 35, now_ms)
    crc = crc32c.crc32c(memoryview(buf)[position + CRC_START : position + header.size])
    _CRC.pack_into(buf, position + 17, crc)
