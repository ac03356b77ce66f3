"""storage/partition_dir.py: a partition directory knows the topic id it was made for, and one
of another incarnation of the topic name is never taken as ours."""

from __future__ import annotations

import uuid
from pathlib import Path

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
