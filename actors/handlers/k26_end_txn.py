"""EndTxn (key 26), versions 0-3.

v1 same as v0; v2 PRODUCER_FENCED where v0-1 get INVALID_PRODUCER_EPOCH (KIP-588); v3
flexible. v4 (KIP-890: the epoch bumped by every EndTxn, answered with the new producer id and
epoch) is not offered. The coordinator answers once CommitPrepare/AbortPrepare is persisted,
the outcome decided; the markers are written afterwards. A retried EndTxn of the outcome that
has completed is NONE; one that contradicts the transaction's state is INVALID_TXN_STATE, one
that meets its markers in flight CONCURRENT_TRANSACTIONS (the client retries).
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import EndTransaction
from actors.handlers.txn_common import fenced_error, tell_txn_coordinator
from wire.errors import ErrorCode
from wire.messages.end_txn import EndTxnRequest, EndTxnResponse

API_KEY = 26
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = EndTxnRequest

_FENCED_SINCE_VERSION = 2


def handle(ctx: Any, request: EndTxnRequest) -> None:
    version = ctx.version

    def reply(error: ErrorCode) -> None:
        ctx.respond(EndTxnResponse(
            throttle_time_ms=0, error_code=fenced_error(error, _FENCED_SINCE_VERSION, version)))

    message = EndTransaction(request.transactional_id, request.producer_id,
                             request.producer_epoch, request.committed, reply)
    if not tell_txn_coordinator(ctx, request.transactional_id, message):
        reply(ErrorCode.NOT_COORDINATOR)
