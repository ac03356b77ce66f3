"""The Router: one shard's end of the mesh, the transport under the calls of shards/calls/.

It knows no call's fields. Sending, it numbers each request, keeps its reply callable until
the last answer, and queues the message for its target; receiving, it matches each answer to
its request and hands each request to its call's serve side (`shards.calls.SERVE`), with a
`Request` to answer through. On the wire a message is `[kind, request id, body]` and raw
payload frames (shards/calls/base.py).

Batching: a hop between processes costs ~100 µs (DESIGN.md §11), so what is queued for one
target in one loop turn leaves as one message, a `BATCH` of them: one produce request spanning
six partitions, its six phase-one answers, the phase-two answers one flush releases. A call
that keeps state for the rest of a batch being served (produce's answer group) asks
`batch_state`. Phase-one answers leave lazily, riding with the next message to their shard
(`answer_lazily`).

Addresses and node RPC: the Router never looks inside an address; it is what the mesh's
`writer(address)` resolves and what the mesh hands `on_message` as the source. With one node
it is a shard of this node and the mesh is the node's pipe mesh (shards/pipes.py). With node
RPC (DESIGN.md §5) the mesh is a `NodeMesh` (shards/node_mesh.py): this node's shards keep
their plain shard numbers and go over the pipes, another node's shard k is `(node, k)` and
goes over ZeroMQ TCP to that node's RPC port + k, carrying the same frames. Request ids,
pending replies, batching and lazy answers stay as they are (they are kept per address
already, so one turn's messages to one remote shard leave as one TCP message); `peers()`
stays this node's shards. Only the two calls that pass things by place, produce (the arena)
and read (a segment file), would send bytes as payload frames to another node.

Calls to other nodes expire: a node may die with a call unanswered, and ZeroMQ, which
reconnects by itself, says nothing of the messages lost with a connection. So for the
addresses `expires(address)` names (the NodeMesh's `is_remote`), each call with a reply is
given a deadline, `call_timeout_s` after it was sent or after its last answer; one timer,
set for the earliest deadline, answers each overdue call `UNREACHABLE` (calls/base.py) and
forgets it. The deadlines sit in send order (one timeout for all, so that is deadline order),
an answer that keeps the call waiting moves its own to the back, and a finished call takes its
own out, so they hold only the calls still waiting. A message the mesh refuses (its peer's
bound is hit: `send` says False) has its calls answered `UNREACHABLE` on the next turn, not at
their deadline. An answer that comes after its call expired is counted (`late_replies`) and
dropped. Calls to this node's shards never expire: a dead shard stops the node.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from actors.runtime import current_loop
from shards import limits
from shards.arena import ArenaSet
from shards.calls import SERVE
from shards.calls.base import BATCH, REPLY, UNREACHABLE, Address, Host, Reply, Request
from shards.calls.segments import SegmentFiles
from shards.pipes import PipeBroken, PipeWriter

__all__ = ["Mesh", "Router"]

log = logging.getLogger(__name__)

Message = tuple[list[Any], Sequence[Any]]  # (header, payload frames)


class Mesh(Protocol):
    """What the Router needs of its mesh: a writer per address, FIFO per (source, target)
    pair, whose `send` may refuse a message (False) but never blocks; the mesh in turn hands
    every message it receives to `Router.on_message(source address, header, frames)`.
    shards.pipes.PipeMesh is one, for the shards of this node (it never refuses);
    shards.node_mesh.NodeMesh another, for every shard of the cluster."""

    def writer(self, address: Any) -> PipeWriter: ...


class _BatchState(Protocol):
    def close(self) -> None: ...


_State = TypeVar("_State", bound=_BatchState)


class Router:
    """One shard's end of the mesh: sends calls, matches answers, serves requests.

    `shard` is the local Shard (what the serve sides need of it: `Host`); `arenas`
    (shards/arena.py), when given, carry produced batches by reference instead of as payload
    frames. `expires(address)`: whether calls to `address` are answered UNREACHABLE after
    `call_timeout_s` without an answer (another node's shards; module docstring). None: no
    call expires, as with one node.
    """

    def __init__(
        self,
        shard: Host,
        mesh: Mesh,
        arenas: ArenaSet | None = None,
        *,
        expires: Callable[[Address], bool] | None = None,
        call_timeout_s: float = limits.node_rpc_call_timeout_s,
    ) -> None:
        assert call_timeout_s > 0, call_timeout_s
        self.shard = shard
        self._mesh = mesh
        self._arenas = arenas
        self.arena_misses = 0  # batches that found no room in the arena and went as frames
        self.dispatched = 0  # produces whose phase one came back (calls/produce.py; stats)
        self.segment_files = SegmentFiles()  # other shards' segments, open (calls/read.py)
        self._next_id = 1
        self._pending: dict[int, Reply] = {}
        # Calls that expire, by request id: their deadline, earliest first (module docstring).
        self._expires = expires
        self._call_timeout_s = call_timeout_s
        self._deadlines: OrderedDict[int, float] = OrderedDict()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self.expired_calls = 0  # answered UNREACHABLE: timed out, or their message refused
        self.late_replies = 0  # answers to calls that had expired already
        # Messages for each address gathered during one loop turn, sent as one message.
        self._outbox: dict[Address, list[Message]] = {}
        self._flush_scheduled = False
        # Phase-one answers waiting for a ride to their shard: body by request id.
        self._lazy: dict[Address, dict[int, Any]] = {}
        self._lazy_timers: dict[Address, Any] = {}
        self._batch: dict[type, Any] | None = None  # calls' state while serving a batch

    @property
    def pending_calls(self) -> int:
        return len(self._pending)

    @property
    def expiring_calls(self) -> int:
        """Pending calls with a deadline (to other nodes)."""
        return len(self._deadlines)

    def peers(self) -> list[Address]:
        """Every other shard of this node."""
        return [s for s in range(self.shard.shards) if s != self.shard.shard_id]

    # Sending ----------------------------------------------------------------------------------

    def call(
        self, to: Address, kind: int, body: Any, payloads: Sequence[Any], reply: Reply | None
    ) -> None:
        """Send a request; `reply(body, frames)` runs for each answer until it returns falsy
        (None: no answer wanted)."""
        request_id = 0
        if reply is not None:
            request_id = self._next_id
            self._next_id += 1
            self._pending[request_id] = reply
            if self._expires is not None and self._expires(to):
                self._set_deadline(request_id)
        self._send(to, [kind, request_id, body], payloads)

    def answer(self, to: Address, request_id: int, body: Any, payloads: Sequence[Any] = ()) -> None:
        self._send(to, [REPLY, request_id, body], payloads)

    def answer_lazily(self, request: Request, body: Any) -> None:
        """Answer without a message of its own: ride with the next one to the source.

        For phase one of a produce. Its answer frees the source's arena region and nothing
        waits on it (pipes are FIFO, so the source dispatches its next request at once), while
        every pipe message costs both shards a wake-up of their loop and of ZeroMQ's I/O
        thread (~70 µs of CPU here). So it leaves with the next message to that shard, usually
        the same request's phase two after its flush, and at the latest
        `pipe_lazy_answer_delay_s` after it was made. Phase two may take it back first
        (`withdraw_lazy`) and carry it itself.
        """
        if not request.id:
            return
        source = request.source
        lazy = self._lazy.get(source)
        if lazy is None:
            lazy = self._lazy[source] = {}
            self._lazy_timers[source] = current_loop().call_later(
                limits.pipe_lazy_answer_delay_s, self._flush_lazy, source
            )
        lazy[request.id] = body
        if len(lazy) >= limits.pipe_batch_messages_max:
            self._flush_lazy(source)

    def withdraw_lazy(self, request: Request) -> bool:
        """Take back the request's lazy answer; False if it has left already."""
        lazy = self._lazy.get(request.source)
        if not lazy or lazy.pop(request.id, None) is None:
            return False
        if not lazy:
            self._take_lazy(request.source)  # nothing left to wait for: drop the timer
        return True

    def _send(self, to: Address, header: list[Any], payloads: Sequence[Any]) -> None:
        """Queue a message for `to`; everything queued in one loop turn leaves together."""
        outbox = self._outbox.setdefault(to, [])
        outbox.append((header, payloads))
        if len(outbox) >= limits.pipe_batch_messages_max:
            self._flush_target(to)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            current_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for to in list(self._outbox):
            self._flush_target(to)

    def send_now(self, to: Address) -> None:
        """What is queued for `to` leaves now, as one message, not at the end of the turn:
        for a sender that has gathered a turn's worth itself (shards/raft_host.py)."""
        self._flush_target(to)

    def _flush_target(self, to: Address) -> None:
        messages = self._outbox.pop(to, None)
        if not messages:
            return
        lazy = self._take_lazy(to)
        if len(lazy) + len(messages) <= limits.pipe_batch_messages_max:
            messages = lazy + messages  # phase-one answers first: they are the older
        elif lazy:
            self._write(to, lazy)
        self._write(to, messages)

    def _take_lazy(self, to: Address) -> list[Message]:
        """The lazy answers waiting for `to`, their timer cancelled."""
        lazy = self._lazy.pop(to, None)
        timer = self._lazy_timers.pop(to, None)
        if timer is not None:
            timer.cancel()
        if not lazy:
            return []
        return [([REPLY, request_id, body], ()) for request_id, body in lazy.items()]

    def _flush_lazy(self, to: Address) -> None:
        lazy = self._take_lazy(to)
        if lazy:
            self._write(to, lazy)

    def _write(self, to: Address, messages: list[Message]) -> None:
        """One message on the mesh: the message itself, or a batch of them."""
        writer = self._mesh.writer(to)
        if len(messages) == 1:
            header, payloads = messages[0]
            refused = writer.send(header, payloads) is False
        else:
            frames: list[Any] = []
            for _, payloads in messages:
                frames.extend(payloads)
            refused = writer.send([BATCH, 0, [[h, len(p)] for h, p in messages]], frames) is False
        if refused:
            # Its calls can never be answered. Next turn, not now: their replies may call again.
            calls = [h[1] for h, _ in messages if h[0] != REPLY and h[1]]
            if calls:
                current_loop().call_soon(self._unreachable, calls)

    # Expiry of calls to other nodes (module docstring) -----------------------------------------

    def _set_deadline(self, request_id: int) -> None:
        loop = current_loop()
        deadline = loop.time() + self._call_timeout_s
        self._deadlines[request_id] = deadline
        self._deadlines.move_to_end(request_id)  # an answer that keeps it waiting: to the back
        if self._expiry_timer is None:
            self._expiry_timer = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """Answer every call past its deadline UNREACHABLE; set the timer for the next."""
        self._expiry_timer = None
        loop = current_loop()
        now = loop.time()
        deadlines = self._deadlines
        try:
            while deadlines:
                request_id, deadline = next(iter(deadlines.items()))
                if deadline > now:
                    break
                self._unreachable([request_id])
        finally:
            # Replies may have called again (and set a timer for their own, later, deadline).
            if self._expiry_timer is not None:
                self._expiry_timer.cancel()
                self._expiry_timer = None
            if deadlines:
                self._expiry_timer = loop.call_at(next(iter(deadlines.values())), self._expire)

    def _unreachable(self, request_ids: list[int]) -> None:
        for request_id in request_ids:
            self._deadlines.pop(request_id, None)
            reply = self._pending.pop(request_id, None)
            if reply is not None:  # an answer may have come first
                self.expired_calls += 1
                reply(UNREACHABLE, [])

    # Receiving --------------------------------------------------------------------------------

    def on_message(self, source: Address, header: Any, frames: list[Any]) -> None:
        if not isinstance(header, list) or len(header) != 3 or not isinstance(header[0], int):
            # Only our own shards write here: our bug, and its sender waits for an answer.
            raise PipeBroken(f"header is not [kind, id, body]: {header!r:.64}")
        kind, request_id, body = header
        if kind == REPLY:
            self._on_reply(source, request_id, body, frames)
        elif kind == BATCH:
            self._serve_batch(source, body, frames)
        else:
            serve = SERVE.get(kind)
            if serve is None:
                raise PipeBroken(f"message of unknown kind {kind!r}")
            serve(Request(self, source, request_id), body, frames)

    def _on_reply(self, source: Address, request_id: int, body: Any, frames: list[Any]) -> None:
        reply = self._pending.get(request_id)
        if reply is None:
            if self._expires is not None and self._expires(source):
                self.late_replies += 1  # its call expired first (module docstring)
                log.debug("reply from %s to request %d, expired already", source, request_id)
            else:
                log.error("reply to unknown request %d", request_id)
            return
        if reply(body, frames):
            if request_id in self._deadlines:
                self._set_deadline(request_id)
        else:
            del self._pending[request_id]
            if self._deadlines:
                self._deadlines.pop(request_id, None)

    def _serve_batch(self, source: Address, entries: list[Any], frames: list[Any]) -> None:
        batch: dict[type, Any] = {}
        self._batch = batch
        try:
            position = 0
            for header, count in entries:
                self.on_message(source, header, frames[position : position + count])
                position += count
        finally:
            self._batch = None
            for state in batch.values():
                state.close()

    def batch_state(self, make: type[_State]) -> _State | None:
        """A call's state for the rest of the batch message being served, made on first use
        and closed when the batch is done; None outside a batch."""
        batch = self._batch
        if batch is None:
            return None
        state = batch.get(make)
        if state is None:
            state = batch[make] = make()
        return state

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

    def arena_view(self, source: Address, start: int, nbytes: int) -> memoryview:
        """A region of `source`'s arena, which it holds for us until we answer phase one."""
        assert self._arenas is not None, "arena region from a peer, but no arenas here"
        assert isinstance(source, int), "only the shards of one node share arenas"
        return self._arenas.peer_view(source, start, nbytes)

    def close(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self.segment_files.clear()
