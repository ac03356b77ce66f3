"""Node RPC: one shard's end of the mesh that joins it to every shard of the cluster (DESIGN.md §5).

Addresses. This node's shard k is `k`, as on the pipes; another node's shard k is `(node, k)`
(`RemoteAddress`). `address(node, shard)` gives a shard its one name: the Router keeps
batches, lazy answers and FIFO order per name, so a shard must never have two, and `writer`
takes `(this node, k)` for our bug. A local address goes to the node's pipe mesh
(shards/pipes.py), exactly as before; this module adds only the TCP side, and `is_remote`
tells the two apart (the Router's expiry of calls to other nodes asks it).

The wire. Shard k of every node binds one PULL socket on `tcp://rpc_host:rpc_port + k`. To
another node's shard it sends on a PUSH socket of its own, connected to that endpoint, one
per remote shard it talks to: each ordered (source shard, target shard) pair has its own
one-way ZeroMQ pipe, FIFO, as on one node, and answers come back the same way (the answering
shard's PUSH), so both directions have the same bounds. A message is the pipes' frames with
one frame in front:

    frame 0    source: version u8, node u32, shard u16, little-endian (7 bytes)
    frame 1    header, msgpack (the Router's [kind, request id, body])
    frame 2..  raw payload frames, sent with copy=False (ZeroMQ copies those under 64 KiB)

The source travels in a frame, not as a ROUTER identity: a PULL socket keeps no state per
peer, so a restarted peer, or one whose old connection is still half-open, is one more
connection, where a ROUTER silently drops a new connection whose identity it still holds
(unless ROUTER_HANDOVER); and the frame is read and checked with every message, where an
identity is set once per connection. It costs 7 bytes and a frame per message, and a message
carries a whole loop turn's calls to its target.

Bounds. Every peer shard has ZeroMQ's high-water mark (`node_rpc_high_water_mark_messages`,
on both ends) and then a local FIFO backlog bounded in messages and bytes. A send that finds
both full is refused: `send` says False (the Router answers that message's calls UNREACHABLE)
and the peer is reported through `on_unreachable(address)`, once per peer per loop turn, on
the next turn (the report may make Raft send, and the Router may be mid-flush). A dead peer
thus holds at most its high-water mark and its backlog, never an unbounded queue. ZeroMQ
reconnects by itself (backing off to `node_rpc_reconnect_interval_max_s`), and what waited in
the pipe goes out when the peer is back; messages lost with a connection are the Router's
expiry's to answer, and Raft has its own liveness (heartbeats, check-quorum).

Dead peers. The kernel closes a connection whose bytes go unacknowledged for
`node_rpc_tcp_user_timeout_s` (TCP_USER_TIMEOUT, ZMQ_TCP_MAXRT) and probes an idle one
(TCP keepalive), so a half-open connection to a crashed host is dropped and reconnected in
seconds. A paused or busy peer's kernel still answers; only once its buffers have been full
for that long is the connection closed, which costs what was in flight (the Router's expiry
answers it), never the node. There are no ZMTP heartbeats (ZMQ_HEARTBEAT_*), and no node may
turn them on: with them libzmq 4.3.5 (the newest release; its master is the same) aborts a
shard resumed after a pause (issue #26). A peer's heartbeat timeout closed its connection to
a shard stopped for more than 3 s while the stopped side's kernel still held the peer's last
messages, PINGs among them. At SIGCONT the stopped shard's I/O thread read that backlog until
the PULL socket's queue was full (the engine's `_input_stopped`); the reset of the closed
connection (its answer to the resumed side's own PING) made `in_event_internal` mark the
engine failed (`_io_error = true`, src/stream_engine_base.cpp:247-250), to be torn down once
the shard had read its queue. The shard read it, `restart_input` (:394) decoded the bytes
left in the engine's buffer, one of them a PING, and `zmtp_engine_t::process_heartbeat_message`
wrote the PONG at once through `out_event` (src/zmtp_engine.cpp:527), which asserts
`!_io_error` (src/stream_engine_base.cpp:310): abort. The heartbeat timer calls `out_event`
the same way (:737). Every other `out_event` call is guarded (`restart_output` returns on
`_io_error`; the poller skips the descriptor `in_event_internal` removed), and a kernel
timeout is a read error, which the engine turns into a reconnect, never into a write.

Loop. As the pipes: every socket's edge-triggered `zmq.FD` is watched with `loop.add_reader`
on the shard's one loop thread, a read asks `EVENTS & POLLIN` first and stops after a turn's
worth, a writer is watched only while it has a backlog; no thread beyond ZeroMQ's I/O thread.

A message another node sends that cannot be read (source, header, or a header the Router
refuses) is dropped, counted and logged: a peer may run another version, and its caller's
call expires. Unlike a pipe, it does not stop the node: the pipes' rule is for our own shards.

Peers are `{node id: (rpc host, rpc port)}` (shard k of that node listens on port + k), set at
start and changed with `set_peers` as cluster membership changes; a node whose address
changes or that leaves has its sockets closed and their queues dropped, and sends to a node
not in the map are refused. Counters are plain numbers per peer node (`PeerStats`), read with
`snapshot()` as actors/metrics.py's are: the shard puts them in its stats snapshot.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

import msgpack
import zmq

from shards import limits
from shards.pipes import (
    Buffer,
    PipeBroken,
    PipeMesh,
    PipeWriter,
    buffer_bytes,
    pack_header,
    unpack_header,
)

__all__ = [
    "NODE_RPC_VERSION",
    "NodeAddress",
    "NodeMesh",
    "OnNodeMessage",
    "OnUnreachable",
    "PeerStats",
    "Peers",
    "RemoteAddress",
]

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)

# Frame 0's form; a peer that sends another version is not understood (its messages dropped).
NODE_RPC_VERSION = 1
_SOURCE = struct.Struct("<BIH")
_NODE_MAX = 2**32 - 1
_SHARD_MAX = 2**16 - 1

RemoteAddress = tuple[int, int]  # (node, shard) of another node
NodeAddress = int | RemoteAddress  # this node's shard, or another node's
# node id -> (RPC host, RPC port): that node's shard k listens on port + k.
Peers = Mapping[int, tuple[str, int]]
# (source, header, payload frames): this node's shards' messages come from the pipe mesh.
OnNodeMessage = Callable[[NodeAddress, Any, list[memoryview]], None]
OnUnreachable = Callable[[RemoteAddress], None]


class PeerStats:
    """What crossed between this shard and one peer node's shards, since start. Messages are
    TCP messages (one per loop turn and target shard), bytes their headers and payloads."""

    __slots__ = (
        "messages_sent", "bytes_sent", "messages_received", "bytes_received", "sends_refused",
        "messages_unreadable",
    )  # fmt: skip

    def __init__(self) -> None:
        self.messages_sent = 0
        self.bytes_sent = 0
        self.messages_received = 0
        self.bytes_received = 0
        self.sends_refused = 0  # backpressure: the peer's bound was hit, or it is not a peer
        self.messages_unreadable = 0  # dropped: a source, header or kind we cannot read

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def _endpoint(host: str, port: int) -> str:
    assert 0 < port <= 65535, f"node RPC port {port}"
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _tune(socket: zmq.Socket[Any], host: str) -> None:
    """The options every node RPC socket shares (shards/limits.py says why)."""
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RECONNECT_IVL, int(limits.node_rpc_reconnect_interval_s * 1000))
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, int(limits.node_rpc_reconnect_interval_max_s * 1000))
    socket.setsockopt(zmq.CONNECT_TIMEOUT, int(limits.node_rpc_connect_timeout_s * 1000))
    # No ZMQ_HEARTBEAT_*: the kernel finds a dead peer (the module docstring says why).
    socket.setsockopt(zmq.TCP_MAXRT, int(limits.node_rpc_tcp_user_timeout_s * 1000))
    socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
    socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, limits.node_rpc_keepalive_idle_s)
    socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, limits.node_rpc_keepalive_interval_s)
    if ":" in host:
        socket.setsockopt(zmq.IPV6, 1)


class _PeerWriter:
    """The writing end to one shard of another node: a PUSH socket and its bounded backlog.

    Payloads are referenced, not copied, until ZeroMQ has written them or they leave the
    backlog (shards/pipes.py): the sender must not change them after `send`.
    """

    def __init__(
        self,
        mesh: NodeMesh,
        socket: zmq.Socket[Any],
        address: RemoteAddress,
        stats: PeerStats,
        backlog_messages_max: int,
        backlog_bytes_max: int,
    ) -> None:
        self.address = address
        self._mesh = mesh
        self._socket = socket
        self._fd = socket.fileno()
        self._loop = mesh.loop
        self._source = mesh.source_frame
        self._stats = stats
        self._packer = msgpack.Packer(use_bin_type=True)
        self._queue: collections.deque[tuple[bytes, Sequence[Buffer], int]] = collections.deque()
        self._queued_bytes = 0
        self._messages_max = backlog_messages_max
        self._bytes_max = backlog_bytes_max
        self._flush_pending = False
        self._closed = False

    @property
    def backlog_bytes(self) -> int:
        return self._queued_bytes

    @property
    def backlog_messages(self) -> int:
        return len(self._queue)

    def send(self, header: Any, payloads: Sequence[Buffer] = ()) -> bool:
        """Hand one message to ZeroMQ, or queue it behind the full pipe; False: refused, the
        backlog is at its bound (the peer is reported unreachable)."""
        assert not self._closed, f"send on the closed node RPC writer to {self.address}"
        packed = pack_header(self._packer, header)
        size = len(packed)
        for payload in payloads:
            size += buffer_bytes(payload)
        queue = self._queue
        if not queue and self._try_send(packed, payloads, size):
            return True
        if len(queue) >= self._messages_max or self._queued_bytes + size > self._bytes_max:
            self._mesh.refused(self.address, self._stats)
            return False
        queue.append((packed, payloads, size))  # FIFO: once anything waits, all wait behind it
        self._queued_bytes += size
        if len(queue) == 1:
            # Register before flushing: the FD edge may already have fired and been consumed.
            self._loop.add_reader(self._fd, self._flush)
            self._schedule_flush()
        return True

    def close(self) -> None:
        """Drop the backlog and close; ZeroMQ drops what it still holds (LINGER 0)."""
        if self._closed:
            return
        self._closed = True
        if self._queue:
            self._loop.remove_reader(self._fd)
            log.info("node RPC to %s closed, %d messages queued", self.address, len(self._queue))
            self._queue.clear()
            self._queued_bytes = 0
        self._socket.close(linger=0)

    def _try_send(self, packed: bytes, payloads: Sequence[Buffer], size: int) -> bool:
        socket = self._socket
        try:
            socket.send(self._source, _NOBLOCK_SNDMORE)
        except zmq.Again:
            return False
        # The high-water mark counts whole messages, so once frame 0 is in, the rest fit.
        socket.send(packed, _NOBLOCK_SNDMORE if payloads else _NOBLOCK)
        last = len(payloads) - 1
        for i, payload in enumerate(payloads):
            socket.send(payload, _NOBLOCK_SNDMORE if i < last else _NOBLOCK, copy=False)
        stats = self._stats
        stats.messages_sent += 1
        stats.bytes_sent += size
        return True

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_pending = False
        self._flush()

    def _flush(self) -> None:
        """Move backlog into ZeroMQ until it is full (then the FD wakes us) or a turn is spent
        (the pipes' writer, shards/pipes.py, says why it asks EVENTS first)."""
        if self._closed:
            return
        if not cast(int, self._socket.getsockopt(_EVENTS)) & _POLLOUT:
            return
        queue = self._queue
        for _ in range(limits.node_rpc_flush_messages_per_turn_max):
            if not queue:
                break
            packed, payloads, size = queue[0]
            if not self._try_send(packed, payloads, size):
                return  # this send consumed the edge; the peer's next read raises a new one
            queue.popleft()
            self._queued_bytes -= size
        assert self._queued_bytes >= 0 and (self._queued_bytes == 0) == (not queue)
        if queue:
            self._schedule_flush()
        else:
            self._loop.remove_reader(self._fd)


class _NoPeer:
    """The writer to a shard of a node this shard has no address for: refuses every send."""

    def __init__(self, mesh: NodeMesh, address: RemoteAddress, stats: PeerStats) -> None:
        self._mesh = mesh
        self.address = address
        self._stats = stats

    @property
    def backlog_bytes(self) -> int:
        return 0

    @property
    def backlog_messages(self) -> int:
        return 0

    def send(self, header: Any, payloads: Sequence[Buffer] = ()) -> bool:
        self._mesh.refused(self.address, self._stats)
        return False

    def close(self) -> None:
        pass


class NodeMesh:
    """This shard's ends of node RPC, and of the node's pipes through `local`: the Router's
    `Mesh` (shards/router.py) for every shard of the cluster. Loop thread only.

    `rpc_listen` is this node's (RPC host, RPC port): this shard binds port + shard_id, or
    serves `listening_fd`, a socket already bound there (as the supervisor binds every port
    of a node before its shards start, shards/ports.py). `local`: the node's pipe mesh, None
    on a node of one shard. Messages from other nodes go to `on_message((node, shard),
    header, frames)`; those of this node's shards come from `local`, as before.
    """

    def __init__(
        self,
        node_id: int,
        shard_id: int,
        loop: asyncio.AbstractEventLoop,
        on_message: OnNodeMessage,
        rpc_listen: tuple[str, int],
        *,
        peers: Peers | None = None,
        local: PipeMesh | None = None,
        on_unreachable: OnUnreachable | None = None,
        listening_fd: int | None = None,
        context: zmq.Context[Any] | None = None,
        high_water_mark_messages: int = limits.node_rpc_high_water_mark_messages,
        backlog_messages_max: int = limits.node_rpc_backlog_messages_max,
        backlog_bytes_max: int = limits.node_rpc_backlog_bytes_max,
    ) -> None:
        assert 0 <= node_id <= _NODE_MAX and 0 <= shard_id <= _SHARD_MAX, (node_id, shard_id)
        assert high_water_mark_messages > 0, "0 would mean no limit"
        assert backlog_messages_max >= 0 and backlog_bytes_max >= 0
        self.node_id = node_id
        self.shard_id = shard_id
        self.loop = loop
        self.source_frame = _SOURCE.pack(NODE_RPC_VERSION, node_id, shard_id)
        self._on_message = on_message
        self._on_unreachable = on_unreachable
        self._local = local
        self._hwm = high_water_mark_messages
        self._backlog_messages_max = backlog_messages_max
        self._backlog_bytes_max = backlog_bytes_max
        self._own_context = context is None
        self._context = zmq.Context(io_threads=1) if context is None else context
        self._peers: dict[int, tuple[str, int]] = {}
        self._writers: dict[RemoteAddress, _PeerWriter] = {}
        self._stats: dict[int, PeerStats] = {}
        self._unreachable: set[RemoteAddress] = set()  # to report next turn
        self.unreadable_messages = 0  # dropped, from a source we could not even name
        self._reading = False
        self._drain_pending = False
        self._closed = False
        host, port = rpc_listen
        self._pull = self._context.socket(zmq.PULL)
        _tune(self._pull, host)
        self._pull.setsockopt(zmq.RCVHWM, high_water_mark_messages)
        self._pull.setsockopt(zmq.MAXMSGSIZE, limits.node_rpc_frame_bytes_max)
        if listening_fd is not None:
            self._pull.setsockopt(zmq.USE_FD, listening_fd)
        try:
            self._pull.bind(_endpoint(host, port + shard_id))
        except zmq.ZMQError:
            self._pull.close(linger=0)
            if self._own_context:
                self._context.term()
            raise
        self._pull_fd = self._pull.fileno()
        self.set_peers(peers or {})
        self.resume_reading()

    # Addresses --------------------------------------------------------------------------------

    def address(self, node: int, shard: int) -> NodeAddress:
        """The one name of `node`'s shard `shard`: its number on this node, else the pair."""
        return shard if node == self.node_id else (node, shard)

    def is_remote(self, address: Hashable) -> bool:
        """Whether `address` is another node's shard (the Router's `expires`)."""
        return type(address) is tuple

    # Sending ----------------------------------------------------------------------------------

    def writer(self, address: NodeAddress) -> PipeWriter:
        """The writer to `address`: a pipe for this node's shards, node RPC for others'."""
        assert not self._closed, "writer of a closed node mesh"
        if type(address) is int:
            assert self._local is not None, f"shard {address}: this node has one shard"
            return self._local.writer(address)
        remote = cast(RemoteAddress, address)
        writer = self._writers.get(remote)
        if writer is not None:
            return writer
        return self._open(remote)

    def set_peers(self, peers: Peers) -> None:
        """The cluster's nodes and their RPC addresses (this node's own entry is ignored).
        A node that left or moved has its writers closed and their queues dropped (their
        calls expire); the next send to a node that moved connects to its new address."""
        new: dict[int, tuple[str, int]] = {}
        for node, (host, port) in peers.items():
            assert 0 <= node <= _NODE_MAX and 0 < port <= 65535, (node, host, port)
            if node != self.node_id:
                new[node] = (host, port)
                self._stats_of(node)
        for address, writer in list(self._writers.items()):
            if new.get(address[0]) != self._peers.get(address[0]):
                writer.close()
                del self._writers[address]
        self._peers = new

    @property
    def peers(self) -> dict[int, tuple[str, int]]:
        return dict(self._peers)

    @property
    def backlog_bytes(self) -> int:
        """Bytes waiting in the backlogs to other nodes (each bounded; not the pipes')."""
        return sum(writer.backlog_bytes for writer in self._writers.values())

    def refused(self, address: RemoteAddress, stats: PeerStats) -> None:
        """A send to `address` was refused: count it, report the peer next turn (writers)."""
        stats.sends_refused += 1
        if stats.sends_refused % limits.node_rpc_log_every == 1:
            log.warning(
                "node RPC to %s refused (%s): %d sends to node %d refused so far",
                address, "no address" if address[0] not in self._peers else "queue full",
                stats.sends_refused, address[0],
            )  # fmt: skip
        if self._on_unreachable is None:
            return
        if not self._unreachable:
            self.loop.call_soon(self._report_unreachable)
        self._unreachable.add(address)

    def _report_unreachable(self) -> None:
        addresses, self._unreachable = self._unreachable, set()
        if self._closed or self._on_unreachable is None:
            return
        for address in sorted(addresses):
            self._on_unreachable(address)

    def _open(self, address: RemoteAddress) -> PipeWriter:
        node, shard = address
        assert node != self.node_id, f"{address} names this node's shard {shard}: use address()"
        assert 0 <= node <= _NODE_MAX and 0 <= shard <= _SHARD_MAX, address
        peer = self._peers.get(node)
        stats = self._stats_of(node)
        if peer is None:
            return _NoPeer(self, address, stats)
        host, port = peer
        push = self._context.socket(zmq.PUSH)
        _tune(push, host)
        push.setsockopt(zmq.SNDHWM, self._hwm)
        # Connecting before the peer listens is fine: ZeroMQ queues (up to the high-water
        # mark) and retries, so nodes may start in any order.
        push.connect(_endpoint(host, port + shard))
        writer = _PeerWriter(
            self, push, address, stats, self._backlog_messages_max, self._backlog_bytes_max
        )
        self._writers[address] = writer
        return writer

    def _stats_of(self, node: int) -> PeerStats:
        stats = self._stats.get(node)
        if stats is None:
            stats = self._stats[node] = PeerStats()
        return stats

    # Receiving --------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        """Stop taking messages from other nodes (their writers back up, then refuse)."""
        if not self._reading:
            return
        self._reading = False
        self.loop.remove_reader(self._pull_fd)

    def resume_reading(self) -> None:
        assert not self._closed
        if self._reading:
            return
        self._reading = True
        self.loop.add_reader(self._pull_fd, self._drain)
        self._schedule_drain()  # messages may have arrived with no edge left for us

    def _schedule_drain(self) -> None:
        if not self._drain_pending:
            self._drain_pending = True
            self.loop.call_soon(self._scheduled_drain)

    def _scheduled_drain(self) -> None:
        self._drain_pending = False
        self._drain()

    def _drain(self) -> None:
        if not self._reading:
            return
        pull = self._pull
        more = True
        try:
            for _ in range(limits.node_rpc_receive_messages_per_turn_max):
                if not cast(int, pull.getsockopt(_EVENTS)) & _POLLIN:
                    more = False  # and the query re-armed the FD's edge
                    return
                try:
                    frame = pull.recv(_NOBLOCK, copy=False)
                except zmq.Again:  # not expected after POLLIN; look again next turn
                    return
                frames = [frame]
                while frame.more:  # whole messages arrive at once
                    frame = pull.recv(_NOBLOCK, copy=False)
                    frames.append(frame)
                self._deliver(frames)
                if not self._reading:  # paused or closed by the handler
                    return
        finally:
            # Also after a handler raised: the edge is gone, nothing else would wake us.
            if more and self._reading:
                self._schedule_drain()

    def _deliver(self, frames: list[zmq.Frame]) -> None:
        source = frames[0].bytes
        if len(frames) < 2 or len(source) != _SOURCE.size:
            self._unreadable(None, f"{len(frames)} frames, the first of {len(source)} bytes")
            return
        version, node, shard = _SOURCE.unpack(source)
        if version != NODE_RPC_VERSION or node == self.node_id:
            what = f"version {version}" if version != NODE_RPC_VERSION else "this node's id"
            self._unreadable(None, f"from node {node} shard {shard}: {what}")
            return
        stats = self._stats_of(node)
        packed = frames[1].bytes
        payloads = [frame.buffer for frame in frames[2:]]
        stats.messages_received += 1
        stats.bytes_received += len(packed) + sum(payload.nbytes for payload in payloads)
        try:
            header = unpack_header(packed)
            self._on_message((node, shard), header, payloads)
        except PipeBroken as e:  # a peer's message we cannot read: its call expires there
            self._unreadable(stats, f"from node {node} shard {shard}: {e}")

    def _unreadable(self, stats: PeerStats | None, what: str) -> None:
        if stats is None:
            self.unreadable_messages += 1
            count = self.unreadable_messages
        else:
            stats.messages_unreadable += 1
            count = stats.messages_unreadable
        if count % limits.node_rpc_log_every == 1:
            log.error("node RPC message dropped (%d so far): %s", count, what)

    # Stats and closing ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Counters per peer node, and what waits for each: plain values for the shard's stats
        snapshot (shards/stats.py)."""
        backlog: dict[int, list[int]] = {}
        for (node, _shard), writer in self._writers.items():
            entry = backlog.setdefault(node, [0, 0])
            entry[0] += writer.backlog_messages
            entry[1] += writer.backlog_bytes
        peers = []
        for node, stats in sorted(self._stats.items()):
            messages, nbytes = backlog.get(node, (0, 0))
            peers.append({
                "node": node, "known": node in self._peers, **stats.as_dict(),
                "backlog_messages": messages, "backlog_bytes": nbytes,
            })  # fmt: skip
        return {"peers": peers, "unreadable_messages": self.unreadable_messages}

    def peer_stats(self, node: int) -> PeerStats:
        """The counters of one peer node (made at zero if it has none yet)."""
        return self._stats_of(node)

    def close(self) -> None:
        """Close every node RPC socket (what they hold is dropped) and the context if ours.
        The pipe mesh is the shard's to close."""
        if self._closed:
            return
        self.pause_reading()
        self._closed = True
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._pull.close(linger=0)
        if self._own_context:
            self._context.term()
