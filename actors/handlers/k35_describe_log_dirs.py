"""DescribeLogDirs (key 35), versions 1-4: this node's log directory and the size of every
replica in it (`kafka-log-dirs.sh --describe`, AdminClient.describeLogDirs).

v0 is deprecated (Kafka 4 refuses it too); v2 flexible; v3 adds a top-level error; v4 the
volume's total and usable bytes. A node has one log directory, `--data-dir`. Topics null:
every replica on this node; else the partitions asked that have a replica here (others are
left out, as Kafka leaves out what it does not host). Each partition's size is its segments'
bytes and its offset lag the log end less the high watermark (Kafka's `offsetLag` for a
current replica), from the partition itself (`PartitionInfo`, wherever on this node it is);
a replica that cannot answer (starting, offline, deleted meanwhile) is left out. The volume's
figures come from statvfs on the read pool. No future logs: Krill has no
AlterReplicaLogDirs, so `is_future_key` is always false.
"""

from __future__ import annotations

import os
from typing import Any

from actors.handlers.join import Join, send
from actors.partition_messages import PartitionInfo
from wire.errors import ErrorCode
from wire.messages.describe_log_dirs import DescribeLogDirsRequest, DescribeLogDirsResponse

Result = DescribeLogDirsResponse.DescribeLogDirsResult
Topic = DescribeLogDirsResponse.DescribeLogDirsTopic
Partition = DescribeLogDirsResponse.DescribeLogDirsPartition

API_KEY = 35
MIN_VERSION = 1
MAX_VERSION = 4
REQUEST = DescribeLogDirsRequest


def handle(ctx: Any, request: DescribeLogDirsRequest) -> None:
    table = ctx.services.topics().topics
    if request.topics is None:
        asked = [(name, index) for name, info in sorted(table.items())
                 for index in range(info.partitions)]
    else:
        asked = [(t.topic, index) for t in request.topics if t.topic in table
                 for index in t.partitions if 0 <= index < table[t.topic].partitions]
    here = [(topic, index, ref) for topic, index in asked
            if (ref := ctx.services.partition(topic, index)) is not None]
    data_dir = os.path.abspath(ctx.services.settings.data_dir)

    def done(results: list[Any]) -> None:
        *infos, volume = results
        topics: dict[str, list[Any]] = {}
        for (topic, index, _), info in zip(here, infos, strict=True):
            if not isinstance(info, dict) or "size_bytes" not in info:
                continue  # not answered: starting, offline, or gone meanwhile
            lag = max(0, info["next_offset"] - info["high_watermark"])
            topics.setdefault(topic, []).append(Partition(
                partition_index=index, partition_size=info["size_bytes"], offset_lag=lag,
                is_future_key=False))
        ctx.respond(DescribeLogDirsResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE,
            results=[Result(
                error_code=ErrorCode.NONE, log_dir=data_dir,
                topics=[Topic(name=name, partitions=ps) for name, ps in topics.items()],
                total_bytes=-1 if volume is None else volume.f_frsize * volume.f_blocks,
                usable_bytes=-1 if volume is None else volume.f_frsize * volume.f_bavail)],
        ))

    join = Join(len(here) + 1, done)
    for slot, (_topic, _index, ref) in enumerate(here):
        if not send(ref, PartitionInfo(join.slot(slot))):
            join.fill(slot, None)
    statvfs = join.slot(len(here))
    ctx.services.read_blocking(lambda: os.statvfs(data_dir),
                               lambda volume, error: statvfs(None if error else volume))
