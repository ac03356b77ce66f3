"""rebuild_batch: what log compaction writes of a batch (some records, same offsets), the
KIP-534 delete horizon, Kafka's empty batch, and kafka-python reading the result."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire.compression import CODEC_NONE, CODECS
from wire.record_batch import DELETE_HORIZON_BIT, iter_batches, read_header
from wire.records import build_batch, decode_batch, rebuild_batch

pytestmark = pytest.mark.timeout(60)

NOW_MS = 1_700_000_000_000
SAMPLE = [(b"k%d" % i, None if i % 5 == 4 else b"value %d" % i * 8, [("h", b"%d" % i)])
          for i in range(20)]


def sample_batch(codec: int = CODEC_NONE, **kwargs) -> bytearray:
    times = [NOW_MS + 7 * i for i in range(len(SAMPLE))]
    batch = build_batch(SAMPLE, codec=codec, base_offset=500, timestamps=times, producer_id=4,
                        producer_epoch=2, base_sequence=30, **kwargs)
    batch[12:16] = (9).to_bytes(4, "big")  # partition leader epoch, as the log stamps it
    return batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(CODECS), keep=st.lists(st.booleans(), min_size=20, max_size=20))
def test_kept_records_keep_offsets_timestamps_and_batch_fields(codec: int, keep: list) -> None:
    original = sample_batch(codec)
    header, records = decode_batch(original)
    kept = [r for r, k in zip(records, keep, strict=True) if k]
    rebuilt = rebuild_batch(header, kept)
    iter_batches(rebuilt)  # the broker's header walk accepts it, CRC included
    new, decoded = decode_batch(rebuilt)
    assert decoded == kept
    same = ("base_offset", "last_offset_delta", "partition_leader_epoch", "producer_id",
            "producer_epoch", "base_sequence")
    assert [getattr(new, f) for f in same] == [getattr(header, f) for f in same]
    assert new.record_count == len(kept)
    if kept:
        assert new.codec == codec and new.base_timestamp == header.base_timestamp
        assert new.max_timestamp == max(r.timestamp for r in kept)
        assert new.delete_horizon_ms is None
    else:  # Kafka's empty batch
        assert (new.codec, new.base_timestamp, new.max_timestamp) == (
            CODEC_NONE, -1, header.max_timestamp)


@pytest.mark.parametrize("codec", CODECS)
def test_keeping_every_record_gives_the_same_bytes(codec: int) -> None:
    original = sample_batch(codec)
    header, records = decode_batch(original)
    assert rebuild_batch(header, records) == original


def test_delete_horizon_moves_base_timestamp_not_record_timestamps() -> None:
    header, records = decode_batch(sample_batch())
    horizon = NOW_MS + 86_400_000
    rebuilt = rebuild_batch(header, records[3:], delete_horizon_ms=horizon)
    new, decoded = decode_batch(rebuilt)
    assert new.attributes & DELETE_HORIZON_BIT and new.delete_horizon_ms == horizon
    assert new.base_timestamp == horizon
    assert decoded == records[3:]  # timestamps as they were: deltas are from the horizon
    # A later rebuild keeps the horizon it finds.
    again, decoded_again = decode_batch(rebuild_batch(new, decoded[1:]))
    assert again.delete_horizon_ms == horizon and decoded_again == records[4:]
    # Emptied, it is Kafka's empty batch: no horizon.
    assert read_header(rebuild_batch(new, [])).delete_horizon_ms is None


def test_log_append_time_batches_stay_stamped() -> None:
    header, records = decode_batch(sample_batch(log_append_time=True))
    new, decoded = decode_batch(rebuild_batch(header, records[::2]))
    assert new.log_append_time and new.max_timestamp == header.max_timestamp
    assert decoded == records[::2]


def test_records_out_of_the_batch_or_out_of_order_are_refused() -> None:
    header, records = decode_batch(sample_batch())
    other_header, other = decode_batch(build_batch(SAMPLE[:1], base_offset=10))
    with pytest.raises(ValueError):
        rebuild_batch(header, other)
    with pytest.raises(ValueError):
        rebuild_batch(header, [records[2], records[1]])


kafka_records = pytest.importorskip("kafka.record.default_records")


def test_kafka_python_reads_a_batch_with_a_delete_horizon() -> None:
    header, records = decode_batch(sample_batch())
    kept = records[1::3]
    rebuilt = rebuild_batch(header, kept, delete_horizon_ms=NOW_MS + 10**6)
    theirs = kafka_records.DefaultRecordBatch(bytes(rebuilt))
    assert theirs.validate_crc()
    assert theirs.last_offset_delta == header.last_offset_delta
    got = [(r.offset, r.timestamp, r.key, r.value) for r in theirs]
    assert got == [(r.offset, r.timestamp, r.key, r.value) for r in kept]
