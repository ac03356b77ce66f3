"""Rolling ahead (storage/log.py): the next segment's files are made by a job the caller runs
off its loop, then installed; the append that follows goes to it without rolling again. A
segment made for a log that moved meanwhile is dropped with its files."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import DiskLog, LogConfig
from tests.storage.batches import make_batch, make_records

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=300)
EPOCH = 3


def append(log: DiskLog, batch: bytes, epoch: int = EPOCH, now_ms: int = 0) -> None:
    records, headers = make_records(batch)
    log.append(records, headers, epoch, now_ms)


def ahead(log: DiskLog, batch: bytes, epoch: int = EPOCH, now_ms: int = 0):  # type: ignore[no-untyped-def]
    base = log.next_offset
    return log.roll_ahead(base, base + 1, len(batch), epoch, now_ms)


def fill_until_a_roll_is_due(log: DiskLog, batch: bytes) -> int:
    """Append `batch` until the next one would roll; the offset the roll would start at."""
    while ahead(log, batch) is None:
        append(log, batch)
    return log.next_offset


def files(directory: Path, base: int) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f"{base:020d}."))


def test_an_append_that_would_pass_segment_bytes_rolls_ahead_and_goes_to_the_segment(
        tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, SMALL)
    batch = make_batch([1, 1], value_bytes=300)  # two records, ~400 bytes
    assert ahead(log, batch) is None  # an empty segment never rolls
    base = fill_until_a_roll_is_due(log, batch)
    job = ahead(log, batch)
    segment = job()  # what the I/O pool runs: the three files made, indexes included
    assert files(tmp_path, base) == [f"{base:020d}.index", f"{base:020d}.log",
                                     f"{base:020d}.timeindex"]
    assert segment.index.fd is not None and segment.time_index.fd is not None
    assert log.install_segment(segment)
    assert log.segment_base_offsets == [0, base]
    append(log, batch)
    assert log.segment_base_offsets == [0, base] and log.next_offset == base + 2
    log.close()
    reopened = DiskLog.open(tmp_path, SMALL)
    assert reopened.segment_base_offsets == [0, base] and reopened.next_offset == base + 2
    reopened.close()


def test_a_new_epoch_rolls_ahead(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, SMALL)
    batch = make_batch([1, 1], value_bytes=10)
    append(log, batch)
    assert ahead(log, batch) is None
    assert ahead(log, batch, epoch=EPOCH + 1) is not None
    log.close()


def test_a_segment_made_for_a_log_that_moved_is_dropped_with_its_files(tmp_path: Path) -> None:
    log = DiskLog.open(tmp_path, SMALL)
    batch = make_batch([1, 1], value_bytes=300)
    base = fill_until_a_roll_is_due(log, batch)
    segment = ahead(log, batch)()
    log.truncate(2)  # meanwhile: the log no longer ends where the segment begins
    assert not log.install_segment(segment)
    assert files(tmp_path, base) == [] and log.segment_base_offsets == [0]
    append(log, batch)
    assert log.next_offset == 4
    log.close()


def test_a_segment_made_for_an_offset_the_log_has_again_keeps_the_live_files(
        tmp_path: Path) -> None:
    """The log rolled at that offset by itself meanwhile (an inline roll): the files are
    the live segment's; only the made segment's fds go."""
    log = DiskLog.open(tmp_path, SMALL)
    batch = make_batch([1, 1], value_bytes=300)
    base = fill_until_a_roll_is_due(log, batch)
    segment = ahead(log, batch)()
    append(log, batch)  # rolls inline at `base`, the same file names
    assert log.segment_base_offsets == [0, base]
    assert not log.install_segment(segment)
    assert len(files(tmp_path, base)) == 3
    append(log, batch)
    log.close()
    reopened = DiskLog.open(tmp_path, SMALL)
    assert reopened.next_offset == base + 4
    reopened.close()
