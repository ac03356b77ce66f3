"""delete_records: DeleteRecords' `DeleteRecords` on a partition another shard owns.

    DeleteRecordsCall(topic, partition, offset)  -->  Partition: move the log start
                <-- DeleteRecordsAnswer(error, low watermark)   once the new start is durable
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import DeleteRecords
from shards.calls.base import Address, Caller, Request, tell_partition
from wire.errors import ErrorCode

__all__ = ["KIND", "DeleteRecordsAnswer", "DeleteRecordsCall", "send", "serve"]

KIND = 7


class DeleteRecordsCall(NamedTuple):
    topic: str
    partition: int
    offset: int  # -1: the high watermark


class DeleteRecordsAnswer(NamedTuple):
    error: int
    low_watermark: int


def send(router: Caller, to: Address, topic: str, partition: int, m: DeleteRecords) -> None:
    def on_reply(body: Any, _frames: list[Any]) -> None:
        a = DeleteRecordsAnswer._make(body)
        m.reply((ErrorCode(a.error), a.low_watermark))

    router.call(to, KIND, DeleteRecordsCall(topic, partition, m.offset), [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = DeleteRecordsCall._make(body)

    def reply(r: tuple[ErrorCode, int]) -> None:
        request.answer(DeleteRecordsAnswer(int(r[0]), r[1]))

    if not tell_partition(request, call.topic, call.partition, DeleteRecords(call.offset, reply)):
        reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))
