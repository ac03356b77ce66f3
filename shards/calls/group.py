"""group: a message to the GroupCoordinator of another shard (the one that owns the group's
`__consumer_offsets` partition).

    GroupCall()  + the message, without its reply, in the pipe codec's generic form
                   (shards/pipe_codec.py) as payload frame 0  -->  the coordinator
                <-- GroupAnswer()  + the arguments of each call of the reply, frame 0

The coordinator's messages (actors.group) are many and small and carry nested records, so
they cross generically rather than with a header each. Each call of the owner's reply comes
back as one answer, that call's arguments.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

from actors.handlers.join import send as tell
from shards import pipe_codec
from shards.calls.base import Address, Caller, Request

__all__ = ["KIND", "GroupAnswer", "GroupCall", "send", "serve"]

log = logging.getLogger(__name__)

KIND = 12


class GroupCall(NamedTuple):
    pass  # the message is payload frame 0


class GroupAnswer(NamedTuple):
    pass  # the reply's arguments are payload frame 0


def _with_reply(message: Any, reply: Any) -> Any:
    if hasattr(message, "_replace"):
        return message._replace(reply=reply)
    return dataclasses.replace(message, reply=reply)


def send(router: Caller, to: Address, message: Any) -> None:
    reply = message.reply

    def on_reply(_body: Any, frames: list[Any]) -> None:
        if reply is not None:
            reply(*pipe_codec.unpack(frames[0]))

    router.call(to, KIND, GroupCall(), [pipe_codec.pack(_with_reply(message, None))], on_reply)


def serve(request: Request, _body: Any, frames: list[Any]) -> None:
    def reply(*args: Any) -> None:
        request.answer(GroupAnswer(), [pipe_codec.pack(args)])

    message = _with_reply(pipe_codec.unpack(frames[0]), reply)
    shard = request.router.shard
    coordinator = shard.local_group_coordinator()
    if coordinator is None or not tell(coordinator, message):
        log.error(
            "shard %d has no group coordinator for a request from %s", shard.shard_id,
            request.source,
        )  # fmt: skip
