"""TxnOffsetCommit (key 28), versions 0-3: the versions clients send.

v1 same as v0; v2 CommittedLeaderEpoch; v3 GenerationId, MemberId and GroupInstanceId
(KIP-447: the consumer's member, checked as OffsetCommit checks it; before v3 none) and
flexible. v4 (KIP-890, TRANSACTION_ABORTABLE) is not offered. Served by the GROUP's
coordinator: the offsets are appended to the group's `__consumer_offsets` partition as one
transactional batch of the producer (acks=-1, answered once durable) and stay pending, unseen
by OffsetFetch, until the producer's COMMIT marker lands there (ABORT drops them). The
producer's id and epoch are checked by that partition as for its other partitions: an older
epoch is INVALID_PRODUCER_EPOCH (Kafka passes it on; clients take it as fenced). Partitions of
topics that do not exist are UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import TxnCommitOffsets
from actors.handlers.group_common import CommitParts, tell_coordinator
from wire.errors import ErrorCode
from wire.messages.txn_offset_commit import TxnOffsetCommitRequest, TxnOffsetCommitResponse

PartitionResult = TxnOffsetCommitResponse.TxnOffsetCommitResponsePartition
TopicResult = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic

API_KEY = 28
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = TxnOffsetCommitRequest

_MEMBER_SINCE_VERSION = 3
_LEADER_EPOCH_SINCE_VERSION = 2


def handle(ctx: Any, request: TxnOffsetCommitRequest) -> None:
    version = ctx.version
    parts = CommitParts(ctx, request.topics,
                        leader_epochs=version >= _LEADER_EPOCH_SINCE_VERSION)

    def reply(results: list[ErrorCode]) -> None:
        by_topic = parts.by_topic(results, lambda index, error: PartitionResult(
            partition_index=index, error_code=error))
        ctx.respond(TxnOffsetCommitResponse(
            throttle_time_ms=0,
            topics=[TopicResult(name=name, partitions=partitions)
                    for name, partitions in by_topic.items()]))

    if not parts.entries:
        reply([])
        return
    members = version >= _MEMBER_SINCE_VERSION
    message = TxnCommitOffsets(
        transactional_id=request.transactional_id,
        group_id=request.group_id,
        producer_id=request.producer_id,
        producer_epoch=request.producer_epoch,
        generation_id=request.generation_id if members else -1,
        member_id=request.member_id if members else "",
        group_instance_id=request.group_instance_id if members else None,
        entries=parts.entries,
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, message):
        reply([ErrorCode.NOT_COORDINATOR] * len(parts.entries))
