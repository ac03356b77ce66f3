"""The Router: one shard's end of every pipe (see shards/remote.py for the picture).

It sends the calls that `RemotePartition` and `RemoteController` make and matches each
answer to its request by id; and it serves the owner side: it rebuilds the actor message a
peer sent, tells the local actor, and sends each reply back on the pipe to that peer.
Segment files of other shards are opened here, by path, for cross-core fetches.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import msgpack

from actors.controller import (
    AllocateProducerId,
    AlterTopicConfigs,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    TopicResult,
    TopicSpec,
)
from actors.handlers.join import send
from actors.partition import (
    DeleteRecords,
    EpochEndOffset,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
)
from actors.runtime import current_loop
from actors.services import TopicTable
from actors.topic_config import Operation
from shards import limits, pipe_codec
from shards.arena import ArenaSet
from shards.pipes import PipeBroken
from shards.remote import Reply, result_to_wire, table_from_wire, table_to_wire
from storage import FileSlice
from storage.page_cache import no_readahead
from storage.segment import OpenFile
from wire.errors import DecodeError, ErrorCode
from wire.record_batch import iter_batches

__all__ = ["Router"]

log = logging.getLogger(__name__)


class Router:
    """One shard's end of every pipe: sends calls, matches replies, serves the owner side.

    `shard` is the local Shard (it implements actors.services.Services); `mesh` gives a writer
    per target shard; `arenas` (shards/arena.py), when given, carry produced batches by
    reference instead of as payload frames.
    """

    def __init__(self, shard: Any, mesh: Any, arenas: ArenaSet | None = None) -> None:
        self._shard = shard
        self._mesh = mesh
        self._arenas = arenas
        self.arena_misses = 0  # batches that found no room in the arena and went as frames
        self._next_id = 1
        self._pending: dict[int, Reply] = {}
        # Messages for each target gathered during one loop turn, sent as one pipe message.
        self._outbox: dict[int, list[tuple[dict[str, Any], list[Any]]]] = {}
        self._flush_scheduled = False
        # Phase-one answers waiting for a ride to their shard, by request id (`_answer_lazily`).
        self._lazy: dict[int, dict[int, dict[str, Any]]] = {}
        self._lazy_timers: dict[int, Any] = {}
        self._group: _AnswerGroup | None = None  # while serving a batch message
        # Other shards' segment files open for sendfile: path -> (file, inode).
        self._segments: collections.OrderedDict[str, tuple[OpenFile, int]]
        self._segments = collections.OrderedDict()
        self.dispatched = 0  # produce requests whose phase one came back (for tests, stats)
        self._incoming: dict[str, Callable[[int, dict[str, Any], list[Any]], None]] = {
            "reply": self._on_reply,
            "produce": self._serve_produce,
            "read": self._serve_read,
            "watch": self._serve_watch,
            "list_offset": self._serve_list_offset,
            "epoch_end": self._serve_epoch_end,
            "delete_records": self._serve_delete_records,
            "info": self._serve_info,
            "create_topics": self._serve_controller,
            "delete_topics": self._serve_controller,
            "create_partitions": self._serve_controller,
            "alter_configs": self._serve_controller,
            "producer_id": self._serve_controller,
            "topics": self._serve_topics,
            "forget_segments": self._serve_forget_segments,
            "batch": self._serve_batch,
            "group": self._serve_group,
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
        self._send(target, header, payloads)

    def _send(self, target: int, header: dict[str, Any], payloads: list[Any]) -> None:
        """Queue a message for `target`; everything queued in one loop turn leaves together.

        A hop between processes costs ~100 µs (DESIGN.md §11), so what crosses carries a
        batch: one produce request spanning six partitions, its six phase-one answers, and
        the phase-two answers that one flush releases each become one pipe message per peer.
        """
        outbox = self._outbox.setdefault(target, [])
        outbox.append((header, payloads))
        if len(outbox) >= limits.pipe_batch_messages_max:
            self._flush_target(target)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            current_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for target in list(self._outbox):
            self._flush_target(target)

    def _flush_target(self, target: int) -> None:
        messages = self._outbox.pop(target, None)
        if not messages:
            return
        lazy = self._take_lazy(target)
        if len(lazy) + len(messages) <= limits.pipe_batch_messages_max:
            messages = lazy + messages  # phase-one answers first: they are the older
        elif lazy:
            self._write(target, lazy)
        self._write(target, messages)

    def _write(self, target: int, messages: list[tuple[dict[str, Any], list[Any]]]) -> None:
        """One pipe message: the message itself, or a "batch" of them."""
        writer = self._mesh.writer(target)
        if len(messages) == 1:
            header, payloads = messages[0]
            writer.send(header, payloads)
            return
        frames: list[Any] = []
        for _, payloads in messages:
            frames.extend(payloads)
        writer.send({"t": "batch", "m": [[h, len(p)] for h, p in messages]}, frames)

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

        # In a payload frame, not the header: a table of thousands of topics is large.
        packed = msgpack.packb(table_to_wire(table), use_bin_type=True)
        for target in targets:
            self.call(target, {"t": "topics"}, [packed], applied)

    def _answer_lazily(self, source: int, request: dict[str, Any], header: dict[str, Any]) -> None:
        """Answer without a pipe message of its own: ride with the next one to `source`.

        For phase one of a produce. Its answer frees the source's arena region and nothing
        waits on it (pipes are FIFO, so the source dispatches its next request at once), while
        every pipe message costs both shards a wake-up of their loop and of ZeroMQ's I/O
        thread (~70 µs of CPU here). So "dispatched" leaves with the next message to that
        shard, usually the same request's "produced" after its flush, and at the latest
        `pipe_lazy_answer_delay_s` after it was made. If the same request's "produced" is
        sent first, it takes phase one along in itself (`_answer_produced`).
        """
        if "id" not in request:
            return
        header["t"] = "reply"
        header["id"] = request["id"]
        lazy = self._lazy.get(source)
        if lazy is None:
            lazy = self._lazy[source] = {}
            self._lazy_timers[source] = current_loop().call_later(
                limits.pipe_lazy_answer_delay_s, self._flush_lazy, source
            )
        lazy[request["id"]] = header
        if len(lazy) >= limits.pipe_batch_messages_max:
            self._flush_lazy(source)

    def _take_lazy(self, target: int) -> list[tuple[dict[str, Any], list[Any]]]:
        """The phase-one answers waiting for `target`, their timer cancelled."""
        lazy = self._lazy.pop(target, None)
        timer = self._lazy_timers.pop(target, None)
        if timer is not None:
            timer.cancel()
        return [(header, []) for header in lazy.values()] if lazy else []

    def _answer_produced(
        self, source: int, request: dict[str, Any], header: dict[str, Any]
    ) -> None:
        """Phase two of a produce. If its phase one still waits for a ride, this answer
        carries both ("d"): one answer for the source to handle instead of two."""
        lazy = self._lazy.get(source)
        if lazy and lazy.pop(request.get("id", -1), None) is not None:
            header["d"] = 1
            if not lazy:
                self._take_lazy(source)  # nothing left to wait for: drop the timer
        self._answer(source, request, header)

    def _flush_lazy(self, target: int) -> None:
        lazy = self._take_lazy(target)
        if lazy:
            self._write(target, lazy)

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
        self._send(source, header, payloads or [])

    # Receiving --------------------------------------------------------------------------------

    def on_message(self, source: int, header: dict[str, Any], frames: list[Any]) -> None:
        kind = header.get("t", "") if isinstance(header, dict) else None
        handler = self._incoming.get(kind) if isinstance(kind, str) else None
        if handler is None:
            # Only our own shards write here: our bug, and its sender waits for an answer.
            raise PipeBroken(f"message of unknown type {kind!r}")
        handler(source, header, frames)

    def _serve_batch(self, source: int, header: dict[str, Any], frames: list[Any]) -> None:
        # The produces in one pipe message (usually one request's partitions owned here) are
        # answered together: one message back instead of one per partition's flush.
        self._group = group = _AnswerGroup()
        try:
            position = 0
            for sub_header, count in header["m"]:
                self.on_message(source, sub_header, frames[position : position + count])
                position += count
        finally:
            self._group = None
            group.close()

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
        where = h.get("a")
        if where is not None:  # in the source's arena, ours until we answer
            assert self._arenas is not None, "arena region from a peer, but no arenas here"
            records = self._arenas.peer_view(source, where[0], where[1])
        else:
            # The pipe's frame is read-only: the log patches offsets in place, so copy it once.
            records = memoryview(bytearray(frames[0]))
        wants_reply = "id" in h
        acks = h["acks"]

        def dispatched() -> None:
            self._answer_lazily(source, h, {"k": "dispatched"})

        def answer_produced(result: ProduceResult) -> None:
            self._answer_produced(
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

        produced: Callable[[ProduceResult], None] = answer_produced
        # A write-caching topic answers at append time: it must not wait for others' flushes.
        if (
            self._group is not None
            and wants_reply
            and acks != 0
            and not self._shard.write_caching(h["topic"])
        ):
            produced = self._group.member(answer_produced)

        def refused(result: ProduceResult) -> None:
            # One answer either way; with acks=0 the source only waits to free its region.
            if not wants_reply:
                return
            if acks != 0:
                produced(result)
            else:
                dispatched()

        try:
            headers = iter_batches(records, check_crc=False)  # checked by the source shard
        except DecodeError:  # our bug: the source shard validated these bytes
            log.exception("batches from shard %d do not parse", source)
            refused(ProduceResult(ErrorCode.CORRUPT_MESSAGE))
            return
        ref = self._local(h)
        # The partition appends in the turn it takes the message, before "dispatched" can
        # leave this shard: so "dispatched" also tells the source its region is free.
        message = Produce(
            records,
            headers,
            acks,
            produced if wants_reply and acks != 0 else None,
            dispatched if wants_reply else None,
        )
        if ref is None or not send(ref, message):
            refused(ProduceResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    # Arena regions of this shard (the source side of a cross-core produce) ---------------

    def arena_put(self, records: memoryview) -> int | None:
        """Copy `records` into this shard's arena; the region's offset, or None: no room."""
        if self._arenas is None:
            return None
        arena = self._arenas.own
        start = arena.put(records)
        if start is None:
            self.arena_misses += 1
            if self.arena_misses % limits.arena_miss_log_every == 1:
                log.info(
                    "arena full (%d of %d bytes in %d regions): %d batches sent as frames",
                    arena.used, arena.size, arena.live_regions, self.arena_misses,
                )  # fmt: skip
        return start

    def arena_offset(self, records: memoryview) -> int | None:
        """Where `records` are in this shard's arena, if they were received into it."""
        return None if self._arenas is None else self._arenas.own.offset_of(records)

    def arena_release(self, start: int) -> None:
        assert self._arenas is not None
        self._arenas.own.release(start)

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
                answer["slice"] = [
                    records.path, records.position, records.length, records.records,
                    records.inode,
                ]
            elif records is not None:
                payloads = [records]
            self._answer(source, h, answer, payloads)

        ref = self._local(h)
        if ref is None or not send(ref, Read(h["o"], h["max"], h["cle"], budget, reply)):
            reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _serve_watch(self, source: int, h: dict[str, Any], _frames: list[Any]) -> None:
        # A peer's long polls subscribe to one of our partitions (shards/watch.py).
        self._shard.long_polls.serve(h, lambda hwm: self._answer(source, h, {"hwm": hwm}))

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

    def _serve_delete_records(self, source: int, h: dict[str, Any], _f: list[Any]) -> None:
        def reply(r: tuple[ErrorCode, int]) -> None:
            self._answer(source, h, {"e": int(r[0]), "lw": r[1]})

        ref = self._local(h)
        if ref is None or not send(ref, DeleteRecords(h["o"], reply)):
            reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))

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
            self._answer(source, h, {"results": [result_to_wire(r) for r in rs]})

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
        elif kind == "alter_configs":
            changes = [(name, [Operation(*op) for op in ops]) for name, ops in h["changes"]]
            controller.tell(AlterTopicConfigs(changes, h["replace"], h["vo"], results))
        else:
            controller.tell(AllocateProducerId(lambda pid: self._answer(source, h, {"pid": pid})))

    def _serve_group(self, source: int, h: dict[str, Any], frames: list[Any]) -> None:
        message = pipe_codec.unpack(frames[0])

        def reply(*args: Any) -> None:
            self._answer(source, h, {}, [pipe_codec.pack(args)])

        if hasattr(message, "_replace"):
            message = message._replace(reply=reply)
        else:
            message = dataclasses.replace(message, reply=reply)
        coordinator = self._shard.local_group_coordinator()
        if coordinator is None or not send(coordinator, message):
            log.error(
                "shard %d has no group coordinator for a request from %d",
                self._shard.shard_id,
                source,
            )

    def _serve_topics(self, source: int, h: dict[str, Any], frames: list[Any]) -> None:
        table = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
        self._shard.on_topics_changed(table_from_wire(table))
        self._answer(source, h, {})

    # Segment files of other shards -----------------------------------------------------------

    def open_segment(self, path: str, inode: int) -> OpenFile | None:
        """An open segment file another shard owns, cached; None if that file is gone
        (deleted, or another file at its path: a topic deleted and made again). The fd
        stays open while a FileSlice holds the OpenFile, though the cache let it go."""
        cached = self._segments.get(path)
        if cached is not None:
            if cached[1] == inode:
                self._segments.move_to_end(path)
                return cached[0]
            del self._segments[path]
        try:
            file = OpenFile(os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            return None
        no_readahead(file.fd)  # as the owner's own fd (storage/page_cache.py)
        if os.fstat(file.fd).st_ino != inode:
            return None
        self._segments[path] = (file, inode)
        if len(self._segments) > limits.remote_segment_fds_max:
            self._segments.popitem(last=False)
        return file

    def broadcast_removed_segments(self, paths: list[str]) -> None:
        """Segment files this shard removed (retention, compaction): every other shard lets
        go of its cached fd for them now, so their disk space is freed when the owner
        deletes them, not when the cache would have evicted them (up to
        `remote_segment_fds_max` segments' worth)."""
        for target in range(self._shard.shards):
            if target != self._shard.shard_id:
                self.call(target, {"t": "forget_segments", "paths": paths}, [], None)

    def _serve_forget_segments(self, _source: int, h: dict[str, Any], _f: list[Any]) -> None:
        for path in h["paths"]:
            self._segments.pop(path, None)

    def forget_segments(self, prefix: str) -> None:
        """Let go of cached files under `prefix` (a deleted topic's partition directory)."""
        for path in [p for p in self._segments if p.startswith(prefix)]:
            del self._segments[path]

    def close(self) -> None:
        self._segments.clear()


class _AnswerGroup:
    """Holds the phase-two answers of the produces that came in one pipe message until every
    one of them is ready, then sends them in the same loop turn, so in one pipe message.

    Those produces are usually one Kafka request's partitions owned by this shard, and the
    source answers that request only when all of them are produced anyway; each partition's
    flush completes on its own, so without this each would cost a pipe message. Produces to
    write-caching topics are not members: they are answered at append time.
    """

    __slots__ = ("_waiting", "_ready", "_open")

    def __init__(self) -> None:
        self._waiting = 0
        self._ready: list[tuple[Callable[[ProduceResult], None], ProduceResult]] = []
        self._open = True  # members may still join (the batch is being served)

    def member(self, answer: Callable[[ProduceResult], None]) -> Callable[[ProduceResult], None]:
        self._waiting += 1

        def ready(result: ProduceResult) -> None:
            self._ready.append((answer, result))
            self._waiting -= 1
            self._release()

        return ready

    def close(self) -> None:
        self._open = False
        self._release()

    def _release(self) -> None:
        if self._open or self._waiting or not self._ready:
            return
        ready, self._ready = self._ready, []
        for answer, result in ready:
            answer(result)
