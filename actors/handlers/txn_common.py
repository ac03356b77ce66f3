"""What the transaction handlers (keys 22, 24, 25, 26, 65, 66) share: reaching a transactional
id's coordinator (the GroupCoordinator that owns its `__consumer_offsets` partition, as for a
group id) and the error older request versions get instead of PRODUCER_FENCED."""

from __future__ import annotations

from typing import Any

from actors.handlers.group_common import tell_coordinator
from wire.errors import ErrorCode

__all__ = ["fenced_error", "tell_txn_coordinator"]


def tell_txn_coordinator(ctx: Any, transactional_id: str, message: Any) -> bool:
    """Send `message` to the id's coordinator; False if there is none to reach (the caller
    answers NOT_COORDINATOR, and the client looks it up again)."""
    return tell_coordinator(ctx, transactional_id, message)


def fenced_error(error: ErrorCode, fenced_since_version: int, version: int) -> ErrorCode:
    """KIP-588: PRODUCER_FENCED came with a version bump of each API; a client on an older
    version knows the same fact as INVALID_PRODUCER_EPOCH."""
    if error == ErrorCode.PRODUCER_FENCED and version < fenced_since_version:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error
