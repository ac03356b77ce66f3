"""The vectorised decoder (wire/spark/record_columns.py) against the per-record one it
replaced on the common path: the same Arrow rows, the same errors, for every codec, edge case
and random batch. Neither Spark nor a broker is needed.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire import compression
from wire.errors import DecodeError
from wire.primitives import read_varint, write_varint
from wire.record_batch import HEADER_BYTES, batch_length_at, read_header
from wire.records import build_batch, decode_batch, rebuild_batch
from wire.spark import record_columns
from wire.spark.arrow import RowBuilder

pytestmark = pytest.mark.timeout(120)

CODECS = list(compression.CODECS)
NOW_MS = 1_700_000_000_000


def rows(blob: bytes | bytearray, vectorised: bool, start: int = 0, end: int | None = None,
         include_headers: bool = True) -> tuple[int, int, pa.RecordBatch]:
    """(batches taken, next offset, the rows) of one RowBuilder fed `blob` from the batch
    holding `start` on, as a fetch at `start` returns it."""
    end = _next_offset(blob) if end is None else end
    blob = blob[_position_of(blob, start):]
    builder = RowBuilder("topic", 3, start, end, include_headers, vectorised=vectorised)
    taken = builder.add(blob)
    return taken, builder.next_offset, builder.build()


def assert_same(blob: bytes | bytearray, start: int = 0, end: int | None = None,
                include_headers: bool = True) -> pa.RecordBatch:
    """The vectorised rows equal the per-record decoder's; returns them."""
    fast = rows(blob, True, start, end, include_headers)
    slow = rows(blob, False, start, end, include_headers)
    assert fast[:2] == slow[:2]
    assert fast[2].schema.equals(slow[2].schema)
    assert fast[2].to_pydict() == slow[2].to_pydict()
    assert fast[2].equals(slow[2])
    return fast[2]


def assert_vectorised(blob: bytes | bytearray, include_headers: bool = True) -> None:
    """The vectorised pass reads every batch of `blob` itself (no per-record fallback)."""
    assert record_columns.decode(areas(blob), include_headers) is not None


def areas(blob: bytes | bytearray) -> list[record_columns.Area]:
    found, position = [], 0
    while (size := batch_length_at(blob, position)) is not None and position + size <= len(blob):
        header = read_header(blob, position)
        area = bytes(blob[position + HEADER_BYTES : position + size])
        if header.codec:
            area = compression.decompress(header.codec, area)
        stamped = header.max_timestamp if header.log_append_time else None
        found.append(record_columns.Area(area, header.record_count, header.base_offset,
                                         header.base_timestamp, stamped,
                                         int(header.log_append_time)))
        position += size
    return found


def _position_of(blob: bytes | bytearray, offset: int) -> int:
    """Where the batch holding `offset` (or the first after it) starts in `blob`."""
    position = 0
    while (size := batch_length_at(blob, position)) is not None and position + size <= len(blob):
        if read_header(blob, position).next_offset > offset:
            break
        position += size
    return position


def _next_offset(blob: bytes | bytearray) -> int:
    position, last = 0, 0
    while (size := batch_length_at(blob, position)) is not None and position + size <= len(blob):
        last = read_header(blob, position).next_offset
        position += size
    return last


def record_starts(batch: bytes | bytearray) -> list[int]:
    """Where each record of an uncompressed batch starts, as positions in the batch."""
    view = memoryview(bytes(batch))
    position, starts = HEADER_BYTES, []
    while position < len(view):
        starts.append(position)
        length, body = read_varint(view, position)
        position = body + length
    return starts


def patched(batch: bytes | bytearray, changes: dict[int, int]) -> bytearray:
    """`batch` with some bytes changed and its CRC made right again."""
    out = bytearray(batch)
    for position, byte in changes.items():
        out[position] = byte
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return out


# Records and fields ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_keys_values_nulls_and_empties_every_codec(codec: int) -> None:
    records = [
        (b"k0", b"v0", []),
        (None, b"v1", []),
        (b"k2", None, []),
        (None, None, []),
        (b"", b"", []),
        (b"", None, []),
        (b"k6" * 50, b"v" * 127, []),
    ]
    blob = build_batch(records, codec=codec, base_offset=10, base_timestamp=NOW_MS)
    for include_headers in (False, True):
        assert_vectorised(blob, include_headers)
        got = assert_same(blob, start=10, include_headers=include_headers)
        assert got.column("key").to_pylist() == [r[0] for r in records]
        assert got.column("value").to_pylist() == [r[1] for r in records]
        assert got.column("offset").to_pylist() == list(range(10, 17))


@pytest.mark.parametrize("codec", CODECS)
def test_headers_none_one_many_and_null_values(codec: int) -> None:
    records = [
        (b"a", b"1", []),
        (b"b", b"2", [("one", b"x")]),
        (b"c", b"3", [("n", None)]),
        (b"d", b"4", [(f"h{i}", b"%d" % i if i % 2 else None) for i in range(12)]),
        (b"e", b"5", [("", b""), ("é ü 中", b"\x00\xff")]),
        (b"f", b"6", [("same", b"1"), ("same", b"2")]),
    ]
    blob = build_batch(records, codec=codec, base_timestamp=NOW_MS)
    assert_vectorised(blob)
    got = assert_same(blob)
    assert got.column("headers").to_pylist()[3][1] == {"key": "h1", "value": b"1"}
    assert got.column("headers").to_pylist()[0] == []
    assert_same(blob, include_headers=False)


def test_multi_byte_varints() -> None:
    # Lengths of 2, 3 and 4 varint bytes; offset deltas past 63 (two bytes); timestamp deltas
    # negative and past 32 bits.
    records = [(b"k%d" % i, b"v%d" % i, []) for i in range(300)]
    records[5] = (b"K" * 130, b"V" * 200, [("big", b"h" * 20_000)])
    records[6] = (None, bytes(range(256)) * 80, [])  # 20,480 bytes
    records[7] = (b"k", b"\x80" * 1_100_000, [])
    times = [NOW_MS + (i % 7 - 3) * 1000 for i in range(300)]
    times[8], times[9] = NOW_MS - 2**40, NOW_MS + 2**41
    for codec in CODECS:
        blob = build_batch(records, codec=codec, base_offset=2**40, timestamps=times)
        assert_vectorised(blob)
        got = assert_same(blob, start=2**40)
        assert got.column("offset").to_pylist()[-1] == 2**40 + 299
        micros = got.column("timestamp").cast(pa.int64()).to_pylist()
        assert micros[8] == (NOW_MS - 2**40) * 1000 and micros[9] == (NOW_MS + 2**41) * 1000


def test_several_batches_in_one_fetch_mixed_codecs_and_log_append_time() -> None:
    blob = bytearray()
    offset = 0
    for i, codec in enumerate(CODECS * 2):
        records = [(b"k%d" % j, b"v" * j, [("i", b"%d" % i)] if j % 2 else [])
                   for j in range(i * 3 + 1)]
        blob += build_batch(records, codec=codec, base_offset=offset, base_timestamp=NOW_MS + i,
                            log_append_time=i % 3 == 0)
        offset += len(records)
    assert_vectorised(blob)
    got = assert_same(blob)
    assert got.column("offset").to_pylist() == list(range(offset))
    assert set(got.column("timestampType").to_pylist()) == {0, 1}
    assert_same(blob, include_headers=False)


@pytest.mark.parametrize("include_headers", [False, True])
def test_range_cuts_the_first_and_last_batches(include_headers: bool) -> None:
    blob = bytearray()
    for base in range(0, 40, 10):
        blob += build_batch([(b"k", b"%d" % i, [("h", b"%d" % i)]) for i in range(base, base + 10)],
                            base_offset=100 + base, base_timestamp=NOW_MS)
    for start, end in [(105, 135), (100, 140), (113, 117), (109, 110), (139, 140)]:
        got = assert_same(blob, start, end, include_headers)
        assert got.column("offset").to_pylist() == list(range(start, end))


def test_compacted_and_empty_batches() -> None:
    whole = build_batch([(b"k%d" % i, b"v%d" % i, []) for i in range(10)], base_offset=50,
                        base_timestamp=NOW_MS)
    header, records = decode_batch(whole)
    gaps = rebuild_batch(header, [r for r in records if r.offset % 3 == 0])
    empty = rebuild_batch(read_header(build_batch([(b"x", b"y", [])], base_offset=60)), [])
    tail = build_batch([(b"z", b"w", [])], base_offset=61, base_timestamp=NOW_MS)
    blob = gaps + empty + tail
    assert_vectorised(blob)
    got = assert_same(blob, start=50)
    assert got.column("offset").to_pylist() == [51, 54, 57, 61]


def test_realistic_records_need_no_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18's records and random values: the zero-byte candidates alone find every
    record (the per-record walk is a fallback, not the common path)."""

    def no_walk(*_: Any) -> None:
        raise AssertionError("walked the records")

    monkeypatch.setattr(record_columns, "_walk", no_walk)
    rng = random.Random(18)
    values = {
        "bench": lambda i: b"v" * 100,
        "json": lambda i: json.dumps({"id": i, "score": rng.random()}).encode(),
        "random": lambda i: rng.randbytes(rng.randrange(300)),
    }
    headers = [("trace-id", b"4bf92f3577b34da6a3ce929d0e0e4736"), ("source", b"bench")]
    for value in values.values():
        records = [(b"k%d" % i, value(i), headers if i % 3 == 0 else []) for i in range(3000)]
        for codec in (compression.CODEC_NONE, compression.CODEC_LZ4):
            blob = build_batch(records[:1000], codec=codec, base_timestamp=NOW_MS)
            blob += build_batch(records[1000:], codec=codec, base_offset=1000,
                                base_timestamp=NOW_MS)
            assert_vectorised(blob)
            assert_same(blob)


# What the vectorised pass leaves to the per-record decoder -------------------------------


def test_record_attributes_set_take_the_walk() -> None:
    batch = build_batch([(b"k%d" % i, b"v" * i, [("h", b"x")]) for i in range(20)],
                        base_timestamp=NOW_MS)
    starts = record_starts(batch)
    # The attributes byte follows each one-byte length varint: set a bit no record defines.
    changed = patched(batch, {start + 1: 0x40 for start in starts})
    assert_vectorised(changed)
    assert_same(changed)


def test_more_headers_than_rounds_fall_back() -> None:
    many = [(f"h{i}", b"%d" % i) for i in range(record_columns.header_rounds_max + 1)]
    blob = build_batch([(b"a", b"1", []), (b"b", b"2", many)], base_timestamp=NOW_MS)
    assert record_columns.decode(areas(blob), True) is None
    assert_vectorised(blob, include_headers=False)  # not read when not asked for
    got = assert_same(blob)
    assert len(got.column("headers").to_pylist()[1]) == len(many)


def assert_same_error(blob: bytes | bytearray, include_headers: bool = True,
                      start: int = 0) -> str:
    """Both decoders raise the same DecodeError, having taken the same rows before it."""
    outcomes = []
    for vectorised in (True, False):
        builder = RowBuilder("topic", 0, start, 1000, include_headers, vectorised=vectorised)
        with pytest.raises(DecodeError) as raised:
            builder.add(blob)
        outcomes.append((str(raised.value), builder.next_offset, builder.build().to_pydict()))
    assert outcomes[0] == outcomes[1]
    return outcomes[0][0]


def test_header_key_not_utf8_raises_as_before() -> None:
    good = build_batch([(b"k", b"v", [("ok", b"1")])], base_timestamp=NOW_MS)
    bad = build_batch([(b"k", b"v", [(b"\xff\xfe", b"1")])], base_offset=1,
                      base_timestamp=NOW_MS)
    assert "not UTF-8" in assert_same_error(good + bad)
    assert_same(good + bad, include_headers=False)  # not read when not asked for


def test_corrupt_records_raise_as_before() -> None:
    good = build_batch([(b"k0", b"v0", [])], base_timestamp=NOW_MS)
    batch = build_batch([(b"k%d" % i, b"v%d" % i, []) for i in range(1, 5)], base_offset=1,
                        base_timestamp=NOW_MS)
    first = record_starts(batch)[0]
    # Each record is 1-byte length | attributes | ts | offset | key length | key | ...
    overrun_record = patched(batch, {first: 0x7E})  # length 63: past the batch
    overrun_key = patched(batch, {first + 4: 0x7E})  # key length 63: past its record
    bad_crc = bytearray(batch)
    bad_crc[-1] ^= 0xFF
    for corrupt, expected in [(overrun_record, "overruns the batch"),
                              (overrun_key, "overruns its record"),
                              (bad_crc, "CRC-32C")]:
        for include_headers in (False, True):
            assert expected in assert_same_error(good + corrupt, include_headers)


def raw_batch(bodies: list[bytes], base_offset: int = 0) -> bytearray:
    """A batch of records written byte by byte (`bodies`: each record after its length)."""
    area = bytearray()
    for body in bodies:
        write_varint(area, len(body))
        area += body
    batch = build_batch([(None, b"", [])] * len(bodies), base_offset=base_offset,
                        base_timestamp=NOW_MS)[:HEADER_BYTES] + area
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    return patched(batch, {})


def test_unreadable_fields_raise_as_before() -> None:
    good = build_batch([(b"k", b"v", [("ok", b"1")])], base_timestamp=NOW_MS)
    # attributes, timestampDelta 0, offsetDelta 0, key null, value "v", then headers
    start = b"\x00\x00\x00\x01\x02v"
    null_key = raw_batch([start + b"\x02\x01\x02x"], base_offset=1)  # 1 header, key -1
    left_over = raw_batch([start + b"\x00\x02a"], base_offset=1)  # 0 headers, 2 bytes after
    assert "header key of -1 bytes" in assert_same_error(good + null_key)
    assert "its length says" in assert_same_error(good + left_over)
    for blob in (good + null_key, good + left_over):
        assert_same(blob, include_headers=False)  # not read when not asked for
    long_varint = raw_batch([b"\x00\x00" + b"\x80" * 5 + b"\x00\x01\x02v\x00"], base_offset=1)
    for include_headers in (False, True):
        assert "longer than 5 bytes" in assert_same_error(good + long_varint, include_headers)


def test_a_timestamp_past_64_bits_fails_as_before() -> None:
    # timestampDelta: a 10-byte varlong whose last byte holds more than bit 63
    blob = raw_batch([b"\x00" + b"\xff" * 9 + b"\x02" + b"\x00\x01\x02v\x00"])
    failures = []
    for vectorised in (True, False):
        with pytest.raises(Exception) as raised:  # noqa: B017 (whatever wire.records does)
            rows(blob, vectorised)
        failures.append((type(raised.value), str(raised.value)))
    assert failures[0] == failures[1]


def test_a_fetch_cut_anywhere() -> None:
    """A fetch may end inside a batch: what is whole is taken, the rest comes next time."""
    blob = build_batch([(b"a", b"1", [("h", b"x")]), (None, b"2", [])], base_timestamp=NOW_MS)
    blob += build_batch([(b"c", b"3", [])], codec=compression.CODEC_ZSTD, base_offset=2,
                        base_timestamp=NOW_MS)
    blob += build_batch([(b"d", None, [])], base_offset=3, base_timestamp=NOW_MS)
    want = rows(blob, False)[2]
    for cut in range(len(blob) + 1):
        builder = RowBuilder("topic", 3, 0, 4, True, vectorised=True)
        builder.add(blob[:cut])
        parts = [builder.build()]
        builder.add(blob[_position_of(blob, builder.next_offset):])
        parts.append(builder.build())
        got = pa.Table.from_batches(parts).combine_chunks().to_batches()
        assert got[0].equals(want), cut


# Random batches ----------------------------------------------------------------------------

nullable_bytes = st.none() | st.binary(max_size=200)
headers = st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=4)
records = st.lists(st.tuples(nullable_bytes, nullable_bytes, headers), min_size=1, max_size=25)
batches = st.lists(
    st.tuples(records, st.sampled_from(CODECS), st.booleans(),
              st.lists(st.integers(-(2**42), 2**42), min_size=25, max_size=25)),
    min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches, include_headers=st.booleans(), data=st.data())
def test_random_batches_decode_alike(batches: list[Any], include_headers: bool,
                                     data: st.DataObject) -> None:
    blob, offset = bytearray(), 0
    for records_in, codec, log_append_time, deltas in batches:
        times = [NOW_MS + delta for delta in deltas[: len(records_in)]]
        blob += build_batch(records_in, codec=codec, base_offset=offset, timestamps=times,
                            log_append_time=log_append_time)
        offset += len(records_in)
    assert_vectorised(blob, include_headers)
    start = data.draw(st.integers(0, offset - 1))
    end = data.draw(st.integers(start + 1, offset))
    assert_same(blob, start, end, include_headers)
