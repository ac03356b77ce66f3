"""Which topic a partition directory belongs to, and moving directories out of the way.

A directory is named `<topic>-<index>` (Kafka's layout), so two incarnations of one topic
name (deleted and created again) would meet in one directory. A node that was down while
that happened, or that applies the delete late, must never take the old incarnation's log,
term and vote for the new one's: its higher terms would depose the new leader and its log
could win an election and make the followers truncate acknowledged records. So every
directory carries the id of the topic it was made for, in `partition.metadata`, as Kafka does
since KIP-516:

    version: 0
    topic_id: <the topic's UUID, URL-safe base64 without padding>

`claim(directory, topic_id)` is asked before a partition opens its log:

    no directory                         made, the file written durably       -> NEW
    the file names this topic id         kept                                 -> OURS
    the file names another id, or is     renamed to `<name>.<uuid>-delete`     -> REPLACED
    unreadable                           (start-up removes it), made anew
    no file, no segment                  the file written                     -> NEW
    no file, segments                    adopted, the file written (made by a -> ADOPTED
                                         version before topic ids)

The file is written before any segment, so a directory with segments and no file was made
before topic ids existed, never by an interrupted start. It is written (temp file, rename)
without an fsync on the shard's loop: the log's first flush ticket syncs it, with the
directory and its entry in the data directory (storage/log.py), off the loop and before
anything in the log counts as flushed, so no acknowledged record is ever in a directory whose
file a power loss could take.
"""

from __future__ import annotations

import base64
import enum
import logging
import os
import uuid
from pathlib import Path
from typing import NamedTuple

__all__ = ["FILE_NAME", "TRASH_SUFFIX", "Claim", "Claimed", "claim", "encode_topic_id",
           "move_to_trash", "read_topic_id"]

log = logging.getLogger("krill.storage")

FILE_NAME = "partition.metadata"
TRASH_SUFFIX = "-delete"
_VERSION = 0


class Claim(enum.Enum):
    NEW = "new"
    OURS = "ours"
    REPLACED = "replaced"
    ADOPTED = "adopted"


class Claimed(NamedTuple):
    claim: Claim
    trash: Path | None = None  # REPLACED: where the other incarnation's directory went


def encode_topic_id(topic_id: bytes) -> str:
    """Kafka's `Uuid.toString()`: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode()


def _decode_topic_id(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"a topic id of {len(raw)} bytes")
    return raw


def read_topic_id(directory: Path) -> bytes | None:
    """The topic id `directory`'s file names; None without a file. ValueError if the file
    cannot be read as one."""
    try:
        text = (directory / FILE_NAME).read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if fields.get("version") != str(_VERSION) or "topic_id" not in fields:
        raise ValueError(f"not a version {_VERSION} partition.metadata: {text[:80]!r}")
    return _decode_topic_id(fields["topic_id"])


def _write(directory: Path, topic_id: bytes) -> None:
    """Written whole under a temp name, then renamed (recovery removes a leftover temp file);
    synced by the log's first flush (module docstring)."""
    data = f"version: {_VERSION}\ntopic_id: {encode_topic_id(topic_id)}\n".encode()
    temp = directory / (FILE_NAME + ".tmp")
    temp.write_bytes(data)
    os.replace(temp, directory / FILE_NAME)


def _make(directory: Path, topic_id: bytes) -> None:
    directory.mkdir(parents=True)
    _write(directory, topic_id)


def claim(directory: Path, topic_id: bytes) -> Claimed:
    """Make `directory` the one of the topic `topic_id` (module docstring). A REPLACED
    directory's trash is the caller's to remove."""
    if not directory.is_dir():
        _make(directory, topic_id)
        return Claimed(Claim.NEW)
    try:
        found = read_topic_id(directory)
    except (ValueError, UnicodeDecodeError) as e:
        log.warning("%s: %s is unreadable (%s); moving the directory to trash",
                    directory, FILE_NAME, e)
        found = b""
    if found == topic_id:
        return Claimed(Claim.OURS)
    if found is not None:
        trash = move_to_trash(directory)
        if found:
            log.warning("%s belongs to topic id %s, not %s (the topic was deleted and created "
                        "again): moved to %s", directory, encode_topic_id(found),
                        encode_topic_id(topic_id), trash.name)
        _make(directory, topic_id)
        return Claimed(Claim.REPLACED, trash)
    if any(path.suffix == ".log" for path in directory.iterdir()):
        log.info("%s: no %s (made before topic ids); adopting it for topic id %s",
                 directory, FILE_NAME, encode_topic_id(topic_id))
        _write(directory, topic_id)
        return Claimed(Claim.ADOPTED)
    _write(directory, topic_id)
    return Claimed(Claim.NEW)


def move_to_trash(directory: Path) -> Path:
    """Rename a partition directory out of the way (as Kafka does), so a topic of the same
    name can be created at once; the caller removes it off the loop, and start-up removes any
    a crash left (shards/supervisor.py)."""
    trash = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{TRASH_SUFFIX}")
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        pass
    return trash
