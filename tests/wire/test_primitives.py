"""Reader and Writer: varint edges, every truncation and over-limit length ends in
`DecodeError`, file regions stay separate chunks, and random bytes fed to the big decoders
raise nothing but `DecodeError`."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import limits
from wire.errors import DecodeError
from wire.messages.fetch import FetchRequest
from wire.messages.metadata import MetadataRequest
from wire.messages.produce import ProduceRequest
from wire.primitives import Reader, Writer

pytestmark = pytest.mark.timeout(60)
FUZZ = settings(max_examples=300, deadline=None, database=None)


def written(method: str, value: Any) -> bytes:
    w = Writer()
    getattr(w, method)(value)
    return w.getvalue()


# Varints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_unsigned_varint_known_bytes(value: int, encoded: bytes) -> None:
    assert written("unsigned_varint", value) == encoded
    assert Reader(encoded).unsigned_varint() == value


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        (-(2**31), b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_varint_known_bytes(value: int, encoded: bytes) -> None:
    assert written("varint", value) == encoded
    assert Reader(encoded).varint() == value


@given(st.integers(-(2**63), 2**63 - 1))
@settings(deadline=None, database=None)
def test_varlong_round_trip(value: int) -> None:
    data = written("varlong", value)
    r = Reader(data)
    assert r.varlong() == value and r.remaining() == 0


@pytest.mark.parametrize("value", [-(2**63), -1, 0, 2**63 - 1])
def test_varlong_edges(value: int) -> None:
    assert Reader(written("varlong", value)).varlong() == value


def test_overlong_varint_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="longer than 5"):
        Reader(b"\xff\xff\xff\xff\xff\x01").unsigned_varint()
    with pytest.raises(DecodeError, match="longer than 10"):
        Reader(b"\xff" * 11).varlong()


# Fixed-size values and strings ------------------------------------------------------------

FIXED_CASES = [
    ("int8", -5),
    ("int16", -300),
    ("int32", -70000),
    ("int64", -(2**40)),
    ("uint16", 65535),
    ("uint32", 2**32 - 1),
    ("float64", 1.5),
    ("boolean", True),
    ("uuid", bytes(range(16))),
    ("unsigned_varint", 2**31),
    ("varint", -12345),
    ("varlong", 2**50),
    ("string", "héllo"),
    ("nullable_string", None),
    ("compact_string", "x" * 200),
    ("compact_nullable_string", None),
    ("bytes_", b"abc"),
    ("nullable_bytes", None),
    ("compact_bytes", b"\x00" * 130),
    ("compact_nullable_bytes", b""),
]


@pytest.mark.parametrize(("method", "value"), FIXED_CASES)
def test_reader_writer_round_trip_and_every_truncation(method: str, value: Any) -> None:
    data = written(method, value)
    r = Reader(data)
    assert getattr(r, method)() == value
    assert r.remaining() == 0
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            getattr(Reader(data[:cut]), method)()


def test_bytes_are_zero_copy_slices() -> None:
    frame = bytearray(written("compact_bytes", b"payload"))
    value = Reader(frame).compact_bytes()
    assert isinstance(value, memoryview) and value == b"payload"
    frame[-1:] = b"D"
    assert value == b"payloaD"


def test_invalid_utf8_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="UTF-8"):
        Reader(b"\x00\x02\xc3\x28").string()


def test_null_for_non_nullable_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff").string()
    with pytest.raises(DecodeError):
        Reader(b"\x00").compact_string()
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff").bytes_()
    assert Reader(b"\xff\xff\xff\xff").array_length() == -1
    assert Reader(b"\x00").compact_array_length() == -1


def test_lengths_over_limits_fail_before_reading() -> None:
    big_string = limits.string_bytes_max + 1
    with pytest.raises(DecodeError, match="string_bytes_max"):
        Reader(written("unsigned_varint", big_string + 1)).compact_string()
    with pytest.raises(DecodeError, match="array_length_max"):
        Reader(struct.pack(">i", limits.array_length_max + 1)).array_length()
    with pytest.raises(DecodeError, match="array_length_max"):
        Reader(written("unsigned_varint", 2**32 - 1)).compact_array_length()
    with pytest.raises(DecodeError, match="bytes_field_bytes_max"):
        Reader(struct.pack(">i", limits.bytes_field_bytes_max + 1)).bytes_()
    with pytest.raises(DecodeError, match="tagged_fields_max"):
        Reader(written("unsigned_varint", limits.tagged_fields_max + 1)).tagged_fields()
    with pytest.raises(DecodeError, match="tagged_field_bytes_max"):
        Reader(b"\x01\x00" + written("unsigned_varint", 2**31)).tagged_fields()
    # A length within limits but past the end of the frame.
    with pytest.raises(DecodeError, match="past the end"):
        Reader(struct.pack(">i", 1000) + b"short").bytes_()


def test_tagged_fields_section() -> None:
    data = b"\x02" + b"\x00\x01\x07" + b"\x05\x02hi" + b"rest"
    r = Reader(data)
    assert r.tagged_fields() == {0: b"\x07", 5: b"hi"}
    assert bytes(r.buf[r.pos :]) == b"rest"
    r = Reader(data)
    r.skip_tagged_fields()
    assert r.remaining() == 4


# Writer chunks and file regions ----------------------------------------------------------


class Region:
    def __init__(self, length: int) -> None:
        self.length = length


def test_records_regions_become_separate_chunks() -> None:
    w = Writer()
    frame_size = w.reserve_int32()
    w.int32(7)
    region = Region(1000)
    w.records(region)
    w.compact_records(b"inline")
    w.records(None)
    w.compact_records(None)
    w.patch_int32(frame_size, w.size - 4)
    chunks = w.chunks()
    assert chunks[1] is region
    assert bytes(chunks[0]) == struct.pack(">iii", 1020, 7, 1000)
    assert bytes(chunks[2]) == b"\x07inline" + b"\xff\xff\xff\xff" + b"\x00"
    assert w.size == sum(c.length if c is region else len(c) for c in chunks)
    with pytest.raises(AssertionError):
        w.getvalue()


def test_writer_without_regions_is_one_chunk() -> None:
    w = Writer()
    w.string("a")
    w.empty_tagged_fields()
    w.compact_array_length(-1)
    w.array_length(2)
    assert w.chunks() == [b"\x00\x01a\x00\x00\x00\x00\x00\x02"]
    assert w.getvalue() == b"\x00\x01a\x00\x00\x00\x00\x00\x02"


def test_encoding_none_for_non_nullable_is_our_bug() -> None:
    with pytest.raises(ValueError):
        ProduceRequest(topic_data=None).to_bytes(9)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ProduceRequest.TopicProduceData(name=None).to_bytes(9)  # type: ignore[arg-type]


# Whole messages: truncation and random bytes ---------------------------------------------


def produce_request() -> ProduceRequest:
    parts = [ProduceRequest.PartitionProduceData(index=i, records=b"r" * 40) for i in range(3)]
    topic = ProduceRequest.TopicProduceData(name="orders", partition_data=parts)
    return ProduceRequest(transactional_id="tx", acks=-1, timeout_ms=1500, topic_data=[topic])


def fetch_request(version: int) -> FetchRequest:
    part = FetchRequest.FetchPartition(partition=2, fetch_offset=99, partition_max_bytes=1 << 20)
    if version >= 13:  # topic ids replace names
        topic = FetchRequest.FetchTopic(topic_id=bytes(range(16)), partitions=[part])
    else:
        topic = FetchRequest.FetchTopic(topic="orders", partitions=[part])
    cluster = "c1" if version >= 12 else None
    return FetchRequest(max_wait_ms=500, min_bytes=1, topics=[topic], cluster_id=cluster)


def metadata_request() -> MetadataRequest:
    topic = MetadataRequest.MetadataRequestTopic(name="orders")
    return MetadataRequest(topics=[topic], allow_auto_topic_creation=True)


SAMPLES = [
    (ProduceRequest, 3, produce_request()),
    (ProduceRequest, 9, produce_request()),
    (FetchRequest, 4, fetch_request(4)),
    (FetchRequest, 12, fetch_request(12)),
    (FetchRequest, 16, fetch_request(16)),
    (MetadataRequest, 1, metadata_request()),
    (MetadataRequest, 12, metadata_request()),
]


@pytest.mark.parametrize(("cls", "version", "value"), SAMPLES)
def test_every_truncation_of_a_message_is_a_decode_error(
    cls: Any, version: int, value: Any
) -> None:
    data = value.to_bytes(version)
    assert cls.from_bytes(data, version) == value
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            cls.decode(Reader(data[:cut]), version)
    with pytest.raises(DecodeError, match="trailing"):
        cls.from_bytes(data + b"\x00", version)


def test_unknown_version_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="no version 12"):
        ProduceRequest.decode(Reader(b""), 12)


def decode_or_decode_error(cls: Any, data: bytes, version: int) -> None:
    try:
        cls.decode(Reader(data), version)
    except DecodeError:
        pass


@pytest.mark.parametrize(("cls", "version"), [(c, v) for c, v, _ in SAMPLES])
@given(data=st.binary(max_size=200))
@FUZZ
def test_random_bytes_only_raise_decode_error(cls: Any, version: int, data: bytes) -> None:
    decode_or_decode_error(cls, data, version)


@pytest.mark.parametrize(("cls", "version", "value"), SAMPLES)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
@FUZZ
def test_mutated_messages_only_raise_decode_error(
    cls: Any, version: int, value: Any, edits: list[tuple[int, int]]
) -> None:
    data = bytearray(value.to_bytes(version))
    for at, byte in edits:
        data[at % len(data)] = byte
    decode_or_decode_error(cls, bytes(data), version)
