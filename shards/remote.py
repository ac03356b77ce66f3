"""Cross-core calls: actor messages to another shard of this node, over the SPSC pipes.

A handler asks `Services.partition()` for a partition's actor. On the owning shard that is
the local `Partition` ref; on any other shard it is a `RemotePartition`, whose `tell()` turns
the actor message into one pipe message (a msgpack header and raw payload frames) and keeps
the reply callable under a request id until the owner answers. The owner's `Router` rebuilds
the message, tells its local actor, and sends each reply back on its own pipe to the source.
Actors never see the difference (DESIGN.md §2–5):

    source shard                               owner shard
    Produce(records, acks, reply) --produce--> Partition: append        (phase 1)
                                  <-dispatched-  order fixed, page cache has the bytes
                                  <--produced--  flushed: base offset   (phase 2)
    Read(offset, budget, reply)   ----read---->  Partition: where the bytes are
                                  <---read-----  (path, position, length): the source shard
                                                 opens the segment and sendfiles it itself
    WatchHighWatermark(callback)  ----watch--->  one-shot watcher
                                  <----hwm-----  the high watermark moved

Controller messages (topics, producer ids) go to shard 0, which alone runs the Controller;
it broadcasts each new topic table to every shard in order, so every shard sees topic
changes in one order. Pipes are FIFO per shard pair, so requests from one connection to one
partition keep their order.

The message codecs live here rather than in `wire/` because they map `actors` message types,
which `wire/` may not import (DESIGN.md §1); their on-pipe form is plain msgpack.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from typing import Any

from actors.controller import (
    AllocateProducerId,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    TopicResult,
    TopicSpec,
)
from actors.handlers.join import send
from actors.partition import (
    EpochEndOffset,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
    WatchHighWatermark,
)
from actors.services import TopicInfo, TopicTable
from shards import limits
from storage import FileSlice
from wire.errors import ErrorCode
from wire.record_batch import iter_batches

__all__ = ["Router", "RemotePartition", "RemoteController", "table_to_wire", "table_from_wire"]

log = logging.getLogger(__name__)

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


def _result_to_wire(r: TopicResult) -> list[Any]:
    info = r.info
    packed = (
        None
        if info is None
        else [info.name, info.topic_id, info.partitions, info.configs, info.internal]
    )
    return [r.name, int(r.error), r.message, packed]


def _result_from_wire(value: list[Any]) -> TopicResult:
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

    def on_reply(header: dict[str, Any], _frames: list[Any]) -> bool:
        if header.get("k") == "dispatched":
            ref._router.dispatched += 1
            return True  # phase two, "produced", follows
        assert user_reply is not None
        user_reply(
            ProduceResult(
                ErrorCode(header["e"]), header["o"], header["lat"], header["lso"], header.get("m")
            )
        )
        return False

    ref._call(
        "produce", {"acks": m.acks}, [m.records], on_reply if user_reply is not None else None
    )


def _send_read(ref: RemotePartition, m: Read) -> None:
    budget = m.budget
    router = ref._router

    def on_reply(header: dict[str, Any], frames: list[Any]) -> None:
        error, hwm, start = ErrorCode(header["e"]), header["hwm"], header["lso"]
        records: Any = None
        where = header.get("slice")
        if where is not None:
            path, position, length = where
            fd = router.open_segment(path)
            records = None if fd is None else FileSlice(fd, position, length, path)
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


def _send_watch(ref: RemotePartition, m: WatchHighWatermark) -> None:
    ref._call("watch", {}, [], lambda _h, _f: m.callback())


def _send_list_offset(ref: RemotePartition, m: ListOffset) -> None:
    def on_reply(h: dict[str, Any], _f: list[Any]) -> None:
        m.reply(ListOffsetResult(ErrorCode(h["e"]), h["ts"], h["o"], h["le"]))

    ref._call("list_offset", {"ts": m.timestamp, "cle": m.current_leader_epoch}, [], on_reply)


def _send_epoch_end(ref: RemotePartition, m: EpochEndOffset) -> None:
    def on_reply(h: dict[str, Any], _f: list[Any]) -> None:
        m.reply((ErrorCode(h["e"]), h["le"], h["o"]))

    ref._call("epoch_end", {"le": m.leader_epoch, "cle": m.current_leader_epoch}, [], on_reply)


def _send_info(ref: RemotePartition, m: PartitionInfo) -> None:
    ref._call("info", {}, [], lambda h, _f: m.reply(h["info"]))


_PARTITION_REQUESTS: dict[type, Callable[[RemotePartition, Any], None]] = {
    Produce: _send_produce,
    Read: _send_read,
    WatchHighWatermark: _send_watch,
    ListOffset: _send_list_offset,
    EpochEndOffset: _send_epoch_end,
    PartitionInfo: _send_info,
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
        elif isinstance(message, AllocateProducerId):
            reply = message.reply
            router.call(0, {"t": "producer_id"}, [], lambda h, _f: reply(h["pid"]))
        else:
            raise AssertionError(f"no pipe form for {type(message).__name__}")


def _results_reply(reply: Callable[[list[TopicResult]], None]) -> Reply:
    return lambda h, _f: reply([_result_from_wire(r) for r in h["results"]])


# The router: both sides ------------------------------------------------------------------------


class Router:
    """One shard's end of every pipe: sends calls, matches replies, serves the owner side.

    `shard` is the local Shard (it implements actors.services.Services); `mesh` gives a writer
    per target shard.
    """

    def __init__(self, shard: Any, mesh: Any) -> None:
        self._shard = shard
        self._mesh = mesh
        self._next_id = 1
        self._pending: dict[int, Reply] = {}
        self._segments: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.dispatched = 0  # produce requests whose phase one came back (for tests, stats)
        self._incoming: dict[str, Callable[[int, dict[str, Any], list[Any]], None]] = {
            "reply": self._on_reply,
            "produce": self._serve_produce,
            "read": self._serve_read,
            "watch": self._serve_watch,
            "list_offset": self._serve_list_offset,
            "epoch_end": self._serve_epoch_end,
            "info": self._serve_info,
            "create_topics": self._serve_controller,
            "delete_topics": self._serve_controller,
            "create_partitions": self._serve_controller,
            "producer_id": self._serve_controller,
            "topics": self._serve_topics,
        }

    @property
    def pending_calls(self) -> int:
        return len(self._pending)

    # Sending ----------------------------------------------------------------------------------

    def call(
        self, target: int, header: dict[str, Any], payloads: list[Any], reply: Reply | None
    ) -> None:
        """Send a request; `reply(header, frames)` runs for each answer until it returns falsy."""
        if reply is not None:
            request_id = self._next_id
            self._next_id += 1
            self._pending[request_id] = reply
            header["id"] = request_id
        self._mesh.writer(target).send(header, payloads)

    def broadcast_topics(self, table: TopicTable, done: Callable[[], None]) -> None:
        """Send the table to every other shard; `done()` when all have applied it."""
        targets = [t for t in range(self._shard.shards) if t != self._shard.shard_id]
        waiting = len(targets)

        def applied(_header: dict[str, Any], _frames: list[Any]) -> bool:
            nonlocal waiting
            waiting -= 1
            if waiting == 0:
                done()
            return False

        wire_table = table_to_wire(table)
        for target in targets:
            self.call(target, {"t": "topics", "table": wire_table}, [], applied)

    def _answer(
        self,
        source: int,
        request: dict[str, Any],
        header: dict[str, Any],
        payloads: list[Any] | None = None,
    ) -> None:
        if "id" not in request:
            return  # the source expects no answer (acks=0)
        assert "t" not in header and "id" not in header, "keys reserved for routing"
        header["t"] = "reply"
        header["id"] = request["id"]
        self._mesh.writer(source).send(header, payloads or [])

    # Receiving --------------------------------------------------------------------------------

    def on_message(self, source: int, header: dict[str, Any], frames: list[Any]) -> None:
        handler = self._incoming.get(header.get("t", ""))
        if handler is None:
            log.error("pipe message of unknown type from shard %d: %r", source, header.get("t"))
            return
        handler(source, header, frames)

    def _on_reply(self, _source: int, header: dict[str, Any], frames: list[Any]) -> None:
        request_id = header["id"]
        reply = self._pending.get(request_id)
        if reply is None:
            log.error("reply to unknown request %d", request_id)
            return
        if not reply(header, frames):
            del self._pending[request_id]

    def _local(self, header: dict[str, Any]) -> Any:
        return self._shard.local_partition(header["topic"], header["p"])

    def _serve_produce(self, source: int, h: dict[str, Any], frames: list[Any]) -> None:
        # The pipe's frame is read-only: the log patches offsets in place, so copy it once.
        records = bytearray(frames[0])
        wants_reply = "id" in h

        def dispatched() -> None:
            self._answer(source, h, {"k": "dispatched"})

        def produced(result: ProduceResult) -> None:
            self._answer(
                source,
                h,
                {
                    "e": int(result.error),
                    "o": result.base_offset,
                    "lat": result.log_append_time_ms,
                    "lso": result.log_start_offset,
                    "m": result.message,
                },
            )

        try:
            headers = iter_batches(records, check_crc=False)  # checked by the source shard
        except Exception:  # our bug: the source validated these bytes
            log.exception("batches from shard %d do not parse", source)
            if wants_reply:
                produced(ProduceResult(ErrorCode.CORRUPT_MESSAGE))
            return
        ref = self._local(h)
        message = Produce(
            memoryview(records),
            headers,
            h["acks"],
            produced if wants_reply else None,
            dispatched if wants_reply else None,
        )
        if ref is None or not send(ref, message):
            if wants_reply:
                produced(ProduceResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _serve_read(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        budget = FetchBudget(h["rem"])
        budget.taken = h["taken"]

        def reply(result: ReadResult) -> None:
            answer: dict[str, Any] = {
                "e": int(result.error),
                "hwm": result.high_watermark,
                "lso": result.log_start_offset,
            }
            records = result.records
            payloads: list[Any] = []
            if isinstance(records, FileSlice):
                answer["slice"] = [records.path, records.position, records.length]
            elif records is not None:
                payloads = [records]
            self._answer(source, h, answer, payloads)

        ref = self._local(h)
        if ref is None or not send(ref, Read(h["o"], h["max"], h["cle"], budget, reply)):
            reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _serve_watch(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        def moved() -> None:
            self._answer(source, h, {})

        ref = self._local(h)
        if ref is None or not send(ref, WatchHighWatermark(moved)):
            moved()

    def _serve_list_offset(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        def reply(r: ListOffsetResult) -> None:
            self._answer(
                source,
                h,
                {"e": int(r.error), "ts": r.timestamp, "o": r.offset, "le": r.leader_epoch},
            )

        ref = self._local(h)
        if ref is None or not send(ref, ListOffset(h["ts"], h["cle"], reply)):
            reply(ListOffsetResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _serve_epoch_end(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        def reply(r: tuple[ErrorCode, int, int]) -> None:
            self._answer(source, h, {"e": int(r[0]), "le": r[1], "o": r[2]})

        ref = self._local(h)
        if ref is None or not send(ref, EpochEndOffset(h["le"], h["cle"], reply)):
            reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1))

    def _serve_info(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        ref = self._local(h)
        if ref is None or not send(
            ref, PartitionInfo(lambda info: self._answer(source, h, {"info": info}))
        ):
            self._answer(source, h, {"info": None})

    def _serve_controller(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        controller = self._shard.controller()
        kind = h["t"]

        def results(rs: list[TopicResult]) -> None:
            self._answer(source, h, {"results": [_result_to_wire(r) for r in rs]})

        if kind == "create_topics":
            specs = [
                TopicSpec(n, p, rf, [tuple(a) for a in asg], dict(cfg))
                for n, p, rf, asg, cfg in h["specs"]
            ]
            controller.tell(CreateTopics(specs, h["vo"], results))
        elif kind == "delete_topics":
            ids = [None if i is None else bytes(i) for i in h["ids"]]
            controller.tell(DeleteTopics(list(h["names"]), ids, results))
        elif kind == "create_partitions":
            controller.tell(CreatePartitions([tuple(c) for c in h["counts"]], h["vo"], results))
        else:
            controller.tell(AllocateProducerId(lambda pid: self._answer(source, h, {"pid": pid})))

    def _serve_topics(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        self._shard.on_topics_changed(table_from_wire(h["table"]))
        self._answer(source, h, {})

    # Segment files of other shards -----------------------------------------------------------

    def open_segment(self, path: str) -> int | None:
        """An fd for a segment another shard owns, cached; None if it is gone (deleted)."""
        fd = self._segments.get(path)
        if fd is not None:
            self._segments.move_to_end(path)
            return fd
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        self._segments[path] = fd
        if len(self._segments) > limits.remote_segment_fds_max:
            _, oldest = self._segments.popitem(last=False)
            os.close(oldest)
        return fd

    def forget_segments(self, prefix: str) -> None:
        """Close cached fds under `prefix` (a deleted topic's partition directory)."""
        for path in [p for p in self._segments if p.startswith(prefix)]:
            os.close(self._segments.pop(path))

    def close(self) -> None:
        for fd in self._segments.values():
            os.close(fd)
        self._segments.clear()
