"""OffsetDelete (key 47), version 0 (KIP-496).

Deletes a group's committed offsets for some partitions. Allowed when the group is Empty, or
for topics no member of a "consumer" group subscribes to (GROUP_SUBSCRIBED_TO_TOPIC per
partition otherwise); a non-empty group of another protocol type is NON_EMPTY_GROUP.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import DeleteOffsets
from actors.handlers.group_common import tell_coordinator
from wire.errors import ErrorCode
from wire.messages.offset_delete import OffsetDeleteRequest, OffsetDeleteResponse

OffsetDeleteResponsePartition = OffsetDeleteResponse.OffsetDeleteResponsePartition
OffsetDeleteResponseTopic = OffsetDeleteResponse.OffsetDeleteResponseTopic

API_KEY = 47
MIN_VERSION = 0
MAX_VERSION = 0
REQUEST = OffsetDeleteRequest


def handle(ctx: Any, request: OffsetDeleteRequest) -> None:
    partitions = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]

    def reply(error: ErrorCode, errors: list[ErrorCode]) -> None:
        by_topic: dict[str, list[OffsetDeleteResponsePartition]] = {}
        if error == ErrorCode.NONE:
            for (topic, index), e in zip(partitions, errors, strict=True):
                by_topic.setdefault(topic, []).append(
                    OffsetDeleteResponsePartition(partition_index=index, error_code=e)
                )
        ctx.respond(
            OffsetDeleteResponse(
                error_code=error,
                throttle_time_ms=0,
                topics=[
                    OffsetDeleteResponseTopic(name=name, partitions=parts)
                    for name, parts in by_topic.items()
                ],
            )
        )

    message = DeleteOffsets(request.group_id, partitions, reply)
    if not tell_coordinator(ctx, request.group_id, message):
        reply(ErrorCode.NOT_COORDINATOR, [])
