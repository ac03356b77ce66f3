"""DiskLog only: reopen, recovery of torn tails and bad indexes, flush tickets; each in
buffered and in direct mode (storage/appender.py)."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from pathlib import Path

import pytest

from storage import DiskLog, LogConfig
from tests.storage.batches import batch_of_size, every_batch, make_batch, make_records
from wire.record_batch import iter_batches

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

BIG = 1 << 40
SMALL_SEGMENTS = LogConfig(segment_bytes=5000, index_interval_bytes=300)


def append(log: DiskLog, *batches: bytes, now_ms: int = 0):
    records, headers = make_records(*batches)
    return log.append(records, headers, 3, now_ms)


def fill(log: DiskLog, count: int) -> None:
    for i in range(count):
        append(log, make_batch([1000 + i, 1000 + i], value_bytes=100 + i % 7))  # 2 offsets each


def file_bytes(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def segment_files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


def test_empty_directory_opens_empty_log(tmp_path):
    log = DiskLog.open(tmp_path / "t-0")
    assert (log.log_start_offset, log.next_offset, log.flushed_offset) == (0, 0, 0)
    assert [p.name for p in segment_files(tmp_path / "t-0", ".log")] == [f"{0:020d}.log"]
    log.close()


def test_close_and_reopen_keeps_every_batch(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    before, bases, max_ts = every_batch(log), log.segment_base_offsets, log.max_timestamp()
    ts_answer = log.offset_for_timestamp(1050)
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert (log.next_offset, log.written_offset, log.flushed_offset) == (200, 200, 0)
    log.flush()  # the recovery sync
    assert log.flushed_offset == 200
    assert every_batch(log) == before and log.segment_base_offsets == bases
    assert log.max_timestamp() == max_ts == (198, 1099)
    assert log.offset_for_timestamp(1050) == ts_answer == (100, 1050)
    assert append(log, make_batch([1])).base_offset == 200
    log.close()


def reopen_after(tmp_path: Path, damage) -> tuple[DiskLog, list[bytes]]:
    """Write 30 batches, damage the tail segment's file, reopen; also return the batches."""
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 30)
    batches = every_batch(log)
    log.close()
    tail = segment_files(tmp_path, ".log")[-1]
    damage(tail)
    return DiskLog.open(tmp_path, SMALL_SEGMENTS), batches


def test_torn_tail_cut_mid_batch(tmp_path, caplog):
    log, batches = reopen_after(tmp_path, lambda p: os.truncate(p, p.stat().st_size - 50))
    assert log.next_offset == 58 and every_batch(log) == batches[:-1]
    assert "torn batch" in caplog.text
    assert append(log, make_batch([5])).base_offset == 58
    log.close()


def test_torn_tail_cut_inside_length_prefix(tmp_path, caplog):
    size = len(batches_last := make_batch([1029, 1029], value_bytes=100 + 29 % 7))
    log, batches = reopen_after(tmp_path, lambda p: os.truncate(p, p.stat().st_size - size + 5))
    assert batches[-1][16:] == batches_last[16:]
    assert log.next_offset == 58 and "torn length prefix" in caplog.text
    log.close()


def test_garbage_after_the_last_batch(tmp_path, caplog):
    def damage(path: Path) -> None:
        with path.open("ab") as f:
            f.write(b"\x00" * 100 + os.urandom(300))

    log, batches = reopen_after(tmp_path, damage)
    assert log.next_offset == 60 and every_batch(log) == batches
    assert "impossible batch length" in caplog.text
    assert append(log, make_batch([5])).base_offset == 60
    log.close()


def test_flipped_byte_in_last_batch(tmp_path, caplog):
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x40
        path.write_bytes(data)

    log, batches = reopen_after(tmp_path, damage)
    assert log.next_offset == 58 and every_batch(log) == batches[:-1]
    assert "CRC-32C mismatch" in caplog.text
    assert append(log, make_batch([5])).base_offset == 58
    assert DiskLog.open(tmp_path / "other").next_offset == 0
    log.close()


def test_corrupt_sealed_segment_drops_what_follows(tmp_path, caplog):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    batches = every_batch(log)
    bases = log.segment_base_offsets
    log.close()
    first = segment_files(tmp_path, ".log")[0]
    first.write_bytes(first.read_bytes()[:-10])  # torn: last batch of segment 0
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert log.segment_base_offsets == [0]
    assert log.next_offset == bases[1] - 2 and every_batch(log) == batches[: bases[1] // 2 - 1]
    assert "dropping segments" in caplog.text
    assert len(segment_files(tmp_path, ".index")) == 1
    log.close()


@pytest.mark.parametrize("damage", ["delete", "garbage", "past_end", "not_increasing", "short"])
def test_bad_index_is_rebuilt(tmp_path, damage):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    batches = every_batch(log)
    log.close()
    index = segment_files(tmp_path, ".index")[1]
    good = index.read_bytes()
    timeindex = segment_files(tmp_path, ".timeindex")[1]
    good_time = timeindex.read_bytes()
    if damage == "delete":
        index.unlink()
        timeindex.unlink()
    elif damage == "garbage":
        index.write_bytes(os.urandom(len(good)))
    elif damage == "past_end":
        index.write_bytes(good + (100).to_bytes(4, "big") + (10**6).to_bytes(4, "big"))
    elif damage == "not_increasing":
        index.write_bytes(good[:8] + good[16:24] + good[8:16] + good[24:])
    else:
        index.write_bytes(good[:-3])
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert index.read_bytes() == good and timeindex.read_bytes() == good_time
    assert every_batch(log) == batches
    for h in list(log.iter_batch_headers())[::5]:
        assert iter_batches(log.read_bytes(h.last_offset, 1, BIG))[0].base_offset == h.base_offset
    log.close()


def test_empty_tail_left_by_a_crash_after_roll_is_dropped(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    bases = log.segment_base_offsets
    log.close()
    (tmp_path / f"{200:020d}.log").touch()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert log.segment_base_offsets == bases and log.next_offset == 200
    log.close()


def test_stray_files_removed(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 10)
    log.close()
    (tmp_path / f"{0:020d}.index.tmp").write_bytes(b"x")
    (tmp_path / f"{555:020d}.index").write_bytes(b"x" * 8)
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(n.endswith(".tmp") or n.startswith(f"{555:020d}") for n in names)
    assert log.next_offset == 20
    log.close()


def test_segment_reborn_after_truncate_keeps_its_own_index(tmp_path, caplog):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    bases = log.segment_base_offsets
    log.truncate(bases[-2])
    fill(log, (200 - bases[-2]) // 2)  # rolls again at bases[-2], same file names
    assert log.segment_base_offsets == bases
    log.close()
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    log.close()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert "rebuilding" not in caplog.text


def test_truncate_then_reopen(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 100)
    bases = log.segment_base_offsets
    log.truncate(bases[3] + 4)
    fill(log, 3)
    expected = every_batch(log)
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert every_batch(log) == expected
    assert log.next_offset == bases[3] + 4 + 6
    log.close()


# Flush tickets -------------------------------------------------------------------------------


def test_flush_ticket_lifecycle(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert log.flush_prepare() is None
    fill(log, 5)
    ticket = log.flush_prepare()
    assert ticket is not None and ticket.offset == 10
    fill(log, 5)  # appends continue while the ticket is out
    assert (log.flushed_offset, log.written_offset, log.next_offset) == (0, 20, 20)
    ticket.run()
    log.flush_complete(ticket)
    assert (log.flushed_offset, log.written_offset) == (10, 20)
    log.flush()
    assert log.flushed_offset == 20 and log.flush_prepare() is None
    log.close()


def test_flush_ticket_covers_rolled_segments_and_the_directory(tmp_path, monkeypatch):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    log.flush()
    fill(log, 100)
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    ticket = log.flush_prepare()
    assert ticket is not None
    ticket.run()
    log.flush_complete(ticket)
    segments = len(log.segment_base_offsets)
    # every segment's log + index + timeindex (the first segment's first entry has no time
    # entry before a seal... every segment was sealed or has one), plus the directory
    assert len(set(synced)) == len(synced) >= 2 * segments + 1
    monkeypatch.undo()
    log.close()


def test_the_active_segments_indexes_wait_for_its_seal_and_a_crash_rebuilds_them(
        tmp_path, monkeypatch):
    """A flush syncs the active segment's log, not its index files: their entries stay in
    memory (recovery rebuilds the tail's indexes from its batches whatever the files hold).
    The flush after a roll writes and syncs the sealed segment's; a crash before any of
    that loses nothing a reader needs."""
    log = DiskLog.open(tmp_path / "log", SMALL_SEGMENTS)
    log.flush()
    fill(log, 8)  # within one segment of 5000 bytes, an index entry every 300
    assert len(log.segment_base_offsets) == 1
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    log.flush()
    active = log._segments[-1]
    assert active.fd in synced and len(active.index) > 1
    assert file_bytes(active.index.path) == 0 == file_bytes(active.time_index.path)
    fill(log, 40)  # rolls: the first segment is sealed
    synced.clear()
    log.flush()
    monkeypatch.undo()
    sealed = log._segments[0]
    assert sealed.index.fd in synced and sealed.time_index.fd in synced
    assert file_bytes(sealed.index.path) == len(sealed.index) * 8
    tail = log._segments[-1]
    assert len(tail.index) > 1 and file_bytes(tail.index.path) == 0
    # A crash now: the files as they are (the tail's indexes empty) open as the same log,
    # looked up through rebuilt indexes.
    shutil.copytree(tmp_path / "log", tmp_path / "crashed")
    expected = every_batch(log)
    log.close()
    reopened = DiskLog.open(tmp_path / "crashed", SMALL_SEGMENTS)
    assert reopened.next_offset == 96 and every_batch(reopened) == expected
    assert len(reopened._segments[-1].index) == len(tail.index)
    middle = reopened.read_bytes(91, 1 << 20, 1 << 62)
    assert iter_batches(middle)[0].base_offset == 90
    reopened.close()


def test_fdatasync_on_a_thread_while_appends_continue(tmp_path, monkeypatch):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    real_fdatasync = os.fdatasync
    entered, release = threading.Event(), threading.Event()

    def slow_fdatasync(fd: int) -> None:
        entered.set()
        assert release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    fill(log, 3)
    ticket = log.flush_prepare()
    assert ticket is not None
    worker = threading.Thread(target=ticket.run)
    worker.start()
    assert entered.wait(10)
    for _ in range(50):  # appends (with rolls) while fdatasync blocks
        fill(log, 1)
        assert log.flushed_offset <= log.written_offset <= log.next_offset
    assert log.flushed_offset == 0
    release.set()
    worker.join(10)
    log.flush_complete(ticket)
    assert (log.flushed_offset, log.written_offset) == (6, 106)
    log.flush()
    assert log.flushed_offset == 106
    log.close()


def test_truncate_while_ticket_out_caps_flushed(tmp_path):
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 10)
    ticket = log.flush_prepare()
    assert ticket is not None and ticket.offset == 20
    log.truncate(6)
    fill(log, 10)  # new data at 6.. is not covered by the ticket
    ticket.run()
    log.flush_complete(ticket)
    assert (log.flushed_offset, log.written_offset) == (6, 26)
    log.flush()
    assert log.flushed_offset == 26
    log.close()


def test_oversized_first_batch_read_from_disk(tmp_path, storage_mode):
    log = DiskLog.open(tmp_path)
    append(log, batch_of_size(6144), batch_of_size(6144))
    region = log.read(0, 100, BIG)
    if storage_mode == "direct":  # still in the writer's chunks: a copy of them
        assert isinstance(region, memoryview) and len(region) == 6144
    else:
        assert region is not None and (region.position, region.length) == (0, 6144)
    log.close()


def _failing_pwrite(monkeypatch: pytest.MonkeyPatch, after_bytes: int, err: int) -> None:
    """The next segment writes take `after_bytes` in all, then fail with `err` (a disk
    that fills part way through a write)."""
    from storage import segment as segment_module

    real = os.pwrite
    left = [after_bytes]

    def pwrite(fd: int, data: memoryview, position: int) -> int:
        take = min(len(data), left[0])
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            take -= take % 4096  # O_DIRECT writes whole blocks, from aligned memory
        if take <= 0:
            raise OSError(err, os.strerror(err))
        left[0] -= take
        return real(fd, memoryview(data)[:take], position)

    monkeypatch.setattr(segment_module.os, "pwrite", pwrite)


@pytest.mark.parametrize("written_bytes", [0, 700, 2500])
def test_a_write_that_fails_part_way_is_undone(tmp_path, monkeypatch, written_bytes,
                                               storage_mode):
    """Buffered: the append's pwrite fails, the append is undone. Direct: the append goes to
    memory, the flush's write fails, and the flush's failure cuts the log back the same."""
    import errno

    from storage.log import AppendFailed

    log = DiskLog.open(tmp_path, LogConfig(segment_bytes=3000, index_interval_bytes=300))
    fill(log, 10)  # ~2 KiB: the next append rolls part way (3000-byte segments)
    log.flush()
    before, bases, end = every_batch(log), log.segment_base_offsets, log.next_offset
    sizes = {p.name: p.stat().st_size for p in segment_files(tmp_path, ".log")}
    _failing_pwrite(monkeypatch, written_bytes, errno.ENOSPC)
    batches = [make_batch([2000 + i], value_bytes=600) for i in range(4)]
    if storage_mode == "direct":
        append(log, *batches)
        with pytest.raises(OSError) as failed:
            log.flush()
        assert failed.value.errno == errno.ENOSPC
        assert (log.next_offset, log.written_offset, log.flushed_offset) == (end, end, end)
        assert log.segment_base_offsets == bases and every_batch(log) == before
        peek = DiskLog.open(tmp_path)  # what a crash now would recover: no failed batch
        assert every_batch(peek) == before
        peek.close()
    else:
        with pytest.raises(AppendFailed) as failure:
            append(log, *batches)
        assert failure.value.error.errno == errno.ENOSPC
        assert {p.name: p.stat().st_size for p in segment_files(tmp_path, ".log")} == sizes
    assert (log.next_offset, log.written_offset, log.segment_base_offsets) == (end, end, bases)
    assert every_batch(log) == before
    monkeypatch.undo()  # room again: the same append goes in at the same offsets
    assert append(log, *batches).base_offset == end
    log.flush()
    after = every_batch(log)
    log.close()
    assert every_batch(reopened := DiskLog.open(tmp_path)) == after
    reopened.close()


def test_a_failed_flush_cuts_the_log_back_to_what_was_durable(tmp_path, monkeypatch):
    import errno

    from storage import probes

    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 10)
    log.flush()
    durable, kept = log.flushed_offset, every_batch(log)
    fill(log, 40)  # rolls segments: the cut takes whole segments and part of one
    ticket = log.flush_prepare()
    fill(log, 3)  # appended while the flush runs
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", True)
    with pytest.raises(OSError) as failure:
        ticket.run()
    assert failure.value.errno == errno.EIO
    log.flush_failed(ticket)
    assert (log.flushed_offset, log.written_offset, log.next_offset) == (durable,) * 3
    assert every_batch(log) == kept
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", False)
    fill(log, 5)
    log.flush()
    after = every_batch(log)
    log.close()
    reopened = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    assert every_batch(reopened) == after and reopened.next_offset == durable + 10
    reopened.close()


# What recovery keeps is synced before it counts as flushed (issue #26, defect 4) ----------------


def _synced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every fdatasync and fsync from here on by the path of its file."""
    from storage import probes

    synced: list[str] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def path_of(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def fdatasync(fd: int) -> None:
        synced.append(path_of(fd))
        real_fdatasync(fd)

    def fsync(fd: int) -> None:
        synced.append(path_of(fd))
        real_fsync(fd)

    monkeypatch.setattr(probes, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_reopened_log_is_flushed_only_once_its_first_ticket_synced_every_file(
    tmp_path, monkeypatch
):
    # Appended, never flushed, the process gone (a kill -9 leaves the bytes in the page
    # cache, where recovery finds them whole): nothing of it may count as durable until an
    # fdatasync of each segment file (and the directory, and its entry in the parent) ran.
    directory = tmp_path / "t-0"
    log = DiskLog.open(directory, SMALL_SEGMENTS)
    fill(log, 60)
    end, before = log.next_offset, every_batch(log)
    log.close()
    synced = _synced_paths(monkeypatch)
    log = DiskLog.open(directory, SMALL_SEGMENTS)
    assert every_batch(log) == before
    assert (log.log_start_offset, log.flushed_offset, log.written_offset) == (0, 0, end)
    assert log.next_offset == end
    ticket = log.flush_prepare()
    assert ticket is not None and ticket.offset == end
    assert synced == []  # nothing synced on open: the ticket does it, on the caller's pool
    ticket.run()
    log.flush_complete(ticket)
    assert log.flushed_offset == end and log.flush_prepare() is None
    segments = {str(p) for p in segment_files(directory, ".log")}
    assert len(segments) == len(log.segment_base_offsets) > 3
    assert segments <= set(synced), sorted(segments - set(synced))
    assert str(directory) in synced and str(tmp_path) in synced
    assert len(synced) == len(set(synced)), synced  # one sync per file
    log.close()


def test_a_failed_recovery_sync_cuts_nothing_and_the_next_ticket_syncs_it_all(
    tmp_path, monkeypatch
):
    from storage import probes

    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    fill(log, 30)
    end, before = log.next_offset, every_batch(log)
    log.close()
    log = DiskLog.open(tmp_path, SMALL_SEGMENTS)
    ticket = log.flush_prepare()
    assert ticket is not None
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", True)
    with pytest.raises(OSError):
        ticket.run()
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", False)
    log.flush_abandoned(ticket)  # not flush_failed: the flushed offset is only the start
    assert (log.flushed_offset, log.written_offset, log.next_offset) == (0, end, end)
    assert every_batch(log) == before
    synced = _synced_paths(monkeypatch)
    log.flush()
    assert log.flushed_offset == end
    assert {str(p) for p in segment_files(tmp_path, ".log")} <= set(synced)
    log.close()


def test_time_lookups_start_at_the_log_start(tmp_path: Path) -> None:
    """DeleteRecords moves the log start into a segment: a by-time lookup and the max
    timestamp pass over the batches below it, as Kafka looks from the log start (found
    below it, the partition would read an offset out of range)."""
    log = DiskLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20, index_interval_bytes=100))
    for ts in [[1000], [2000], [3000], [9000], [4000], [5000], [6000]]:  # offsets 0..6
        append(log, make_batch(ts, value_bytes=100), now_ms=ts[0])
    assert log.offset_for_timestamp(3500) == (3, 9000) and log.max_timestamp() == (3, 9000)
    log.advance_log_start(4)
    assert log.offset_for_timestamp(3500) == (4, 4000)
    assert log.offset_for_timestamp(500) == (4, 4000)
    assert log.offset_for_timestamp(6001) is None
    assert log.max_timestamp() == (6, 6000)
    log.advance_log_start(7)
    assert log.offset_for_timestamp(0) is None and log.max_timestamp() is None
    log.close()
