"""DescribeTransactions (key 65), version 0 (flexible; KIP-664).

Each transactional id is described by its coordinator: its state by Kafka's exact names
("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
"Dead"), timeout, start time (-1 when no transaction is open), producer id and epoch, and the
partitions of its open transaction. An id this node does not coordinate is NOT_COORDINATOR
(the admin client asks the coordinator FindCoordinator names); one the coordinator does not
know is TRANSACTIONAL_ID_NOT_FOUND.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import DescribeTxns, TxnDescription
from actors.handlers.join import Join
from actors.handlers.txn_common import tell_txn_coordinator
from wire.errors import ErrorCode
from wire.messages.describe_transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
)

TransactionState = DescribeTransactionsResponse.TransactionState
TopicData = DescribeTransactionsResponse.TopicData

API_KEY = 65
MIN_VERSION = 0
MAX_VERSION = 0
REQUEST = DescribeTransactionsRequest


def handle(ctx: Any, request: DescribeTransactionsRequest) -> None:
    ids = list(request.transactional_ids)

    def done(results: list[TxnDescription]) -> None:
        ctx.respond(DescribeTransactionsResponse(
            throttle_time_ms=0, transaction_states=[_state(d) for d in results]))

    join = Join(len(ids), done)
    for index, transactional_id in enumerate(ids):
        slot = join.slot(index)

        def first(described: list[TxnDescription], slot: Any = slot) -> None:
            slot(described[0])

        message = DescribeTxns([transactional_id], first)
        if not tell_txn_coordinator(ctx, transactional_id, message):
            slot(TxnDescription(transactional_id, ErrorCode.NOT_COORDINATOR))


def _state(d: TxnDescription) -> Any:
    topics: dict[str, list[int]] = {}
    for topic, partition in d.partitions:
        topics.setdefault(topic, []).append(partition)
    return TransactionState(
        error_code=d.error, transactional_id=d.transactional_id, transaction_state=d.state,
        transaction_timeout_ms=d.timeout_ms, transaction_start_time_ms=d.start_ms,
        producer_id=d.producer_id, producer_epoch=d.producer_epoch,
        topics=[TopicData(topic=t, partitions=p) for t, p in topics.items()])
