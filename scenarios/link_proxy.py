"""A link-fault proxy: one direction of a node pair's node RPC (A -> B), which a scenario's
nemesis cuts, delays and heals while the cluster runs.

Node A reaches node B at the address B has in A's `seeds`, so the runner gives A a proxy's
port there: a `LinkProxy` listens on `shards` consecutive ports P..P+shards-1 and forwards
port P+k to B's rpc_port + k, where B's shard k listens. ZeroMQ carries node RPC one way per
connection (A's shard sends on its own PUSH connection to B; B answers on B's own connection
to A, through the B -> A proxy), so this proxy carries A's messages and, backwards, only the
ZMTP handshake on A's connections (node RPC has no heartbeats: shards/node_mesh.py).

Modes, set from any thread while connections stay up:

- `heal()`: pass: every chunk is forwarded as it is read.
- `delay(ms)`: every chunk is forwarded `ms` after it was read, in order, both byte
  directions of every connection.
- `cut()`: a black hole, as a real partition is one. Both byte directions of every
  connection stop: nothing is read, nothing written, nothing dropped (TCP would retransmit
  what a partition loses, so what waited in the proxy goes on after `heal()`, in order). A
  new connection is accepted but neither read nor connected onward until then. Connections
  stay up through a cut while the buffers take what is sent (this side's kernel acknowledges
  it), where a real partition ends one whose bytes go unacknowledged for TCP's user timeout.

One-way loss between A and B is cutting the A -> B proxy while the B -> A proxy passes.

`reset()`, in any mode, aborts every connection at once, both ends, and drops what they held
(in the delay line or behind a cut): what a crash of the sending host does to bytes it sent
that have not arrived. The mode stays; ZeroMQ reconnects as after any lost connection.

Example, B's shards listening on 33145 and 33146:

    proxy = LinkProxy(33145, shards=2, name="1->2").start()   # proxy.ports == [P, P + 1]
    proxy.delay(200); proxy.cut(); proxy.reset(); proxy.heal(); proxy.close()

Bounds. A stalled direction stops reading: each direction of a connection holds at most
`buffer_bytes` in its delay line and `buffer_bytes` in the socket's write buffer, plus one
read (asyncio reads 256 KiB at most) in each; past that the proxy stops reading and the
kernel's buffers, then the sender, take the back-pressure. A proxy keeps at most
`connections_max` connections; one more is closed at once (connections stalled by a cut
pile up as ZeroMQ reconnects, until the cut heals or they time out).

Threads. Every proxy of a run shares one `ProxyThread`: an asyncio loop on a thread of its
own in the runner's process. The proxy's methods may be called from any thread; each waits
until the loop has applied it, so a `cut()` that returned is in force.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["LinkProxy", "ProxyStats", "ProxyThread", "bind_consecutive"]

HOST = "127.0.0.1"
# Per direction of a connection: in the delay line, and again in the socket's write buffer.
BUFFER_BYTES = 1 << 20
CONNECTIONS_MAX = 256  # per proxy (all its ports); ZeroMQ makes one per shard pair
CALL_TIMEOUT_S = 10.0  # a mode change or start applied by the proxy's loop
BIND_ATTEMPTS_MAX = 100  # tries at finding `count` consecutive free ports
LISTEN_BACKLOG = 128

T = TypeVar("T")


def bind_consecutive(count: int, host: str = HOST) -> list[socket.socket]:
    """`count` TCP sockets bound to consecutive free ports of `host` (not yet listening)."""
    assert count >= 1
    for _ in range(BIND_ATTEMPTS_MAX):
        bound: list[socket.socket] = []
        try:
            first = _bound(host, 0)
            bound.append(first)
            base = first.getsockname()[1]
            if base + count - 1 > 65535:
                raise OSError("no room above")
            for k in range(1, count):
                bound.append(_bound(host, base + k))
            return bound
        except OSError:
            for s in bound:
                s.close()
    raise OSError(f"no {count} consecutive free ports on {host} in {BIND_ATTEMPTS_MAX} tries")


def _bound(host: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s


class ProxyThread:
    """An asyncio loop on a daemon thread of its own, for a run's proxies."""

    def __init__(self, name: str = "link-proxy") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run `fn` on the loop and wait for its result (at once if already on the loop)."""
        if threading.current_thread() is self._thread:
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                future.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout_s)

    def wait(self, coroutine: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass(slots=True)
class ProxyStats:
    """Counters since start; read with `LinkProxy.stats()`."""

    accepted: int = 0  # connections from A
    refused: int = 0  # closed at once: B not listening, or over connections_max
    forward_bytes: int = 0  # A -> B, written onward
    backward_bytes: int = 0  # B -> A
    open_connections: int = 0
    held_bytes: int = 0  # now in delay lines and write buffers, every connection


class LinkProxy:
    """One direction of a node pair: ports P..P+shards-1 forward to target_port + k."""

    def __init__(self, target_port: int, shards: int = 1, *, target_host: str = HOST,
                 name: str = "", buffer_bytes: int = BUFFER_BYTES,
                 connections_max: int = CONNECTIONS_MAX,
                 thread: ProxyThread | None = None) -> None:
        assert shards >= 1 and buffer_bytes > 0
        self.target = (target_host, target_port)
        self.shards = shards
        self.name = name or f"-> {target_host}:{target_port}"
        self.buffer_bytes = buffer_bytes
        self.connections_max = connections_max
        self.ports: list[int] = []
        self._own_thread = thread is None
        self._thread = thread or ProxyThread(f"link-proxy {self.name}")
        self._servers: list[asyncio.Server] = []
        self._connections: set[_Connection] = set()
        self._stats = ProxyStats()
        # The mode, read and written on the loop only.
        self.is_cut = False
        self.delay_s = 0.0

    # --- from any thread ---------------------------------------------------------------------

    def start(self, sockets: list[socket.socket] | None = None) -> LinkProxy:
        """Listen on `sockets` (bound to consecutive ports; by default found free here)."""
        sockets = sockets if sockets is not None else bind_consecutive(self.shards)
        assert len(sockets) == self.shards
        self.ports = [s.getsockname()[1] for s in sockets]
        assert self.ports == list(range(self.ports[0], self.ports[0] + self.shards))
        self._thread.wait(self._serve(sockets))
        return self

    @property
    def port(self) -> int:
        """The first port: the one a node's seeds name (its shard k is this + k)."""
        return self.ports[0]

    @property
    def mode(self) -> str:
        if self.is_cut:
            return "cut"
        return f"delay {self.delay_s * 1000:g} ms" if self.delay_s else "pass"

    def cut(self) -> None:
        self._thread.call(lambda: self._set(True, 0.0))

    def delay(self, ms: float) -> None:
        assert ms >= 0
        self._thread.call(lambda: self._set(False, ms / 1000))

    def heal(self) -> None:
        self._thread.call(lambda: self._set(False, 0.0))

    def reset(self) -> None:
        """Abort every connection now, dropping what it held; keep listening."""
        self._thread.call(self._abort_connections)

    def stats(self) -> ProxyStats:
        def read() -> ProxyStats:
            s = self._stats
            return ProxyStats(s.accepted, s.refused, s.forward_bytes, s.backward_bytes,
                              len(self._connections),
                              sum(c.held_bytes() for c in self._connections))

        return self._thread.call(read)

    def close(self) -> None:
        """Stop listening and drop every connection (both ends closed at once)."""
        if not self._thread.loop.is_closed():
            try:
                self._thread.wait(self._close())
            except (RuntimeError, concurrent.futures.TimeoutError):
                pass  # the loop is already stopping: its sockets go with it
        if self._own_thread:
            self._thread.close()

    # --- on the loop ---------------------------------------------------------------------------

    async def _serve(self, sockets: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for k, sock in enumerate(sockets):
            server = await loop.create_server(
                functools.partial(_Side, self, None, k), sock=sock, backlog=LISTEN_BACKLOG)
            self._servers.append(server)

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        self._abort_connections()
        self._servers.clear()

    def _abort_connections(self) -> None:
        for connection in list(self._connections):
            connection.abort()

    def _set(self, cut: bool, delay_s: float) -> None:
        self.is_cut, self.delay_s = cut, delay_s
        for connection in list(self._connections):
            connection.mode_changed()

    def _accepted(self, side: _Side, transport: asyncio.Transport, shard: int) -> None:
        if len(self._connections) >= self.connections_max:
            self._stats.refused += 1
            transport.abort()
            return
        self._stats.accepted += 1
        connection = _Connection(self, side, transport, shard)
        self._connections.add(connection)
        connection.mode_changed()

    def _closed(self, connection: _Connection) -> None:
        self._connections.discard(connection)


class _Side(asyncio.Protocol):
    """One socket of a connection: A's (accepted) or B's (connected onward)."""

    def __init__(self, proxy: LinkProxy, connection: _Connection | None, shard: int) -> None:
        self.proxy = proxy
        self.connection = connection
        self.shard = shard
        self.transport: asyncio.Transport | None = None
        self.reading = True
        self.write_blocked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self.proxy.buffer_bytes)
        if self.connection is None:  # accepted from A
            self.proxy._accepted(self, transport, self.shard)
        else:  # connected onward to B
            self.connection.connected()

    def data_received(self, data: bytes) -> None:
        if self.connection is not None:
            self.connection.pipe_from(self).feed(data)

    def eof_received(self) -> bool:
        if self.connection is not None:
            self.connection.pipe_from(self).feed(None)
        return True  # the connection closes both sides once the end has gone through

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.connection is not None:
            self.connection.side_lost(self)

    def pause_writing(self) -> None:
        self.write_blocked = True
        if self.connection is not None:
            self.connection.pipe_to(self).flow()

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self.connection is not None:
            self.connection.pipe_to(self).pump()

    def set_reading(self, reading: bool) -> None:
        if self.transport is None or reading == self.reading:
            return
        self.reading = reading
        if reading:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()


class _Pipe:
    """One byte direction of a connection: the delay line from a source side to a sink side.

    Chunks wait in order with the time they are due (read time + delay, never before the
    chunk ahead); `None` is the source's end, after which the connection closes."""

    def __init__(self, connection: _Connection, source: _Side, forward: bool) -> None:
        self.connection = connection
        self.proxy = connection.proxy
        self.source = source
        self.sink: _Side | None = None
        self.forward = forward
        self.line: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.line_bytes = 0
        self.timer: asyncio.TimerHandle | None = None

    def feed(self, data: bytes | None) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self.proxy.delay_s
        if self.line:
            due = max(due, self.line[-1][0])
        self.line.append((due, data))
        self.line_bytes += len(data) if data else 0
        self.pump()

    def pump(self) -> None:
        """Write what is due, unless cut or the sink's buffer is full; then set reading."""
        sink = self.sink
        if not self.proxy.is_cut and sink is not None and sink.transport is not None:
            now = asyncio.get_running_loop().time()
            while self.line and self.line[0][0] <= now and not sink.write_blocked:
                _, chunk = self.line.popleft()
                if chunk is None:
                    self.connection.close()
                    return
                self.line_bytes -= len(chunk)
                sink.transport.write(chunk)
                if self.forward:
                    self.proxy._stats.forward_bytes += len(chunk)
                else:
                    self.proxy._stats.backward_bytes += len(chunk)
            self._schedule()
        self.flow()

    def _schedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.line and not self.proxy.is_cut:
            self.timer = asyncio.get_running_loop().call_at(self.line[0][0], self.pump)

    def flow(self) -> None:
        sink_blocked = self.sink is not None and self.sink.write_blocked
        self.source.set_reading(not self.proxy.is_cut and not sink_blocked
                                and self.line_bytes < self.proxy.buffer_bytes)

    def held_bytes(self) -> int:
        buffered = 0
        if self.sink is not None and self.sink.transport is not None:
            buffered = self.sink.transport.get_write_buffer_size()
        return self.line_bytes + buffered

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Connection:
    """A's connection to a proxy port and, once it may go on, B's to the shard's port."""

    def __init__(self, proxy: LinkProxy, a: _Side, a_transport: asyncio.Transport,
                 shard: int) -> None:
        self.proxy = proxy
        self.shard = shard
        self.a = a
        a.connection = self
        self.b: _Side | None = None
        self.forward = _Pipe(self, a, forward=True)  # A -> B
        self.backward: _Pipe | None = None  # B -> A, once B is connected
        self.connecting: asyncio.Task[None] | None = None
        self.closed = False

    def pipe_from(self, side: _Side) -> _Pipe:
        if side is self.a:
            return self.forward
        assert self.backward is not None
        return self.backward

    def pipe_to(self, side: _Side) -> _Pipe:
        if side is self.b:
            return self.forward
        assert self.backward is not None
        return self.backward

    def mode_changed(self) -> None:
        if self.closed:
            return
        if self.connecting is None and not self.proxy.is_cut:
            self.connecting = asyncio.get_running_loop().create_task(self._connect())
        for pipe in (self.forward, self.backward):
            if pipe is not None:
                pipe.pump()

    async def _connect(self) -> None:
        host, port = self.proxy.target
        side = self.b = _Side(self.proxy, self, self.shard)
        self.backward = _Pipe(self, side, forward=False)
        self.backward.sink = self.a
        self.forward.sink = side  # written to once connected (its transport is set)
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: side, host, port + self.shard)
        except OSError:
            self.proxy._stats.refused += 1  # B is down: A sees its connection reset
            self.abort()

    def connected(self) -> None:
        """B's socket is up (it may read before `_connect` resumes)."""
        if self.closed:
            assert self.b is not None and self.b.transport is not None
            self.b.transport.abort()
            return
        self.mode_changed()

    def side_lost(self, side: _Side) -> None:
        if self.closed:
            return
        pipe = self.forward if side is self.a else self.backward
        if pipe is not None and (not pipe.line or pipe.line[-1][1] is not None):
            pipe.feed(None)  # its end goes through after what it sent

    def held_bytes(self) -> int:
        return sum(p.held_bytes() for p in (self.forward, self.backward) if p is not None)

    def close(self) -> None:
        """Both sides closed once their write buffers are flushed."""
        self._finish(lambda t: t.close())

    def abort(self) -> None:
        self._finish(lambda t: t.abort())

    def _finish(self, end: Callable[[asyncio.Transport], None]) -> None:
        if self.closed:
            return
        self.closed = True
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        for pipe in (self.forward, self.backward):
            if pipe is not None:
                pipe.stop()
        for side in (self.a, self.b):
            if side is not None and side.transport is not None:
                end(side.transport)
        self.proxy._closed(self)
