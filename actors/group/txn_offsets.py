"""Transactional offset commits waiting for their transaction's end: a pure table, kept by the
group coordinator for its served groups and by each load for the partition it replays.

A TxnOffsetCommit appends its offsets to the group's `__consumer_offsets` partition as one
transactional batch of the producer (Kafka's GroupMetadataManager.storeOffsets with a
producer id); they are pending, invisible to OffsetFetch, until the producer's transaction
marker lands on that partition: COMMIT makes them the group's committed offsets (replacing
the committed ones of the same partitions), ABORT drops them (Kafka's
scheduleHandleTxnCompletion).

    add(group, pid, offsets)         pending[group][pid] |= offsets (a later one replaces)
    end(pid, in_partition, commit)   the pid's pending of the groups `in_partition` picks
                                     leave; returned to be committed when `commit`
    drop_group(group)                the group was deleted: its pending go too
    forget(in_partition)             the partition is no longer served

One marker ends one producer's transaction on one offsets partition, so `end` takes only the
groups of that partition (a producer's transaction may hold offsets of several groups, on
several partitions). Bounds (actors/group/limits.py): `admits` refuses a commit that would put
more than `txn_offsets_per_producer_max` partitions pending for one producer, or a
`txn_offset_producers_max`-th producer; a load replays what was admitted when written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from actors.group import limits
from actors.group.log_records import OffsetValue
from wire.errors import ErrorCode

__all__ = ["PendingTxnOffsets"]

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, OffsetValue]


class PendingTxnOffsets:
    def __init__(self, per_producer_max: int = limits.txn_offsets_per_producer_max,
                 producers_max: int = limits.txn_offset_producers_max) -> None:
        self.per_producer_max = per_producer_max
        self.producers_max = producers_max
        self._by_group: dict[str, dict[int, Offsets]] = {}  # group -> producer -> offsets
        self._groups_of: dict[int, set[str]] = {}  # producer -> groups it has pending in
        self._count: dict[int, int] = {}  # producer -> partitions pending, all groups

    def __len__(self) -> int:
        """Producers with pending offsets."""
        return len(self._groups_of)

    def pending_count(self, producer_id: int) -> int:
        return self._count.get(producer_id, 0)

    def admits(self, group_id: str, producer_id: int,
               partitions: Iterable[TopicPartition]) -> ErrorCode:
        """NONE if `add` of these partitions stays within the bounds; else the error the
        TxnOffsetCommit gets."""
        if producer_id not in self._groups_of and len(self._groups_of) >= self.producers_max:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        known = self._by_group.get(group_id, {}).get(producer_id, {})
        new = {tp for tp in partitions if tp not in known}
        if self._count.get(producer_id, 0) + len(new) > self.per_producer_max:
            return ErrorCode.INVALID_REQUEST
        return ErrorCode.NONE

    def add(self, group_id: str, producer_id: int,
            offsets: Iterable[tuple[TopicPartition, OffsetValue]]) -> None:
        pending = self._by_group.setdefault(group_id, {}).setdefault(producer_id, {})
        before = len(pending)
        pending.update(offsets)
        self._groups_of.setdefault(producer_id, set()).add(group_id)
        self._count[producer_id] = self._count.get(producer_id, 0) + len(pending) - before

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        """Some producer's transaction holds an offset of this partition for the group."""
        return any(tp in offsets for offsets in self._by_group.get(group_id, {}).values())

    def has_group(self, group_id: str) -> bool:
        return group_id in self._by_group

    def end(self, producer_id: int, in_partition: Callable[[str], bool],
            commit: bool) -> dict[str, Offsets]:
        """The producer's transaction ended on a partition (its marker is in): its pending
        offsets of the groups `in_partition` picks leave. Returns them per group when
        `commit` (to become committed), else {}."""
        groups = self._groups_of.get(producer_id)
        if not groups:
            return {}
        committed: dict[str, Offsets] = {}
        for group_id in [g for g in groups if in_partition(g)]:
            offsets = self._take(group_id, producer_id)
            if commit and offsets:
                committed[group_id] = offsets
        return committed

    def drop_group(self, group_id: str) -> None:
        for producer_id in list(self._by_group.get(group_id, {})):
            self._take(group_id, producer_id)

    def forget(self, in_partition: Callable[[str], bool]) -> None:
        for group_id in [g for g in self._by_group if in_partition(g)]:
            self.drop_group(group_id)

    def absorb(self, other: PendingTxnOffsets) -> None:
        """Take over a load's pending offsets (its groups are new to this table)."""
        for group_id, producers in other._by_group.items():
            for producer_id, offsets in producers.items():
                self.add(group_id, producer_id, offsets.items())

    def _take(self, group_id: str, producer_id: int) -> Offsets:
        producers = self._by_group.get(group_id, {})
        offsets = producers.pop(producer_id, {})
        if not producers:
            self._by_group.pop(group_id, None)
        groups = self._groups_of.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            left = self._count.get(producer_id, 0) - len(offsets)
            if groups:
                self._count[producer_id] = left
            else:
                del self._groups_of[producer_id]
                self._count.pop(producer_id, None)
        return offsets
