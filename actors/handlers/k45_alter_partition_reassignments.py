"""AlterPartitionReassignments (key 45), version 0 (flexible): `kafka-reassign-partitions.sh
--execute`, AdminClient.alterPartitionReassignments.

Each partition's new replicas (node ids, the first the preferred leader) start a move, or
redirect the one under way; null cancels it (the partition goes back to the replicas it began
from). The controller records the moves and answers; the partitions' Raft leaders carry them
out (actors/cluster/moves.py). Per partition: UNKNOWN_TOPIC_OR_PARTITION,
INVALID_REPLICA_ASSIGNMENT (an unknown node, a node twice, a node kept on another shard, a
move to or from one replica: not built), NO_REASSIGNMENT_IN_PROGRESS (a cancel with none),
NOT_CONTROLLER / REQUEST_TIMED_OUT while the controller has no leader. A node of its own holds
every replica: a move to itself is nothing to do, any other is INVALID_REPLICA_ASSIGNMENT.
"""

from __future__ import annotations

from typing import Any

from actors.controller import MovePartitions, PartitionResult
from wire.errors import ErrorCode
from wire.messages.alter_partition_reassignments import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
)

PartitionResponse = AlterPartitionReassignmentsResponse.ReassignablePartitionResponse
TopicResponse = AlterPartitionReassignmentsResponse.ReassignableTopicResponse

API_KEY = 45
MIN_VERSION = 0
MAX_VERSION = 0
REQUEST = AlterPartitionReassignmentsRequest


def handle(ctx: Any, request: AlterPartitionReassignmentsRequest) -> None:
    moves = [(t.name, [(p.partition_index, None if p.replicas is None else list(p.replicas))
                       for p in t.partitions]) for t in request.topics]

    def done(results: list[PartitionResult]) -> None:
        by_topic: dict[str, list[PartitionResponse]] = {}
        for r in results:
            by_topic.setdefault(r.topic, []).append(PartitionResponse(
                partition_index=r.partition, error_code=r.error, error_message=r.message))
        ctx.respond(AlterPartitionReassignmentsResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
            responses=[TopicResponse(name=name, partitions=partitions)
                       for name, partitions in by_topic.items()]))

    ctx.services.controller().tell(MovePartitions(moves, done))
