"""Direct-mode reads (storage/direct_read.py): what a served direct-mode log's chunks no longer
hold is read with O_DIRECT into read windows, never through the page cache; a sequential
reader's readahead grows; the shard's windows stay within their budget; a cut makes a window
(or a fill begun before it) give no stale bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import DiskLog, LogConfig, NotCached
from storage.appender import ChunkPool
from storage.direct_read import DirectMiss, ReadWindows, SegmentReader, Window
from storage.page_cache import cached, drop_file
from tests.storage.batches import iter_batches, make_batch, make_records

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 40


def append(log: DiskLog, *batches: bytes, epoch: int = 3):
    records, headers = make_records(*batches)
    return log.append(records, headers, epoch, 0)


def batch(i: int, size: int = 900) -> bytes:
    return make_batch([1000 + i, 1000 + i], value_bytes=size)  # two offsets


def served(directory: Path, pool: ChunkPool, config: LogConfig = LogConfig()) -> DiskLog:  # noqa: B008
    log = DiskLog.open(directory, config, pool)
    log.serve()
    return log


def filled(directory: Path, pool: ChunkPool, count: int, **config: int) -> DiskLog:
    """A served direct log of `count` batches, flushed one by one, its first chunks evicted."""
    log = served(directory, pool, LogConfig(**config))
    for i in range(count):
        append(log, batch(i))
        log.flush()
    assert pool.evictions > 0
    return log


def read_loop(log: DiskLog, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """A read as the shard's loop makes it: nowait, a miss warmed (here, inline) and the read
    made again. The bytes, and how many misses it took."""
    misses = 0
    for _ in range(10):  # bounded: a warmed read is served
        try:
            region = log.read(offset, max_bytes, BIG, nowait=True)
        except NotCached as miss:
            assert isinstance(miss, DirectMiss), miss  # never a page-cache miss here
            miss.warm()
            misses += 1
            continue
        assert isinstance(region, memoryview), region  # a copy, never a FileSlice
        return bytes(region), misses
    raise AssertionError("a warmed read kept missing")


def test_old_bytes_come_from_the_file_with_o_direct_not_the_page_cache(tmp_path: Path) -> None:
    pool = ChunkPool(8192, 4 * 8192)
    log = filled(tmp_path, pool, 60)  # ~55 KiB through a 32 KiB pool
    path = tmp_path / f"{0:020d}.log"
    drop_file(path)
    data, misses = read_loop(log, 0, 8000)  # batches of ~1.9 KB: four
    assert misses == 1
    with open(path, "rb") as f:
        on_disk = f.read(len(data))
    assert data == on_disk and [h.base_offset for h in iter_batches(data)] == [0, 2, 4, 6]
    segment = log._segments[0]
    drop_file(path)  # the buffered read above brought it in; the window is ours alone
    again, misses = read_loop(log, 0, 8000)
    assert again == data and misses == 0  # from the window
    assert not cached(segment.fd, 0, len(data))
    stats = pool.stats()
    assert stats["window_fills"] == 1 and stats["window_hits"] >= 2
    assert stats["window_bytes"] == 64 * 1024  # the first miss's readahead
    log.close()


def test_a_sequential_reader_reads_ahead_further_each_time(tmp_path: Path) -> None:
    pool = ChunkPool(8192, 4 * 8192)
    log = filled(tmp_path, pool, 1200)  # ~1.1 MB, one segment
    reader_misses = []
    offset, got = 0, []
    written = log._segments[0].writer.written
    while offset < log.next_offset:
        data, misses = read_loop(log, offset, 4000)  # a consumer's small fetches
        reader_misses.append(misses)
        headers = iter_batches(data)
        got += [h.base_offset for h in headers]
        offset = headers[-1].next_offset
    assert got == list(range(0, 2400, 2))
    fills = pool.stats()["window_fills"]
    # 64 KiB, 128, 256, 512, 1 MiB windows: a handful of misses for ~1.1 MB, where a fixed
    # 64 KiB readahead would take 17 and no readahead ~300.
    assert fills <= 7 and sum(reader_misses) <= 7, (fills, reader_misses, written)
    assert log._segments[0].reader._ahead == 1024 * 1024
    log.close()


def test_the_shards_windows_stay_within_their_budget(tmp_path: Path) -> None:
    pool = ChunkPool(8192, 4 * 8192, read_budget_bytes=256 * 1024)
    log = filled(tmp_path, pool, 400, segment_bytes=40_000)  # ~9 segments, ~45 batches each
    firsts = [s.base_offset for s in log._segments[:-1]]
    for round_ in range(2):
        for base in firsts:
            data, _ = read_loop(log, base, 2000)
            assert iter_batches(data)[0].base_offset == base
            stats = pool.stats()
            # Counted when first read; one window (<= the largest readahead) may overshoot.
            assert stats["window_bytes"] <= 256 * 1024 + 64 * 1024, (round_, stats)
    stats = pool.stats()
    assert stats["window_evictions"] > 0
    assert sum(1 for s in log._segments if s.reader._window is not None) <= 256 // 40 + 1
    log.close()
    assert pool.reads.bytes == sum(len(w.buffer) for w in pool.reads._held.values())


def test_a_cut_leaves_no_stale_bytes_in_a_window_nor_in_a_fill_begun_before_it(
        tmp_path: Path) -> None:
    pool = ChunkPool(8192, 4 * 8192)
    log = filled(tmp_path, pool, 40)
    before, _ = read_loop(log, 0, 8000)  # a window over the first bytes
    miss = log._segments[0].reader.miss(0, 4096, 4096)  # a fill not yet run
    log.truncate(4)  # a follower's cut: offsets 4.. go, and others take their place
    for i in range(40):
        append(log, batch(500 + i, size=700))
        log.flush()
    miss.warm()  # begun before the cut: it makes no window
    assert not log._segments[0].reader.holds(0, 1)
    after, _ = read_loop(log, 0, 8000)
    headers = iter_batches(after)
    assert after[:headers[2].position] == before[:headers[2].position]  # offsets 0..3 stayed
    assert after[headers[2].position:] != before[headers[2].position:len(after)]
    with open(tmp_path / f"{0:020d}.log", "rb") as f:
        assert f.read(len(after)) == after
    log.close()


def test_header_scans_off_the_nowait_path_fill_a_window_once(tmp_path: Path) -> None:
    """The Raft leader sizes a far-behind follower's append by scanning headers on the loop
    (actors/replica.py `log_batch_reader`): one O_DIRECT read for the lot, not one each."""
    pool = ChunkPool(8192, 4 * 8192)
    log = filled(tmp_path, pool, 200)
    headers = log.iter_batch_headers(0)
    first = [h.base_offset for _, h in zip(range(30), headers, strict=False)]  # ~57 KB
    assert first == list(range(0, 60, 2)) and pool.stats()["window_fills"] == 1
    rest = [h.base_offset for h in headers]  # ~320 KB more: 128 KiB and 256 KiB windows
    assert first + rest == list(range(0, 400, 2)) and pool.stats()["window_fills"] == 3
    log.close()


def test_buffers_are_used_again_and_free_ones_stay_within_the_budget() -> None:
    """Windows replaced give their buffers back for the next misses; a size class emptied by
    a miss and the budget trimmed afterwards (the broker once met an empty free list here)."""
    windows = ReadWindows(512 * 1024)
    a, b = SegmentReader(windows, "a.log"), SegmentReader(windows, "b.log")

    def show(reader: SegmentReader, size: int) -> Window:
        buffer = windows.buffer(size)
        window = Window(0, memoryview(buffer)[:size], buffer)
        reader._window = window
        windows.read(reader, window)
        return window

    first = show(a, 100 * 1024)  # a 128 KiB buffer
    show(a, 40 * 1024)  # replaced: its buffer is free
    assert windows.free_bytes == 128 * 1024 and windows.bytes == 64 * 1024
    again = windows.buffer(120 * 1024)
    assert again is first.buffer and windows.free_bytes == 0  # used again, not made
    show(b, 300 * 1024)  # 512 KiB: past the budget with a's window
    show(b, 500 * 1024)  # and again: the one being read stays, a's goes
    assert windows.bytes == 512 * 1024 and windows.free_bytes == 0
    assert a._window is None and windows.evictions == 1
    assert windows.buffers_made == 4  # 128 KiB, 64, 512, 512: the 120 KiB miss made none
