"""AddOffsetsToTxn (key 25), versions 0-3: the versions clients send.

v1 same as v0; v2 PRODUCER_FENCED where v0-1 get INVALID_PRODUCER_EPOCH (KIP-588); v3
flexible. v4 (KIP-890, TRANSACTION_ABORTABLE) is not offered. The transactional id's
coordinator adds the group's `__consumer_offsets` partition to the transaction, with the
checks and the persistence of AddPartitionsToTxn; the offsets themselves come next, in
TxnOffsetCommit (key 28) to the group's coordinator.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import AddTxnOffsets
from actors.handlers.txn_common import fenced_error, tell_txn_coordinator
from wire.errors import ErrorCode
from wire.messages.add_offsets_to_txn import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

API_KEY = 25
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = AddOffsetsToTxnRequest

_FENCED_SINCE_VERSION = 2


def handle(ctx: Any, request: AddOffsetsToTxnRequest) -> None:
    version = ctx.version

    def reply(error: ErrorCode) -> None:
        error = fenced_error(error, _FENCED_SINCE_VERSION, version)
        ctx.respond(AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=error))

    transactional_id = request.transactional_id
    message = AddTxnOffsets(transactional_id, request.producer_id, request.producer_epoch,
                            request.group_id, reply)
    if not tell_txn_coordinator(ctx, transactional_id, message):
        reply(ErrorCode.NOT_COORDINATOR)
