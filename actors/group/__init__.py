"""Consumer groups: the pure group state machine (`state`), the records kept in
`__consumer_offsets` (`log_records`) and the per-shard `GroupCoordinator` actor (`coordinator`).

A group's coordinator is whoever owns partition `offsets_partition(group_id, N)` of
`__consumer_offsets`, Kafka's rule, so every node and client agrees on it.
"""

from __future__ import annotations

__all__ = ["OFFSETS_TOPIC", "offsets_partition", "java_string_hash"]

OFFSETS_TOPIC = "__consumer_offsets"


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: over UTF-16 code units, wrapping at 32 bits (signed)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def offsets_partition(group_id: str, partitions: int) -> int:
    """Kafka's GroupMetadataManager.partitionFor: Utils.abs(hashCode) % partitions."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
