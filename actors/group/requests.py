"""The group coordinator's requests as its queue sees them: which groups (or transactional
ids) each one is about, so that it waits for their partitions' loads, and how each group
request is answered when it cannot be served here (now): NOT_COORDINATOR, or
COORDINATOR_LOAD_IN_PROGRESS, or COORDINATOR_NOT_AVAILABLE, in the shape of its reply. Pure
functions of the messages (actors/group/messages.py and the group events); the transaction
requests are refused by the transaction coordinator (txn_coordinator.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.group.membership import not_described
from actors.group.messages import (
    AddTxnOffsets,
    AddTxnPartitions,
    CommitOffsets,
    DeleteGroups,
    DeleteOffsets,
    DescribeGroups,
    DescribeTxns,
    EndTransaction,
    EnsureReady,
    FetchOffsets,
    InitTransactional,
    ListGroups,
    ListTxns,
    TxnCommitOffsets,
)
from actors.group.state import (
    Heartbeat,
    HeartbeatResult,
    Join,
    JoinResult,
    Leave,
    LeaveResult,
    Sync,
    SyncResult,
)
from wire.errors import ErrorCode

__all__ = ["group_ids_of", "refuse"]


def group_ids_of(message: Any) -> Sequence[str] | None:
    """The groups (or transactional ids) a request is about; None: every group (it waits for
    every load)."""
    if isinstance(message, ListGroups | ListTxns):
        return None
    if isinstance(message, DescribeTxns):
        return message.transactional_ids
    if isinstance(message, InitTransactional | AddTxnPartitions | AddTxnOffsets
                  | EndTransaction):
        return (message.transactional_id,)
    if isinstance(message, EnsureReady):
        return None if message.group_id is None else (message.group_id,)
    if isinstance(message, DescribeGroups | DeleteGroups):
        return message.group_ids
    return (message.group_id,)


def refuse(message: Any, error: ErrorCode) -> None:
    """Answer a group request that cannot be served here (now) with `error`."""
    if isinstance(message, Join):
        message.reply(JoinResult(error, member_id=message.member_id))
    elif isinstance(message, Sync):
        message.reply(SyncResult(error))
    elif isinstance(message, Heartbeat):
        message.reply(HeartbeatResult(error))
    elif isinstance(message, Leave):
        message.reply(LeaveResult(error))
    elif isinstance(message, EnsureReady):
        message.reply(error)
    elif isinstance(message, CommitOffsets | TxnCommitOffsets):
        message.reply([error] * len(message.entries))
    elif isinstance(message, DeleteGroups):
        message.reply([error] * len(message.group_ids))
    elif isinstance(message, DeleteOffsets):
        message.reply(error, [error] * len(message.partitions))
    elif isinstance(message, FetchOffsets):
        if message.with_error:
            message.reply(error, [])
        else:
            message.reply([])
    elif isinstance(message, DescribeGroups):
        message.reply([not_described(g, error) for g in message.group_ids])
    elif isinstance(message, ListGroups):
        message.reply([])
