"""Reads on a shard's loop never wait on the disk: misses are named, warmed, then served.

Pages are evicted with posix_fadvise(DONTNEED) after an fdatasync (clean pages of one file:
no privilege needed, unlike drop_caches), and each test first checks that eviction took,
since a kernel may keep pages anyway.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from storage import DiskLog, LogConfig, NotCached
from storage.page_cache import cached, cached_pages, drop_file, read_nowait, warm
from tests.storage.batches import batch_of_size, make_records

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024


def cold_file(tmp_path: Path, size: int = 4 * MiB) -> tuple[int, Path]:
    path = tmp_path / "cold.bin"
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past what is read
    for _ in range(20):  # bounded: DONTNEED skips a page still under write-back
        drop_file(path)
        if cached_pages(fd, 0, size) == 0:
            return fd, path
        time.sleep(0.05)
    os.close(fd)
    pytest.fail("posix_fadvise(DONTNEED) did not evict the file: cannot test cold reads")


def test_cached_sees_what_warm_brings_in(tmp_path: Path) -> None:
    fd, _ = cold_file(tmp_path)
    try:
        assert not cached(fd, MiB, MiB)
        warm(fd, MiB, MiB)
        assert cached(fd, MiB, MiB)
        assert cached(fd, MiB + 100, 5000)  # any range inside
        assert not cached(fd, MiB, MiB + 4096)  # one page past it is still cold
        assert cached(fd, 0, 0)
    finally:
        os.close(fd)


def test_read_nowait_names_the_range_to_warm(tmp_path: Path) -> None:
    fd, _ = cold_file(tmp_path)
    try:
        with pytest.raises(NotCached) as miss:
            read_nowait(fd, 61, 2 * MiB, warm_bytes=MiB)
        assert (miss.value.fd, miss.value.position, miss.value.length) == (fd, 2 * MiB, MiB)
        warm(fd, 2 * MiB, MiB)
        assert read_nowait(fd, 61, 2 * MiB, warm_bytes=MiB) == os.pread(fd, 61, 2 * MiB)
        # At the end of the file a short read is the answer, not a miss.
        warm(fd, 4 * MiB - 10, 10)
        assert len(read_nowait(fd, 61, 4 * MiB - 10, warm_bytes=MiB)) == 10
    finally:
        os.close(fd)


def test_a_cold_log_read_misses_until_warmed(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path / "t-0", LogConfig(segment_bytes=2 * MiB))
    for i in range(600):  # ~6 MB over three segments
        records, headers = make_records(batch_of_size(10_000, timestamp=1_700_000_000_000 + i))
        log.append(records, headers, 0, 1_700_000_000_000 + i)
    log.flush()
    hot = log.read(300, MiB, log.next_offset, nowait=True)  # just written: in memory
    assert hot is not None
    for path in (tmp_path / "t-0").glob("*.log"):
        drop_file(path)
    misses = 0
    while True:
        try:
            region = log.read(300, MiB, log.next_offset, nowait=True)
            break
        except NotCached as miss:
            misses += 1
            assert misses <= 3, "warming the named range did not make the read succeed"
            warm(miss.fd, miss.position, miss.length)
    assert misses >= 1
    assert region is not None and region.read() == hot.read()
    # By time, too.
    log_path = next((tmp_path / "t-0").glob("*.log"))
    drop_file(log_path)
    with pytest.raises(NotCached):
        log.offset_for_timestamp(1_700_000_000_100, nowait=True)
    log.close()
