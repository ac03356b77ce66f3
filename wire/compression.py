"""The five record-batch codecs, with every decompression bounded by a size limit.

A batch's record area (everything after the 61-byte header) is compressed as one blob with
the codec in attributes bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. Decompression is
the place a hostile producer can make a few kilobytes grow into gigabytes, so each codec
checks the output size against `limit` before or while producing it, never only after:

- gzip: `zlib.decompressobj(max_length=...)` stops at limit + 1 bytes.
- snappy: the raw format states its decompressed length up front (a varint preamble, which
  the decoder verifies), so each block is measured before it is decoded. Both framings are
  accepted: raw blocks (librdkafka) and snappy-java's "xerial" stream (Java client,
  kafka-python). Compression writes raw, as librdkafka does; every client reads both.
- lz4: a frame states its block maximum (64 KiB .. 4 MiB) and the decoder rejects a block
  that would exceed it, so walking the block headers gives a sound bound before decoding.
- zstd: a frame that states its content size is held to it by the decoder; one that does not
  (the Java client's streams) is fed in steps small enough that no step can yield more than
  the budget left, and abandoned as soon as the output passes the limit.

Any failure — unknown codec, corrupt stream, output over the limit — is a DecodeError.
Layout notes: shared/kafka-protocol/RECORD_BATCH.md.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import zstandard

from wire import limits
from wire.errors import DecodeError

__all__ = [
    "CODEC_NONE",
    "CODEC_GZIP",
    "CODEC_SNAPPY",
    "CODEC_LZ4",
    "CODEC_ZSTD",
    "CODECS",
    "compress",
    "decompress",
]

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODECS = (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD)

Buffer = bytes | bytearray | memoryview


def compress(codec: int, data: Buffer) -> bytes:
    """Compress `data` with `codec` the way a Kafka producer does."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        encoder = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
        return encoder.compress(data) + encoder.flush()
    if codec == CODEC_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if codec == CODEC_LZ4:
        # cramjam writes a frame of independent 64 KiB blocks, which is what Kafka requires
        # (the Java reader refuses linked blocks).
        return bytes(cramjam.lz4.compress(bytes(data)))
    if codec == CODEC_ZSTD:
        return _ZSTD_COMPRESSOR.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: Buffer, limit: int = limits.decompressed_bytes_max) -> bytes:
    """Decompress one batch's record area; DecodeError if corrupt or over `limit` bytes."""
    if codec == CODEC_NONE:
        if len(data) > limit:
            raise _over(limit)
        return bytes(data)
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise DecodeError(f"unknown compression codec {codec}")
    try:
        out = decoder(data, limit)
    except DecodeError:
        raise
    except Exception as exc:  # each library has its own error types; all mean "corrupt"
        raise DecodeError(f"corrupt {_NAMES[codec]} data: {exc}") from exc
    # A second check on the way out: the per-codec bounds above are our reasoning, this is
    # the fact.
    if len(out) > limit:
        raise _over(limit)
    return out


def _over(limit: int) -> DecodeError:
    return DecodeError(f"decompressed record area over {limit} bytes")


# gzip ----------------------------------------------------------------------------------

# 16 + 15: a gzip header and trailer around a deflate stream with a 32 KiB window.
_GZIP_WBITS = 31


def _gunzip(data: Buffer, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest = bytes(data)
    # Concatenated gzip members are one valid gzip stream (Java's GZIPInputStream reads on).
    while True:
        decoder = zlib.decompressobj(_GZIP_WBITS)
        part = decoder.decompress(rest, limit - total + 1)
        total += len(part)
        if total > limit:
            raise _over(limit)
        parts.append(part)
        if not decoder.eof:
            raise DecodeError("gzip stream truncated")
        rest = decoder.unused_data
        if not rest:
            return b"".join(parts)


# snappy ----------------------------------------------------------------------------------

# snappy-java's stream header: 8-byte magic, int32 version, int32 compatible version. A raw
# snappy block cannot begin with these bytes: 0x82 0x53 is a length varint and the next
# byte, 'N', would be a back-reference before any literal, which is invalid.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")


def _unsnappy(data: Buffer, limit: int) -> bytes:
    view = memoryview(data)
    if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return _unsnappy_raw(view, limit)
    # Version and compat are ignored, as kafka-python does: some producers write them
    # little-endian, and there has only ever been one xerial block format.
    parts: list[bytes] = []
    total = 0
    pos = _XERIAL_HEADER_BYTES
    end = len(view)
    if end < pos:
        raise DecodeError("xerial snappy header truncated")
    while pos < end:
        if end - pos < 4:
            raise DecodeError("xerial snappy block length truncated")
        (block_bytes,) = _XERIAL_BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if block_bytes < 0 or block_bytes > end - pos:
            raise DecodeError(f"xerial snappy block of {block_bytes} bytes overruns the data")
        part = _unsnappy_raw(view[pos : pos + block_bytes], limit - total)
        total += len(part)
        parts.append(part)
        pos += block_bytes
    return b"".join(parts)


def _unsnappy_raw(block: memoryview, limit: int) -> bytes:
    block_bytes = bytes(block)
    if cramjam.snappy.decompress_raw_len(block_bytes) > limit:
        raise _over(limit)
    return bytes(cramjam.snappy.decompress_raw(block_bytes))


# lz4 -------------------------------------------------------------------------------------

_LZ4_MAGIC = 0x184D2204
_LZ4_SKIPPABLE_MASK = 0xFFFFFFF0
_LZ4_SKIPPABLE_MAGIC = 0x184D2A50
_U32 = struct.Struct("<I")
# BD bits 4-6 -> largest block, in bytes.
_LZ4_BLOCK_BYTES_MAX = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}


def _unlz4(data: Buffer, limit: int) -> bytes:
    block = bytes(data)
    if _lz4_output_bound(block) > limit:
        raise _over(limit)
    return bytes(cramjam.lz4.decompress(block))


def _lz4_output_bound(data: bytes) -> int:
    """Most bytes the LZ4 frames in `data` can decode to, from their block headers alone.

    Exact for the full blocks every Kafka client writes; an encoder that flushed many short
    blocks would be bounded loosely and could be refused slightly below the limit.
    """
    bound = 0
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < 7:
            raise DecodeError("lz4 frame header truncated")
        (magic,) = _U32.unpack_from(data, pos)
        if magic & _LZ4_SKIPPABLE_MASK == _LZ4_SKIPPABLE_MAGIC:
            (skip_bytes,) = _U32.unpack_from(data, pos + 4)
            pos += 8 + skip_bytes
            continue
        if magic != _LZ4_MAGIC:
            raise DecodeError(f"lz4 frame magic {magic:#x} is wrong")
        flags, block_descriptor = data[pos + 4], data[pos + 5]
        block_max = _LZ4_BLOCK_BYTES_MAX.get((block_descriptor >> 4) & 0x07)
        if flags >> 6 != 1 or block_max is None:
            raise DecodeError("lz4 frame descriptor is invalid")
        block_checksum = 4 if flags & 0x10 else 0
        pos += 7 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
        while True:
            if end - pos < 4:
                raise DecodeError("lz4 block header truncated")
            (block_word,) = _U32.unpack_from(data, pos)
            pos += 4
            if block_word == 0:
                break
            block_bytes = block_word & 0x7FFFFFFF
            uncompressed = block_word & 0x80000000
            bound += block_bytes if uncompressed else block_max
            pos += block_bytes + block_checksum
        pos += 4 if flags & 0x04 else 0
    return bound


# zstd ------------------------------------------------------------------------------------

_ZSTD_COMPRESSOR = zstandard.ZstdCompressor(level=3)
_ZSTD_DECOMPRESSOR = zstandard.ZstdDecompressor()
# Most output one input byte can yield: a 4-byte RLE block (3-byte header, 1 byte) expands to
# a 128 KiB block. Feeding input in steps of (budget left / this) bounds each step's output
# by the budget left, so a bomb costs at most about twice the limit before it is refused.
_ZSTD_EXPANSION_MAX = 128 * 1024 // 4
_ZSTD_FEED_BYTES_MIN = 256


def _unzstd(data: Buffer, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest = memoryview(data)
    while rest:  # one zstd frame per pass; producers write one, concatenations are legal
        declared_bytes = zstandard.frame_content_size(rest)
        if declared_bytes > limit - total:
            raise _over(limit)  # the decoder holds a frame to its declared size
        decoder = _ZSTD_DECOMPRESSOR.decompressobj()
        pos = 0
        while not decoder.eof:
            if pos >= len(rest):
                raise DecodeError("zstd frame truncated")
            if declared_bytes >= 0:
                step = len(rest)
            else:  # the Java client's streams state no size: feed a bounded step at a time
                step = max(_ZSTD_FEED_BYTES_MIN, (limit - total) // _ZSTD_EXPANSION_MAX)
            part = decoder.decompress(rest[pos : pos + step])
            pos += step
            total += len(part)
            if total > limit:
                raise _over(limit)
            parts.append(part)
        unused = decoder.unused_data
        rest = memoryview(bytes(unused) + rest[pos:]) if unused else rest[pos:]
    return b"".join(parts)


_DECODERS = {
    CODEC_GZIP: _gunzip,
    CODEC_SNAPPY: _unsnappy,
    CODEC_LZ4: _unlz4,
    CODEC_ZSTD: _unzstd,
}
_NAMES = {CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
