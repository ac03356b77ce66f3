"""The client messages a partition holds while it cannot answer them yet.

Until its recovery sync and first producer-state rebuild are back, and while a rebuild after a
Raft cut runs, a partition answers no client (actors/partition.py): the messages that need its
log or its producer state (`WAIT_FOR_STATE`) wait here in order, at most
`partition_held_messages_max` (past that one is answered REQUEST_TIMED_OUT, retriable), and are
handled once it serves again, a turn's share (`inbox_drain_messages_max`) at a time, so the
other actors of the loop go on meanwhile. A partition gone offline (its producer state cannot
be known) refuses them KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from actors import limits
from actors.partition_messages import (
    DeleteRecords,
    EpochEndOffset,
    ListOffset,
    PartitionInfo,
    Produce,
    Read,
    TransferLeadership,
    WriteTxnMarker,
    refuse,
)
from actors.partition_reads import Warmed
from wire.errors import ErrorCode

__all__ = ["WAIT_FOR_STATE", "HeldMessages", "refuse_held"]

# What waits while the partition starts or rebuilds its producer state.
WAIT_FOR_STATE = frozenset({Produce, Read, ListOffset, EpochEndOffset, PartitionInfo,
                            DeleteRecords, WriteTxnMarker, TransferLeadership, Warmed})


def refuse_held(message: Any, error: ErrorCode) -> None:
    """`refuse`, and a read back from the read pool is its own read refused."""
    refuse(message.message if isinstance(message, Warmed) else message, error)


class HeldMessages:
    def __init__(self) -> None:
        self._queue: collections.deque[Any] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._queue)

    def hold(self, message: Any, offline: bool) -> None:
        if offline:
            refuse_held(message, ErrorCode.KAFKA_STORAGE_ERROR)
        elif len(self._queue) >= limits.partition_held_messages_max:
            refuse_held(message, ErrorCode.REQUEST_TIMED_OUT)
        else:
            self._queue.append(message)

    def release(self, handle: Callable[[Any], None], serving: Callable[[], bool],
                offline: Callable[[], bool]) -> bool:
        """Handle held messages in order while the partition is `serving`, a turn's share;
        whether any are left for the next turn."""
        for _ in range(limits.inbox_drain_messages_max):
            if not self._queue or not serving():
                return False
            message = self._queue.popleft()
            if offline():
                refuse_held(message, ErrorCode.KAFKA_STORAGE_ERROR)
            else:
                handle(message)
        return bool(self._queue)

    def refuse_all(self, error: ErrorCode) -> None:
        held, self._queue = self._queue, collections.deque()
        for message in held:
            refuse_held(message, error)
