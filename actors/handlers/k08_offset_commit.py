"""OffsetCommit (key 8), versions 0-9.

v0 commits without group management (no generation or member); v1 adds GenerationId,
MemberId and a per-partition CommitTimestamp (ignored: the broker stamps commits); v2
RetentionTimeMs (ignored: offsets live until deleted, as with Kafka's default of 7 days
which this broker does not expire yet); v3 throttle time; v4 same; v5 drops RetentionTimeMs;
v6 CommittedLeaderEpoch (stored and returned by OffsetFetch); v7 GroupInstanceId (fencing);
v8 flexible; v9 GenerationIdOrMemberEpoch (KIP-848), the same field for classic groups.
Commits to topics or partitions that do not exist are UNKNOWN_TOPIC_OR_PARTITION. The answer
comes only after the commit is appended to `__consumer_offsets` with acks=-1.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import CommitOffsets
from actors.handlers.group_common import CommitParts, tell_coordinator
from wire.errors import ErrorCode
from wire.messages.offset_commit import OffsetCommitRequest, OffsetCommitResponse

OffsetCommitResponsePartition = OffsetCommitResponse.OffsetCommitResponsePartition
OffsetCommitResponseTopic = OffsetCommitResponse.OffsetCommitResponseTopic

API_KEY = 8
MIN_VERSION = 0
MAX_VERSION = 9
REQUEST = OffsetCommitRequest


def handle(ctx: Any, request: OffsetCommitRequest) -> None:
    version = ctx.version
    parts = CommitParts(ctx, request.topics, leader_epochs=version >= 6)

    def reply(results: list[ErrorCode]) -> None:
        by_topic = parts.by_topic(results, lambda index, error: OffsetCommitResponsePartition(
            partition_index=index, error_code=error))
        ctx.respond(OffsetCommitResponse(
            throttle_time_ms=0,
            topics=[OffsetCommitResponseTopic(name=name, partitions=partitions)
                    for name, partitions in by_topic.items()]))

    if not parts.entries:
        reply([])
        return
    message = CommitOffsets(
        group_id=request.group_id,
        generation_id=request.generation_id_or_member_epoch if version >= 1 else -1,
        member_id=request.member_id if version >= 1 else "",
        group_instance_id=request.group_instance_id if version >= 7 else None,
        entries=parts.entries,
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, message):
        reply([ErrorCode.NOT_COORDINATOR] * len(parts.entries))
