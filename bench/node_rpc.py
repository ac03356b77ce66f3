"""Node RPC beside the pipes: what a call costs between two nodes' shards over loopback TCP
(shards/node_mesh.py), and between two shards of one node over the ipc pipes
(shards/pipes.py), in the same run.

Two processes, each pinned to a core of its own as shards are, each with one loop, a Router
and its mesh: for `tcp` a NodeMesh (node 1's shard 0 calls node 2's shard 1), for `ipc` the
node's ZmqPipeMesh (shard 0 calls shard 1). The calls are a bench kind registered in these
two processes' `SERVE` only. Side 0 calls, side 1 answers:

- round trips: one call in flight, a small body, answered with it: calls per second and µs
  per round trip (wall);
- stream: calls carrying one 64 KiB payload frame each (zero-copy), `STREAM_WINDOW` in
  flight, answered with an empty body: MB/s of payload one way, and calls per second. The
  Router gathers what one turn sends to one shard into one message, as it does in a shard.

Each side also reports its CPU seconds over the whole run (all threads).

    python -m bench.node_rpc [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = ["node_rpc"]

ROUND_TRIPS = 20_000
STREAM_CALLS = 16_000  # 1 GiB of 64 KiB payloads
QUICK_DIVISOR = 10
PAYLOAD_BYTES = 64 * 1024
STREAM_WINDOW = 32  # calls in flight in the stream
WARMUP_CALLS = 500
# Both ends bound and connected before the first call; the answering side's last answer out.
SETTLE_S = 0.3
# A side gives up if its work is not done by then (a few seconds here).
SIDE_TIMEOUT_S = 120.0
# What the parent waits for a side: its own limit, plus starting Python and imports.
PROCESS_TIMEOUT_S = SIDE_TIMEOUT_S + 30.0
HOST = "127.0.0.1"
# Bench-only call kinds, far from the real ones (shards/calls/__init__.py).
_ECHO, _SINK, _STOP = 240, 241, 242


def node_rpc(args: argparse.Namespace) -> dict[str, Any]:
    """Both transports, one after the other; `args.quick` does a tenth of the calls."""
    divisor = QUICK_DIVISOR if getattr(args, "quick", False) else 1
    round_trips, stream_calls = ROUND_TRIPS // divisor, STREAM_CALLS // divisor
    started = time.perf_counter()
    figures: dict[str, Any] = {
        "case": "node_rpc", "payload_bytes": PAYLOAD_BYTES, "stream_window": STREAM_WINDOW,
        "round_trips": round_trips, "stream_calls": stream_calls,
    }  # fmt: skip
    for transport in ("tcp", "ipc"):
        figures[transport] = _measure(transport, round_trips, stream_calls)
    tcp, ipc = figures["tcp"], figures["ipc"]
    figures["tcp_over_ipc_round_trip_us"] = round(tcp["round_trip_us"] / ipc["round_trip_us"], 2)
    figures["tcp_over_ipc_stream_mb_s"] = round(tcp["stream_mb_s"] / ipc["stream_mb_s"], 2)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures


def _measure(transport: str, round_trips: int, stream_calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="krill-node-rpc-") as run_dir:
        ports = [_free_port_run(1), _free_port_run(2)]
        common = [
            "side", "--transport", transport, "--run-dir", run_dir,
            "--ports", f"{ports[0]},{ports[1]}", "--round-trips", str(round_trips),
            "--stream-calls", str(stream_calls),
        ]  # fmt: skip
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.node_rpc", *common, "--side", str(side)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            for side in (1, 0)  # the answering side first
        ]
        answering, calling = _collect(procs)
    calling["answering_cpu_s"] = answering["cpu_s"]
    return calling


def _collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each process's last line of output (its figures), in order; none is left running."""
    try:
        out = []
        for proc in procs:
            stdout, _ = proc.communicate(timeout=PROCESS_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"node RPC bench side exited {proc.returncode}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _free_port_run(count: int) -> int:
    """A port p with p .. p + count - 1 free: a node's RPC ports, one per shard."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            base = int(probe.getsockname()[1])
        if base + count <= 65535 and all(_port_free(base + k) for k in range(1, count)):
            return base
    raise RuntimeError("no run of free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


# One side -------------------------------------------------------------------------------------


class _Host:
    def __init__(self, shard_id: int) -> None:
        self.shard_id = shard_id
        self.shards = 2


def _side(args: argparse.Namespace) -> dict[str, Any]:
    """One process: pinned, one loop, a Router on the chosen mesh; its figures."""
    from actors.runtime import bind_loop
    from shards.calls import SERVE
    from shards.node_mesh import NodeMesh
    from shards.pipes import ZmqPipeMesh
    from shards.router import Router
    from shards.threads import demote_helper_threads

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[args.side % len(cores)]})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    bind_loop(loop)
    done: asyncio.Future[dict[str, Any]] = loop.create_future()
    box: list[Router] = []

    def on_message(source: Any, header: Any, frames: list[Any]) -> None:
        box[0].on_message(source, header, frames)

    mesh: Any
    if args.transport == "tcp":
        ports = [int(p) for p in args.ports.split(",")]
        node = args.side + 1  # node 1's shard 0 calls node 2's shard 1
        other = 3 - node
        mesh = NodeMesh(
            node, args.side, loop, on_message, (HOST, ports[args.side]),
            peers={other: (HOST, ports[1 - args.side])},
        )  # fmt: skip
        target: Any = (2, 1)
    else:
        mesh = ZmqPipeMesh(args.side, 2, args.run_dir, loop, on_message)
        target = 1
    router = Router(_Host(args.side), mesh)  # type: ignore[arg-type]  # serves no partition
    box.append(router)
    SERVE[_ECHO] = lambda request, body, _frames: request.answer(body)
    SERVE[_SINK] = lambda request, _body, _frames: request.answer(None)
    SERVE[_STOP] = lambda _request, _body, _frames: loop.call_later(SETTLE_S, done.set_result, {})
    demote_helper_threads(threading.get_native_id())
    try:
        if args.side == 1:
            loop.run_until_complete(asyncio.wait_for(done, SIDE_TIMEOUT_S + SETTLE_S))
            return {"side": 1, "cpu_s": round(time.process_time(), 2)}
        calls = asyncio.wait_for(_calls(router, target, args), SIDE_TIMEOUT_S)
        figures = loop.run_until_complete(calls)
        router.call(target, _STOP, None, [], None)
        loop.run_until_complete(asyncio.sleep(SETTLE_S))
        figures["cpu_s"] = round(time.process_time(), 2)
        return figures
    finally:
        router.close()
        mesh.close()
        loop.close()


async def _calls(router: Any, target: Any, args: argparse.Namespace) -> dict[str, Any]:
    await asyncio.sleep(SETTLE_S)
    await _round_trips(router, target, WARMUP_CALLS)
    started = time.perf_counter()
    await _round_trips(router, target, args.round_trips)
    round_trip_s = time.perf_counter() - started
    await _stream(router, target, WARMUP_CALLS)
    started = time.perf_counter()
    await _stream(router, target, args.stream_calls)
    stream_s = time.perf_counter() - started
    return {
        "round_trips_per_s": round(args.round_trips / round_trip_s),
        "round_trip_us": round(round_trip_s / args.round_trips * 1e6, 1),
        "stream_mb_s": round(args.stream_calls * PAYLOAD_BYTES / stream_s / 1e6),
        "stream_calls_per_s": round(args.stream_calls / stream_s),
    }


def _round_trips(router: Any, target: Any, count: int) -> asyncio.Future[None]:
    """`count` calls one after another, each sent from the answer of the last."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    body = ["bench", 0, "x" * 80]

    def one(i: int) -> None:
        if i == count:
            finished.set_result(None)
            return
        router.call(target, _ECHO, body, [], lambda _b, _f: one(i + 1))

    one(0)
    return finished


def _stream(router: Any, target: Any, count: int) -> asyncio.Future[None]:
    """`count` calls of one 64 KiB payload each, `STREAM_WINDOW` in flight."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    payload = os.urandom(PAYLOAD_BYTES)
    state = {"sent": 0, "answered": 0}

    def answered(_body: Any, _frames: list[Any]) -> None:
        state["answered"] += 1
        if state["answered"] == count:
            finished.set_result(None)
        elif state["sent"] < count:
            send()

    def send() -> None:
        state["sent"] += 1
        router.call(target, _SINK, None, [payload], answered)

    for _ in range(min(STREAM_WINDOW, count)):
        send()
    return finished


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.node_rpc")
    ap.add_argument("mode", nargs="?", default="measure", choices=["measure", "side"])
    ap.add_argument("--quick", action="store_true", help="a tenth of the calls")
    ap.add_argument("--transport", choices=["tcp", "ipc"], default="tcp")
    ap.add_argument("--side", type=int, choices=[0, 1], default=0)
    ap.add_argument("--run-dir", default="")
    ap.add_argument("--ports", default="")
    ap.add_argument("--round-trips", type=int, default=ROUND_TRIPS)
    ap.add_argument("--stream-calls", type=int, default=STREAM_CALLS)
    args = ap.parse_args(argv)
    if args.mode == "side":
        if not args.run_dir or (args.transport == "tcp" and not args.ports):
            ap.error("side needs --run-dir, and --ports for tcp")
        print(json.dumps(_side(args)), flush=True)
        return
    print(json.dumps(node_rpc(args)), flush=True)


if __name__ == "__main__":
    main()
