"""The SPSC pipe mesh between the shard processes of one node (DESIGN.md §5).

Every ordered pair of shards (i→j) has its own one-way pipe with exactly one writer (shard i)
and one reader (shard j): a ZeroMQ PUSH socket (connect) to a PULL socket (bind) over
`ipc://<run_dir>/pipe-<i>-<j>`. A message is frame 0, a msgpack header (a dict or a list),
then zero or more raw payload frames sent with `copy=False`. The pipes live on the shard's one
asyncio loop thread: each socket's `zmq.FD` is watched with `loop.add_reader`, no thread and no
`zmq.asyncio` future sits on the hot path.

Ownership of payloads: a payload buffer handed to `send` is referenced, not copied, until
ZeroMQ has written it (frames of `copy_threshold` bytes or more, 64 KiB by default) or until it
leaves the local backlog. The sender must not mutate it after `send`; copy it first if it must.
Received payloads are `memoryview`s of ZeroMQ's own frames, valid for as long as they are held.

Backpressure: `send` never drops and never blocks the loop. When the pipe is full (ZeroMQ's
high-water mark, in messages, on both ends) later sends queue locally in FIFO order and are
flushed when the socket becomes writable again. `backlog_bytes` (and the optional
`on_backlog` hook) tell the shard to stop reading client sockets until the backlog drains.
A shard must never stop reading its *pipes* because an outgoing pipe is full: two shards doing
that to each other would deadlock. That is why the backlog, not the pipe, absorbs the surge.

ZMQ_FD is edge-triggered: it wakes the loop when the socket's state changes, and any send,
recv or `EVENTS` query can consume that edge. So a reader asks `EVENTS & POLLIN` before each
read and stops when it says empty (bounded per loop turn, continuing with `call_soon`); a
writer with a backlog asks `EVENTS & POLLOUT`, then flushes until `zmq.Again` (also bounded per
turn), after which the reader's next batch of reads is guaranteed to signal the FD again.
Everything here runs on the loop thread; nothing is thread-safe.

A header that does not decode breaks the pipe: only our own shards write to it, so that is
our bug, and whatever request it carried can no longer be answered. Dropping it would leave
its caller waiting forever; instead the mesh calls `on_broken(source, reason)` (the shard
stops the node, shards/shard.py) or, without one, raises `PipeBroken`.

`MemoryPipeNetwork` is the same mesh in one process (tests, simulations): delivery by
`loop.call_soon`, FIFO per pipe, optional capacity to exercise backpressure.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import msgpack
import zmq

from shards import limits

__all__ = [
    "Buffer",
    "MemoryPipeMesh",
    "MemoryPipeNetwork",
    "OnBacklog",
    "OnBroken",
    "OnMessage",
    "PipeBroken",
    "PipeMesh",
    "PipeWriter",
    "ZmqPipeMesh",
    "buffer_bytes",
    "pack_header",
    "pipe_path",
    "unpack_header",
]

log = logging.getLogger(__name__)

# Plain ints: or-ing zmq's IntFlag members costs more than the send itself on the hot path.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)

Buffer = bytes | bytearray | memoryview
# (source shard, header, payload frames)
OnMessage = Callable[[int, Any, list[memoryview]], None]
# (source shard, what was wrong): a message from that shard could not be read.
OnBroken = Callable[[int, str], None]


class PipeBroken(Exception):
    """A pipe message that cannot be read: our bug, and its sender waits for an answer."""
# (target shard, backlog bytes): called when a writer's backlog becomes non-empty and when it
# drains back to empty, so the shard can pause and resume reading client sockets.
OnBacklog = Callable[[int, int], None]


class PipeWriter(Protocol):
    def send(self, header: Any, payloads: Sequence[Buffer] = ()) -> bool | None:
        """Queue one message without blocking the loop. A pipe never drops one (None); a
        writer to another node's shard refuses one past its bound and says False
        (shards/node_mesh.py)."""
        ...

    @property
    def backlog_bytes(self) -> int:
        """Bytes queued locally because the pipe is full (the backpressure signal)."""
        ...

    @property
    def backlog_messages(self) -> int: ...

    def close(self) -> None: ...


class PipeMesh(Protocol):
    def writer(self, target: int) -> PipeWriter: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


def pipe_path(run_dir: str, source: int, target: int) -> str:
    """The socket file of the source→target pipe."""
    path = os.path.join(run_dir, f"pipe-{source}-{target}")
    assert len(path) < limits.pipe_path_chars_max, f"pipe socket path too long: {path}"
    return path


def buffer_bytes(buffer: Buffer) -> int:
    """The size of a payload frame in bytes."""
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def pack_header(packer: msgpack.Packer, header: Any) -> bytes:
    """Frame 0 of a message (shared with shards/node_mesh.py, which carries the same frames)."""
    assert isinstance(header, (dict, list, tuple)), f"pipe header not a dict or list: {header!r}"
    packed: bytes = packer.pack(header)
    assert len(packed) <= limits.pipe_header_bytes_max, f"pipe header of {len(packed)} bytes"
    return packed


def unpack_header(packed: bytes) -> Any:
    """The header, or PipeBroken saying what is wrong with it."""
    if len(packed) > limits.pipe_header_bytes_max:
        raise PipeBroken(f"header of {len(packed)} bytes, over {limits.pipe_header_bytes_max}")
    try:
        header = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except Exception as e:
        raise PipeBroken(f"header does not decode ({e}): {bytes(packed[:64])!r}") from None
    if not isinstance(header, dict | list):
        raise PipeBroken(f"header is not a dict or list: {header!r:.64}")
    return header


def _broken(on_broken: OnBroken | None, source: int, error: PipeBroken) -> None:
    if on_broken is None:
        raise error
    on_broken(source, str(error))


class _Backlog:
    """The FIFO of messages waiting for room in the pipe, with its size in bytes."""

    def __init__(self, target: int, on_backlog: OnBacklog | None) -> None:
        self.target = target
        self.queue: collections.deque[tuple[bytes, Sequence[Buffer], int]] = collections.deque()
        self.bytes = 0
        self._on_backlog = on_backlog

    def push(self, packed: bytes, payloads: Sequence[Buffer]) -> None:
        size = len(packed)
        for payload in payloads:
            size += buffer_bytes(payload)
        self.queue.append((packed, payloads, size))
        self.bytes += size
        if len(self.queue) == 1 and self._on_backlog is not None:
            self._on_backlog(self.target, self.bytes)

    def pop(self) -> None:
        _, _, size = self.queue.popleft()
        self.bytes -= size
        assert self.bytes >= 0 and (self.bytes == 0) == (not self.queue)
        if not self.queue and self._on_backlog is not None:
            self._on_backlog(self.target, 0)


class _WriterBase:
    """What both transports' writers share: the header packer and the local backlog."""

    def __init__(self, target: int, on_backlog: OnBacklog | None) -> None:
        self._packer = msgpack.Packer(use_bin_type=True)
        self._backlog = _Backlog(target, on_backlog)
        self._closed = False

    @property
    def backlog_bytes(self) -> int:
        return self._backlog.bytes

    @property
    def backlog_messages(self) -> int:
        return len(self._backlog.queue)


# ZeroMQ ----------------------------------------------------------------------------------


class _ZmqPipeWriter(_WriterBase):
    """The writing end of one pipe: a PUSH socket plus the local backlog."""

    def __init__(
        self,
        socket: zmq.Socket[Any],
        target: int,
        loop: asyncio.AbstractEventLoop,
        on_backlog: OnBacklog | None,
    ) -> None:
        super().__init__(target, on_backlog)
        self._socket = socket
        self._fd = socket.fileno()
        self._loop = loop
        self._flush_pending = False

    def send(self, header: Any, payloads: Sequence[Buffer] = ()) -> None:
        assert not self._closed, "send on a closed pipe"
        packed = pack_header(self._packer, header)
        if self._backlog.queue:  # FIFO: once anything waits, everything waits behind it
            self._backlog.push(packed, payloads)
        elif not self._try_send(packed, payloads):
            self._backlog.push(packed, payloads)
            # Register before flushing: the FD edge may already have fired and been consumed.
            self._loop.add_reader(self._fd, self._flush)
            self._schedule_flush()

    def close(self) -> None:
        """Drop the backlog and close; ZeroMQ drops what it still holds (LINGER 0)."""
        if self._closed:
            return
        self._closed = True
        if self._backlog.queue:
            self._loop.remove_reader(self._fd)
            log.warning(
                "pipe to %d closed with %d messages backlogged",
                self._backlog.target,
                len(self._backlog.queue),
            )
        self._socket.close(linger=0)

    def _try_send(self, packed: bytes, payloads: Sequence[Buffer]) -> bool:
        socket = self._socket
        try:
            socket.send(packed, _NOBLOCK_SNDMORE if payloads else _NOBLOCK)
        except zmq.Again:
            return False
        # The high-water mark counts whole messages, so once frame 0 is in, the rest fit.
        last = len(payloads) - 1
        for i, payload in enumerate(payloads):
            socket.send(payload, _NOBLOCK_SNDMORE if i < last else _NOBLOCK, copy=False)
        return True

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_pending = False
        self._flush()

    def _flush(self) -> None:
        """Move backlog into ZeroMQ until it is full (then the FD wakes us) or a turn is spent."""
        if self._closed:
            return
        # Most wake-ups are other commands. Asking EVENTS is cheaper than a send raising Again
        # and consumes the edge just as well: the peer's next activation raises a new one.
        if not cast(int, self._socket.getsockopt(_EVENTS)) & _POLLOUT:
            return
        queue = self._backlog.queue
        for _ in range(limits.pipe_flush_messages_per_turn_max):
            if not queue:
                self._loop.remove_reader(self._fd)
                return
            packed, payloads, _ = queue[0]
            if not self._try_send(packed, payloads):
                return  # this send consumed the edge; the peer's next read raises a new one
            self._backlog.pop()
        if queue:
            self._schedule_flush()
        else:
            self._loop.remove_reader(self._fd)


class ZmqPipeMesh:
    """This shard's ends of the node's pipes: N-1 readers (PULL) and N-1 writers (PUSH)."""

    def __init__(
        self,
        shard_id: int,
        shards: int,
        run_dir: str,
        loop: asyncio.AbstractEventLoop,
        on_message: OnMessage,
        *,
        context: zmq.Context[Any] | None = None,
        high_water_mark_messages: int = limits.pipe_high_water_mark_messages,
        on_backlog: OnBacklog | None = None,
        on_broken: OnBroken | None = None,
    ) -> None:
        assert 0 <= shard_id < shards, (shard_id, shards)
        assert high_water_mark_messages > 0, "0 would mean no limit"
        self.shard_id = shard_id
        self._loop = loop
        self._on_message = on_message
        self._on_broken = on_broken
        self._own_context = context is None
        self._context = zmq.Context(io_threads=1) if context is None else context
        self._readers: dict[int, zmq.Socket[Any]] = {}
        self._reader_fds: dict[int, int] = {}
        self._drain_pending: set[int] = set()
        self._writers: dict[int, _ZmqPipeWriter] = {}
        self._reading = False
        self._closed = False
        for peer in range(shards):
            if peer == shard_id:
                continue
            pull = self._context.socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, high_water_mark_messages)
            pull.setsockopt(zmq.LINGER, 0)
            pull.bind("ipc://" + pipe_path(run_dir, peer, shard_id))
            self._readers[peer] = pull
            self._reader_fds[peer] = pull.fileno()
            # Connecting before the peer has bound is fine: ZeroMQ queues (up to the
            # high-water mark) and retries every 100 ms, so shards may start in any order.
            push = self._context.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, high_water_mark_messages)
            push.setsockopt(zmq.LINGER, 0)
            push.connect("ipc://" + pipe_path(run_dir, shard_id, peer))
            self._writers[peer] = _ZmqPipeWriter(push, peer, loop, on_backlog)
        self.resume_reading()

    def writer(self, target: int) -> PipeWriter:
        """The shard_id→target pipe."""
        return self._writers[target]

    def pause_reading(self) -> None:
        """Stop taking messages off the pipes (their writers back up). For tests and drains."""
        if not self._reading:
            return
        self._reading = False
        for fd in self._reader_fds.values():
            self._loop.remove_reader(fd)

    def resume_reading(self) -> None:
        assert not self._closed
        if self._reading:
            return
        self._reading = True
        for source, fd in self._reader_fds.items():
            self._loop.add_reader(fd, self._drain, source)
            self._schedule_drain(source)  # messages may have arrived with no edge left for us

    def close(self) -> None:
        """Close every socket (in-flight messages are dropped) and the context if ours."""
        if self._closed:
            return
        self.pause_reading()
        self._closed = True
        for writer in self._writers.values():
            writer.close()
        for pull in self._readers.values():
            pull.close(linger=0)
        if self._own_context:
            self._context.term()

    def _schedule_drain(self, source: int) -> None:
        if source not in self._drain_pending:
            self._drain_pending.add(source)
            self._loop.call_soon(self._scheduled_drain, source)

    def _scheduled_drain(self, source: int) -> None:
        self._drain_pending.discard(source)
        self._drain(source)

    def _drain(self, source: int) -> None:
        if not self._reading:
            return
        pull = self._readers[source]
        more = True
        try:
            for _ in range(limits.pipe_receive_messages_per_turn_max):
                # Ask before each read rather than read until Again: here an EVENTS query
                # costs less than half a failed recv, and the last one, which says "empty",
                # re-arms the FD's edge just the same.
                if not cast(int, pull.getsockopt(_EVENTS)) & _POLLIN:
                    more = False
                    return
                try:
                    frame = pull.recv(_NOBLOCK, copy=False)
                except zmq.Again:  # not expected after POLLIN; look again next turn
                    return
                packed = frame.bytes
                payloads: list[memoryview] = []
                while frame.more:  # set by recv in C; a getsockopt(RCVMORE) costs far more
                    frame = pull.recv(_NOBLOCK, copy=False)  # whole messages arrive at once
                    payloads.append(frame.buffer)
                try:
                    header = unpack_header(packed)
                except PipeBroken as e:
                    _broken(self._on_broken, source, e)
                    return
                self._on_message(source, header, payloads)
                if not self._reading:  # paused or closed by the handler
                    return
        finally:
            # Also after a handler raised: the edge is gone, nothing else would wake us.
            if more and self._reading:
                self._schedule_drain(source)


# In memory -------------------------------------------------------------------------------


class _MemoryPipe(_WriterBase):
    """One source→target pipe: `in_flight` plays ZeroMQ's queue, bounded by `capacity`."""

    def __init__(
        self,
        network: MemoryPipeNetwork,
        source: int,
        target: int,
        on_backlog: OnBacklog | None,
    ) -> None:
        super().__init__(target, on_backlog)
        self._network = network
        self.source = source
        self.target = target
        self._in_flight: collections.deque[tuple[bytes, list[memoryview]]] = collections.deque()
        self._delivery_pending = False

    @property
    def in_flight_messages(self) -> int:
        return len(self._in_flight)

    def send(self, header: Any, payloads: Sequence[Buffer] = ()) -> None:
        assert not self._closed, "send on a closed pipe"
        packed = pack_header(self._packer, header)
        capacity = self._network.capacity_messages
        if self._backlog.queue or (capacity is not None and len(self._in_flight) >= capacity):
            self._backlog.push(packed, payloads)
        else:
            self._in_flight.append((packed, [memoryview(p) for p in payloads]))
            self.schedule_delivery()

    def close(self) -> None:
        self._closed = True

    def schedule_delivery(self) -> None:
        if not self._delivery_pending and self._in_flight:
            self._delivery_pending = True
            self._network.loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivery_pending = False
        reader = self._network.meshes.get(self.target)
        try:
            for _ in range(limits.pipe_receive_messages_per_turn_max):
                if reader is None or not reader.reading or not self._in_flight:
                    return
                packed, payloads = self._in_flight.popleft()
                self._refill()
                try:
                    header = unpack_header(packed)
                except PipeBroken as e:
                    _broken(reader.on_broken, self.source, e)
                    return
                reader.on_message(self.source, header, payloads)
        finally:
            if reader is not None and reader.reading:
                self.schedule_delivery()

    def _refill(self) -> None:
        capacity = self._network.capacity_messages
        queue = self._backlog.queue
        while queue and (capacity is None or len(self._in_flight) < capacity):
            packed, payloads, _ = queue[0]
            self._in_flight.append((packed, [memoryview(p) for p in payloads]))
            self._backlog.pop()


class MemoryPipeMesh:
    """One shard's ends of a `MemoryPipeNetwork`; made by `MemoryPipeNetwork.mesh`."""

    def __init__(
        self,
        shard_id: int,
        shards: int,
        loop: asyncio.AbstractEventLoop,
        on_message: OnMessage,
        network: MemoryPipeNetwork,
        *,
        on_backlog: OnBacklog | None = None,
        on_broken: OnBroken | None = None,
    ) -> None:
        assert 0 <= shard_id < shards == network.shards, (shard_id, shards)
        assert loop is network.loop
        self.shard_id = shard_id
        self.on_message = on_message
        self.on_broken = on_broken
        self.reading = True
        self._network = network
        self._writers = {
            target: _MemoryPipe(network, shard_id, target, on_backlog)
            for target in range(shards)
            if target != shard_id
        }

    def writer(self, target: int) -> PipeWriter:
        return self._writers[target]

    def pipe(self, target: int) -> _MemoryPipe:
        """The shard_id→target pipe itself, for tests that look at what is in flight."""
        return self._writers[target]

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        for source, mesh in self._network.meshes.items():
            if source != self.shard_id:
                mesh.pipe(self.shard_id).schedule_delivery()

    def close(self) -> None:
        self.reading = False
        for writer in self._writers.values():
            writer.close()
        self._network.meshes.pop(self.shard_id, None)


class MemoryPipeNetwork:
    """The pipe mesh of `shards` shards in one process, all on `loop`.

    `capacity_messages` bounds each pipe's in-flight queue like ZeroMQ's high-water mark
    (None: unbounded, the backlog is never used).
    """

    def __init__(
        self,
        shards: int,
        loop: asyncio.AbstractEventLoop,
        capacity_messages: int | None = None,
    ) -> None:
        assert capacity_messages is None or capacity_messages > 0
        self.shards = shards
        self.loop = loop
        self.capacity_messages = capacity_messages
        self.meshes: dict[int, MemoryPipeMesh] = {}

    def mesh(
        self,
        shard_id: int,
        on_message: OnMessage,
        *,
        on_backlog: OnBacklog | None = None,
        on_broken: OnBroken | None = None,
    ) -> MemoryPipeMesh:
        assert shard_id not in self.meshes, f"shard {shard_id} already has its mesh"
        mesh = MemoryPipeMesh(
            shard_id, self.shards, self.loop, on_message, self, on_backlog=on_backlog,
            on_broken=on_broken,
        )
        self.meshes[shard_id] = mesh
        # Messages sent to this shard before it existed wait in their pipes.
        for source, other in self.meshes.items():
            if source != shard_id:
                other.pipe(shard_id).schedule_delivery()
        return mesh
