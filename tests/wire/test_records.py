"""Records in v2 batches: build/decode round trips, hostile bytes, fetch-blob walking, and
byte compatibility with kafka-python's own record batch writer and reader.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire.compression import CODECS
from wire.errors import DecodeError
from wire.record_batch import iter_batches, offsets_spanned, read_header
from wire.records import Record, build_batch, decode_batch, iter_records

pytestmark = pytest.mark.timeout(60)

NOW_MS = 1_700_000_000_000

nullable_bytes = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=20), nullable_bytes), max_size=4).map(tuple)
record_inputs = st.lists(st.tuples(nullable_bytes, nullable_bytes, headers), max_size=30)


def refresh_crc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    codec=st.sampled_from(CODECS),
    records=record_inputs,
    base_offset=st.integers(0, 2**62),
    data=st.data(),
)
def test_round_trip(codec: int, records: list, base_offset: int, data: st.DataObject) -> None:
    times = data.draw(st.lists(st.integers(0, 2**45), min_size=len(records), max_size=len(records)))
    batch = build_batch(records, codec=codec, base_offset=base_offset, timestamps=times)
    iter_batches(batch)  # the broker's header walk accepts it, CRC included
    header, decoded = decode_batch(bytes(batch))
    assert header.codec == codec
    assert header.record_count == len(records)
    assert header.max_timestamp == max(times, default=-1)
    assert header.last_offset_delta == max(len(records) - 1, 0)
    expected = [
        Record(base_offset + i, t, k, v, h)
        for i, ((k, v, h), t) in enumerate(zip(records, times, strict=True))
    ]
    assert decoded == expected
    # Re-encoding what was decoded gives the same bytes: build_batch is deterministic.
    again = build_batch(
        decoded, codec=codec, base_offset=base_offset, base_timestamp=header.base_timestamp
    )
    assert again == batch


def test_header_fields_and_timestamp_defaults() -> None:
    batch = build_batch(
        [(b"k", b"v", ()), (None, None, ())],
        base_offset=7,
        base_timestamp=NOW_MS,
        producer_id=42,
        producer_epoch=3,
        base_sequence=100,
        transactional=True,
    )
    header, records = decode_batch(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 100)
    assert header.is_transactional and not header.is_control
    assert header.partition_leader_epoch == -1
    assert [r.offset for r in records] == [7, 8]
    assert [r.timestamp for r in records] == [NOW_MS, NOW_MS]
    _, untimed = decode_batch(build_batch([(b"k", b"v", ())]))
    assert untimed[0].timestamp == -1  # no clock read: no timestamp given means none


def test_log_append_time_gives_every_record_max_timestamp() -> None:
    batch = build_batch(
        [(b"a", b"1", ()), (b"b", b"2", ())],
        timestamps=[NOW_MS + 5, NOW_MS],
        log_append_time=True,
    )
    header, records = decode_batch(batch)
    assert header.log_append_time
    assert [r.timestamp for r in records] == [NOW_MS + 5, NOW_MS + 5]


def test_empty_batch_left_by_compaction() -> None:
    header, records = decode_batch(build_batch([], base_offset=10))
    assert header.record_count == 0 and records == []


def test_offset_gaps_inside_a_batch_are_kept() -> None:
    # Compaction removes records but keeps deltas; rewrite delta 1 -> 5 by hand.
    batch = build_batch([(b"a", b"", ()), (b"b", b"", ())], base_offset=100)
    second = batch.index(b"\x02b") - 1  # offsetDelta, just before keyLength (zigzag 1)
    assert batch[second] == 2  # zigzag 1
    batch[second] = 10  # zigzag 5
    refresh_crc(batch)
    assert [r.offset for r in decode_batch(batch)[1]] == [100, 105]


def test_offsets_spanned_by_whole_batches() -> None:
    first = build_batch([(b"a", b"", ()), (b"b", b"", ())], base_offset=100)
    second = build_batch([(b"c", b"", ())] * 3, base_offset=110)  # a gap of 8 (compaction)
    both = bytes(first + second)
    assert offsets_spanned(both) == 113 - 100
    assert offsets_spanned(memoryview(both)) == 13
    assert offsets_spanned(bytes(first)) == 2
    assert offsets_spanned(both[:-5]) == 2  # a partial batch at the end is not counted
    assert offsets_spanned(b"") == 0


# Hostile bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_truncation_is_a_decode_error(codec: int) -> None:
    batch = bytes(build_batch([(b"key", b"value" * 20, (("h", b"x"),))] * 5, codec=codec))
    for cut in range(len(batch)):
        with pytest.raises(DecodeError):
            decode_batch(batch[:cut])
    with pytest.raises(DecodeError):
        decode_batch(batch + b"\x00")


def test_crc_mismatch() -> None:
    batch = build_batch([(b"k", b"v", ())])
    batch[-2] ^= 0x01  # the value byte: "v" -> "w"
    with pytest.raises(DecodeError, match="CRC"):
        decode_batch(batch)
    assert decode_batch(bytes(batch), check_crc=False)[1][0].value == b"w"


@pytest.mark.parametrize("count", [0, 1, 3, 4, 2**31 - 1, -1])  # the truth is 2
def test_record_count_that_does_not_match_the_records(count: int) -> None:
    batch = build_batch([(b"k", b"v", ())] * 2)
    struct.pack_into(">i", batch, 57, count)
    refresh_crc(batch)
    with pytest.raises(DecodeError):
        decode_batch(batch)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    try:
        decode_batch(data, check_crc=False)
    except DecodeError:
        pass
    try:
        list(iter_records(data, check_crc=False))
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    codec=st.sampled_from(CODECS),
    flips=st.lists(st.tuples(st.integers(61, 10**6), st.integers(0, 7)), min_size=1, max_size=3),
)
def test_corrupt_records_only_raise_decode_error(codec: int, flips: list) -> None:
    records = [(b"key%d" % i, b"v" * i, (("h", None), ("i", b"x"))) for i in range(8)]
    batch = build_batch(records, codec=codec)
    for pos, bit in flips:
        batch[61 + pos % (len(batch) - 61)] ^= 1 << bit
    try:
        decode_batch(bytes(batch), check_crc=False)
    except DecodeError:
        pass


# Walking a fetch response -------------------------------------------------------------


def fetch_blob() -> tuple[bytes, list[int]]:
    """Three data batches around a commit marker, as a fetch of offsets 0.. returns them."""
    commit_marker = (struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 0), ())
    parts = [
        build_batch([(b"a", b"0", ()), (b"b", b"1", ())], base_offset=0, codec=4),
        build_batch([(b"c", b"2", ())], base_offset=2, transactional=True, producer_id=1),
        build_batch([commit_marker], base_offset=3, control=True, transactional=True),
        build_batch([(b"d", b"4", ()), (b"e", b"5", ())], base_offset=4, codec=2),
    ]
    return b"".join(parts), [0, 1, 2, 4, 5]


def test_iter_records_skips_control_batches() -> None:
    blob, offsets = fetch_blob()
    assert [r.offset for r in iter_records(blob)] == offsets
    assert [r.value for r in iter_records(memoryview(blob))] == [b"0", b"1", b"2", b"4", b"5"]


@pytest.mark.parametrize("start", range(7))
def test_iter_records_respects_start_offset(start: int) -> None:
    blob, offsets = fetch_blob()
    assert [r.offset for r in iter_records(blob, start_offset=start)] == [
        o for o in offsets if o >= start
    ]


def test_iter_records_ignores_a_trailing_partial_batch() -> None:
    blob, offsets = fetch_blob()
    last = read_header(
        blob, len(blob) - len(build_batch([(b"d", b"4", ()), (b"e", b"5", ())], codec=2))
    )
    complete = [r.offset for r in iter_records(blob)]
    for cut in range(last.position, len(blob)):
        assert [r.offset for r in iter_records(blob[:cut])] == complete[:3], cut
    assert list(iter_records(b"")) == []


def test_iter_records_rejects_a_corrupt_complete_batch() -> None:
    blob = bytearray(fetch_blob()[0])
    blob[70] ^= 0x01
    with pytest.raises(DecodeError):
        list(iter_records(blob))


# kafka-python's writer and reader ------------------------------------------------------

kafka_records = pytest.importorskip("kafka.record.default_records")


@pytest.fixture
def kafka_snappy(monkeypatch: pytest.MonkeyPatch) -> None:
    import cramjam
    import kafka.codec

    if not kafka.codec.has_snappy():  # python-snappy absent: stand cramjam in for it
        shim = type(
            "Snappy",
            (),
            {
                "compress": staticmethod(lambda d: bytes(cramjam.snappy.compress_raw(d))),
                "decompress": staticmethod(lambda d: bytes(cramjam.snappy.decompress_raw(d))),
            },
        )
        monkeypatch.setattr(kafka.codec, "snappy", shim)


SAMPLE = [
    (
        b"key-%d" % i,
        (b"value %d " % i) * 20 if i % 4 else None,
        [("trace", b"t%d" % i), ("n", None)],
    )
    for i in range(50)
] + [(None, b"", [])]


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_decode(codec: int) -> None:
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, (key, value, hdrs) in enumerate(SAMPLE):
        assert builder.append(i, NOW_MS + i, key, value, hdrs) is not None
    batch = bytes(builder.build())
    header, records = decode_batch(batch)
    assert header.codec == codec  # the sample compresses, so kafka-python kept the codec
    assert records == [Record(i, NOW_MS + i, k, v, tuple(h)) for i, (k, v, h) in enumerate(SAMPLE)]


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", CODECS)
def test_our_batches_decode_with_kafka_python(codec: int) -> None:
    times = [NOW_MS + i * 3 for i in range(len(SAMPLE))]
    batch = build_batch(
        SAMPLE,
        codec=codec,
        base_offset=1000,
        timestamps=times,
        producer_id=9,
        producer_epoch=0,
        base_sequence=5,
    )
    theirs = kafka_records.DefaultRecordBatch(bytes(batch))
    assert theirs.validate_crc()
    assert (theirs.compression_type, theirs.producer_id, theirs.base_sequence) == (codec, 9, 5)
    assert theirs.max_timestamp == times[-1] and theirs.last_offset_delta == len(SAMPLE) - 1
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]
    assert got == [
        (1000 + i, t, k, v, h) for i, ((k, v, h), t) in enumerate(zip(SAMPLE, times, strict=True))
    ]
