"""watch: a subscription to a partition another shard owns, answered when it moves.

    WatchCall(topic, partition, seen)  -->  the owner's watermark table (shards/watch.py)
                <-- WatchAnswer(high watermark)   once past `seen`; GONE: no such partition

One per (partition, shard pair) at a time, whatever the number of long polls waiting: the
subscriber's `WatchService` sends it and the owner's serves it (shards/watch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from shards.calls.base import Address, Caller, Request

__all__ = ["KIND", "WatchAnswer", "WatchCall", "send", "serve"]

KIND = 4


class WatchCall(NamedTuple):
    topic: str
    partition: int
    seen: int  # the high watermark the subscriber last read


class WatchAnswer(NamedTuple):
    high_watermark: int  # GONE (shards/watch.py): the partition is not on its owner


def send(
    router: Caller, to: Address, topic: str, partition: int, seen: int,
    answered: Callable[[int], None],
) -> None:  # fmt: skip
    """Subscribe; `answered(high watermark)` once the owner's passes `seen`."""

    def on_reply(body: Any, _frames: list[Any]) -> None:
        answered(WatchAnswer._make(body).high_watermark)

    router.call(to, KIND, WatchCall(topic, partition, seen), [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = WatchCall._make(body)
    request.router.shard.long_polls.serve(
        call.topic, call.partition, call.seen, lambda hwm: request.answer(WatchAnswer(hwm))
    )
