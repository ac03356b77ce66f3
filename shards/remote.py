"""Cross-core calls: actor messages to another shard of this node, over the SPSC pipes.

A handler asks `Services.partition()` for a partition's actor. On the owning shard that is
the local `Partition` ref; on any other shard it is a `RemotePartition`, whose `tell()` turns
the actor message into one pipe message (a msgpack header and raw payload frames) and keeps
the reply callable under a request id until the owner answers. The owner's `Router`
(shards/router.py) rebuilds the message, tells its local actor, and sends each reply back on
its own pipe to the source.
Actors never see the difference (DESIGN.md §2–5):

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

The message codecs live here rather than in `wire/` because they map `actors` message types,
which `wire/` may not import (DESIGN.md §1); their on-pipe form is plain msgpack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.controller import (
    AllocateProducerId,
    AlterTopicConfigs,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    TopicResult,
)
from actors.partition import (
    DeleteRecords,
    EpochEndOffset,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
)
from actors.services import TopicInfo, TopicTable
from shards import pipe_codec
from storage import FileSlice
from wire.errors import ErrorCode

if TYPE_CHECKING:
    from shards.router import Router

__all__ = [
    "RemotePartition",
    "RemoteController",
    "RemoteCoordinator",
    "Reply",
    "result_from_wire",
    "result_to_wire",
    "table_from_wire",
    "table_to_wire",
]


# Handles one answer to a request; returns True to keep waiting for more (a produce's
# "dispatched" comes before its "produced").
Reply = Callable[[dict[str, Any], list[Any]], "bool | None"]


# Topic tables and results on the wire ------------------------------------------------------


def table_to_wire(table: TopicTable) -> dict[str, Any]:
    return {
        "version": table.version,
        "topics": [
            [t.name, t.topic_id, t.partitions, t.configs, t.internal] for t in table.topics.values()
        ],
    }


def table_from_wire(value: dict[str, Any]) -> TopicTable:
    topics = {
        name: TopicInfo(name, bytes(topic_id), partitions, dict(configs), internal)
        for name, topic_id, partitions, configs, internal in value["topics"]
    }
    return TopicTable(topics, value["version"])


def result_to_wire(r: TopicResult) -> list[Any]:
    info = r.info
    packed = (
        None
        if info is None
        else [info.name, info.topic_id, info.partitions, info.configs, info.internal]
    )
    return [r.name, int(r.error), r.message, packed]


def result_from_wire(value: list[Any]) -> TopicResult:
    name, error, message, packed = value
    info = (
        None
        if packed is None
        else TopicInfo(packed[0], bytes(packed[1]), packed[2], dict(packed[3]), packed[4])
    )
    return TopicResult(name, ErrorCode(error), message, info)


# The source side -----------------------------------------------------------------------------


class RemotePartition:
    """Stands in for a Partition actor owned by another shard: `tell()` crosses the pipe."""

    __slots__ = ("_router", "target", "topic", "index")

    def __init__(self, router: Router, target: int, topic: str, index: int) -> None:
        self._router = router
        self.target = target
        self.topic = topic
        self.index = index

    def __repr__(self) -> str:
        return f"RemotePartition({self.topic}-{self.index} on shard {self.target})"

    def tell(self, message: Any) -> None:
        encode = _PARTITION_REQUESTS.get(type(message))
        assert encode is not None, f"no pipe form for {type(message).__name__}"
        encode(self, message)

    def _call(
        self, kind: str, fields: dict[str, Any], payloads: list[Any], reply: Reply | None
    ) -> None:
        header = {"t": kind, "topic": self.topic, "p": self.index, **fields}
        self._router.call(self.target, header, payloads, reply)


def _send_produce(ref: RemotePartition, m: Produce) -> None:
    user_reply = m.reply
    router = ref._router
    region: int | None = None  # a region of our own, to free on the first answer
    where = router.arena_offset(m.records) if m.on_dispatched is not None else None
    if where is None:
        where = region = router.arena_put(m.records)
    # else: received into our arena, held by the caller until on_dispatched: pass it on
    first = True

    def on_reply(header: dict[str, Any], _frames: list[Any]) -> bool:
        nonlocal first
        if first:  # whichever answer comes first, the owner is done with the batch by then
            first = False
            if region is not None:
                router.arena_release(region)
            if m.on_dispatched is not None:
                m.on_dispatched()
        if header.get("k") == "dispatched":
            router.dispatched += 1
            return user_reply is not None  # phase two, "produced", follows unless acks=0
        if "d" in header:  # "produced", with phase one in it (it had not left yet)
            router.dispatched += 1
        if user_reply is not None:
            user_reply(
                ProduceResult(
                    ErrorCode(header["e"]), header["o"], header["lat"], header["lso"],
                    header.get("m"),
                )
            )  # fmt: skip
        return False

    if where is None:
        fields: dict[str, Any] = {"acks": m.acks}
        payloads = [m.records]
    else:  # the batches are in this shard's arena; the owner reads them there
        fields = {"acks": m.acks, "a": [where, m.records.nbytes]}
        payloads = []
    # With acks=0 and a payload frame nothing need come back; a region must, to be freed.
    wants_reply = user_reply is not None or where is not None or m.on_dispatched is not None
    ref._call("produce", fields, payloads, on_reply if wants_reply else None)


def _send_read(ref: RemotePartition, m: Read) -> None:
    budget = m.budget
    router = ref._router

    def on_reply(header: dict[str, Any], frames: list[Any]) -> None:
        error, hwm, start = ErrorCode(header["e"]), header["hwm"], header["lso"]
        records: Any = None
        where = header.get("slice")
        if where is not None:
            path, position, length, count, inode = where
            file = router.open_segment(path, inode)
            if file is not None:
                records = FileSlice(file.fd, position, length, path, count, inode, file)
        elif frames:
            records = memoryview(frames[0])
        result = ReadResult(error, hwm, start, records)
        size = result.size
        if size > budget.remaining and budget.taken:
            result = ReadResult(error, hwm, start)  # only a response's first batch may overflow
            size = 0
        budget.remaining -= size
        budget.taken += size
        m.reply(result)

    fields = {"o": m.offset, "max": m.max_bytes, "cle": m.current_leader_epoch}
    fields["rem"], fields["taken"] = budget.remaining, budget.taken
    ref._call("read", fields, [], on_reply)


def _send_list_offset(ref: RemotePartition, m: ListOffset) -> None:
    def on_reply(h: dict[str, Any], _f: list[Any]) -> None:
        m.reply(ListOffsetResult(ErrorCode(h["e"]), h["ts"], h["o"], h["le"]))

    ref._call("list_offset", {"ts": m.timestamp, "cle": m.current_leader_epoch}, [], on_reply)


def _send_delete_records(ref: RemotePartition, m: DeleteRecords) -> None:
    def on_reply(h: dict[str, Any], _f: list[Any]) -> None:
        m.reply((ErrorCode(h["e"]), h["lw"]))

    ref._call("delete_records", {"o": m.offset}, [], on_reply)


def _send_epoch_end(ref: RemotePartition, m: EpochEndOffset) -> None:
    def on_reply(h: dict[str, Any], _f: list[Any]) -> None:
        m.reply((ErrorCode(h["e"]), h["le"], h["o"]))

    ref._call("epoch_end", {"le": m.leader_epoch, "cle": m.current_leader_epoch}, [], on_reply)


def _send_info(ref: RemotePartition, m: PartitionInfo) -> None:
    ref._call("info", {}, [], lambda h, _f: m.reply(h["info"]))


_PARTITION_REQUESTS: dict[type, Callable[[RemotePartition, Any], None]] = {
    Produce: _send_produce,
    Read: _send_read,
    ListOffset: _send_list_offset,
    EpochEndOffset: _send_epoch_end,
    PartitionInfo: _send_info,
    DeleteRecords: _send_delete_records,
}


class RemoteController:
    """Stands in for the Controller on shard 0."""

    __slots__ = ("_router",)

    def __init__(self, router: Router) -> None:
        self._router = router

    def tell(self, message: Any) -> None:
        router = self._router
        if isinstance(message, CreateTopics):
            specs = [
                [s.name, s.partitions, s.replication_factor, s.assignments, s.configs]
                for s in message.specs
            ]
            header = {"t": "create_topics", "specs": specs, "vo": message.validate_only}
            router.call(0, header, [], _results_reply(message.reply))
        elif isinstance(message, DeleteTopics):
            header = {"t": "delete_topics", "names": message.names, "ids": message.ids}
            router.call(0, header, [], _results_reply(message.reply))
        elif isinstance(message, CreatePartitions):
            header = {
                "t": "create_partitions",
                "counts": message.counts,
                "vo": message.validate_only,
            }
            router.call(0, header, [], _results_reply(message.reply))
        elif isinstance(message, AlterTopicConfigs):
            header = {
                "t": "alter_configs",
                "changes": [[name, [list(op) for op in ops]] for name, ops in message.changes],
                "replace": message.replace,
                "vo": message.validate_only,
            }
            router.call(0, header, [], _results_reply(message.reply))
        elif isinstance(message, AllocateProducerId):
            reply = message.reply
            router.call(0, {"t": "producer_id"}, [], lambda h, _f: reply(h["pid"]))
        else:
            raise AssertionError(f"no pipe form for {type(message).__name__}")


class RemoteCoordinator:
    """Stands in for the GroupCoordinator of another shard. Its messages (actors.group) are
    plain records with a `reply` callable: the record crosses in the pipe codec's generic
    form, and each call of the owner's reply comes back as that call's arguments."""

    __slots__ = ("_router", "target")

    def __init__(self, router: Router, target: int) -> None:
        self._router = router
        self.target = target

    def tell(self, message: Any) -> None:
        reply = message.reply
        if hasattr(message, "_replace"):
            bare = message._replace(reply=None)
        else:
            bare = dataclasses.replace(message, reply=None)

        def on_reply(header: dict[str, Any], frames: list[Any]) -> bool:
            if reply is not None:
                reply(*pipe_codec.unpack(frames[0]))
            return False

        self._router.call(self.target, {"t": "group"}, [pipe_codec.pack(bare)], on_reply)


def _results_reply(reply: Callable[[list[TopicResult]], None]) -> Reply:
    return lambda h, _f: reply([result_from_wire(r) for r in h["results"]])
