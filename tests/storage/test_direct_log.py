"""Direct mode (storage/appender.py): appends in the shard's chunks, written with O_DIRECT by
the flush ticket; the files, a crash, a cut racing a write, the chunk pool's bounds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from storage import DiskLog, FileSlice, LogConfig
from storage.appender import ALIGN, QUEUE_ENTRIES_PER_CHUNK_MAX, ChunkPool
from tests.storage.batches import batch_of_size, every_batch, make_batch, make_records
from wire.record_batch import read_header

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 40
ROOT = Path(__file__).resolve().parents[2]


def append(log: DiskLog, *batches: bytes, epoch: int = 3):
    records, headers = make_records(*batches)
    return log.append(records, headers, epoch, 0)


def batch(i: int, size: int = 300) -> bytes:
    return make_batch([1000 + i, 1000 + i], value_bytes=size)  # two offsets


def offsets(log: DiskLog) -> list[int]:
    """Base offsets of every batch, read as a consumer reads."""
    return [read_header(b).base_offset for b in every_batch(log)]


def log_file(directory: Path, base: int = 0) -> Path:
    return directory / f"{base:020d}.log"


def test_appends_are_in_memory_until_a_flush_writes_them(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, chunks=ChunkPool(8192, 64 * 8192))
    for i in range(5):
        append(log, batch(i))
    assert log_file(tmp_path).stat().st_size == 0  # nothing in the file yet
    region = log.read(0, BIG, BIG)
    assert isinstance(region, memoryview) and offsets(log) == [0, 2, 4, 6, 8]
    log.flush()
    size = log._segments[-1].size
    data = log_file(tmp_path).read_bytes()
    assert len(data) == -(-size // ALIGN) * ALIGN  # whole blocks: the tail padded
    assert data[:size] == bytes(region) and not any(data[size:])
    log.close()  # cuts the padding: the file ends where the segment does
    assert log_file(tmp_path).stat().st_size == size
    reopened = DiskLog.open(tmp_path, chunks=ChunkPool(8192, 64 * 8192))
    assert offsets(reopened) == [0, 2, 4, 6, 8]
    append(reopened, batch(5))  # the partial tail block is read back and rewritten
    reopened.flush()
    reopened.close()
    assert offsets(again := DiskLog.open(tmp_path)) == [0, 2, 4, 6, 8, 10]
    again.close()


def test_a_sealed_file_is_exact_and_the_active_one_has_space_reserved(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, LogConfig(segment_bytes=3000), ChunkPool(8192, 64 * 8192))
    for i in range(12):
        append(log, batch(i))
    log.flush()
    bases = log.segment_base_offsets
    assert len(bases) > 2
    for base, segment in zip(bases[:-1], log._segments[:-1], strict=True):
        stat = log_file(tmp_path, base).stat()
        assert stat.st_size == segment.size  # the seal's write cut the padding
        assert stat.st_blocks * 512 <= -(-segment.size // ALIGN) * ALIGN  # and the reserve
    active = log_file(tmp_path, bases[-1]).stat()
    assert active.st_blocks * 512 >= 1024 * 1024  # blocks reserved ahead of the end
    log.close()


CRASH = textwrap.dedent("""
    import os, signal, sys
    from storage import DiskLog
    from storage.appender import ChunkPool
    from tests.storage.batches import batch_of_size, every_batch, make_batch, make_records
    log = DiskLog.open(sys.argv[1], chunks=ChunkPool(8192, 8 * 8192))
    def append(i):
        records, headers = make_records(make_batch([i, i], value_bytes=700))
        log.append(records, headers, 1, 0)
    for i in range(40):
        append(i)
        if i % 7 == 0:
            log.flush()
    log.flush()  # 0..79 acknowledged
    for i in range(40, 45):
        append(i)  # in memory only
    ticket = log.flush_prepare()
    ticket.writes[0].run()  # written, not synced: in the page cache of the drive, if any
    for i in range(45, 50):
        append(i)
    print(log.flushed_offset, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_kill_9_keeps_every_flushed_batch_and_recovery_cuts_the_padding(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == -signal.SIGKILL, run.stderr
    flushed = int(run.stdout.split()[0])
    assert flushed == 80
    log = DiskLog.open(tmp_path)
    found = offsets(log)
    assert found[:40] == list(range(0, 80, 2))  # everything flushed
    assert found == list(range(0, 2 * len(found), 2))  # then a prefix of what was written
    assert len(found) <= 45  # never what stayed in memory
    log.close()


@pytest.mark.parametrize("cut_first", [True, False])
def test_a_cut_and_a_write_in_flight_never_leave_a_cut_batch_in_the_file(
        tmp_path: Path, cut_first: bool) -> None:
    """A write job made before a cut runs after it, new batches already in the cut's place
    (its write stops at the cut), or before it (the cut takes its bytes back): either way a
    reopen finds nothing the cut took. Batches of half a chunk: the cut frees whole chunks,
    which the new batches take again."""
    log = DiskLog.open(tmp_path, chunks=ChunkPool(8192, 64 * 8192))
    for i in range(2):
        append(log, batch_of_size(4096, timestamp=i))
    log.flush()
    for i in range(2, 6):
        append(log, batch_of_size(4096, timestamp=i))
    ticket = log.flush_prepare()
    assert ticket is not None and ticket.writes
    if not cut_first:
        ticket.run()
    log.truncate(2)
    for i in range(2):
        append(log, batch_of_size(4096, timestamp=100 + i))  # where the cut ones were
    if cut_first:
        ticket.run()
    log.flush_complete(ticket)
    assert log.flushed_offset == 2
    peek = DiskLog.open(tmp_path)  # what a crash now would find
    found = every_batch(peek)
    peek.close()
    assert found == every_batch(log)[:len(found)] and len(found) >= 2
    log.flush()
    expected = every_batch(log)
    log.close()
    assert every_batch(reopened := DiskLog.open(tmp_path)) == expected
    reopened.close()


def test_a_cut_waits_for_a_write_running_on_another_thread(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, chunks=ChunkPool(8192, 256 * 8192))
    for round_ in range(30):
        for i in range(6):
            append(log, batch_of_size(2048, timestamp=round_ * 10 + i))
        cut_to = log.next_offset - 6
        ticket = log.flush_prepare()
        assert ticket is not None
        runner = threading.Thread(target=ticket.run)
        runner.start()
        log.truncate(cut_to)
        runner.join(10)
        log.flush_complete(ticket)
        log.flush()
        peek = DiskLog.open(tmp_path)
        assert every_batch(peek) == every_batch(log), round_
        peek.close()
    log.close()


def test_reads_of_evicted_chunks_come_from_the_file(tmp_path: Path) -> None:
    pool = ChunkPool(8192, 4 * 8192)
    log = DiskLog.open(tmp_path, chunks=pool)
    for i in range(60):  # ~60 KiB through a 32 KiB pool
        append(log, batch(i, size=900))
        log.flush()
    assert pool.overflow == 0 and pool.evictions > 0
    region = log.read(0, 2000, BIG)
    assert isinstance(region, FileSlice)  # the first chunks were evicted
    tail = log.read(log.next_offset - 2, BIG, BIG)
    assert isinstance(tail, memoryview)  # the last ones are held
    assert offsets(log) == list(range(0, 120, 2))
    log.close()
    assert pool.free == pool.count  # every chunk back


def test_more_unwritten_bytes_than_the_pool_holds_overflow_and_are_counted(
        tmp_path: Path) -> None:
    pool = ChunkPool(8192, 2 * 8192)
    log = DiskLog.open(tmp_path, chunks=pool)
    for i in range(40):
        append(log, batch(i, size=900))  # ~40 KiB unwritten
    assert pool.overflow >= 3
    log.flush()
    assert offsets(log) == list(range(0, 80, 2))
    log.close()
    assert pool.free == pool.count


def test_a_header_scan_reads_what_is_not_yet_written(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, chunks=ChunkPool(8192, 64 * 8192))
    for i in range(3):
        append(log, batch(i))
    log.flush()
    for i in range(3, 6):
        append(log, batch(i))
    scan = log.header_scan(log.next_offset)
    found = []
    for header in scan.headers(0):
        found.append(header.base_offset)
        assert len(scan.read(header)) == header.size
    assert found == [0, 2, 4, 6, 8, 10]
    log.flush()
    log.close()


def test_the_pool_forgets_chunks_given_back_so_its_queue_stays_bounded(tmp_path: Path) -> None:
    pool = ChunkPool(8192, 8 * 8192)
    for i in range(40):  # logs that write a few chunks each and close: nothing is evicted
        log = DiskLog.open(tmp_path / f"l{i}", chunks=pool)
        for j in range(3):
            append(log, batch_of_size(8192, timestamp=j))
        log.flush()
        log.close()
        assert len(pool._written) <= QUEUE_ENTRIES_PER_CHUNK_MAX * pool.count + 1
    assert pool.free == pool.count and pool.evictions == 0


def test_a_sealed_segment_lets_its_last_chunk_go(tmp_path: Path) -> None:
    """Each 3000-byte segment holds a part of one chunk: once sealed and written, that chunk
    is cache like any other, or the pool would fill with sealed segments' tails."""
    pool = ChunkPool(8192, 4 * 8192)
    log = DiskLog.open(tmp_path, LogConfig(segment_bytes=3000), pool)
    for i in range(60):
        append(log, batch(i, size=900))
        log.flush()
    assert len(log.segment_base_offsets) > 20
    assert pool.overflow == 0 and pool.evictions > 0
    assert offsets(log) == list(range(0, 120, 2))
    log.close()


def test_a_cut_into_bytes_no_longer_held_reads_their_block_back(tmp_path: Path) -> None:
    """A follower cuts deep into its written log, where the chunks were evicted: the next
    write rewrites the block the cut lies in, so that block is read back from the file
    first, not taken from a reused chunk's stale bytes."""
    pool = ChunkPool(8192, 4 * 8192)
    log = DiskLog.open(tmp_path, chunks=pool)
    for i in range(40):  # ~40 KiB through a 32 KiB pool: the first chunks go
        append(log, batch(i, size=700))
        log.flush()
    assert pool.evictions > 0
    kept = every_batch(log)[:5]  # a cut at offset 10: inside the first chunk, not on a block
    log.truncate(10)
    append(log, batch(99, size=50))
    log.flush()
    expected = every_batch(log)
    assert expected[:5] == kept
    log.close()
    assert every_batch(reopened := DiskLog.open(tmp_path)) == expected
    reopened.close()


def test_segments_out_of_the_log_give_their_chunks_back_on_the_loop(tmp_path: Path) -> None:
    """Retention's and a cut's segments are closed on an I/O thread; their chunks go back to
    the pool before that, where the loop takes chunks (a chunk given back by a thread while
    the loop evicts it would have two owners)."""
    pool = ChunkPool(8192, 64 * 8192)
    log = DiskLog.open(tmp_path, LogConfig(segment_bytes=3000), pool)
    for i in range(30):
        append(log, batch(i))
    log.flush()
    held = pool.count - pool.free
    removed = log.remove_head(log.removable_head(3))
    assert removed and pool.count - pool.free < held  # given back already
    assert all(s.writer is not None and not s.writer._chunks for s in removed)
    closer = threading.Thread(target=lambda: [s.close() for s in removed])
    closer.start()
    closer.join(10)
    log.truncate(log.segment_base_offsets[1])  # the last segments out: retired
    closable = log.take_closable()
    assert closable and all(not s.writer._chunks for s in closable if s.writer is not None)
    for segment in closable:
        segment.close()
    log.close()
    assert pool.free == pool.count


def test_a_sealed_segment_taking_appends_again_reads_its_evicted_tail_back(
        tmp_path: Path) -> None:
    """A cut that drops every segment after a sealed one, at its very end, makes it the
    active one again with nothing of it cut: its last chunk, evicted once it was sealed and
    written, is read back before the next write rewrites its tail block."""
    pool = ChunkPool(8192, 4 * 8192)
    log = DiskLog.open(tmp_path, LogConfig(segment_bytes=3000), pool)
    for i in range(40):
        append(log, batch(i, size=900))
        log.flush()
    assert pool.evictions > 0
    second = log.segment_base_offsets[1]
    kept = every_batch(log)[:offsets(log).index(second)]
    log.truncate(second)  # the first segment is the active one again, whole
    append(log, batch(99, size=50))
    log.flush()
    expected = every_batch(log)
    assert expected[:-1] == kept
    log.close()
    assert every_batch(reopened := DiskLog.open(tmp_path)) == expected
    reopened.close()
