"""Krill's partition storage: segmented logs of Kafka RecordBatch v2 bytes (DESIGN.md §6).

`DiskLog` is the buffered-mode log (page cache, pwrite, fdatasync in flush tickets);
`MemoryLog` implements the same `Log` interface in memory. No sockets, actors or threads here:
the partition actor calls the log, and runs flush tickets on its I/O pool.
"""

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

__all__ = [
    "AppendResult",
    "DiskLog",
    "FileSlice",
    "FlushTicket",
    "Log",
    "LogConfig",
    "MemoryLog",
    "NotCached",
    "OffsetOutOfRange",
]
