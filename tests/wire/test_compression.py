"""The batch codecs: round trips, both snappy framings, bombs and corrupt streams.

Every failure a hostile or broken producer can cause must come out as DecodeError, and no
decompression may produce more than its limit — bombs here are small inputs that expand
far past a small limit.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import cramjam
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    CODECS,
    compress,
    decompress,
)
from wire.errors import DecodeError

pytestmark = pytest.mark.timeout(60)

COMPRESSED = (CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD)
MIXED = os.urandom(70_000) + b"abc" * 50_000  # several lz4/xerial blocks, some compressible


def xerial(data: bytes, block_bytes: int = 32 * 1024, byteorder: str = ">") -> bytes:
    """snappy-java's stream framing, as the Java client and kafka-python write it."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(byteorder + "ii", 1, 1))
    for i in range(0, len(data), block_bytes):
        block = bytes(cramjam.snappy.compress_raw(data[i : i + block_bytes]))
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=3000))
def test_round_trip_every_codec(codec: int, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_large(codec: int) -> None:
    assert decompress(codec, memoryview(compress(codec, MIXED))) == MIXED


def test_snappy_compress_writes_raw_blocks() -> None:
    assert compress(CODEC_SNAPPY, MIXED) == bytes(cramjam.snappy.compress_raw(MIXED))


@pytest.mark.parametrize("data", [b"", b"x", MIXED])
def test_snappy_reads_both_framings(data: bytes) -> None:
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert decompress(CODEC_SNAPPY, raw) == data
    assert decompress(CODEC_SNAPPY, xerial(data)) == data
    # Version and compat are ignored: some producers write them little-endian.
    assert decompress(CODEC_SNAPPY, xerial(data, byteorder="<")) == data


def test_xerial_block_overrunning_its_stream() -> None:
    framed = xerial(MIXED)
    with pytest.raises(DecodeError):
        decompress(CODEC_SNAPPY, framed[:-10])
    with pytest.raises(DecodeError):
        decompress(CODEC_SNAPPY, framed + b"\x00\x00")  # cut inside a block length
    with pytest.raises(DecodeError):
        decompress(CODEC_SNAPPY, framed[:18])  # cut inside a block length


def test_gzip_reads_concatenated_members() -> None:
    assert decompress(CODEC_GZIP, gzip.compress(b"one") + gzip.compress(b"two")) == b"onetwo"


def test_zstd_frames_without_content_size_and_concatenated() -> None:
    sizeless = zstandard.ZstdCompressor(write_content_size=False).compress(MIXED)
    assert zstandard.frame_content_size(sizeless) == -1
    assert decompress(CODEC_ZSTD, sizeless) == MIXED
    assert decompress(CODEC_ZSTD, sizeless + compress(CODEC_ZSTD, b"tail")) == MIXED + b"tail"


# Bombs: a few KB that expand to 4 MiB, against a 1 MiB limit. -------------------------

BOMB = bytes(4 * 1024 * 1024)
LIMIT = 1024 * 1024


def bombs() -> list[tuple[int, bytes]]:
    return [
        (CODEC_NONE, BOMB),
        (CODEC_GZIP, gzip.compress(BOMB)),
        (CODEC_GZIP, gzip.compress(b"x") + gzip.compress(BOMB)),
        (CODEC_SNAPPY, bytes(cramjam.snappy.compress_raw(BOMB))),
        (CODEC_SNAPPY, xerial(BOMB)),
        (CODEC_LZ4, bytes(cramjam.lz4.compress(BOMB))),
        (CODEC_ZSTD, zstandard.ZstdCompressor().compress(BOMB)),
        (CODEC_ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(BOMB)),
        (CODEC_ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(BOMB) * 3),
    ]


@pytest.mark.parametrize(("codec", "data"), bombs())
def test_output_over_the_limit_is_refused(codec: int, data: bytes) -> None:
    assert len(data) < 300_000 or codec == CODEC_NONE
    with pytest.raises(DecodeError, match="over"):
        decompress(codec, data, limit=LIMIT)
    assert len(decompress(codec, data, limit=len(BOMB) * 3)) >= len(BOMB)


def test_zstd_bomb_is_refused_after_a_bounded_amount_of_output() -> None:
    # 64 MiB of zeros in a sizeless frame is ~2 KB; with a 1 MiB limit the feed steps are
    # small, so the refusal comes long before 64 MiB is ever produced (this would take
    # seconds and the memory if it were decompressed first and measured after).
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))
    with pytest.raises(DecodeError, match="over"):
        decompress(CODEC_ZSTD, bomb, limit=LIMIT)


def test_lz4_block_larger_than_its_frame_allows() -> None:
    lz4_frame = pytest.importorskip("lz4.frame")
    # A 64 KiB-block frame header with no checksums, then one block that expands to 1 MiB.
    header = lz4_frame.compress(
        b"", block_size=lz4_frame.BLOCKSIZE_MAX64KB, content_checksum=False
    )[:7]
    block = bytes(cramjam.lz4.compress_block(bytes(1 << 20), store_size=False))
    frame = header + struct.pack("<I", len(block)) + block + struct.pack("<I", 0)
    with pytest.raises(DecodeError):
        decompress(CODEC_LZ4, frame, limit=512 * 1024)


# Corrupt input ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(DecodeError, match="unknown"):
        decompress(codec, b"abc")


@pytest.mark.parametrize("codec", COMPRESSED)
def test_truncated_streams(codec: int) -> None:
    good = compress(codec, MIXED)
    for cut in (1, 5, 17, len(good) // 2, len(good) - 1):
        with pytest.raises(DecodeError):
            decompress(codec, good[:cut])


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=200))
def test_random_bytes_only_raise_decode_error(codec: int, data: bytes) -> None:
    try:
        decompress(codec, data, limit=LIMIT)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), flips=st.lists(st.integers(0, 10**6), max_size=4))
def test_bit_flips_only_raise_decode_error(codec: int, flips: list[int]) -> None:
    data = bytearray(compress(codec, MIXED[:5000] + MIXED[-5000:]))
    for flip in flips:
        data[flip % len(data)] ^= 1 << (flip % 8)
    try:
        decompress(codec, bytes(data), limit=LIMIT)
    except DecodeError:
        pass


def test_gzip_rejects_a_zlib_stream() -> None:
    with pytest.raises(DecodeError):
        decompress(CODEC_GZIP, zlib.compress(b"not gzip"))


# kafka-python's own codec functions ---------------------------------------------------


@pytest.fixture
def kafka_codec(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - a module
    codec = pytest.importorskip("kafka.codec")
    if not codec.has_snappy():  # python-snappy absent: stand cramjam in for it
        shim = type(
            "Snappy",
            (),
            {
                "compress": staticmethod(lambda d: bytes(cramjam.snappy.compress_raw(d))),
                "decompress": staticmethod(lambda d: bytes(cramjam.snappy.decompress_raw(d))),
            },
        )
        monkeypatch.setattr(codec, "snappy", shim)
    return codec


def test_kafka_python_codecs_interoperate(kafka_codec) -> None:  # noqa: ANN001
    theirs = {
        CODEC_GZIP: (kafka_codec.gzip_encode, kafka_codec.gzip_decode),
        CODEC_SNAPPY: (kafka_codec.snappy_encode, kafka_codec.snappy_decode),  # xerial
        CODEC_LZ4: (kafka_codec.lz4_encode, kafka_codec.lz4_decode),
        CODEC_ZSTD: (kafka_codec.zstd_encode, kafka_codec.zstd_decode),
    }
    for codec, (encode, decode) in theirs.items():
        assert decompress(codec, encode(MIXED)) == MIXED, codec
        assert decode(compress(codec, MIXED)) == MIXED, codec
    assert kafka_codec.snappy_encode(MIXED).startswith(b"\x82SNAPPY\x00")
