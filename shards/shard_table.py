"""The shard table: which shard of a node owns a partition.

Every partition has exactly one owning shard, chosen by a stable function of (topic,
partition) and the node's shard count, so every shard computes the same answer with no
coordination and no table to ship. CRC-32C of the topic name (not Python's `hash`, which is
salted per process) spreads topics; adding the partition index spreads a topic's partitions
round-robin over the shards:

    shard_of("orders", 0, 2) == (crc32c(b"orders") + 0) % 2
    shard_of("orders", 1, 2) == the other shard
"""

from __future__ import annotations

import crc32c

__all__ = ["shard_of"]


def shard_of(topic: str, partition: int, shards: int) -> int:
    assert shards > 0 and partition >= 0
    return (crc32c.crc32c(topic.encode()) + partition) % shards
