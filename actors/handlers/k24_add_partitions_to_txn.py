"""AddPartitionsToTxn (key 24), versions 0-3: the versions clients send.

v1 same as v0; v2 PRODUCER_FENCED where v0-1 get INVALID_PRODUCER_EPOCH (KIP-588); v3
flexible. v4-5 (KIP-890: batched transactions and VerifyOnly, broker to broker) are not
offered. The coordinator answers one error for the whole request, given for every partition;
a partition whose topic or index does not exist is UNKNOWN_TOPIC_OR_PARTITION, and then the
others OPERATION_NOT_ATTEMPTED, without asking the coordinator, as Kafka does.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import AddTxnPartitions
from actors.handlers.txn_common import fenced_error, tell_txn_coordinator
from wire.errors import ErrorCode
from wire.messages.add_partitions_to_txn import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
)

TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
PartitionResult = AddPartitionsToTxnResponse.AddPartitionsToTxnPartitionResult

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = AddPartitionsToTxnRequest

_FENCED_SINCE_VERSION = 2


def handle(ctx: Any, request: AddPartitionsToTxnRequest) -> None:
    partitions = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    version = ctx.version

    def respond(errors: dict[tuple[str, int], ErrorCode]) -> None:
        by_topic: dict[str, list[PartitionResult]] = {}
        for (topic, partition), error in errors.items():
            by_topic.setdefault(topic, []).append(PartitionResult(
                partition_index=partition, partition_error_code=error))
        ctx.respond(AddPartitionsToTxnResponse(
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                TopicResult(name=topic, results_by_partition=results)
                for topic, results in by_topic.items()]))

    def reply(error: ErrorCode) -> None:
        error = fenced_error(error, _FENCED_SINCE_VERSION, version)
        respond({tp: error for tp in partitions})

    topics = ctx.services.topics().topics
    unknown = {(t, p) for t, p in partitions if t not in topics or not
               0 <= p < topics[t].partitions}
    if unknown:
        respond({tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                 else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in partitions})
        return
    transactional_id = request.v3_and_below_transactional_id
    message = AddTxnPartitions(transactional_id, request.v3_and_below_producer_id,
                               request.v3_and_below_producer_epoch, partitions, reply)
    if not tell_txn_coordinator(ctx, transactional_id, message):
        reply(ErrorCode.NOT_COORDINATOR)
