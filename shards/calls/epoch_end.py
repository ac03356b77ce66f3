"""epoch_end: OffsetForLeaderEpoch's `EpochEndOffset` on a partition another shard owns.

    EpochEndCall(topic, partition, leader epoch, current leader epoch)  -->  Partition
                <-- EpochEndAnswer(error, leader epoch, end offset)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import EpochEndOffset
from shards.calls.base import Address, Caller, Request, tell_partition
from wire.errors import ErrorCode

__all__ = ["KIND", "EpochEndAnswer", "EpochEndCall", "send", "serve"]

KIND = 6


class EpochEndCall(NamedTuple):
    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int


class EpochEndAnswer(NamedTuple):
    error: int
    leader_epoch: int
    end_offset: int


def send(router: Caller, to: Address, topic: str, partition: int, m: EpochEndOffset) -> None:
    def on_reply(body: Any, _frames: list[Any]) -> None:
        a = EpochEndAnswer._make(body)
        m.reply((ErrorCode(a.error), a.leader_epoch, a.end_offset))

    call = EpochEndCall(topic, partition, m.leader_epoch, m.current_leader_epoch)
    router.call(to, KIND, call, [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = EpochEndCall._make(body)

    def reply(r: tuple[ErrorCode, int, int]) -> None:
        request.answer(EpochEndAnswer(int(r[0]), r[1], r[2]))

    message = EpochEndOffset(call.leader_epoch, call.current_leader_epoch, reply)
    if not tell_partition(request, call.topic, call.partition, message):
        reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1))
