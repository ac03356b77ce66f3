"""Krill's partition storage: segmented logs of Kafka RecordBatch v2 bytes (DESIGN.md §6).

`DiskLog` is the buffered-mode log (page cache, pwrite, fdatasync in flush tickets);
`MemoryLog` implements the same `Log` interface in memory. The log is also the partition's
Raft log (DESIGN.md §7): an epoch cache says where each leader epoch begins, and a follower
appends the leader's batches, cuts a divergent tail and resets to the leader's start. No
sockets, actors or threads here: the partition actor calls the log, and runs flush and cut
tickets on its I/O pool.
"""

from storage.epochs import EpochCache
from storage.log import (
    AppendResult,
    DiskLog,
    FileSlice,
    FlushTicket,
    Log,
    LogConfig,
    OffsetOutOfRange,
)
from storage.memory_log import MemoryLog
from storage.page_cache import NotCached
from storage.replica import CutTicket, NotBatchBoundary, NotContiguous

__all__ = [
    "AppendResult",
    "CutTicket",
    "DiskLog",
    "EpochCache",
    "FileSlice",
    "FlushTicket",
    "Log",
    "LogConfig",
    "MemoryLog",
    "NotBatchBoundary",
    "NotCached",
    "NotContiguous",
    "OffsetOutOfRange",
]
