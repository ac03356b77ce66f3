"""The Log interface, run against DiskLog and MemoryLog alike."""

from __future__ import annotations

import pytest

from storage import FileSlice, Log, LogConfig, OffsetOutOfRange
from tests.storage.batches import batch_of_size, make_batch, make_records
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 40


def append(log: Log, *batches: bytes, now_ms: int = 0, epoch: int = 7):
    records, headers = make_records(*batches)
    return log.append(records, headers, epoch, now_ms)


def offsets_in(data: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of every batch in a read result."""
    return [(h.base_offset, h.last_offset) for h in iter_batches(data)]


def test_append_read_round_trip(make_log):
    log = make_log()
    batch = make_batch([100, 101, 102])
    result = append(log, batch)
    assert result == (0, 2, 102, 0)
    assert (log.next_offset, log.written_offset, log.flushed_offset) == (3, 3, 0)
    data = log.read_bytes(0, BIG, log.next_offset)
    (header,) = iter_batches(data)
    assert (header.base_offset, header.partition_leader_epoch) == (0, 7)
    assert data[16:] == batch[16:]  # only baseOffset and the epoch were patched


def test_read_returns_fileslice_or_memoryview(make_log):
    log = make_log()
    append(log, make_batch([1]))
    region = log.read(0, BIG, 1)
    assert isinstance(region, FileSlice | memoryview)
    assert region is not None and len(
        bytes(region.read() if isinstance(region, FileSlice) else region)
    ) == len(make_batch([1]))


def test_offsets_contiguous_across_batches_and_appends(make_log):
    log = make_log()
    first = append(log, make_batch([1, 2, 3]), make_batch([4, 5]), make_batch([6]))
    second = append(log, make_batch([7, 8]))
    assert first == (0, 5, 6, 5)
    assert second == (6, 7, 8, 6)
    assert offsets_in(log.read_bytes(0, BIG, BIG)) == [(0, 2), (3, 4), (5, 5), (6, 7)]
    assert [h.base_offset for h in log.iter_batch_headers()] == [0, 3, 5, 6]
    assert [h.base_offset for h in log.iter_batch_headers(4)] == [3, 5, 6]


def test_offset_of_max_timestamp_is_first_batch_reaching_it(make_log):
    log = make_log()
    assert append(log, make_batch([5, 9]), make_batch([9]), make_batch([3])) == (0, 3, 9, 0)


def test_read_inside_a_batch_returns_the_whole_batch(make_log):
    log = make_log()
    append(log, make_batch([1, 2, 3, 4]), make_batch([5, 6]))
    assert offsets_in(log.read_bytes(2, BIG, BIG)) == [(0, 3), (4, 5)]
    assert offsets_in(log.read_bytes(5, BIG, BIG)) == [(4, 5)]


def test_max_bytes_whole_batches_and_oversized_first_batch(make_log):
    log = make_log()
    append(log, *(batch_of_size(1000) for _ in range(5)))
    assert offsets_in(log.read_bytes(0, 2999, BIG)) == [(0, 0), (1, 1)]
    assert offsets_in(log.read_bytes(0, 3000, BIG)) == [(0, 0), (1, 1), (2, 2)]
    assert offsets_in(log.read_bytes(1, 10, BIG)) == [(1, 1)]  # KIP-74: first batch alone
    assert offsets_in(log.read_bytes(1, 0, BIG)) == [(1, 1)]


def test_max_offset_is_exclusive(make_log):
    log = make_log()
    append(log, make_batch([1, 2]), make_batch([3, 4]), make_batch([5]))
    assert offsets_in(log.read_bytes(0, BIG, 3)) == [(0, 1)]  # batch 2..3 reaches the limit
    assert offsets_in(log.read_bytes(0, BIG, 4)) == [(0, 1), (2, 3)]
    assert offsets_in(log.read_bytes(0, BIG, 5)) == [(0, 1), (2, 3), (4, 4)]
    assert log.read(2, BIG, 3) is None  # the batch holding 2 ends past max_offset
    assert log.read(4, BIG, 4) is None
    assert log.read(5, BIG, BIG) is None  # offset == next_offset


def test_offset_out_of_range(make_log):
    log = make_log()
    assert log.read(0, BIG, BIG) is None
    append(log, make_batch([1, 2]))
    with pytest.raises(OffsetOutOfRange):
        log.read(3, BIG, BIG)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, BIG, BIG)
    assert log.read(2, BIG, BIG) is None


def test_roll_by_size_never_splits_a_batch(make_log):
    log = make_log(LogConfig(segment_bytes=2500, index_interval_bytes=100))
    append(log, *(batch_of_size(1000) for _ in range(5)))  # 2 per segment
    append(log, batch_of_size(6000))  # oversized: alone in a fresh segment
    append(log, batch_of_size(1000))
    assert log.segment_base_offsets == [0, 2, 4, 5, 6]
    # A read stops at the end of a segment; the client fetches again.
    assert offsets_in(log.read_bytes(0, BIG, BIG)) == [(0, 0), (1, 1)]
    assert offsets_in(log.read_bytes(2, BIG, BIG)) == [(2, 2), (3, 3)]
    assert offsets_in(log.read_bytes(5, BIG, BIG)) == [(5, 5)]


def test_roll_by_time(make_log):
    log = make_log(LogConfig(segment_ms=1000))
    append(log, make_batch([1]), now_ms=10_000)
    append(log, make_batch([2]), now_ms=10_999)
    append(log, make_batch([3]), now_ms=11_000)
    append(log, make_batch([4]), now_ms=11_500)
    assert log.segment_base_offsets == [0, 2]


def test_lookup_across_many_segments(make_log):
    log = make_log(LogConfig(segment_bytes=3000, index_interval_bytes=256))
    for i in range(300):
        append(log, make_batch([i * 10 + k for k in range(i % 4 + 1)], value_bytes=i % 50))
    assert len(log.segment_base_offsets) > 10
    headers = list(log.iter_batch_headers())
    assert [h.base_offset for h in headers[1:]] == [h.next_offset for h in headers[:-1]]
    for h in headers[::7]:
        for offset in (h.base_offset, h.last_offset):
            got = offsets_in(log.read_bytes(offset, 1, BIG))
            assert got == [(h.base_offset, h.last_offset)]
            got = offsets_in(log.read_bytes(offset, BIG, h.next_offset))
            assert got[-1] == (h.base_offset, h.last_offset)


def test_offset_for_timestamp_and_max_timestamp(make_log):
    log = make_log(LogConfig(segment_bytes=500, index_interval_bytes=100))
    assert log.offset_for_timestamp(0) is None and log.max_timestamp() is None
    assert log.offset_for_timestamp(-1) is None
    timestamps = [[10, 12], [11], [30, 20], [25], [40], [40], [35], [50, 45]]
    for ts in timestamps:
        append(log, make_batch(ts, value_bytes=100))
    assert len(log.segment_base_offsets) > 2
    bases = [0, 2, 3, 5, 6, 7, 8, 9]
    for target in range(0, 55):
        expected = next(
            ((b, max(ts)) for b, ts in zip(bases, timestamps, strict=True) if max(ts) >= target),
            None,
        )
        assert log.offset_for_timestamp(target) == expected, target
    assert log.max_timestamp() == (9, 50)
    assert log.offset_for_timestamp(-1) == (0, 12)


def control_batch(timestamp: int) -> bytes:
    """A control batch (a marker, a LEADER_CHANGE) stamped `timestamp`."""
    return bytes(build_batch([(b"\x00\x00\x00\x02", b"", [])], control=True,
                             base_timestamp=timestamp))


def test_max_timestamp_is_of_data_batches_only(make_log):
    """ListOffsets MAX_TIMESTAMP names a record a consumer reads: a control batch stamped
    later than every record (a new leader's LEADER_CHANGE, a transaction marker) is passed
    over, in a segment with data and in one of its own."""
    log = make_log(LogConfig(segment_bytes=500, index_interval_bytes=100))
    assert log.max_timestamp() is None
    append(log, control_batch(99))
    assert log.max_timestamp() is None
    append(log, make_batch([10, 30], value_bytes=100))  # 1-2
    append(log, control_batch(90))  # 3
    append(log, make_batch([20], value_bytes=100))  # 4
    assert log.max_timestamp() == (1, 30)
    append(log, control_batch(95), epoch=8)  # 5: a new term's LEADER_CHANGE, alone
    append(log, make_batch([30], value_bytes=100), epoch=9)  # 6: a tie, the first one wins
    assert {5, 6} <= set(log.segment_base_offsets)
    assert log.max_timestamp() == (1, 30)
    append(log, make_batch([40], value_bytes=100), control_batch(97), epoch=9)  # 7, 8
    assert log.max_timestamp() == (7, 40)


def test_truncate(make_log):
    log = make_log(LogConfig(segment_bytes=2500))
    append(log, *(make_batch([i, i + 1], value_bytes=400) for i in range(10)))  # 2 offsets each
    bases = log.segment_base_offsets
    assert len(bases) > 2
    log.truncate(9)  # batch 8..9 holds 9 and stays
    assert log.next_offset == 10
    log.truncate(bases[2])
    assert log.next_offset == bases[2]
    assert log.segment_base_offsets == bases[:2]
    assert [h.base_offset for h in log.iter_batch_headers()][-1] == bases[2] - 2
    assert append(log, make_batch([99])).base_offset == bases[2]
    assert log.max_timestamp() == (bases[2], 99)
    log.truncate(0)
    assert (log.next_offset, log.segment_base_offsets) == (0, [0])
    assert log.read(0, BIG, BIG) is None and log.max_timestamp() is None
    assert append(log, make_batch([1])).base_offset == 0
