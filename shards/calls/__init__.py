"""The call layer: one small module per call another shard (or, with node RPC, another node)
answers, each holding its typed header, its send side and its serve side.

    produce         a Produce, in two phases (dispatched, produced)
    read            a fetch's Read: where the bytes are, not the bytes
    watch           a long poll's subscription to a partition's high watermark
    list_offset     ListOffsets
    epoch_end       OffsetForLeaderEpoch
    delete_records  DeleteRecords
    info            a partition's offsets, for describe tools and tests
    controller      create/delete topics, create partitions, alter configs, producer ids
    topics          the topic table, from shard 0 to every other shard
    segments        forget removed segment files (and the fd cache they are kept in)
    group           a GroupCoordinator's messages, in the pipe codec's generic form
    raft            a Raft group's messages to a replica on another shard or node
    leaders         who leads which partition, to every shard of the cluster
    cluster_info    the registered nodes and the controller's leader, from shard 0
    txn_marker      a transaction coordinator's WriteTxnMarker to a partition's leader

The Caller (shards/router.py) only carries them: request ids, pending replies, batching per
loop turn. The stand-ins (shards/remote.py) find a partition message's send side here, so a
call to a partition reads the same whether its replica is on this core or another.

A new call is a new module (its `KIND`, a NamedTuple header, `send`, `serve`; see
calls/base.py for the wire form) and a line in `SERVE` below; a kind is never reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.partition_messages import (
    DeleteRecords,
    EpochEndOffset,
    ListOffset,
    PartitionInfo,
    Produce,
    Read,
    WriteTxnMarker,
)
from shards.calls import (
    cluster_info,
    controller,
    delete_records,
    epoch_end,
    group,
    info,
    leaders,
    list_offset,
    produce,
    raft,
    read,
    segments,
    topics,
    txn_marker,
    watch,
)
from shards.calls.base import BATCH, REPLY, Address, Caller, Serve

__all__ = ["PARTITION_SEND", "SERVE", "PartitionSend"]


def _by_kind(*calls: tuple[int, Serve]) -> dict[int, Serve]:
    table = dict(calls)
    assert len(table) == len(calls), "two calls of one kind"
    assert REPLY not in table and BATCH not in table, "a call of a kind the Caller keeps"
    return table


# Wire kind -> serve side: what the Caller runs for each request that comes in.
SERVE: dict[int, Serve] = _by_kind(
    (produce.KIND, produce.serve),
    (read.KIND, read.serve),
    (watch.KIND, watch.serve),
    (list_offset.KIND, list_offset.serve),
    (epoch_end.KIND, epoch_end.serve),
    (delete_records.KIND, delete_records.serve),
    (info.KIND, info.serve),
    (controller.KIND, controller.serve),
    (topics.KIND, topics.serve),
    (segments.KIND, segments.serve),
    (group.KIND, group.serve),
    (raft.KIND, raft.serve),
    (leaders.KIND, leaders.serve),
    (cluster_info.KIND, cluster_info.serve),
    (txn_marker.KIND, txn_marker.serve),
)


# Sends a partition message: (router, to, topic, partition, message).
PartitionSend = Callable[[Caller, Address, str, int, Any], None]


# Partition message type -> send side: what `RemotePartition.tell` runs.
PARTITION_SEND: dict[type, PartitionSend] = {
    Produce: produce.send,
    Read: read.send,
    ListOffset: list_offset.send,
    EpochEndOffset: epoch_end.send,
    PartitionInfo: info.send,
    DeleteRecords: delete_records.send,
    WriteTxnMarker: txn_marker.send,
}
