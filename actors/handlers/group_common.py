"""What the consumer-group handlers (keys 8-16, 28, 42, 47) share: finding a group's
coordinator, describing the client to it, and the partitions of an offset commit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.group.messages import CommitEntry
from actors.handlers.join import send
from wire.errors import ErrorCode

__all__ = ["CommitParts", "client_host", "tell_coordinator"]


def client_host(ctx: Any) -> str:
    """The client's address as Kafka reports it in DescribeGroups ("/127.0.0.1")."""
    peer = str(getattr(ctx.connection, "_peer", ""))
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host


def tell_coordinator(ctx: Any, group_id: str, message: Any) -> bool:
    """Send `message` to `group_id`'s coordinator; False if there is none to reach (the
    caller answers COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR)."""
    ref = ctx.services.group_coordinator(group_id)
    return ref is not None and send(ref, message)


class CommitParts:
    """The partitions of an OffsetCommit or TxnOffsetCommit, in request order: those of
    topics or partitions that do not exist answered UNKNOWN_TOPIC_OR_PARTITION here, the
    others sent to the coordinator as `entries`, whose answers `by_topic` puts back in
    place."""

    def __init__(self, ctx: Any, request_topics: Any, leader_epochs: bool) -> None:
        topics = ctx.services.topics().topics
        self.parts = [(t.name, p) for t in request_topics for p in t.partitions]
        self._errors: list[ErrorCode | None] = [None] * len(self.parts)
        self.entries: list[CommitEntry] = []
        for index, (topic, p) in enumerate(self.parts):
            info = topics.get(topic)
            if info is None or not 0 <= p.partition_index < info.partitions:
                self._errors[index] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            epoch = p.committed_leader_epoch if leader_epochs else -1
            self.entries.append(CommitEntry(topic, p.partition_index, p.committed_offset,
                                            epoch, p.committed_metadata))

    def by_topic(self, results: list[ErrorCode], partition: Callable[[int, ErrorCode], Any]
                 ) -> dict[str, list[Any]]:
        """topic -> `partition(index, error)` of each of its partitions, in request order;
        `results`: the coordinator's, one per entry."""
        it = iter(results)
        answered: dict[str, list[Any]] = {}
        for (topic, p), error in zip(self.parts, self._errors, strict=True):
            answered.setdefault(topic, []).append(
                partition(p.partition_index, error if error is not None else next(it)))
        return answered
