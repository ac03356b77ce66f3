"""list_offset: a ListOffsets lookup (`ListOffset`) on a partition another shard owns.

    ListOffsetCall(topic, partition, timestamp, leader epoch,  -->  Partition: the offset
                   committed)
                <-- ListOffsetAnswer(error, timestamp, offset, leader epoch)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import ListOffset, ListOffsetResult
from shards.calls.base import Address, Caller, Request, tell_partition
from wire.errors import ErrorCode

__all__ = ["KIND", "ListOffsetAnswer", "ListOffsetCall", "send", "serve"]

KIND = 5


class ListOffsetCall(NamedTuple):
    topic: str
    partition: int
    timestamp: int
    current_leader_epoch: int
    committed: bool  # read_committed: latest is the last stable offset


class ListOffsetAnswer(NamedTuple):
    error: int
    timestamp: int
    offset: int
    leader_epoch: int


def send(router: Caller, to: Address, topic: str, partition: int, m: ListOffset) -> None:
    def on_reply(body: Any, _frames: list[Any]) -> None:
        a = ListOffsetAnswer._make(body)
        m.reply(ListOffsetResult(ErrorCode(a.error), a.timestamp, a.offset, a.leader_epoch))

    call = ListOffsetCall(topic, partition, m.timestamp, m.current_leader_epoch, m.committed)
    router.call(to, KIND, call, [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = ListOffsetCall._make(body)

    def reply(r: ListOffsetResult) -> None:
        request.answer(ListOffsetAnswer(int(r.error), r.timestamp, r.offset, r.leader_epoch))

    message = ListOffset(call.timestamp, call.current_leader_epoch, reply, call.committed)
    if not tell_partition(request, call.topic, call.partition, message):
        reply(ListOffsetResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
