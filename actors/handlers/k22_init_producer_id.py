"""InitProducerId (key 22), versions 0-4.

v1 same as v0; v2 flexible; v3 takes the current producer id and epoch so a producer can
bump its epoch after a fatal error (KIP-360); v4 same as v3, and PRODUCER_FENCED where v0-3
get INVALID_PRODUCER_EPOCH (KIP-588).

Idempotent producers (no transactional id) get an id from the controller's persisted blocks,
epoch 0; a v3+ bump keeps the id and adds one to the epoch (a new id when the epoch would
overflow). A transactional id goes to its transaction coordinator (the GroupCoordinator that
owns its `__consumer_offsets` partition; actors/group/transactions.py), which allocates the
id's producer id once and bumps the epoch on every later InitProducerId, aborting an open
transaction first (CONCURRENT_TRANSACTIONS until that is done: the client retries). A
transaction timeout over transaction.max.timeout.ms is INVALID_TRANSACTION_TIMEOUT.
"""

from __future__ import annotations

from typing import Any

from actors.controller import AllocateProducerId
from actors.group.messages import InitTransactional
from actors.handlers.txn_common import fenced_error, tell_txn_coordinator
from wire.errors import ErrorCode
from wire.messages.init_producer_id import InitProducerIdRequest, InitProducerIdResponse

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = InitProducerIdRequest

_EPOCH_MAX = 32767
_FENCED_SINCE_VERSION = 4


def handle(ctx: Any, request: InitProducerIdRequest) -> None:
    if request.transactional_id is not None:
        _transactional(ctx, request)
        return
    if ctx.version >= 3 and request.producer_id >= 0 and 0 <= request.producer_epoch < _EPOCH_MAX:
        ctx.respond(
            InitProducerIdResponse(
                error_code=ErrorCode.NONE,
                producer_id=request.producer_id,
                producer_epoch=request.producer_epoch + 1,
            )
        )
        return

    def allocated(producer_id: int) -> None:
        if producer_id < 0:  # none could be handed out now: the client retries
            ctx.respond(
                InitProducerIdResponse(
                    error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    producer_id=-1,
                    producer_epoch=-1,
                )
            )
            return
        ctx.respond(
            InitProducerIdResponse(
                error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=0
            )
        )

    ctx.services.controller().tell(AllocateProducerId(allocated))


def _transactional(ctx: Any, request: InitProducerIdRequest) -> None:
    transactional_id = request.transactional_id
    assert transactional_id is not None
    version = ctx.version

    def reply(error: ErrorCode, producer_id: int, producer_epoch: int) -> None:
        ctx.respond(InitProducerIdResponse(
            error_code=fenced_error(error, _FENCED_SINCE_VERSION, version),
            producer_id=producer_id, producer_epoch=producer_epoch))

    if transactional_id == "":  # Kafka: an empty transactional id is no transactional id
        reply(ErrorCode.INVALID_REQUEST, -1, -1)
        return
    current = version >= 3
    message = InitTransactional(
        transactional_id, request.transaction_timeout_ms,
        request.producer_id if current else -1, request.producer_epoch if current else -1,
        reply)
    if not tell_txn_coordinator(ctx, transactional_id, message):
        reply(ErrorCode.NOT_COORDINATOR, -1, -1)
