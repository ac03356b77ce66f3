"""Node RPC (shards/node_mesh.py) and the Router's expiry of calls to other nodes.

Two nodes over real ZeroMQ TCP on 127.0.0.1, on free ports: node 1's shard 0 lives in this
process (its loop bound as the shard's, a Router and a NodeMesh), node 2's shard 1 in a
spawned child process with the same three (`_node_process`), driven over a control pipe. A
test kind of call, echo, is registered in both processes' `SERVE` for the test's length; a
silent kind is served and never answered. The Router's expiry is also tested alone, on a mesh
that takes messages and delivers none.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import pytest
import zmq

from actors.runtime import bind_loop
from shards.calls import SERVE
from shards.calls.base import REPLY, UNREACHABLE, Request
from shards.node_mesh import NODE_RPC_VERSION, NodeMesh, Peers, RemoteAddress
from shards.pipes import MemoryPipeNetwork, PipeWriter
from shards.router import Router
from tests.support.actor_loop import actor_loop
from tests.support.broker import free_port

pytestmark = pytest.mark.timeout(60)

ECHO = 250  # answered with its body and frames
SILENT = 251  # served, never answered
HOST = "127.0.0.1"
BLOCK = random.Random(11).randbytes(1 << 20)
PAYLOAD_SIZES = (0, 1, 1000, 65_536, 300_000)  # both sides of ZeroMQ's copy threshold


def payload(seq: int, size: int) -> bytes:
    offset = (seq * 7919) % (len(BLOCK) - size)
    return BLOCK[offset : offset + size]


def free_port_run(count: int) -> int:
    """A port p with p .. p + count - 1 all free on HOST: a node's RPC ports, one per shard."""
    for _ in range(100):
        base = free_port()
        if base + count <= 65535 and all(_port_free(base + k) for k in range(1, count)):
            return base
    raise AssertionError("no run of free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


class Echo:
    """The test calls' serve sides; checks that each source's sequence numbers rise."""

    def __init__(self) -> None:
        self.served = 0
        self.fifo_errors: list[str] = []
        self._last: dict[Any, int] = {}

    def serve(self, request: Request, body: Any, frames: list[Any]) -> None:
        self.served += 1
        seq = body[0]
        last = self._last.get(request.source, -1)
        if seq <= last and len(self.fifo_errors) < 5:
            self.fifo_errors.append(f"from {request.source}: {seq} after {last}")
        self._last[request.source] = seq
        request.answer(body, frames)

    def silent(self, request: Request, body: Any, frames: list[Any]) -> None:
        self.served += 1


class _Host:
    """What a Router needs of its shard here: its number (the test calls need no more)."""

    def __init__(self, shard_id: int, shards: int) -> None:
        self.shard_id = shard_id
        self.shards = shards


class Node:
    """One shard of one node on `loop`: a NodeMesh and a Router; `answers` by call."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        node_id: int,
        shard_id: int,
        rpc_base: int,
        peers: Peers,
        *,
        shards: int = 1,
        network: MemoryPipeNetwork | None = None,
        call_timeout_s: float = 5.0,
        **mesh_options: Any,
    ) -> None:
        self.loop = loop
        self.unreachable: list[RemoteAddress] = []
        local = None
        if network is not None:
            local = network.mesh(shard_id, lambda s, h, f: self.router.on_message(s, h, f))
        self.mesh = NodeMesh(
            node_id, shard_id, loop, lambda s, h, f: self.router.on_message(s, h, f),
            (HOST, rpc_base), peers=peers, local=local,
            on_unreachable=self.unreachable.append, **mesh_options,
        )  # fmt: skip
        self.router = Router(
            _Host(shard_id, shards),  # type: ignore[arg-type]  # no call here serves a partition
            self.mesh, expires=self.mesh.is_remote, call_timeout_s=call_timeout_s,
        )  # fmt: skip

    def call(self, to: Any, kind: int, body: Any, payloads: Sequence[Any] = ()) -> list[Any]:
        """Make a call; the list gets `(body, frames as bytes)` for its answer."""
        answers: list[Any] = []

        def reply(answer: Any, frames: list[Any]) -> None:
            answers.append((answer, [bytes(f) for f in frames]))

        self.router.call(to, kind, body, payloads, reply)
        return answers

    def close(self) -> None:
        self.router.close()
        self.mesh.close()


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], limit_s: float) -> None:
    async def wait() -> None:
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.001)

    loop.run_until_complete(wait())


def run_for(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def in_one_turn(loop: asyncio.AbstractEventLoop, work: Callable[[], Any]) -> Any:
    """Run `work` inside one loop callback, as a shard's handler runs, and return its value."""
    out: list[Any] = []
    loop.call_soon(lambda: out.append(work()))
    run_until(loop, lambda: bool(out), 5)
    return out[0]


# The other node, in its own process ---------------------------------------------------------


def _node_process(
    node_id: int, shard_id: int, rpc_base: int, peers: dict[int, tuple[str, int]],
    conn: Connection,
) -> None:  # fmt: skip
    """One shard of another node: a loop, a NodeMesh and a Router serving the test calls.
    Commands on `conn`: ("stats",), ("call", to, count, payload size), ("stop",)."""
    logging.basicConfig(level=logging.WARNING)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    bind_loop(loop)
    echo = Echo()
    SERVE[ECHO] = echo.serve
    SERVE[SILENT] = echo.silent
    node = Node(loop, node_id, shard_id, rpc_base, peers)

    def stats() -> dict[str, Any]:
        return {
            "mesh": node.mesh.snapshot(), "served": echo.served, "fifo_errors": echo.fifo_errors,
            "unreachable": node.unreachable, "late_replies": node.router.late_replies,
        }  # fmt: skip

    def call(to: list[int], count: int, size: int) -> None:
        answers = [node.call(tuple(to), ECHO, [i, "from the child"], [payload(i, size)])
                   for i in range(count)]

        def check() -> None:
            if all(answers):  # each answer's body, and whether its frames came back whole
                conn.send([[a[0][0], a[0][1] == [payload(i, size)]] for i, a in enumerate(answers)])
            else:
                loop.call_later(0.001, check)

        check()

    def on_command() -> None:
        while conn.poll():
            command, *args = conn.recv()
            if command == "stats":
                conn.send(stats())
            elif command == "call":
                call(*args)
            elif command == "stop":
                loop.stop()
                return

    loop.add_reader(conn.fileno(), on_command)
    conn.send("ready")
    try:
        loop.run_forever()
    finally:
        node.close()
        loop.close()


class OtherNode:
    """Node `node_id`'s shard `shard_id` in a spawned child process."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, node_id: int, shard_id: int, rpc_base: int,
        peers: dict[int, tuple[str, int]],
    ) -> None:  # fmt: skip
        self.loop = loop
        spawn = multiprocessing.get_context("spawn")
        self.conn, child_conn = spawn.Pipe()
        self.process = spawn.Process(
            target=_node_process, args=(node_id, shard_id, rpc_base, peers, child_conn),
            daemon=True,
        )  # fmt: skip
        self.process.start()
        child_conn.close()
        assert self.wait(30) == "ready"

    def wait(self, limit_s: float = 10) -> Any:
        """The child's next answer; this process's loop runs meanwhile (it may be serving)."""
        run_until(self.loop, lambda: self.conn.poll() or not self.process.is_alive(), limit_s)
        return self.conn.recv()

    def ask(self, *command: Any, limit_s: float = 10) -> Any:
        self.conn.send(command)
        return self.wait(limit_s)

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


loop = pytest.fixture(actor_loop)


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Echo:
    """The test calls, served in this process too (for the other node's calls to us)."""
    echo = Echo()
    monkeypatch.setitem(SERVE, ECHO, echo.serve)
    monkeypatch.setitem(SERVE, SILENT, echo.silent)
    return echo


class Cluster:
    """Node 1 shard 0 here; node 2's shard 1 in a child (`start_other`); all closed after."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ports = {1: free_port_run(2), 2: free_port_run(2)}  # two shards each, at most
        self.nodes: list[Node] = []
        self.others: list[OtherNode] = []

    def peers(self, *nodes: int) -> dict[int, tuple[str, int]]:
        return {n: (HOST, self.ports[n]) for n in nodes}

    def here(self, **options: Any) -> Node:
        node = Node(self.loop, 1, 0, self.ports[1], self.peers(2), **options)
        self.nodes.append(node)
        return node

    def start_other(self) -> OtherNode:
        other = OtherNode(self.loop, 2, 1, self.ports[2], self.peers(1))
        self.others.append(other)
        return other

    def close(self) -> None:
        for other in self.others:
            other.stop()
        for node in self.nodes:
            node.close()


@pytest.fixture
def cluster(loop: asyncio.AbstractEventLoop, echo: Echo) -> Iterator[Cluster]:
    cluster = Cluster(loop)
    try:
        yield cluster
    finally:
        cluster.close()


def sent_to(node: Node, peer: int) -> int:
    return node.mesh.peer_stats(peer).messages_sent


def child_peer(stats: dict[str, Any], peer: int) -> dict[str, Any]:
    return next(p for p in stats["mesh"]["peers"] if p["node"] == peer)


# Calls across nodes ---------------------------------------------------------------------------


def test_a_call_crosses_to_another_node_and_back(cluster: Cluster) -> None:
    here, other = cluster.here(), cluster.start_other()
    payloads = [payload(i, size) for i, size in enumerate(PAYLOAD_SIZES)]
    to = here.mesh.address(2, 1)
    assert to == (2, 1) and here.mesh.is_remote(to)

    answers = here.call(to, ECHO, [0, "hello", {"k": b"\x00\xff"}], payloads)
    run_until(cluster.loop, lambda: bool(answers), 10)

    assert answers == [([0, "hello", {"k": b"\x00\xff"}], payloads)]
    stats = other.ask("stats")
    assert stats["served"] == 1 and stats["fifo_errors"] == []
    assert child_peer(stats, 1)["messages_received"] == 1
    assert child_peer(stats, 1)["bytes_received"] > sum(PAYLOAD_SIZES)
    assert here.mesh.peer_stats(2).messages_received == 1  # the answer
    assert here.router.pending_calls == here.router.expiring_calls == 0


def test_the_other_node_calls_this_one(cluster: Cluster, echo: Echo) -> None:
    cluster.here()
    other = cluster.start_other()
    bodies = other.ask("call", [1, 0], 3, 70_000)
    assert bodies == [[[i, "from the child"], True] for i in range(3)]
    assert echo.served == 3 and echo.fifo_errors == []


def test_calls_keep_their_order_per_pair(cluster: Cluster) -> None:
    here, other = cluster.here(), cluster.start_other()
    order: list[int] = []
    total, per_turn = 3000, 100

    def send(start: int) -> None:
        for seq in range(start, start + per_turn):
            payloads = [payload(seq, 100_000)] if seq % 97 == 0 else []
            here.router.call((2, 1), ECHO, [seq], payloads, lambda b, f: order.append(b[0]))
        if start + per_turn < total:
            cluster.loop.call_soon(send, start + per_turn)

    cluster.loop.call_soon(send, 0)
    run_until(cluster.loop, lambda: len(order) == total, 30)

    assert order == list(range(total))
    stats = other.ask("stats")
    assert stats["served"] == total and stats["fifo_errors"] == []


def test_one_turns_calls_to_one_shard_leave_as_one_tcp_message(cluster: Cluster) -> None:
    here, other = cluster.here(), cluster.start_other()
    warm = here.call((2, 1), ECHO, [0])
    run_until(cluster.loop, lambda: bool(warm), 10)
    sent_before = sent_to(here, 2)
    child_before = child_peer(other.ask("stats"), 1)

    calls = 200
    answers = in_one_turn(
        cluster.loop,
        lambda: [here.call((2, 1), ECHO, [i + 1], [payload(i, 1000)]) for i in range(calls)],
    )
    run_until(cluster.loop, lambda: all(answers), 10)

    child_after = child_peer(other.ask("stats"), 1)
    assert sent_to(here, 2) - sent_before == 1
    assert child_after["messages_received"] - child_before["messages_received"] == 1
    # ... and the 200 answers, made in the one turn that served them, come back as one too.
    assert child_after["messages_sent"] - child_before["messages_sent"] == 1
    assert [a[0][0] for a in answers] == [[i + 1] for i in range(calls)]


def test_this_nodes_shards_go_over_the_pipes(cluster: Cluster, echo: Echo) -> None:
    network = MemoryPipeNetwork(2, cluster.loop)
    shard_0 = cluster.here(shards=2, network=network, call_timeout_s=0.2)
    shard_1 = Node(
        cluster.loop, 1, 1, cluster.ports[1], cluster.peers(2), shards=2, network=network
    )
    cluster.nodes.append(shard_1)
    to = shard_0.mesh.address(1, 1)
    assert to == 1 and not shard_0.mesh.is_remote(to)
    with pytest.raises(AssertionError, match="use address"):
        shard_0.mesh.writer((1, 1))

    answers = shard_0.call(to, ECHO, [0], [payload(0, 70_000)])
    silent = shard_0.call(to, SILENT, [1])
    run_until(cluster.loop, lambda: bool(answers) and echo.served == 2, 5)
    run_for(cluster.loop, 0.5)  # past the call timeout: a call to this node never expires

    assert answers == [([0], [payload(0, 70_000)])]
    assert silent == [] and shard_0.router.pending_calls == 1
    assert shard_0.router.expired_calls == 0
    assert shard_0.mesh.peer_stats(2).messages_sent == 0  # nothing went over TCP


# A peer that does not answer, is down, or comes back ----------------------------------------


def test_a_call_that_is_never_answered_expires(cluster: Cluster) -> None:
    here, other = cluster.here(call_timeout_s=0.3), cluster.start_other()
    started = time.monotonic()
    answers = [here.call((2, 1), SILENT, [i]) for i in range(5)]
    run_until(cluster.loop, lambda: all(answers), 5)

    assert time.monotonic() - started >= 0.3
    assert answers == [[(UNREACHABLE, [])]] * 5
    assert here.router.pending_calls == here.router.expiring_calls == 0
    assert here.router.expired_calls == 5
    assert other.ask("stats")["served"] == 5  # it arrived; nobody answered
    assert here.unreachable == []  # no send was refused: the link itself is fine


def test_a_dead_peer_refuses_sends_expires_calls_and_comes_back(cluster: Cluster) -> None:
    hwm, backlog_max, backlog_bytes_max = 4, 8, 6 * 70_000
    here = cluster.here(
        call_timeout_s=2.0, high_water_mark_messages=hwm, backlog_messages_max=backlog_max,
        backlog_bytes_max=backlog_bytes_max,
    )  # fmt: skip
    writer: PipeWriter = here.mesh.writer((2, 1))
    answers: list[list[Any]] = []
    backlog_seen: list[tuple[int, int]] = []

    def one_call_a_turn(seq: int) -> None:
        answers.append(here.call((2, 1), ECHO, [seq], [payload(seq, 65_536)]))
        backlog_seen.append((writer.backlog_messages, writer.backlog_bytes))
        if seq < 39:
            cluster.loop.call_soon(one_call_a_turn, seq + 1)

    started = time.monotonic()
    cluster.loop.call_soon(one_call_a_turn, 0)
    refused_count = 40 - hwm - 6
    run_until(cluster.loop, lambda: sum(1 for a in answers if a) >= refused_count, 5)
    refused_answered_s = time.monotonic() - started

    # Nobody listens: ZeroMQ took its high-water mark, the backlog its bound (6 of these
    # messages by bytes), and every later send was refused, answered at once, reported.
    stats = here.mesh.peer_stats(2)
    assert stats.messages_sent == hwm
    assert max(m for m, _ in backlog_seen) == 6 and max(b for _, b in backlog_seen) <= 6 * 70_000
    assert stats.sends_refused == refused_count and len(answers) == 40
    assert refused_answered_s < 2.0  # before any deadline
    assert sum(1 for a in answers if a) == refused_count
    assert all(a == [(UNREACHABLE, [])] for a in answers if a)
    assert set(here.unreachable) == {(2, 1)}
    assert len(here.unreachable) <= stats.sends_refused  # one report per turn at most

    # The calls that were queued expire at their deadlines: nothing waits forever.
    run_until(cluster.loop, lambda: all(answers), 5)
    assert all(a == [(UNREACHABLE, [])] for a in answers)
    assert here.router.pending_calls == here.router.expiring_calls == 0
    assert here.router.expired_calls == 40
    assert writer.backlog_messages == 6  # still bounded, waiting for the peer

    # The peer comes back: what waited goes out (its answers are late), and calls work again.
    other = cluster.start_other()
    run_until(cluster.loop, lambda: writer.backlog_messages == 0, 15)
    fresh = here.call((2, 1), ECHO, [1000], [payload(1, 65_536)])
    run_until(cluster.loop, lambda: bool(fresh), 10)
    assert fresh == [([1000], [payload(1, 65_536)])]
    run_until(cluster.loop, lambda: here.router.late_replies == hwm + 6, 10)
    child = other.ask("stats")
    assert child["served"] == hwm + 6 + 1 and child["fifo_errors"] == []


def test_a_peer_that_stops_reading_is_backpressure(cluster: Cluster) -> None:
    """The peer is up but its loop does not read (a slow node): the same bounds hold."""
    here = cluster.here(high_water_mark_messages=4, backlog_messages_max=16)
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 4)
    pull.bind(f"tcp://{HOST}:{cluster.ports[2] + 1}")  # bound, never read
    try:
        writer = here.mesh.writer((2, 1))
        results = [writer.send([0, 0, [i]], [payload(i, 256 * 1024)]) for i in range(400)]
        run_for(cluster.loop, 0.3)  # let ZeroMQ's I/O thread move what it will
        refused = results.count(False)
        assert refused > 0 and results[-1] is False
        assert writer.backlog_messages <= 16
        assert here.mesh.peer_stats(2).sends_refused == refused
        assert here.unreachable == [(2, 1)]  # reported once: one turn's refusals
    finally:
        pull.close(linger=0)
        context.term()


def test_peers_change_at_run_time(cluster: Cluster) -> None:
    here = cluster.here(call_timeout_s=1.0)
    here.mesh.set_peers({})
    cluster.start_other()

    refused = here.call((2, 1), ECHO, [0])
    run_until(cluster.loop, lambda: bool(refused), 5)
    assert refused == [(UNREACHABLE, [])] and here.unreachable == [(2, 1)]

    here.mesh.set_peers(cluster.peers(1, 2))  # its own entry is ignored
    assert here.mesh.peers == cluster.peers(2)
    answers = here.call((2, 1), ECHO, [1])
    run_until(cluster.loop, lambda: bool(answers), 10)
    assert answers == [([1], [])]

    here.mesh.set_peers({2: (HOST, free_port_run(2))})  # node 2 moved where nobody listens
    lost = here.call((2, 1), ECHO, [2])
    run_until(cluster.loop, lambda: bool(lost), 5)
    assert lost == [(UNREACHABLE, [])]

    here.mesh.set_peers(cluster.peers(2))
    back = here.call((2, 1), ECHO, [3])
    run_until(cluster.loop, lambda: bool(back), 10)
    assert back == [([3], [])]


def test_an_unreadable_message_from_another_node_is_dropped(cluster: Cluster) -> None:
    here = cluster.here()
    context = zmq.Context()
    raw = context.socket(zmq.PUSH)
    source = struct.pack("<BIH", NODE_RPC_VERSION, 2, 1)
    try:
        raw.connect(f"tcp://{HOST}:{cluster.ports[1]}")
        raw.send_multipart([b"\x01\x02"])  # one frame, and no source in it
        raw.send_multipart([struct.pack("<BIH", 99, 2, 1), msgpack.packb([ECHO, 0, [0]])])
        raw.send_multipart([struct.pack("<BIH", NODE_RPC_VERSION, 1, 0), b"\x90"])  # our id
        raw.send_multipart([source, b"\xc1"])  # 0xc1: never used in msgpack
        raw.send_multipart([source, msgpack.packb([99, 5, []])])  # a kind nobody serves
        raw.send_multipart([source, msgpack.packb([REPLY, 12345, None])])  # a late answer
        raw.send_multipart([source, msgpack.packb([SILENT, 0, [7]]), b"frame"])  # fine
        run_until(cluster.loop, lambda: here.mesh.peer_stats(2).messages_received == 4, 5)
    finally:
        raw.close(linger=0)
        context.term()
    assert here.mesh.unreadable_messages == 3
    assert here.mesh.peer_stats(2).messages_unreadable == 2
    assert here.router.late_replies == 1


# The Router's expiry, alone -------------------------------------------------------------------


class _Swallow:
    """A writer that takes every message and delivers none (or refuses all)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.sent: list[Any] = []

    def send(self, header: Any, payloads: Any = ()) -> bool:
        if not self.refuse:
            self.sent.append(header)
        return not self.refuse

    backlog_bytes = 0
    backlog_messages = 0

    def close(self) -> None:
        pass


class _SwallowMesh:
    def __init__(self) -> None:
        self.writers: dict[Any, _Swallow] = {}

    def writer(self, address: Any) -> _Swallow:
        return self.writers.setdefault(address, _Swallow())


def _expiring_router(timeout_s: float) -> tuple[Router, _SwallowMesh]:
    mesh = _SwallowMesh()
    router = Router(
        _Host(0, 2), mesh,  # type: ignore[arg-type]
        expires=lambda address: isinstance(address, tuple), call_timeout_s=timeout_s,
    )  # fmt: skip
    return router, mesh


def test_expiry_answers_once_and_forgets(loop: asyncio.AbstractEventLoop) -> None:
    router, _ = _expiring_router(0.1)
    got: list[Any] = []

    def answered(i: int) -> Callable[[Any, list[Any]], None]:
        return lambda body, _frames: got.append((i, body))

    for i in range(3):
        router.call((2, 0), ECHO, [i], [], answered(i))
    router.call(1, ECHO, [9], [], lambda body, frames: got.append((9, body)))  # this node's
    assert router.expiring_calls == 3
    run_for(loop, 0.25)
    assert got == [(0, UNREACHABLE), (1, UNREACHABLE), (2, UNREACHABLE)]
    assert router.expired_calls == 3 and router.pending_calls == 1  # the local one waits
    router.close()


def test_answered_calls_leave_no_deadline_behind(loop: asyncio.AbstractEventLoop) -> None:
    router, mesh = _expiring_router(30.0)
    for i in range(10_000):
        router.call((2, 0), ECHO, [i], [], lambda body, frames: None)
    assert router.expiring_calls == 10_000
    run_for(loop, 0.01)
    assert len(mesh.writers[(2, 0)].sent) == 10_000 // 256 + 1  # batches of 256
    for request_id in range(1, 10_001):
        router.on_message((2, 0), [REPLY, request_id, None], [])
    assert router.pending_calls == router.expiring_calls == 0
    assert router.expired_calls == 0
    router.close()


def test_an_answer_that_keeps_a_call_waiting_moves_its_deadline(
    loop: asyncio.AbstractEventLoop,
) -> None:
    router, _ = _expiring_router(1.0)
    got: list[Any] = []

    def two_answers(body: Any, _frames: list[Any]) -> bool:
        got.append(body)
        return body == "first"  # keep waiting for the second

    router.call((2, 0), ECHO, [0], [], two_answers)
    run_for(loop, 0.6)
    router.on_message((2, 0), [REPLY, 1, "first"], [])  # a produce's phase one, say
    run_for(loop, 0.6)  # 1.2 s after the call, 0.6 s after its answer
    assert got == ["first"]
    run_until(loop, lambda: len(got) == 2, 2)
    assert got == ["first", UNREACHABLE] and router.pending_calls == 0
    router.close()


def test_a_refused_message_answers_its_calls_next_turn(loop: asyncio.AbstractEventLoop) -> None:
    router, mesh = _expiring_router(10.0)
    mesh.writers[(2, 0)] = _Swallow(refuse=True)
    got: list[Any] = []
    router.call((2, 0), ECHO, [0], [], lambda body, frames: got.append(body))
    router.call((2, 0), ECHO, [1], [], None)  # wants no answer
    router.answer((2, 0), 77, "an answer of ours, refused too")
    run_for(loop, 0.01)
    assert got == [UNREACHABLE]
    assert router.pending_calls == router.expiring_calls == 0 and router.expired_calls == 1
    router.close()


def test_a_late_answer_is_counted_not_an_error(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    router, _ = _expiring_router(0.05)
    router.call((2, 0), ECHO, [0], [], lambda body, frames: None)
    run_for(loop, 0.1)
    with caplog.at_level(logging.INFO, logger="shards.router"):
        router.on_message((2, 0), [REPLY, 1, None], [])
    assert router.late_replies == 1 and caplog.records == []
    router.close()
