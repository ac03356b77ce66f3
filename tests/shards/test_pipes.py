"""The SPSC pipe mesh: FIFO, no drops, backpressure and the missed ZMQ_FD edge.

The same bodies run against ZeroMQ (two meshes on one loop) and the in-memory network; the
two-process tests start a spawned child that runs shard 1 on its own loop. The figures test
prints throughput and round-trip latency between two processes (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgpack
import pytest
import zmq

from shards.limits import (
    pipe_flush_messages_per_turn_max,
    pipe_high_water_mark_messages,
    pipe_receive_messages_per_turn_max,
)
from shards.pipes import (
    Buffer,
    MemoryPipeNetwork,
    OnBacklog,
    OnMessage,
    PipeMesh,
    PipeWriter,
    ZmqPipeMesh,
    pipe_path,
)

pytestmark = pytest.mark.timeout(60)

BLOCK = random.Random(7).randbytes(1 << 20)
BIG_PAYLOAD_BYTES = 200_000  # above pyzmq's copy threshold: the zero-copy path
FIFO_MESSAGES = 100_000


def header_for(seq: int) -> dict[Any, Any]:
    return {
        "seq": seq,
        "type": "produce",
        "partition": seq % 7,
        "key": b"\x00\xff" * (seq % 3),
        "sizes": [seq, -seq, 2**40],
        "nested": {1: None, "f": 1.5, "t": True},  # an int map key: strict_map_key is off
    }


def payloads_for(seq: int) -> list[Buffer]:
    """0, 1 or 2 frames of varied size and type, cut from BLOCK so making them costs nothing."""
    frames: list[Buffer] = []
    for k in range(seq % 3):
        size = BIG_PAYLOAD_BYTES if seq % 1000 == 998 else (seq * 7919 + k * 104729) % 3000
        offset = (seq * 131 + k * 17) % (len(BLOCK) - size)
        view = memoryview(BLOCK)[offset : offset + size]
        frames.append(view if k == 0 else bytearray(view))
    return frames


class Checker:
    """An OnMessage that checks per-source FIFO order, headers and payload bytes."""

    def __init__(self) -> None:
        self.next_seq: dict[int, int] = {}
        self.count = 0
        self.errors: list[str] = []

    def __call__(self, source: int, header: Any, payloads: list[memoryview]) -> None:
        seq = header["seq"]
        expected = self.next_seq.get(source, 0)
        self.next_seq[source] = seq + 1
        self.count += 1
        if len(self.errors) >= 5:
            return
        if seq != expected:
            self.errors.append(f"from {source}: seq {seq}, expected {expected}")
        elif header != header_for(seq):
            self.errors.append(f"from {source}: header {header!r}")
        elif [bytes(p) for p in payloads] != [bytes(p) for p in payloads_for(seq)]:
            self.errors.append(f"from {source}: payloads of {seq} differ")


def produce(
    loop: asyncio.AbstractEventLoop, writer: PipeWriter, count: int, chunk: int = 1000
) -> None:
    """Send `count` messages in chunks, one chunk per loop turn, holding back while backed up."""

    def step(next_seq: int) -> None:
        if writer.backlog_bytes > 8 << 20:  # what the shard does: stop taking new work
            loop.call_later(0.001, step, next_seq)
            return
        end = min(count, next_seq + chunk)
        for seq in range(next_seq, end):
            writer.send(header_for(seq), payloads_for(seq))
        if end < count:
            loop.call_soon(step, end)

    loop.call_soon(step, 0)


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], limit_s: float) -> None:
    async def wait() -> None:
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.001)

    loop.run_until_complete(wait())


def run_for(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def short_run_dir() -> str:
    return tempfile.mkdtemp(prefix="kp-", dir="/tmp")


def ignore(source: int, header: Any, payloads: list[memoryview]) -> None:
    pass


# Two meshes on one loop, either transport -----------------------------------------------

MakePair = Callable[..., tuple[PipeMesh, PipeMesh]]


class Pair:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self.run_dir = short_run_dir()
        self.meshes: list[PipeMesh] = []

    def make(
        self,
        on_message_0: OnMessage,
        on_message_1: OnMessage,
        hwm: int = pipe_high_water_mark_messages,
        on_backlog: OnBacklog | None = None,
    ) -> tuple[PipeMesh, PipeMesh]:
        """Shard 0 and shard 1; `hwm` is ZeroMQ's high-water mark or the memory capacity."""
        mesh_0: PipeMesh
        mesh_1: PipeMesh
        if self.kind == "zmq":
            # The reader of 0→1 binds first so that pipe connects at once; a PUSH that finds
            # no socket file retries after ZeroMQ's reconnect interval (100 ms).
            mesh_1 = ZmqPipeMesh(
                1, 2, self.run_dir, self.loop, on_message_1, high_water_mark_messages=hwm
            )
            mesh_0 = ZmqPipeMesh(
                0, 2, self.run_dir, self.loop, on_message_0,
                high_water_mark_messages=hwm, on_backlog=on_backlog,
            )  # fmt: skip
        else:
            network = MemoryPipeNetwork(2, self.loop, capacity_messages=hwm)
            mesh_0 = network.mesh(0, on_message_0, on_backlog=on_backlog)
            mesh_1 = network.mesh(1, on_message_1)
        self.meshes += [mesh_0, mesh_1]
        return mesh_0, mesh_1

    def close(self) -> None:
        for mesh in self.meshes:
            mesh.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


@pytest.fixture(params=["zmq", "memory"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    pair = Pair(request.param)
    try:
        yield pair
    finally:
        pair.close()


def test_fifo_both_ways_no_drops(pair: Pair) -> None:
    checker_0, checker_1 = Checker(), Checker()
    mesh_0, mesh_1 = pair.make(checker_0, checker_1)
    produce(pair.loop, mesh_0.writer(1), FIFO_MESSAGES)
    produce(pair.loop, mesh_1.writer(0), FIFO_MESSAGES)

    run_until(pair.loop, lambda: checker_0.count + checker_1.count >= 2 * FIFO_MESSAGES, 50)

    assert checker_0.errors == [] and checker_1.errors == []
    assert checker_0.next_seq == {1: FIFO_MESSAGES} and checker_1.next_seq == {0: FIFO_MESSAGES}
    run_for(pair.loop, 0.01)
    assert checker_0.count == checker_1.count == FIFO_MESSAGES  # and nothing more
    assert mesh_0.writer(1).backlog_bytes == mesh_1.writer(0).backlog_bytes == 0


def bp_payload(seq: int) -> memoryview:
    offset = (seq * 4099) % (len(BLOCK) - 65536)
    return memoryview(BLOCK)[offset : offset + 65536]


def bp_check(checker: list[str], received: list[int]) -> OnMessage:
    def on_message(source: int, header: Any, payloads: list[memoryview]) -> None:
        seq = header["seq"]
        if seq != len(received) or [bytes(p) for p in payloads] != [bytes(bp_payload(seq))]:
            checker.append(f"message {seq} arrived as number {len(received)} or damaged")
        received.append(seq)

    return on_message


# What ZeroMQ holds beyond the two high-water marks: the messages in the unix socket's kernel
# buffers (~208 KiB each way: about 3 of these 64 KiB messages) and the one being encoded.
ZMQ_SLACK_MESSAGES = 8


def test_backpressure_backlog_grows_and_everything_arrives(pair: Pair) -> None:
    hwm, sent = 16, 400
    errors: list[str] = []
    received: list[int] = []
    backlog_events: list[tuple[int, int]] = []
    mesh_0, mesh_1 = pair.make(
        ignore, bp_check(errors, received), hwm=hwm,
        on_backlog=lambda target, size: backlog_events.append((target, size)),
    )  # fmt: skip
    mesh_1.pause_reading()
    writer = mesh_0.writer(1)
    for seq in range(sent):
        writer.send({"seq": seq}, [bp_payload(seq)])
    run_for(pair.loop, 0.3)  # let ZeroMQ's I/O thread move all it will
    accepted = sent - writer.backlog_messages
    run_for(pair.loop, 0.1)
    assert sent - writer.backlog_messages == accepted, "the pipe kept absorbing"

    header_bytes_max = len(msgpack.packb({"seq": sent - 1}))
    assert writer.backlog_messages > 0 and received == []
    assert writer.backlog_bytes <= writer.backlog_messages * (header_bytes_max + 65536)
    assert writer.backlog_bytes > writer.backlog_messages * 65536
    if pair.kind == "memory":
        assert accepted == hwm
    else:
        assert hwm <= accepted <= 2 * hwm + ZMQ_SLACK_MESSAGES, accepted
    assert len(backlog_events) == 1 and backlog_events[0][0] == 1
    assert 65536 < backlog_events[0][1] <= 65536 + header_bytes_max

    for seq in range(sent, sent + 100):  # later sends queue behind the backlog
        writer.send({"seq": seq}, [bp_payload(seq)])
    mesh_1.resume_reading()
    run_until(pair.loop, lambda: len(received) >= sent + 100, 20)

    assert errors == [] and len(received) == sent + 100
    assert writer.backlog_bytes == writer.backlog_messages == 0
    assert backlog_events[-1] == (1, 0) and len(backlog_events) == 2


def test_ping_pong_with_bursts_never_stalls(pair: Pair) -> None:
    """Sends and receives interleave on one loop; bursts cross the per-turn drain bound."""
    rounds, burst = 10_000, 600
    state = {"round": 0}
    writers: list[PipeWriter] = []

    def ping(round_: int) -> None:
        size = burst if round_ % 100 == 99 else 1
        for i in range(size):
            writers[0].send([round_, i, size], [BLOCK[i : i + 100]])

    def on_ping(source: int, header: Any, payloads: list[memoryview]) -> None:
        round_, i, size = header
        assert bytes(payloads[0]) == BLOCK[i : i + 100]
        if i == size - 1:
            writers[1].send([round_])

    def on_pong(source: int, header: Any, payloads: list[memoryview]) -> None:
        assert header == [state["round"]]
        state["round"] += 1
        if state["round"] < rounds:
            ping(state["round"])

    mesh_0, mesh_1 = pair.make(on_pong, on_ping)
    writers += [mesh_0.writer(1), mesh_1.writer(0)]
    ping(0)
    run_until(pair.loop, lambda: state["round"] >= rounds, 50)


def test_drain_yields_to_other_callbacks_each_turn(pair: Pair) -> None:
    received: list[int] = []
    mesh_0, mesh_1 = pair.make(ignore, lambda source, header, payloads: received.append(1))
    mesh_1.pause_reading()
    for seq in range(1000):
        mesh_0.writer(1).send([seq])
    run_for(pair.loop, 0.1)
    seen_by_then: list[int] = []
    mesh_1.resume_reading()  # schedules the drain first, so it runs before the probe
    pair.loop.call_soon(lambda: seen_by_then.append(len(received)))
    run_until(pair.loop, lambda: len(received) == 1000, 10)
    assert 1 <= seen_by_then[0] <= pipe_receive_messages_per_turn_max


def test_flush_continues_past_one_turn(pair: Pair) -> None:
    """With a high-water mark above the per-turn flush bound, the pipe frees more room than
    one turn fills: the flush must carry on by itself, as no further edge will come."""
    checker = Checker()
    mesh_0, mesh_1 = pair.make(ignore, checker, hwm=4 * pipe_flush_messages_per_turn_max)
    mesh_1.pause_reading()
    for seq in range(20_000):
        mesh_0.writer(1).send(header_for(seq), payloads_for(seq))
    run_for(pair.loop, 0.1)
    assert mesh_0.writer(1).backlog_messages > 0
    mesh_1.resume_reading()
    run_until(pair.loop, lambda: checker.count == 20_000, 20)
    assert checker.errors == []


def test_zmq_writer_may_start_before_its_reader() -> None:
    """Shards start in any order: sends to a shard not yet bound wait, then arrive in order."""
    loop, run_dir = asyncio.new_event_loop(), short_run_dir()
    checker = Checker()
    meshes = [ZmqPipeMesh(0, 2, run_dir, loop, ignore)]
    try:
        produce(loop, meshes[0].writer(1), 2000)
        run_for(loop, 0.1)
        assert meshes[0].writer(1).backlog_messages > 0
        meshes.append(ZmqPipeMesh(1, 2, run_dir, loop, checker))
        run_until(loop, lambda: checker.count == 2000, 20)
        assert checker.errors == []
    finally:
        for mesh in meshes:
            mesh.close()
        loop.close()
        shutil.rmtree(run_dir)


def test_a_bad_header_breaks_the_pipe_loudly() -> None:
    """Dropped, a bad message left its sender waiting forever: now the shard is told which
    pipe broke and why (it stops the node), and nothing after it is lost."""
    loop, run_dir = asyncio.new_event_loop(), short_run_dir()
    checker = Checker()
    broken: list[tuple[int, str]] = []
    mesh = ZmqPipeMesh(1, 2, run_dir, loop, checker, on_broken=lambda s, r: broken.append((s, r)))
    context = zmq.Context()
    raw = context.socket(zmq.PUSH)
    try:
        raw.connect("ipc://" + pipe_path(run_dir, 0, 1))
        raw.send_multipart([b"\xc1", b"payload"])  # 0xc1: never used in msgpack
        raw.send_multipart([msgpack.packb(42)])  # valid msgpack, but not a dict or list
        raw.send_multipart([msgpack.packb(header_for(0))])
        run_until(loop, lambda: checker.count == 1, 5)
        assert checker.errors == []
        assert [source for source, _ in broken] == [0, 0]
        assert "does not decode" in broken[0][1] and "not a dict or list" in broken[1][1]
    finally:
        raw.close(linger=0)
        context.term()
        mesh.close()
        loop.close()
        shutil.rmtree(run_dir)


def test_run_dir_too_long_fails_loudly() -> None:
    with pytest.raises(AssertionError):
        pipe_path("/tmp/" + "x" * 100, 0, 1)


def test_memory_messages_sent_before_the_reader_exists_wait() -> None:
    loop = asyncio.new_event_loop()
    try:
        network = MemoryPipeNetwork(2, loop)
        checker = Checker()
        mesh_0 = network.mesh(0, ignore)
        for seq in range(10):
            mesh_0.writer(1).send(header_for(seq), payloads_for(seq))
        run_for(loop, 0.01)
        network.mesh(1, checker)
        run_until(loop, lambda: checker.count == 10, 5)
        assert checker.errors == []
    finally:
        loop.close()


# Two processes --------------------------------------------------------------------------


def _child(mode: str, run_dir: str, count: int, go: MpEvent | None, cpu: int | None) -> None:
    """Shard 1 in its own process. Modes: fifo, paused (fifo reader that starts late), echo,
    sink. It reports back over its own pipe and exits when shard 0 says stop."""
    logging.basicConfig(level=logging.WARNING)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    loop = asyncio.new_event_loop()
    checker = Checker()
    sink = {"messages": 0, "bytes": 0}
    writers: list[PipeWriter] = []

    def on_message(source: int, header: Any, payloads: list[memoryview]) -> None:
        if isinstance(header, dict) and "stop" in header:
            loop.stop()
        elif mode == "echo":
            writers[0].send(header, payloads)
        elif mode == "sink":
            if isinstance(header, dict) and "end" in header:
                writers[0].send({"sink": dict(sink)})
                sink.update(messages=0, bytes=0)
            else:
                sink["messages"] += 1
                sink["bytes"] += sum(p.nbytes for p in payloads)
        else:
            checker(source, header, payloads)
            if checker.count == count:
                writers[0].send({"report": checker.count, "errors": checker.errors})

    mesh = ZmqPipeMesh(1, 2, run_dir, loop, on_message)
    writers.append(mesh.writer(0))
    writers[0].send({"ready": True})  # goes out through ZeroMQ's thread, loop or not
    if mode == "echo":
        _raw_echo(run_dir, count)  # the baseline, before this shard's loop starts
    if mode == "fifo":
        produce(loop, writers[0], count)
    if go is not None:
        assert go.wait(30), "never told to go"
    try:
        loop.run_forever()
    finally:
        mesh.close()
        loop.close()


class Parent:
    """Shard 0 in this process, shard 1 in a spawned child."""

    def __init__(self, mode: str, count: int = 0, paused: bool = False, pin: bool = False):
        self.loop = asyncio.new_event_loop()
        self.run_dir = short_run_dir()
        self.replies: list[Any] = []
        self.checker = Checker()
        self.go = multiprocessing.get_context("spawn").Event() if paused else None
        self._affinity = os.sched_getaffinity(0)
        cpus = sorted(self._affinity)
        pinned = pin and len(cpus) >= 2
        if pinned:
            os.sched_setaffinity(0, {cpus[0]})
        self.on_reply: Callable[[Any, list[memoryview]], None] | None = None
        self.mesh = ZmqPipeMesh(0, 2, self.run_dir, self.loop, self._on_message)
        self.writer = self.mesh.writer(1)
        spawn = multiprocessing.get_context("spawn")
        child_cpu = cpus[1] if pinned else None
        args = (mode, self.run_dir, count, self.go, child_cpu)
        self.child = spawn.Process(target=_child, args=args, daemon=True)
        self.child.start()
        run_until(self.loop, lambda: len(self.replies) > 0 or not self.child.is_alive(), 20)
        assert self.replies and self.replies.pop(0) == {"ready": True}, "the child did not start"

    def _on_message(self, source: int, header: Any, payloads: list[memoryview]) -> None:
        if self.on_reply is not None:
            self.on_reply(header, payloads)
        elif isinstance(header, dict) and "seq" in header:
            self.checker(source, header, payloads)
        else:
            self.replies.append(header)

    def stop(self) -> None:
        self.on_reply = None
        if self.child.is_alive():
            self.writer.send({"stop": True})
            run_until(self.loop, lambda: not self.child.is_alive(), 10)
        self.child.join(5)
        if self.child.is_alive():
            self.child.kill()
            self.child.join(5)
        self.mesh.close()
        self.loop.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.sched_setaffinity(0, self._affinity)


@pytest.fixture
def parents() -> Iterator[Callable[..., Parent]]:
    made: list[Parent] = []

    def make(*args: Any, **kwargs: Any) -> Parent:
        made.append(Parent(*args, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for parent in made:
            parent.stop()


def test_two_processes_fifo_both_ways(parents: Callable[..., Parent]) -> None:
    parent = parents("fifo", FIFO_MESSAGES)
    produce(parent.loop, parent.writer, FIFO_MESSAGES)
    run_until(
        parent.loop,
        lambda: parent.checker.count >= FIFO_MESSAGES and len(parent.replies) > 0,
        50,
    )
    assert parent.checker.errors == []
    assert parent.checker.next_seq == {1: FIFO_MESSAGES}
    assert parent.replies == [{"report": FIFO_MESSAGES, "errors": []}]
    assert parent.child.exitcode is None


def test_two_processes_backpressure(parents: Callable[..., Parent]) -> None:
    """The child does not run its loop until told to: the parent's backlog takes the rest."""
    hwm = pipe_high_water_mark_messages
    sent = 2 * hwm + 200
    parent = parents("paused", sent, paused=True)
    for seq in range(sent):
        parent.writer.send(header_for(seq), payloads_for(seq))
    run_for(parent.loop, 0.5)
    accepted = sent - parent.writer.backlog_messages
    # Small messages: the kernel's socket buffers hold more of them than of big ones.
    assert hwm <= accepted <= 2 * hwm + 150, accepted
    assert parent.writer.backlog_bytes > 0
    assert parent.go is not None
    parent.go.set()
    run_until(parent.loop, lambda: len(parent.replies) > 0, 20)
    assert parent.replies == [{"report": sent, "errors": []}]
    assert parent.writer.backlog_bytes == 0


# Figures ---------------------------------------------------------------------------------


def measure_one_way(parent: Parent, count: int, payload: bytes, chunk: int) -> tuple[float, int]:
    """(seconds, messages the child saw) for `count` messages with one payload frame each."""
    view = memoryview(payload)
    header = {"seq": 0}

    def step(left: int) -> None:
        if parent.writer.backlog_bytes > 32 << 20:
            parent.loop.call_later(0.0005, step, left)
            return
        for _ in range(min(left, chunk)):
            parent.writer.send(header, [view])
        if left > chunk:
            parent.loop.call_soon(step, left - chunk)
        else:
            parent.writer.send({"end": True})

    start = time.perf_counter()
    parent.loop.call_soon(step, count)
    run_until(parent.loop, lambda: len(parent.replies) > 0, 40)
    seconds = time.perf_counter() - start
    return seconds, parent.replies.pop()["sink"]["messages"]


def percentiles(seconds: list[float]) -> str:
    ordered = sorted(seconds[100:])  # the first ones pay for connection set-up
    p50, p99 = statistics.median(ordered), ordered[int(len(ordered) * 0.99)]
    return f"p50 {p50 * 1e6:.0f} µs, p99 {p99 * 1e6:.0f} µs"


def raw_round_trips(run_dir: str, count: int) -> list[float]:
    """The baseline: blocking pyzmq PUSH/PULL, no loop, no msgpack, against _raw_echo."""
    context = zmq.Context(io_threads=1)
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        pull.bind(f"ipc://{run_dir}/raw-1-0")
        push.connect(f"ipc://{run_dir}/raw-0-1")
        rtts = []
        for i in range(count):
            start = time.perf_counter()
            push.send_multipart([i.to_bytes(4, "big"), BLOCK[:100]])
            pull.recv_multipart()
            rtts.append(time.perf_counter() - start)
        return rtts
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        context.term()


def _raw_echo(run_dir: str, count: int) -> None:
    context = zmq.Context(io_threads=1)
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        pull.bind(f"ipc://{run_dir}/raw-0-1")
        push.connect(f"ipc://{run_dir}/raw-1-0")
        for _ in range(count):
            push.send_multipart(pull.recv_multipart())
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        context.term()


ROUND_TRIPS = 10_000


def test_figures_two_processes(parents: Callable[..., Parent]) -> None:
    """Printed, not asserted: compare with DESIGN.md §11 (~120 µs round trip, ~1.7 GB/s).
    Both processes pinned to their own core, as shards are; the raw pyzmq round trip is
    the baseline measured in the same run."""
    lines = []
    sink = parents("sink", pin=True)
    for label, count, size, chunk in (("64 KiB frames", 20_000, 65536, 64),
                                      ("100 B messages", 300_000, 100, 1000)):  # fmt: skip
        seconds, seen = measure_one_way(sink, count, BLOCK[:size], chunk)
        assert seen == count
        lines.append(
            f"one-way {label}: {count / seconds:,.0f} msg/s, "
            f"{count * size / seconds / 1e9:.2f} GB/s of payload"
        )
    sink.stop()

    echo = parents("echo", ROUND_TRIPS, pin=True)
    raw_rtts = raw_round_trips(echo.run_dir, ROUND_TRIPS)  # the child serves this first
    rtts: list[float] = []
    sent_at = [0.0]

    def on_reply(header: Any, payloads: list[memoryview]) -> None:
        rtts.append(time.perf_counter() - sent_at[0])
        if len(rtts) < ROUND_TRIPS:
            sent_at[0] = time.perf_counter()
            echo.writer.send([len(rtts)], [BLOCK[:100]])

    echo.on_reply = on_reply
    sent_at[0] = time.perf_counter()
    echo.writer.send([0], [BLOCK[:100]])
    run_until(echo.loop, lambda: len(rtts) >= ROUND_TRIPS, 40)
    lines.append(f"round trip, pipes on both loops (100 B): {percentiles(rtts)}")
    lines.append(f"round trip, raw blocking pyzmq (100 B): {percentiles(raw_rtts)}")
    print("\n" + "\n".join(lines))
