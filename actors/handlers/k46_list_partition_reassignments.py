"""ListPartitionReassignments (key 46), version 0 (flexible): `kafka-reassign-partitions.sh
--verify`, AdminClient.listPartitionReassignments.

The moves under way (actors/cluster/moves.py), from this node's copy of the controller's
state: all of them when `topics` is null, else those of the partitions named (a partition
with no move under way, or that does not exist, is left out, as Kafka does). Each: the
partition's replicas now (the target's, then those leaving), the nodes the move adds and
those it removes.
"""

from __future__ import annotations

from typing import Any

from actors.cluster.moves import adding, removing
from actors.cluster.state import PlacedTopic
from wire.errors import ErrorCode
from wire.messages.list_partition_reassignments import (
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)

Ongoing = ListPartitionReassignmentsResponse.OngoingPartitionReassignment
TopicMoves = ListPartitionReassignmentsResponse.OngoingTopicReassignment

API_KEY = 46
MIN_VERSION = 0
MAX_VERSION = 0
REQUEST = ListPartitionReassignmentsRequest


def handle(ctx: Any, request: ListPartitionReassignmentsRequest) -> None:
    table = ctx.services.topics().topics
    asked: list[tuple[str, set[int] | None]]
    if request.topics is None:
        asked = [(name, None) for name in sorted(table)]
    else:
        asked = [(t.name, set(t.partition_indexes)) for t in request.topics]
    topics = []
    for name, indexes in asked:
        info = table.get(name)
        if not isinstance(info, PlacedTopic) or not info.moves:
            continue
        ongoing = [Ongoing(partition_index=p, replicas=[n for n, _ in info.replicas[p]],
                           adding_replicas=adding(move),
                           removing_replicas=removing(move, info.replicas[p]))
                   for p, move in sorted(info.moves.items())
                   if indexes is None or p in indexes]
        if ongoing:
            topics.append(TopicMoves(name=name, partitions=ongoing))
    ctx.respond(ListPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, topics=topics))
