"""Committed offsets, for the GroupCoordinator: OffsetCommit, OffsetFetch, OffsetDelete,
DeleteGroups, TxnOffsetCommit and the transaction markers that end those, and the retention
pass that expires offsets (and the Empty groups left with none; actors/group/expiry.py).

It owns the served groups' committed offsets, their transactional offsets pending a marker
(actors/group/txn_offsets.py) and the expiry timer. Records go to `__consumer_offsets`
through the coordinator's `append`, and an answer changes what is served only if the group's
partition is still the same load (`incarnation`) as when the append went out. The groups
themselves are the membership's (membership.py), seen through the narrow `Groups`; which
partitions are served is the coordinator's.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from actors.group import limits
from actors.group.appends import Append, CallLater, commit_error, txn_commit_error
from actors.group.expiry import expired_offsets, group_expires
from actors.group.log_records import (
    OffsetValue,
    encode_group_key,
    encode_offset_key,
    encode_offset_value,
)
from actors.group.messages import (
    CommitEntry,
    CommitOffsets,
    DeleteGroups,
    DeleteOffsets,
    FetchedOffset,
    FetchOffsets,
    TxnCommitOffsets,
    TxnOffsetsMarker,
)
from actors.group.state import Group, GroupState
from actors.group.txn_offsets import PendingTxnOffsets
from actors.services import Services, now_ms
from wire.errors import ErrorCode

__all__ = ["GroupOffsets", "Groups"]

# The module's logger stays the coordinator's: its lines read as they did.
log = logging.getLogger("actors.group.coordinator")

CONSUMER_PROTOCOL_TYPE = "consumer"

Offsets = dict[tuple[str, int], OffsetValue]


class Groups(Protocol):
    """What offsets need of the membership (membership.Membership)."""

    groups: dict[str, Group]

    def group(self, group_id: str) -> Group: ...

    def remove(self, group_id: str) -> None: ...


class GroupOffsets:
    def __init__(self, services: Services, groups: Groups, append: Append,
                 incarnation: Callable[[str], int | None], serves: Callable[[str], bool],
                 call_later: CallLater) -> None:
        """`incarnation(id)`: which load of the id's offsets partition is served (None:
        none); `serves(id)`: is it served?"""
        self.services = services
        self._groups = groups
        self._append = append
        self._incarnation = incarnation
        self._serves = serves
        self._call_later = call_later
        self.offsets: dict[str, Offsets] = {}  # of loaded partitions only
        self.pending_txn = PendingTxnOffsets()  # TxnOffsetCommits awaiting their marker
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiring: set[str] = set()  # groups whose expiry tombstones are being appended

    def stop(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()

    def forget(self, group_id: str) -> None:
        """The group's partition is no longer served."""
        self.offsets.pop(group_id, None)
        self._expiring.discard(group_id)

    def snapshot(self) -> dict[str, Any]:
        """For the metrics (committed offsets, members, state per group): consumer lag is
        the partitions' high watermarks less these."""
        snapshot: dict[str, Any] = {}
        groups = self._groups.groups
        for group_id in groups.keys() | self.offsets.keys():
            group = groups.get(group_id)
            offsets = self.offsets.get(group_id, {})
            snapshot[group_id] = {
                "state": group.state.value if group is not None else "Empty",
                "members": group.member_count if group is not None else 0,
                "offsets": [[topic, p, value.offset] for (topic, p), value in offsets.items()],
            }
        return snapshot

    # Requests ---------------------------------------------------------------------------------

    def commit(self, m: CommitOffsets) -> None:
        group = self._groups.groups.get(m.group_id)
        if group is None and m.generation_id >= 0:
            m.reply([ErrorCode.ILLEGAL_GENERATION] * len(m.entries))
            return
        if group is None:
            group = self._groups.group(m.group_id)
        error = group.check_commit(m.member_id, m.group_instance_id, m.generation_id)
        if error != ErrorCode.NONE:
            m.reply([error] * len(m.entries))
            return
        errors, values = _offset_values(m.entries, now_ms())
        records = [(encode_offset_key(m.group_id, t, p), encode_offset_value(v))
                   for (t, p), v in values]
        if not records:
            m.reply(errors)
            return
        incarnation = self._incarnation(m.group_id)

        def appended(error: ErrorCode) -> None:
            if error == ErrorCode.NONE:
                if self._incarnation(m.group_id) == incarnation:
                    self.offsets.setdefault(m.group_id, {}).update(values)
                m.reply(errors)
            else:
                failed = commit_error(error)
                m.reply([failed if e == ErrorCode.NONE else e for e in errors])

        self._append(m.group_id, records, appended)

    def fetch(self, m: FetchOffsets) -> None:
        offsets = self.offsets.get(m.group_id, {})
        if m.partitions is None:
            fetched = [FetchedOffset(t, p, v) for (t, p), v in sorted(offsets.items())]
        else:
            fetched = [FetchedOffset(t, p, offsets.get((t, p))) for t, p in m.partitions]
        if m.require_stable and self.pending_txn.has_group(m.group_id):
            unstable = ErrorCode.UNSTABLE_OFFSET_COMMIT
            fetched = [FetchedOffset(f.topic, f.partition, None, unstable)
                       if self.pending_txn.has_pending(m.group_id, (f.topic, f.partition))
                       else f for f in fetched]
        if m.with_error:
            m.reply(ErrorCode.NONE, fetched)
        else:
            m.reply(fetched)

    def txn_commit(self, m: TxnCommitOffsets) -> None:
        """TxnOffsetCommit: append the offsets as the producer's transactional batch; once it
        is produced they are pending in its transaction (answered then)."""
        group = self._groups.groups.get(m.group_id)
        if group is None and m.member_id:
            m.reply([ErrorCode.UNKNOWN_MEMBER_ID] * len(m.entries))
            return
        group = group if group is not None else self._groups.group(m.group_id)
        error = group.check_txn_commit(m.member_id, m.group_instance_id, m.generation_id)
        if error == ErrorCode.NONE:
            partitions = [(e.topic, e.partition) for e in m.entries]
            error = self.pending_txn.admits(m.group_id, m.producer_id, partitions)
        if error != ErrorCode.NONE:
            m.reply([error] * len(m.entries))
            return
        errors, values = _offset_values(m.entries, now_ms())
        if not values:
            m.reply(errors)
            return
        records = [(encode_offset_key(m.group_id, t, p), encode_offset_value(v))
                   for (t, p), v in values]
        incarnation = self._incarnation(m.group_id)

        def appended(error: ErrorCode) -> None:
            if error == ErrorCode.NONE:
                if self._incarnation(m.group_id) == incarnation:
                    self.pending_txn.add(m.group_id, m.producer_id, values)
                m.reply(errors)
            else:
                failed = txn_commit_error(error)
                m.reply([failed if e == ErrorCode.NONE else e for e in errors])

        self._append(m.group_id, records, appended, (m.producer_id, m.producer_epoch))

    def delete_offsets(self, m: DeleteOffsets) -> None:
        group = self._groups.groups.get(m.group_id)
        if group is None or group.state == GroupState.DEAD:
            m.reply(ErrorCode.GROUP_ID_NOT_FOUND, [])
            return
        subscribed: set[str] = set()
        if group.protocol_type == CONSUMER_PROTOCOL_TYPE and not group.is_empty():
            for metadata in group.subscriptions():
                subscribed |= _subscribed_topics(metadata)
        elif not group.is_empty():
            m.reply(ErrorCode.NON_EMPTY_GROUP, [])
            return
        offsets = self.offsets.get(m.group_id, {})
        errors = [
            ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if t in subscribed else ErrorCode.NONE
            for t, _ in m.partitions
        ]
        doomed = [
            tp
            for tp, e in zip(m.partitions, errors, strict=True)
            if e == ErrorCode.NONE and tp in offsets
        ]
        if not doomed:
            m.reply(ErrorCode.NONE, errors)
            return

        def appended(error: ErrorCode) -> None:
            if error != ErrorCode.NONE:
                m.reply(commit_error(error), [])
                return
            for tp in doomed:
                offsets.pop(tp, None)
            m.reply(ErrorCode.NONE, errors)

        tombstones = [(encode_offset_key(m.group_id, t, p), None) for t, p in doomed]
        self._append(m.group_id, tombstones, appended)

    def delete_groups(self, m: DeleteGroups) -> None:
        results: list[ErrorCode | None] = [None] * len(m.group_ids)
        left = [len(m.group_ids)]

        def settle(index: int, error: ErrorCode) -> None:
            results[index] = error
            left[0] -= 1
            if left[0] == 0:
                m.reply([r if r is not None else ErrorCode.UNKNOWN_SERVER_ERROR for r in results])

        if not m.group_ids:
            m.reply([])
        for index, group_id in enumerate(m.group_ids):
            if not self._serves(group_id):
                settle(index, ErrorCode.NOT_COORDINATOR)
                continue
            group = self._groups.groups.get(group_id)
            if group is None:
                settle(index, ErrorCode.GROUP_ID_NOT_FOUND)
                continue
            error = group.delete()
            if error != ErrorCode.NONE:
                settle(index, error)
                continue
            self._groups.remove(group_id)
            offsets = self.offsets.pop(group_id, {})
            self.pending_txn.drop_group(group_id)  # as the load does at the tombstone
            tombstones: list[tuple[bytes, bytes | None]] = [(encode_group_key(group_id), None)]
            tombstones += [(encode_offset_key(group_id, t, p), None) for t, p in offsets]
            self._append(group_id, tombstones, _settler(settle, index))

    # Transactional offsets ------------------------------------------------------------------

    def marker(self, m: TxnOffsetsMarker, in_partition: Callable[[str], bool]) -> None:
        """A producer's marker is committed on a served offsets partition: its pending
        offsets of that partition's groups (`in_partition`) are committed now, or dropped."""
        ended = self.pending_txn.end(m.producer_id, in_partition, m.commit)
        for group_id, offsets in ended.items():
            self._groups.group(group_id)
            self.offsets.setdefault(group_id, {}).update(offsets)

    # Retention --------------------------------------------------------------------------------

    def start_expiry(self) -> None:
        """A partition has loaded: the retention pass runs from now on."""
        if self._expiry_timer is None:
            self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        interval_s = self.services.settings.group_offset_retention_check_ms / 1000
        self._expiry_timer = self._call_later(interval_s, self._expire)

    def _expire(self) -> None:
        """Tombstone expired offsets, and groups left Empty with none (actors/group/expiry.py);
        memory follows once the tombstones are produced."""
        now = now_ms()
        retention_ms = self.services.settings.group_offset_retention_sec * 1000
        for group_id, group in list(self._groups.groups.items()):
            if group_id in self._expiring or self.pending_txn.has_group(group_id):
                continue  # a transaction's offsets pending: not idle
            offsets = self.offsets.get(group_id, {})
            doomed = expired_offsets(group, offsets, now, retention_ms)
            goes = group_expires(group, len(offsets) - len(doomed))
            if not doomed and not goes:
                continue
            tombstones: list[tuple[bytes, bytes | None]] = [
                (encode_offset_key(group_id, t, p), None) for t, p in doomed]
            if goes:
                tombstones.append((encode_group_key(group_id), None))
            self._expiring.add(group_id)
            self._append(group_id, tombstones, self._expired(group_id, doomed, goes))
        self._schedule_expiry()

    def _expired(self, group_id: str, doomed: list[tuple[str, int]],
                 goes: bool) -> Callable[[ErrorCode], None]:
        incarnation = self._incarnation(group_id)

        def done(error: ErrorCode) -> None:
            if self._incarnation(group_id) != incarnation:
                return  # its partition was unloaded meanwhile (`_expiring` with it)
            self._expiring.discard(group_id)
            if error != ErrorCode.NONE:
                return  # the next pass tries again
            offsets = self.offsets.get(group_id, {})
            for tp in doomed:
                offsets.pop(tp, None)
            group = self._groups.groups.get(group_id)
            # A member may have joined, or an offset been committed, while the tombstones
            # were out: then the group stays (its metadata is written again as it changes).
            if goes and group is not None and group_expires(group, len(offsets)):
                group.delete()
                self._groups.remove(group_id)
                self.offsets.pop(group_id, None)
            if doomed or goes:
                log.info("group %r: %d offset(s) expired%s", group_id, len(doomed),
                         "; group removed" if goes else "")

        return done


def _offset_values(entries: Sequence[CommitEntry], now: int
                   ) -> tuple[list[ErrorCode], list[tuple[tuple[str, int], OffsetValue]]]:
    """A commit's error per entry (metadata too long) and the values of the others."""
    errors = []
    values: list[tuple[tuple[str, int], OffsetValue]] = []
    for entry in entries:
        metadata = entry.metadata or ""
        if len(metadata) > limits.offset_metadata_chars_max:
            errors.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
            continue
        errors.append(ErrorCode.NONE)
        values.append(((entry.topic, entry.partition),
                       OffsetValue(entry.offset, entry.leader_epoch, metadata, now)))
    return errors, values


def _settler(settle: Callable[[int, ErrorCode], None], index: int) -> Callable[[ErrorCode], None]:
    return lambda error: settle(index, commit_error(error))


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _subscribed_topics(metadata: bytes) -> set[str]:
    """Topics in a ConsumerProtocolSubscription (v0-3 all start: version int16, topics
    [string]); an unreadable one subscribes to nothing."""
    topics: set[str] = set()
    try:
        position = 2
        (count,) = _I32.unpack_from(metadata, position)
        position += 4
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, position)
            position += 2
            topics.add(bytes(metadata[position : position + length]).decode())
            position += length
    except (struct.error, UnicodeDecodeError):
        pass
    return topics
