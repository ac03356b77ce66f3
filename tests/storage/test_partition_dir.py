"""storage/partition_dir.py: a partition directory knows the topic id it was made for, and one
of another incarnation of the topic name is never taken as ours."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from storage import DiskLog
from storage.partition_dir import (
    FILE_NAME,
    TRASH_SUFFIX,
    Claim,
    claim,
    encode_topic_id,
    read_topic_id,
)
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = pytest.mark.timeout(30)

OLD, NEW = uuid.uuid4().bytes, uuid.uuid4().bytes


def test_a_new_directory_is_made_with_the_topic_id_in_kafkas_format(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    assert claim(directory, NEW).claim is Claim.NEW
    assert read_topic_id(directory) == NEW
    text = (directory / FILE_NAME).read_text()
    assert text == f"version: 0\ntopic_id: {encode_topic_id(NEW)}\n"
    assert len(encode_topic_id(NEW)) == 22  # Kafka's Uuid.toString(): base64, no padding
    assert claim(directory, NEW).claim is Claim.OURS


def test_another_incarnations_directory_goes_to_trash_and_a_new_one_is_made(
        tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    claim(directory, OLD)
    (directory / "00000000000000000000.log").write_bytes(b"the old topic's records")
    claimed = claim(directory, NEW)
    assert claimed.claim is Claim.REPLACED
    assert claimed.trash is not None and claimed.trash.name.endswith(TRASH_SUFFIX)
    assert (claimed.trash / "00000000000000000000.log").read_bytes() == b"the old topic's records"
    assert read_topic_id(claimed.trash) == OLD
    assert sorted(p.name for p in directory.iterdir()) == [FILE_NAME]
    assert read_topic_id(directory) == NEW


def test_an_unreadable_file_is_not_taken_as_ours(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    directory.mkdir()
    (directory / FILE_NAME).write_text("version: 7\nsomething: else\n")
    (directory / "00000000000000000000.log").write_bytes(b"x")
    claimed = claim(directory, NEW)
    assert claimed.claim is Claim.REPLACED
    assert read_topic_id(directory) == NEW
    assert not (directory / "00000000000000000000.log").exists()


def test_a_directory_from_before_topic_ids_is_adopted_and_an_empty_one_claimed(
        tmp_path: Path) -> None:
    legacy = tmp_path / "t-0"
    legacy.mkdir()
    (legacy / "00000000000000000000.log").write_bytes(b"records")
    assert claim(legacy, NEW).claim is Claim.ADOPTED
    assert read_topic_id(legacy) == NEW
    assert (legacy / "00000000000000000000.log").read_bytes() == b"records"
    empty = tmp_path / "t-1"
    empty.mkdir()
    assert claim(empty, NEW).claim is Claim.NEW
    assert claim(empty, NEW).claim is Claim.OURS


def test_the_log_ignores_the_file(tmp_path: Path) -> None:
    """Recovery removes what it does not know in a partition directory; not this file."""
    directory = tmp_path / "t-0"
    claim(directory, NEW)
    DiskLog.open(directory).close()
    DiskLog.open(directory).close()
    assert read_topic_id(directory) == NEW


def test_the_file_is_synced_by_the_logs_first_flush_before_anything_counts_as_flushed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """claim() writes without an fsync (it runs on the shard's loop); the log's first flush
    ticket syncs the file, off the loop, before its first offset counts as flushed, and a
    failed ticket leaves it to the next."""
    directory = tmp_path / "t-0"
    claim(directory, NEW)
    log = DiskLog.open(directory)
    log.append(*_one_batch())
    synced: list[str] = []

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    def fail(_fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fdatasync", fail)
    ticket = log.flush_prepare()
    assert ticket is not None
    with pytest.raises(OSError):
        ticket.run()
    log.flush_abandoned(ticket)
    monkeypatch.setattr(os, "fdatasync", record)
    ticket = log.flush_prepare()
    assert ticket is not None and log.flushed_offset == 0
    ticket.run()
    log.flush_complete(ticket)
    assert str(directory / FILE_NAME) in synced
    assert log.flushed_offset == 1
    os.rename(directory, tmp_path / "t-0.x-delete")  # deleted: the log goes on, on its fds
    synced.clear()
    log.append(*_one_batch())
    ticket = log.flush_prepare()
    assert ticket is not None
    ticket.run()
    assert not any(path.endswith(FILE_NAME) for path in synced)  # once is enough
    log.flush_complete(ticket)
    log.close()


def _one_batch() -> tuple[bytearray, list[Any], int, int]:
    batch = bytearray(build_batch([(None, b"v", [])]))
    return batch, iter_batches(batch), 0, 0
