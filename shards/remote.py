"""Stand-ins for actors another shard owns: their `tell()` makes a call (shards/calls/).

A handler asks `Services.partition()` for a partition's actor. On the owning shard that is
the local `Partition` ref; on any other shard it is a `RemotePartition`, whose `tell()` finds
the message's call module and sends it through the Router (shards/router.py) to the owner's
address. There the call's serve side rebuilds the message, tells the local actor, and sends
each reply back. Actors never see the difference (DESIGN.md §2–5):

    source shard                               owner shard
    Produce(records, acks, reply) --produce--> Partition: append        (phase 1)
      batch in the source's arena (received    reads the batch in place
      there, or copied); the header names it
                                  <-dispatched-  order fixed, page cache has the bytes,
                                                 the arena region is free again
                                  <--produced--  flushed: base offset   (phase 2)
    Read(offset, budget, reply)   ----read---->  Partition: where the bytes are
                                  <---read-----  (path, position, length): the source shard
                                                 opens the segment and sendfiles it itself
    (a long poll's first watch)   ----watch--->  one subscription per partition
                                  <----hwm-----  the high watermark moved (shards/watch.py)

No log bytes cross a pipe either way: a produced batch goes by reference into the source's
shared-memory arena (shards/arena.py; as a payload frame only when the arena is full), a
fetched one by file position. What crosses are small headers, gathered per loop turn; the
owner's "dispatched" rides with the next message to the source (usually "produced"), and the
"produced" answers of the produces that arrived in one pipe message leave together.

Controller messages (topics, producer ids) go to shard 0, which alone runs the Controller;
it broadcasts each new topic table to every shard in order, so every shard sees topic
changes in one order. Pipes are FIFO per shard pair, so requests from one connection to one
partition keep their order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shards.calls import PARTITION_SEND, controller, group
from shards.calls.base import Address

if TYPE_CHECKING:
    from shards.router import Router

__all__ = ["RemoteController", "RemoteCoordinator", "RemotePartition"]


class RemotePartition:
    """Stands in for a Partition actor at another address: `tell()` makes the call."""

    __slots__ = ("_router", "target", "topic", "index")

    def __init__(self, router: Router, target: Address, topic: str, index: int) -> None:
        self._router = router
        self.target = target
        self.topic = topic
        self.index = index

    def __repr__(self) -> str:
        return f"RemotePartition({self.topic}-{self.index} on {self.target})"

    def tell(self, message: Any) -> None:
        send = PARTITION_SEND.get(type(message))
        assert send is not None, f"no call for {type(message).__name__}"
        send(self._router, self.target, self.topic, self.index, message)


class RemoteController:
    """Stands in for the Controller, which runs on shard 0."""

    __slots__ = ("_router", "target")

    def __init__(self, router: Router, target: Address = 0) -> None:
        self._router = router
        self.target = target

    def tell(self, message: Any) -> None:
        controller.send(self._router, self.target, message)


class RemoteCoordinator:
    """Stands in for the GroupCoordinator at another address (calls/group.py)."""

    __slots__ = ("_router", "target")

    def __init__(self, router: Router, target: Address) -> None:
        self._router = router
        self.target = target

    def tell(self, message: Any) -> None:
        group.send(self._router, self.target, message)
