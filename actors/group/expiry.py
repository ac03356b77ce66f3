"""Which committed offsets have expired, and which groups go with them (Kafka's KIP-211).

Offsets live as long as their group is in use. Once a group is Empty (no members), Kafka's
rule (GroupMetadata.removeExpiredOffsets) applies after `offsets.retention.minutes`
(Redpanda's `group_offset_retention_sec`, 7 days by default):

- a group that used group management (it has a protocol type) loses all its offsets once it
  has been Empty that long (counted from when it became Empty);
- a group that only ever committed (standalone consumers: no protocol type) loses each
  offset that long after its commit.

A group left Empty with no offsets goes away (Dead, and its metadata key tombstoned). A group
with members keeps everything. Pure: the coordinator passes the clock in and writes the
tombstones.
"""

from __future__ import annotations

from actors.group.log_records import OffsetValue
from actors.group.state import Group, GroupState

__all__ = ["expired_offsets", "group_expires"]

Offsets = dict[tuple[str, int], OffsetValue]


def expired_offsets(group: Group, offsets: Offsets, now_ms: int, retention_ms: int) -> list[
        tuple[str, int]]:
    """The (topic, partition) offsets of `group` that have expired, in order."""
    if group.state != GroupState.EMPTY:
        return []
    if group.protocol_type:
        if group.state_timestamp_ms < 0 or now_ms - group.state_timestamp_ms < retention_ms:
            return []
        return sorted(offsets)
    return sorted(tp for tp, value in offsets.items()
                  if now_ms - value.commit_timestamp_ms >= retention_ms)


def group_expires(group: Group, offsets_left: int) -> bool:
    """Whether the group goes once its expired offsets have: Empty, and nothing committed."""
    return group.state == GroupState.EMPTY and offsets_left == 0
