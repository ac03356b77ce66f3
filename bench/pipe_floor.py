"""The floor of a cross-core hop: what one round trip over the shards' pipes costs with no work.

A forwarded produce needs at least one round trip between two shard processes: the batch's
reference goes to the owner, and an answer comes back before the client can be answered.
This measures that round trip alone, on the same machine and in the same run as the shard
cases: two processes pinned to their own cores as shards are, each with an asyncio loop and
the real `shards.pipes.ZmqPipeMesh`, ZeroMQ's I/O threads made helpers as a shard makes
them (`shards.threads`), headers shaped like a forwarded produce and its answer, and no
partition, arena or connection behind them. Shard 0 sends, shard 1 answers, one message in
flight at a time, as a cross-core produce at one partition is.

The figure is the CPU both processes spend per round trip, all threads (loop, ZeroMQ I/O
threads, kernel time on their behalf), from `time.process_time()`. The shard cases set it
beside the CPU their targets leave per forwarded request (bench/shards.py): no forwarding
path with a round trip per request can cost less than this, whatever it does.

    python -m bench.pipe_floor [--round-trips 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = ["measure_pipe_round_trip"]

WARMUP_ROUND_TRIPS = 2_000
ROUND_TRIPS = 20_000
# Both ends bound before the first message, and the last answer out before a socket closes.
SETTLE_S = 0.2
# A side gives up if its round trips are not done by then (~4 s for 22,000 here).
SIDE_TIMEOUT_S = 60.0
# What the parent waits for a side process: its own limit, plus starting Python and imports.
PROCESS_TIMEOUT_S = SIDE_TIMEOUT_S + 30.0
# The shapes of a forwarded produce's header and of its "produced" answer (shards/router.py).
_REQUEST = {"t": "produce", "topic": "bench-pipe-floor", "p": 0, "acks": -1, "a": [0, 944_000]}
_ANSWER = {"e": 0, "o": 0, "lat": -1, "lso": 0, "m": None, "d": 1, "t": "reply"}


def _side(shard: int, run_dir: str, warmup: int, round_trips: int) -> dict[str, Any]:
    """One process's end: pinned, one loop, the real pipe mesh; its own CPU over the run."""
    from shards.pipes import ZmqPipeMesh
    from shards.threads import demote_helper_threads

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[shard % len(cores)]})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    done: asyncio.Future[None] = loop.create_future()
    total = warmup + round_trips
    count = 0
    start: tuple[float, float, float] | None = None
    end: tuple[float, float, float] | None = None

    def mark() -> tuple[float, float, float]:
        return time.process_time(), time.thread_time(), time.perf_counter()

    def on_message(_source: int, header: Any, _frames: list[memoryview]) -> None:
        nonlocal count, start, end
        count += 1
        if count == warmup:
            start = mark()
        if shard == 1:
            mesh.writer(0).send({**_ANSWER, "id": header["id"], "o": count})
        elif count < total:
            mesh.writer(1).send({**_REQUEST, "id": count})
        if count == total:
            end = mark()
            done.set_result(None)

    mesh = ZmqPipeMesh(shard, 2, run_dir, loop, on_message)
    try:
        demote_helper_threads(threading.get_native_id())

        async def run() -> None:
            if shard == 0:
                await asyncio.sleep(SETTLE_S)
                mesh.writer(1).send({**_REQUEST, "id": 0})
            await asyncio.wait_for(done, timeout=SIDE_TIMEOUT_S)
            await asyncio.sleep(SETTLE_S)

        loop.run_until_complete(run())
    finally:
        mesh.close()
        loop.close()
    assert start is not None and end is not None
    n = total - warmup
    return {
        "shard": shard,
        "cpu_us": (end[0] - start[0]) / n * 1e6,
        "loop_thread_us": (end[1] - start[1]) / n * 1e6,
        "wall_us": (end[2] - start[2]) / n * 1e6,
    }


def measure_pipe_round_trip(
    round_trips: int = ROUND_TRIPS, timeout: float = PROCESS_TIMEOUT_S
) -> dict:
    """Run the two processes; CPU-µs per round trip (both), loop-thread µs, and wall µs."""
    with tempfile.TemporaryDirectory(prefix="krill-pipe-floor-") as run_dir:
        argv = [sys.executable, "-m", "bench.pipe_floor", "side", "--run-dir", run_dir,
                "--round-trips", str(round_trips)]  # fmt: skip
        procs = [
            subprocess.Popen([*argv, "--shard", str(shard)], stdout=subprocess.PIPE, text=True)
            for shard in (1, 0)
        ]
        try:
            sides = []
            for proc in procs:
                out, _ = proc.communicate(timeout=timeout)
                if proc.returncode != 0:
                    raise RuntimeError(f"pipe floor side exited {proc.returncode}")
                sides.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    by_shard = {s["shard"]: s for s in sides}
    return {
        "round_trips": round_trips,
        "cpu_us_per_round_trip": round(sum(s["cpu_us"] for s in sides), 1),
        "loop_threads_us_per_round_trip": round(sum(s["loop_thread_us"] for s in sides), 1),
        "wall_us_per_round_trip": round(by_shard[0]["wall_us"], 1),
        "by_shard_cpu_us": [round(by_shard[i]["cpu_us"], 1) for i in (0, 1)],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pipe_floor")
    ap.add_argument("mode", nargs="?", default="measure", choices=["measure", "side"])
    ap.add_argument("--shard", type=int, choices=[0, 1], default=0)
    ap.add_argument("--run-dir", default="")
    ap.add_argument("--round-trips", type=int, default=ROUND_TRIPS)
    args = ap.parse_args(argv)
    if args.round_trips < 1:
        ap.error("--round-trips must be at least 1")
    if args.mode == "side":
        if not args.run_dir:
            ap.error("side needs --run-dir")
        warmup = min(WARMUP_ROUND_TRIPS, args.round_trips)
        print(json.dumps(_side(args.shard, args.run_dir, warmup, args.round_trips)), flush=True)
        return
    print(json.dumps(measure_pipe_round_trip(args.round_trips)), flush=True)


if __name__ == "__main__":
    main()
