"""ElectLeaders (key 43), versions 0-2 (`kafka-leader-election.sh`, AdminClient.electLeaders).

v1 adds the election type (0 preferred, 1 unclean) and a top-level error; v2 flexible. Krill
elects no leader on request: a partition's leadership goes back to its preferred replica by
itself once that replica has caught up (actors/partition_replication.py), and Raft never elects
an unclean leader. So each partition asked (all of them when the list is null) is answered as
Kafka answers one that needs no election, or with Kafka's error for why it cannot have one:

    preferred  the preferred replica leads (always on a node of its own): ELECTION_NOT_NEEDED
               another replica leads, or none does: PREFERRED_LEADER_NOT_AVAILABLE
    unclean    a replica leads: ELECTION_NOT_NEEDED
               none does (Raft elects in-sync replicas only): ELIGIBLE_LEADERS_NOT_AVAILABLE

An unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from typing import Any

from wire.errors import ErrorCode
from wire.messages.elect_leaders import ElectLeadersRequest, ElectLeadersResponse

PartitionResult = ElectLeadersResponse.PartitionResult
TopicResult = ElectLeadersResponse.ReplicaElectionResult

API_KEY = 43
MIN_VERSION = 0
MAX_VERSION = 2
REQUEST = ElectLeadersRequest

_PREFERRED, _UNCLEAN = 0, 1
_BY_ITSELF = ("leadership moves back to the preferred replica by itself once it has caught up; "
              "Krill elects no leader on request")


def handle(ctx: Any, request: ElectLeadersRequest) -> None:
    table = ctx.services.topics().topics
    if request.topic_partitions is None:
        asked = [(name, list(range(info.partitions))) for name, info in sorted(table.items())
                 if not info.internal]
    else:
        asked = [(t.topic, list(t.partitions)) for t in request.topic_partitions]
    unclean = request.election_type == _UNCLEAN
    results = []
    for topic, partitions in asked:
        info = table.get(topic)
        answers = []
        for index in partitions:
            if info is None or not 0 <= index < info.partitions:
                error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
            else:
                error, message = _answer(ctx.services.partition_leader(topic, index), unclean)
            answers.append(PartitionResult(partition_id=index, error_code=error,
                                           error_message=message))
        results.append(TopicResult(topic=topic, partition_result=answers))
    ctx.respond(ElectLeadersResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                     replica_election_results=results))


def _answer(leader: tuple[int, int, list[int], list[int]] | None,
            unclean: bool) -> tuple[ErrorCode, str | None]:
    if leader is None:  # a node of its own: it is every partition's only replica, and leads
        return ErrorCode.ELECTION_NOT_NEEDED, None
    node, _epoch, replicas, _isr = leader
    if unclean:
        if node >= 0:
            return ErrorCode.ELECTION_NOT_NEEDED, None
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "Raft elects among in-sync replicas only"
    if replicas and node == replicas[0]:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, _BY_ITSELF
