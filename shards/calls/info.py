"""info: `PartitionInfo` (a dict of offsets, for describe tools and tests) of a partition
another shard owns.

    InfoCall(topic, partition)  -->  Partition
                <-- InfoAnswer(the partition's info dict; None: no such partition here)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import PartitionInfo
from shards.calls.base import Address, Caller, Request, tell_partition

__all__ = ["KIND", "InfoAnswer", "InfoCall", "send", "serve"]

KIND = 8


class InfoCall(NamedTuple):
    topic: str
    partition: int


class InfoAnswer(NamedTuple):
    info: dict[str, int] | None


def send(router: Caller, to: Address, topic: str, partition: int, m: PartitionInfo) -> None:
    def on_reply(body: Any, _frames: list[Any]) -> None:
        m.reply(InfoAnswer._make(body).info)  # type: ignore[arg-type]  # None: not there

    router.call(to, KIND, InfoCall(topic, partition), [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = InfoCall._make(body)

    def reply(info: dict[str, int] | None) -> None:
        request.answer(InfoAnswer(info))

    if not tell_partition(request, call.topic, call.partition, PartitionInfo(reply)):
        reply(None)
