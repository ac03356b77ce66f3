"""A replicated partition's memberships on disk: the control batches that carry them in its
log, and the file that lets a restarted replica know them without reading its log
(DESIGN.md §7).

A membership change (actors/raft/quorum.py) is an entry of the partition log like any other:
a control batch of one record, key (version 0, `MEMBERSHIP_TYPE`, a control type of Krill's
own), value the membership as msgpack `[voters, outgoing voters, learners]`, each a sorted
list of `[node, shard]` pairs. Kafka's clients skip every control batch, and one of a type
they do not know as well (the Java client reads it as UNKNOWN; librdkafka, kafka-python and
aiokafka look only for transaction markers).

Raft puts a change in force as soon as it is in a log (etcd's rule), so a restarted replica
must know every change its log holds, and the membership in force just below its log start
(the anchor: the changes before it may be long gone with retention). A log of gigabytes is not
scanned at start for the few it has; the replica keeps them in `raft-memberships.json` in the
partition's directory, the anchor first:

    {"confs": [[offset, membership], ...]}

The file changes only in the replica's order of log writes (actors/replica.py), each write
of it durable (written beside, synced, renamed, the directory synced) before the log writes
behind it go on:

    a batch that carries a change     the file with the change first, then the append: the
                                      log never holds a change the file lacks, whatever a
                                      crash keeps of either
    a cut that removed a change       the file without it, after the cut, before the next
                                      append: no later batch at its offset meets a stale entry
    a reset (Raft's install)          the file with the install's membership as the anchor,
                                      after the reset, before the next append

`recovered` reads it back at start and checks it against the log: an entry at or past the
log's end goes (its batch was never written, or was cut), an entry inside the log must name a
membership batch holding the same membership there (else it goes: a stale entry), and of the
entries below the log start the last one is the anchor. A crash between a reset and its file
leaves an empty log at the new start with the old anchor, and its epoch before the start
unknown (storage/replica.py): the replica's log is then behind every voter's, it can win no
election on it, and its leader's next install writes the file again.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from actors.raft import Membership
from storage.log import Log
from wire.errors import DecodeError
from wire.record_batch import BatchHeader, iter_batches
from wire.records import build_batch, decode_batch

__all__ = ["MEMBERSHIP_FILE", "MEMBERSHIP_TYPE", "Confs", "confs_to_file", "membership_batch",
           "membership_from_wire", "membership_to_wire", "memberships_in", "recovered"]

log = logging.getLogger(__name__)

# Kafka's control types are 0 (ABORT) to 6 (KRAFT_VOTERS); Krill's own start far above them.
MEMBERSHIP_TYPE = 0x4B01
MEMBERSHIP_FILE = "raft-memberships.json"
_CONTROL_KEY = struct.Struct(">hh")
# What `recovered` reads at an entry's offset: a membership batch is one small record.
_BATCH_READ_BYTES = 1 << 16

Confs = list[tuple[int, Membership]]  # (offset, membership), ascending; the anchor first


def membership_to_wire(m: Membership) -> list[list[Any]]:
    """[voters, outgoing voters, learners], each a sorted list of node ids as lists (a
    partition's are (node, shard) pairs)."""
    return [[list(a) if isinstance(a, tuple) else a
             for a in sorted(nodes)]  # type: ignore[type-var]
            for nodes in (m.voters, m.outgoing, m.learners)]


def membership_from_wire(value: Sequence[Any]) -> Membership:
    voters, outgoing, learners = (
        frozenset(tuple(a) if isinstance(a, list) else a for a in nodes) for nodes in value)
    return Membership(voters, outgoing, learners)


def membership_batch(m: Membership, timestamp_ms: int) -> bytearray:
    """The control batch that carries `m` (offset and epoch set as the log appends it)."""
    key = _CONTROL_KEY.pack(0, MEMBERSHIP_TYPE)
    value = msgpack.packb(membership_to_wire(m))
    return build_batch([(key, value, [])], control=True, base_timestamp=timestamp_ms)


def memberships_in(data: bytes | bytearray | memoryview,
                   headers: Iterable[BatchHeader]) -> Confs:
    """The membership changes among `headers`, batches of `data` at their positions."""
    out: Confs = []
    for header in headers:
        if not header.is_control or header.is_transactional:
            continue  # (a transaction marker is transactional: never a membership)
        m = _membership(memoryview(data)[header.position:header.position + header.size])
        if m is not None:
            out.append((header.base_offset, m))
    return out


def _membership(batch: bytes | bytearray | memoryview) -> Membership | None:
    try:
        _header, records = decode_batch(batch, check_crc=False)
    except DecodeError:
        return None
    if len(records) != 1 or records[0].key is None or len(records[0].key) < 4:
        return None
    _version, kind = _CONTROL_KEY.unpack_from(records[0].key)
    if kind != MEMBERSHIP_TYPE or records[0].value is None:
        return None
    try:
        return membership_from_wire(msgpack.unpackb(records[0].value))
    except (ValueError, TypeError, AssertionError, msgpack.UnpackException):
        log.error("a membership batch that does not decode: %r", records[0].value)
        return None


def confs_to_file(confs: Confs) -> dict[str, Any]:
    return {"confs": [[offset, membership_to_wire(m)] for offset, m in confs]}


def recovered(log_: Log) -> tuple[tuple[tuple[int, Membership], ...], bool]:
    """The memberships of a reopened log, the anchor first (the module docstring), () when
    the file has none (no change since the group's first membership, its Config's); and
    whether the file holds exactly those (else it is written again before the next append:
    an entry it drops must not meet a later batch at its offset)."""
    saved = log_.read_state(MEMBERSHIP_FILE, None)
    if not saved:
        return (), True
    start, end = log_.log_start_offset, log_.next_offset
    below: Confs = []
    inside: Confs = []
    for offset, wire in saved.get("confs", []):
        m = membership_from_wire(wire)
        if offset >= end:
            continue
        if offset < start:
            below.append((offset, m))
        elif _held_at(log_, offset) == m:
            inside.append((offset, m))
        else:
            log.warning("%s: the membership at %d is not in the log: dropped", log_, offset)
    kept = tuple(below[-1:] + inside)
    return kept, len(kept) == len(saved.get("confs", []))


def _held_at(log_: Log, offset: int) -> Membership | None:
    """The membership the batch at `offset` carries, if it is one (a read at start, as the
    log's own recovery reads)."""
    data = log_.read_bytes(offset, _BATCH_READ_BYTES, offset + 1)
    if not data:
        return None
    found = memberships_in(data, _headers(data))
    return found[0][1] if found and found[0][0] == offset else None


def _headers(data: bytes) -> list[BatchHeader]:
    try:
        return iter_batches(data, check_crc=False)
    except DecodeError:
        return []
