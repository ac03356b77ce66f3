"""The link-fault proxy with plain sockets: pass, cut (nothing passes, nothing buffered past the
bound, new connections stall), delay (late by at least the delay, in order), reset (what was
held is dropped), heal, ends."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from scenarios.link_proxy import LinkProxy, ProxyThread, bind_consecutive

pytestmark = pytest.mark.timeout(60)

BUFFER_BYTES = 64 * 1024
READ_MAX_BYTES = 256 * 1024  # asyncio's largest read: one may sit in each stage
PATTERN = bytes(range(256)) * 4096  # 1 MiB


class Target:
    """B's shards: `shards` listening sockets on consecutive ports."""

    def __init__(self, shards: int) -> None:
        self.sockets = bind_consecutive(shards)
        for s in self.sockets:
            s.listen(16)
            s.settimeout(5)
        self.port = self.sockets[0].getsockname()[1]
        self.accepted: list[socket.socket] = []

    def accept(self, shard: int = 0, timeout_s: float = 5) -> socket.socket:
        self.sockets[shard].settimeout(timeout_s)
        conn, _ = self.sockets[shard].accept()
        conn.settimeout(5)
        self.accepted.append(conn)
        return conn

    def close(self) -> None:
        for s in self.sockets + self.accepted:
            s.close()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target(2)
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def proxy(target: Target) -> Iterator[LinkProxy]:
    p = LinkProxy(target.port, shards=2, name="a->b", buffer_bytes=BUFFER_BYTES).start()
    try:
        yield p
    finally:
        p.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def read_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def nothing_arrives(s: socket.socket, wait_s: float = 0.5) -> bool:
    s.settimeout(wait_s)
    try:
        return s.recv(1) == b"" and False
    except TimeoutError:
        return True
    finally:
        s.settimeout(5)


def linked(proxy: LinkProxy, target: Target, shard: int = 0
           ) -> tuple[socket.socket, socket.socket]:
    a = connect(proxy.ports[shard])
    b = target.accept(shard)
    a.sendall(b"hello")
    assert read_exactly(b, 5) == b"hello"
    return a, b


def test_consecutive_ports_are_bound_together() -> None:
    sockets = bind_consecutive(4)
    try:
        ports = [s.getsockname()[1] for s in sockets]
        assert ports == list(range(ports[0], ports[0] + 4))
    finally:
        for s in sockets:
            s.close()


def test_pass_forwards_port_k_to_the_targets_port_k_both_ways(proxy: LinkProxy,
                                                             target: Target) -> None:
    assert proxy.ports == [proxy.port, proxy.port + 1] and proxy.mode == "pass"
    held = []  # a socket dropped is closed: keep both open
    for shard in (0, 1):
        a, b = linked(proxy, target, shard)
        held.append(a)
        b.sendall(b"answer %d" % shard)
        assert read_exactly(a, 8) == b"answer %d" % shard
        a.sendall(PATTERN)
        assert read_exactly(b, len(PATTERN)) == PATTERN
    stats = proxy.stats()
    assert stats.accepted == 2 and stats.open_connections == 2
    assert stats.forward_bytes == 2 * (5 + len(PATTERN)) and stats.backward_bytes == 16


def test_cut_passes_nothing_buffers_at_most_the_bound_and_heal_resumes_in_order(
        proxy: LinkProxy, target: Target) -> None:
    a, b = linked(proxy, target)
    proxy.cut()
    assert proxy.mode == "cut"
    # A writes until its own socket pushes back; B hears nothing, and B's answers stall too.
    a.setblocking(False)
    sent = 0
    try:
        for _ in range(256):
            sent += a.send(PATTERN[sent % len(PATTERN):] + PATTERN)
    except BlockingIOError:
        pass
    a.setblocking(True)
    a.settimeout(5)
    assert sent > 0
    b.sendall(b"answer")
    assert nothing_arrives(b) and nothing_arrives(a)
    assert proxy.stats().held_bytes <= 2 * (BUFFER_BYTES + READ_MAX_BYTES)
    # A new connection is accepted, but nothing is connected onward while cut.
    late = connect(proxy.port)
    late.sendall(b"late")
    with pytest.raises(TimeoutError):
        target.accept(0, timeout_s=0.5)

    proxy.heal()
    assert proxy.mode == "pass"
    received = read_exactly(b, sent)
    expected = (PATTERN * (sent // len(PATTERN) + 2))[:sent]
    assert received == expected
    assert read_exactly(a, 6) == b"answer"
    b_late = target.accept(0)
    assert read_exactly(b_late, 4) == b"late"


def stamped(n: int) -> bytes:
    return struct.pack("<Id", n, time.monotonic())


def test_delay_holds_every_chunk_at_least_that_long_in_order(proxy: LinkProxy,
                                                             target: Target) -> None:
    a, b = linked(proxy, target)
    proxy.delay(200)
    assert proxy.mode == "delay 200 ms"
    lateness = []
    for n in range(8):
        a.sendall(stamped(n))
        time.sleep(0.03)
    for n in range(8):
        got, sent_at = struct.unpack("<Id", read_exactly(b, 12))
        lateness.append(time.monotonic() - sent_at)
        assert got == n
    assert min(lateness) >= 0.2
    # Backwards too.
    b.sendall(stamped(99))
    got, sent_at = struct.unpack("<Id", read_exactly(a, 12))
    assert got == 99 and time.monotonic() - sent_at >= 0.2
    proxy.heal()
    a.sendall(stamped(100))
    _, sent_at = struct.unpack("<Id", read_exactly(b, 12))
    assert time.monotonic() - sent_at < 0.15


def test_a_cut_holds_chunks_already_in_the_delay_line_until_heal(proxy: LinkProxy,
                                                                 target: Target) -> None:
    a, b = linked(proxy, target)
    proxy.delay(300)
    a.sendall(b"in flight")
    time.sleep(0.05)
    proxy.cut()
    assert nothing_arrives(b, 0.5)
    proxy.heal()
    assert read_exactly(b, 9) == b"in flight"


def test_reset_drops_what_a_cut_held_and_new_connections_pass(proxy: LinkProxy,
                                                               target: Target) -> None:
    a, b = linked(proxy, target)
    proxy.delay(300)
    a.sendall(b"in flight")
    time.sleep(0.05)
    proxy.cut()
    proxy.reset()
    for s in (a, b):  # both ends closed, nothing of what was held delivered
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass
    assert proxy.stats().open_connections == 0 and proxy.mode == "cut"
    proxy.heal()
    a2, b2 = linked(proxy, target)
    a2.sendall(b"after")
    assert read_exactly(b2, 5) == b"after"


def test_ends_go_through_both_ways(proxy: LinkProxy, target: Target) -> None:
    a, b = linked(proxy, target)
    a.sendall(b"bye")
    a.close()
    assert read_exactly(b, 3) == b"bye"
    assert b.recv(1) == b""
    a2, b2 = linked(proxy, target, 1)
    b2.close()
    assert a2.recv(1) == b""
    deadline = time.monotonic() + 5
    while proxy.stats().open_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.stats().open_connections == 0


def test_a_target_that_is_down_resets_the_connection() -> None:
    down = bind_consecutive(1)[0]
    port = down.getsockname()[1]
    down.close()  # nothing listens there
    proxy = LinkProxy(port, name="to nowhere").start()
    try:
        a = connect(proxy.port)
        try:
            assert a.recv(1) == b""
        except ConnectionResetError:
            pass
        assert proxy.stats().refused == 1
    finally:
        proxy.close()


def test_connections_past_the_maximum_are_closed(target: Target) -> None:
    proxy = LinkProxy(target.port, shards=2, connections_max=2).start()
    try:
        kept = [linked(proxy, target, 0), linked(proxy, target, 1)]
        extra = connect(proxy.port)
        try:
            assert extra.recv(1) == b""
        except ConnectionResetError:
            pass
        assert proxy.stats().refused == 1 and len(kept) == 2
    finally:
        proxy.close()


def test_close_drops_connections_and_frees_the_ports(target: Target) -> None:
    thread = ProxyThread()
    proxy = LinkProxy(target.port, shards=2, thread=thread).start()
    try:
        a, b = linked(proxy, target)
        proxy.close()
        for s in (a, b):
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        for port in proxy.ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
    finally:
        thread.close()
    assert not any(t.name == "link-proxy" for t in threading.enumerate())


def test_mode_changes_from_many_threads_end_in_the_last_one(proxy: LinkProxy,
                                                            target: Target) -> None:
    a, b = linked(proxy, target)
    threads = [threading.Thread(target=proxy.cut if i % 2 else lambda: proxy.delay(5))
               for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proxy.heal()
    a.sendall(b"after")
    assert read_exactly(b, 5) == b"after"
