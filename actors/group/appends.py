"""Appending to `__consumer_offsets`, as the coordinator's pieces see it: the shape of the
coordinator's `append` (and of its timers) that membership.py and offsets.py are handed, and
how a failed append is answered: the Partition's error becomes a coordinator error the client
knows how to retry (Kafka's GroupMetadataManager). A module of its own so that the coordinator
and every piece can name these without importing one another; it holds no state and does no
I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from wire.errors import ErrorCode

__all__ = ["Append", "CallLater", "commit_error", "metadata_error", "txn_commit_error"]

CallLater = Callable[[float, Callable[[], None]], asyncio.TimerHandle]


class Append(Protocol):
    """The coordinator's append of one batch to the group's (or transactional id's) offsets
    partition: `done(error)` runs later, in the coordinator, once it is produced (acks=-1)
    or has failed. `producer` (id, epoch): a transactional batch of that producer."""

    def __call__(self, group_id: str, records: Sequence[tuple[bytes, bytes | None]],
                 done: Callable[[ErrorCode], None],
                 producer: tuple[int, int] | None = None) -> None: ...

# Kafka's GroupCoordinatorService / GroupMetadataManager.appendGroupMetadataErrorToResponseError:
# an append's error as a coordinator error the client retries. REQUEST_TIMED_OUT (the new
# leader's outcome unknown) is COORDINATOR_NOT_AVAILABLE: retried, on the same coordinator.
_RETRIABLE_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


def commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka maps append failures to coordinator errors the client knows how to retry."""
    if error == ErrorCode.NONE:
        return error
    return _RETRIABLE_APPEND_ERRORS.get(error, ErrorCode.COORDINATOR_NOT_AVAILABLE)


# The partition's transactional refusals reach the producer as they are (Kafka's storeOffsets
# passes them on): an older epoch fences it; the others are retriable or its own mistake.
_TXN_APPEND_ERRORS = {
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_TXN_STATE,
    ErrorCode.CONCURRENT_TRANSACTIONS,
}


def txn_commit_error(error: ErrorCode) -> ErrorCode:
    return error if error in _TXN_APPEND_ERRORS else commit_error(error)


def metadata_error(error: ErrorCode) -> ErrorCode:
    """As `commit_error`, but a group's metadata too large is no commit's fault (Kafka:
    UNKNOWN_SERVER_ERROR)."""
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE):
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return commit_error(error)
