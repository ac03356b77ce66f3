"""InitProducerId (key 22), versions 0-4.

v1 same as v0; v2 flexible; v3 takes the current producer id and epoch so an idempotent
producer can bump its epoch after a fatal error (KIP-360); v4 same as v3.
Idempotent producers get an id from the controller's persisted blocks, epoch 0. A bump keeps
the id and adds one to the epoch (a new id when the epoch would overflow).
Transactional ids are refused: transactions are not implemented yet.
"""

from __future__ import annotations

from typing import Any

from actors.controller import AllocateProducerId
from wire.errors import ErrorCode
from wire.messages.init_producer_id import InitProducerIdRequest, InitProducerIdResponse

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = InitProducerIdRequest

_EPOCH_MAX = 32767


def handle(ctx: Any, request: InitProducerIdRequest) -> None:
    if request.transactional_id is not None:
        ctx.respond(
            InitProducerIdResponse(
                error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        )
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
