"""topics: the topic table, broadcast by shard 0's Controller to every other shard in order.

    TopicsCall()  + the table, packed, as payload frame 0  -->  every other shard:
                                                                on_topics_changed(table)
                <-- TopicsAnswer()   applied; the Controller's change completes when all have

Pipes are FIFO per shard pair, so every shard sees topic changes in one order. The table is a
payload frame, not the header: a table of thousands of topics is large. `info_to_wire` /
`info_from_wire` are also the controller calls' form of a topic (calls/controller.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from actors.cluster.commands import (
    moves_from_wire,
    moves_to_wire,
    replicas_from_wire,
    replicas_to_wire,
)
from actors.cluster.state import PlacedTopic
from actors.services import TopicInfo, TopicTable
from shards.calls.base import Caller, Request

__all__ = [
    "KIND", "TopicsAnswer", "TopicsCall", "broadcast", "info_from_wire", "info_to_wire", "serve",
    "table_from_wire", "table_to_wire",
]  # fmt: skip

KIND = 10


class TopicsCall(NamedTuple):
    pass  # the table is payload frame 0


class TopicsAnswer(NamedTuple):
    pass


def info_to_wire(t: TopicInfo) -> list[Any]:
    """A topic's fields; a cluster's topic (PlacedTopic) adds every partition's replicas and
    the moves under way."""
    value = [t.name, t.topic_id, t.partitions, t.configs, t.internal]
    if isinstance(t, PlacedTopic):
        value.append([replicas_to_wire(r) for r in t.replicas])
        value.append(moves_to_wire(t.moves))
    return value


def info_from_wire(value: list[Any]) -> TopicInfo:
    name, topic_id, partitions, configs, internal = value[:5]
    if len(value) > 5:
        replicas = tuple(replicas_from_wire(r) for r in value[5])
        return PlacedTopic(name, bytes(topic_id), partitions, dict(configs), internal,
                           replicas, moves_from_wire(value[6]))
    return TopicInfo(name, bytes(topic_id), partitions, dict(configs), internal)


def table_to_wire(table: TopicTable) -> bytes:
    value = [table.version, [info_to_wire(t) for t in table.topics.values()]]
    return msgpack.packb(value, use_bin_type=True)


def table_from_wire(packed: bytes | memoryview) -> TopicTable:
    version, topics = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    infos = [info_from_wire(t) for t in topics]
    return TopicTable({t.name: t for t in infos}, version)


def broadcast(router: Caller, table: TopicTable, done: Callable[[], None]) -> None:
    """Send the table to every other shard of the node; `done()` when all have applied it."""
    peers = router.peers()
    waiting = len(peers)

    def applied(_body: Any, _frames: list[Any]) -> None:
        nonlocal waiting
        waiting -= 1
        if waiting == 0:
            done()

    packed = table_to_wire(table)
    for peer in peers:
        router.call(peer, KIND, TopicsCall(), [packed], applied)


def serve(request: Request, _body: Any, frames: list[Any]) -> None:
    request.router.shard.on_topics_changed(table_from_wire(frames[0]))
    request.answer(TopicsAnswer())
