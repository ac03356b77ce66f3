"""The client messages a partition holds while it cannot answer them yet.

Until its recovery sync and first producer-state rebuild are back, and while a rebuild after a
Raft cut runs, a partition answers no client (actors/partition.py): the messages that need its
log or its producer state (`WAIT_FOR_STATE`) wait here in order, at most
`partition_held_messages_max` (past that one is answered REQUEST_TIMED_OUT, retriable), and are
handled once it serves again, a turn's share (`inbox_drain_messages_max`) at a time, so the
other actors of the loop go on meanwhile. A partition gone offline (its producer state cannot
be known) refuses them KAFKA_STORAGE_ERROR.

A replicated partition that has just been elected refuses no write by its producer state
until an entry of its own term has committed (actors/partition_replication.py, `settling`):
such a write is held here, first, with the writes (`WRITES`) after it, and taken again
then (actors/partition_produce.py); its reads go on. Until then a batch of an earlier term that
this leader lacks may yet be elected back by a later leader. OUT_OF_ORDER_SEQUENCE_NUMBER
answered against this log, for a batch whose predecessor it lacks, makes librdkafka bump the
producer epoch and send the predecessor again under new sequences, and it was stored twice
once a later leader kept the first copy (issue #28's CI run). A write it takes, or answers as
a duplicate once committed, is safe either way, so the usual first write goes straight in,
and is itself the entry of the term that settles it.
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

__all__ = ["WAIT_FOR_STATE", "WRITES", "HeldMessages", "refuse_held"]

# What waits while the partition starts or rebuilds its producer state.
WAIT_FOR_STATE = frozenset({Produce, Read, ListOffset, EpochEndOffset, PartitionInfo,
                            DeleteRecords, WriteTxnMarker, TransferLeadership, Warmed})
# The writes: they queue behind a write held (until this new leader settles, or until the
# segment it goes to is made: actors/partition_produce.py), keeping a producer's order.
WRITES = frozenset({Produce, WriteTxnMarker})


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

    def hold_first(self, message: Any) -> None:
        """Hold `message` before every other (a produce put back: see its partition)."""
        self._queue.appendleft(message)

    def release(self, handle: Callable[[Any], None], ready: Callable[[Any], bool],
                offline: Callable[[], bool]) -> bool:
        """Handle held messages in order while the partition is `ready` for the first, a
        turn's share; whether any are left for the next turn (False when the first must wait
        on: the partition says when to try again)."""
        for _ in range(limits.inbox_drain_messages_max):
            if not self._queue or not ready(self._queue[0]):
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
