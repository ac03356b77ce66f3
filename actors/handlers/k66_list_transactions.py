"""ListTransactions (key 66), versions 0-1 (flexible; KIP-664).

v1 adds DurationFilter (KIP-994: only transactions open longer than this many ms; -1: all).
Every shard's coordinator is asked and their ids listed together (the admin client asks every
broker). StateFilters names Kafka's states; a name that is none of them is listed back in
UnknownStateFilters and matches nothing.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import ListTxns, TxnListing
from actors.group.transactions import TxnState
from actors.handlers.join import Join, send
from wire.errors import ErrorCode
from wire.messages.list_transactions import ListTransactionsRequest, ListTransactionsResponse

Listed = ListTransactionsResponse.TransactionState

API_KEY = 66
MIN_VERSION = 0
MAX_VERSION = 1
REQUEST = ListTransactionsRequest

_STATES = {s.value for s in TxnState}


def handle(ctx: Any, request: ListTransactionsRequest) -> None:
    states = list(request.state_filters)
    unknown = [s for s in states if s not in _STATES]
    duration_ms = request.duration_filter if ctx.version >= 1 else -1

    def merged(results: list[list[TxnListing]]) -> None:
        ctx.respond(ListTransactionsResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE, unknown_state_filters=unknown,
            transaction_states=[
                Listed(transactional_id=t.transactional_id, producer_id=t.producer_id,
                       transaction_state=t.state)
                for listed in results for t in listed]))

    if states and len(unknown) == len(states):
        merged([])  # nothing can match
        return
    coordinators = [c for c in ctx.services.group_coordinators() if c is not None]
    join = Join(len(coordinators), merged)
    for index, coordinator in enumerate(coordinators):
        slot = join.slot(index)
        message = ListTxns([s for s in states if s in _STATES],
                           list(request.producer_id_filters), duration_ms, slot)
        if not send(coordinator, message):
            slot([])
