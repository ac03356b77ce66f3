"""OffsetFetch (key 9), versions 0-9.

v1 offsets from `__consumer_offsets` (v0 meant ZooKeeper in Kafka; both read the same store
here); v2 a null topic list means every committed partition, and a top-level error; v3 throttle
time; v4 same; v5 CommittedLeaderEpoch; v6 flexible; v7 RequireStable (a partition whose offset
a transaction holds pending, TxnOffsetCommit not yet committed, answers UNSTABLE_OFFSET_COMMIT
and the client retries; without it, the last committed offset); v8 several groups per request
(Groups in and out); v9 MemberId and MemberEpoch per group (KIP-848; ignored for classic
groups). A partition with no commit answers offset -1, as Kafka does.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import FetchedOffset, FetchOffsets
from actors.handlers.group_common import tell_coordinator
from actors.handlers.join import Join
from wire.errors import ErrorCode
from wire.messages.offset_fetch import OffsetFetchRequest, OffsetFetchResponse

Partition = OffsetFetchResponse.OffsetFetchResponsePartition
Topic = OffsetFetchResponse.OffsetFetchResponseTopic
Partitions = OffsetFetchResponse.OffsetFetchResponsePartitions
Topics = OffsetFetchResponse.OffsetFetchResponseTopics
Group = OffsetFetchResponse.OffsetFetchResponseGroup

API_KEY = 9
MIN_VERSION = 0
MAX_VERSION = 9
REQUEST = OffsetFetchRequest

_REQUIRE_STABLE_SINCE_VERSION = 7

# What one group's fetch came back with: (error, offsets).
_Fetched = tuple[ErrorCode, list[FetchedOffset]]


def handle(ctx: Any, request: OffsetFetchRequest) -> None:
    if ctx.version >= 8:
        queries = [(g.group_id, _wanted(g.topics)) for g in request.groups]
    else:
        topics = request.topics
        if ctx.version < 2 and topics is None:
            topics = []
        queries = [(request.group_id, _wanted(topics))]

    def done(results: list[_Fetched]) -> None:
        if ctx.version >= 8:
            groups = [
                Group(
                    group_id=group_id, topics=_topics(fetched, Topics, Partitions), error_code=error
                )
                for (group_id, _), (error, fetched) in zip(queries, results, strict=True)
            ]
            ctx.respond(OffsetFetchResponse(throttle_time_ms=0, groups=groups))
            return
        error, fetched = results[0]
        ctx.respond(
            OffsetFetchResponse(
                throttle_time_ms=0,
                error_code=error,
                topics=_topics(fetched, Topic, Partition, error if ctx.version < 2 else None),
            )
        )

    require_stable = ctx.version >= _REQUIRE_STABLE_SINCE_VERSION and request.require_stable
    join = Join(len(queries), done)
    for index, (group_id, wanted) in enumerate(queries):
        slot = join.slot(index)
        message = FetchOffsets(group_id, wanted, _answer(slot, wanted), with_error=True,
                               require_stable=require_stable)
        if not tell_coordinator(ctx, group_id, message):
            slot(_failed(wanted, ErrorCode.NOT_COORDINATOR))


def _wanted(topics: Any) -> list[tuple[str, int]] | None:
    if topics is None:
        return None
    return [(t.name, p) for t in topics for p in t.partition_indexes]


def _answer(slot: Any, wanted: list[tuple[str, int]] | None) -> Any:
    """The coordinator's answer; an error (NOT_COORDINATOR: the group's partition moved)
    reaches the client, which looks the coordinator up again, instead of an empty list it
    would take for "nothing committed"."""
    def answer(error: ErrorCode, fetched: list[FetchedOffset]) -> None:
        slot((error, fetched) if error == ErrorCode.NONE else _failed(wanted, error))
    return answer


def _failed(wanted: list[tuple[str, int]] | None, error: ErrorCode) -> _Fetched:
    # Before v2 there is no top-level error: each partition carries it (see _topics).
    return error, [FetchedOffset(t, p, None) for t, p in wanted or []]


def _topics(
    fetched: list[FetchedOffset],
    topic_cls: Any,
    partition_cls: Any,
    error: ErrorCode | None = None,
) -> list[Any]:
    by_topic: dict[str, list[Any]] = {}
    for f in fetched:
        v = f.value
        by_topic.setdefault(f.topic, []).append(
            partition_cls(
                partition_index=f.partition,
                committed_offset=v.offset if v is not None else -1,
                committed_leader_epoch=v.leader_epoch if v is not None else -1,
                metadata=v.metadata if v is not None else "",
                error_code=error or f.error,
            )
        )
    return [topic_cls(name=name, partitions=parts) for name, parts in by_topic.items()]
