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

from actors.group.messages import CommitEntry, TxnCommitOffsets
from actors.handlers.group_common import tell_coordinator
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
    topics = ctx.services.topics().topics
    parts = [(t.name, p) for t in request.topics for p in t.partitions]
    errors: list[ErrorCode | None] = [None] * len(parts)
    entries = []
    for index, (topic, p) in enumerate(parts):
        info = topics.get(topic)
        if info is None or not 0 <= p.partition_index < info.partitions:
            errors[index] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            continue
        epoch = p.committed_leader_epoch if version >= _LEADER_EPOCH_SINCE_VERSION else -1
        entries.append(CommitEntry(topic, p.partition_index, p.committed_offset, epoch,
                                   p.committed_metadata))

    def reply(results: list[ErrorCode]) -> None:
        it = iter(results)
        final = [e if e is not None else next(it) for e in errors]
        by_topic: dict[str, list[PartitionResult]] = {}
        for (topic, p), error in zip(parts, final, strict=True):
            by_topic.setdefault(topic, []).append(
                PartitionResult(partition_index=p.partition_index, error_code=error))
        ctx.respond(TxnOffsetCommitResponse(
            throttle_time_ms=0,
            topics=[TopicResult(name=name, partitions=results)
                    for name, results in by_topic.items()]))

    if not entries:
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
        entries=entries,
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, message):
        reply([ErrorCode.NOT_COORDINATOR] * len(entries))
