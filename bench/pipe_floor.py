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

With `handoff_bytes`, each round trip also hands a request's bytes from one core to the
other, as a forwarded produce does: the sender copies them into a shared-memory region
(as a connection receives a request into its shard's arena), the owner copies them out (as
its `pwrite` copies them into the page cache), each from and into rings of
`HANDOFF_REGIONS` regions, so the bytes come cold as a client's do. The same two copies are
then timed in one process on one core, as the local path makes them, and the difference is
the handoff floor: what a forwarded request costs beyond the same bytes handled on one
core, before any of the broker's own work.

    python -m bench.pipe_floor [--round-trips 20000] [--handoff-bytes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
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
# Regions in each ring of a handoff run: 16 requests of ~1 MB are more than a core's cache.
HANDOFF_REGIONS = 16


class _Rings:
    """A handoff's buffers: a private ring the bytes come from, the shared one they cross
    in (a memfd both sides map, as the shards map the arenas), a private one they go to."""

    def __init__(self, nbytes: int, shared_fd: int) -> None:
        self.nbytes = nbytes
        size = nbytes * HANDOFF_REGIONS
        self.incoming = memoryview(bytearray(os.urandom(nbytes)) * HANDOFF_REGIONS)
        self.shared = memoryview(mmap.mmap(shared_fd, size))
        self.outgoing = memoryview(bytearray(size))

    def receive(self, i: int) -> int:
        """Copy request `i` into its shared region, as a connection receives it; its offset."""
        at = (i % HANDOFF_REGIONS) * self.nbytes
        self.shared[at : at + self.nbytes] = self.incoming[at : at + self.nbytes]
        return at

    def write(self, i: int, at: int) -> None:
        """Copy the shared region at `at` out, as an append copies it into the page cache."""
        to = (i * 7 % HANDOFF_REGIONS) * self.nbytes  # not where it came from
        self.outgoing[to : to + self.nbytes] = self.shared[at : at + self.nbytes]


def _pin(shard: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[shard % len(cores)]})


def _side(
    shard: int, run_dir: str, warmup: int, round_trips: int, rings: _Rings | None = None
) -> dict[str, Any]:
    """One process's end: pinned, one loop, the real pipe mesh; its own CPU over the run."""
    from shards.pipes import ZmqPipeMesh
    from shards.threads import demote_helper_threads

    _pin(shard)
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
            if rings is not None:
                rings.write(count, header["a"][0])
            mesh.writer(0).send({**_ANSWER, "id": header["id"], "o": count})
        elif count < total:
            send_request(count)
        if count == total:
            end = mark()
            done.set_result(None)

    def send_request(i: int) -> None:
        request = {**_REQUEST, "id": i}
        if rings is not None:
            request["a"] = [rings.receive(i), rings.nbytes]
        mesh.writer(1).send(request)

    mesh = ZmqPipeMesh(shard, 2, run_dir, loop, on_message)
    try:
        demote_helper_threads(threading.get_native_id())

        async def run() -> None:
            if shard == 0:
                await asyncio.sleep(SETTLE_S)
                send_request(0)
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


def _copies_on_one_core(rings: _Rings, warmup: int, requests: int) -> dict[str, Any]:
    """The handoff's two copies per request, both in this process on one core (the local
    path); CPU-µs per request."""
    _pin(0)

    def one(i: int) -> None:
        rings.write(i, rings.receive(i))

    for i in range(warmup):
        one(i)
    start = time.process_time()
    for i in range(warmup, warmup + requests):
        one(i)
    return {"cpu_us": (time.process_time() - start) / requests * 1e6}


def measure_pipe_round_trip(
    round_trips: int = ROUND_TRIPS, timeout: float = PROCESS_TIMEOUT_S, handoff_bytes: int = 0
) -> dict:
    """Run the two processes; CPU-µs per round trip (both), loop-thread µs, and wall µs.
    With `handoff_bytes`, also the same copies on one core and the handoff floor."""
    with tempfile.TemporaryDirectory(prefix="krill-pipe-floor-") as run_dir:
        options = ["--run-dir", run_dir, "--round-trips", str(round_trips)]
        fds: list[int] = []
        if handoff_bytes:
            fd = os.memfd_create("krill-pipe-floor")
            os.ftruncate(fd, handoff_bytes * HANDOFF_REGIONS)
            fds = [fd]
            options += ["--handoff-bytes", str(handoff_bytes), "--handoff-fd", str(fd)]
        try:
            # Both sides at once, the answering one first; then the copies on one core.
            runs = [_run([["side", "--shard", str(s), *options] for s in (1, 0)], timeout, fds)]
            if handoff_bytes:
                runs.append(_run([["copies", *options]], timeout, fds))
        finally:
            for fd in fds:
                os.close(fd)
    sides = runs[0]
    by_shard = {s["shard"]: s for s in sides}
    figures: dict[str, Any] = {
        "round_trips": round_trips,
        "cpu_us_per_round_trip": round(sum(s["cpu_us"] for s in sides), 1),
        "loop_threads_us_per_round_trip": round(sum(s["loop_thread_us"] for s in sides), 1),
        "wall_us_per_round_trip": round(by_shard[0]["wall_us"], 1),
        "by_shard_cpu_us": [round(by_shard[i]["cpu_us"], 1) for i in (0, 1)],
    }
    if handoff_bytes:
        one_core = runs[1][0]["cpu_us"]
        figures["handoff_bytes"] = handoff_bytes
        figures["copies_on_one_core_cpu_us"] = round(one_core, 1)
        figures["handoff_floor_cpu_us"] = round(figures["cpu_us_per_round_trip"] - one_core, 1)
    return figures


def _run(commands: list[list[str]], timeout: float, fds: list[int]) -> list[dict]:
    """`python -m bench.pipe_floor <command>` for each command, all at once; their figures."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.pipe_floor", *command],
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=fds,
        )
        for command in commands
    ]
    return _collect(procs, timeout)


def _collect(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict]:
    """Each process's last line of output (its figures), in order; none is left running."""
    try:
        out = []
        for proc in procs:
            stdout, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"pipe floor process exited {proc.returncode}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pipe_floor")
    ap.add_argument("mode", nargs="?", default="measure", choices=["measure", "side", "copies"])
    ap.add_argument("--shard", type=int, choices=[0, 1], default=0)
    ap.add_argument("--run-dir", default="")
    ap.add_argument("--round-trips", type=int, default=ROUND_TRIPS)
    ap.add_argument("--handoff-bytes", type=int, default=0, help="bytes handed over per request")
    ap.add_argument("--handoff-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.round_trips < 1:
        ap.error("--round-trips must be at least 1")
    if args.handoff_bytes < 0:
        ap.error("--handoff-bytes must not be negative")
    warmup = min(WARMUP_ROUND_TRIPS, args.round_trips)
    if args.mode in ("side", "copies"):
        if not args.run_dir:
            ap.error(f"{args.mode} needs --run-dir")
        if args.mode == "copies" and not args.handoff_bytes:
            ap.error("copies needs --handoff-bytes")
        rings = None
        if args.handoff_bytes:
            if args.handoff_fd < 0:
                ap.error(f"{args.mode} with --handoff-bytes needs --handoff-fd")
            rings = _Rings(args.handoff_bytes, args.handoff_fd)
        if args.mode == "copies":
            assert rings is not None
            figures = _copies_on_one_core(rings, warmup, args.round_trips)
        else:
            figures = _side(args.shard, args.run_dir, warmup, args.round_trips, rings)
        print(json.dumps(figures), flush=True)
        return
    figures = measure_pipe_round_trip(args.round_trips, handoff_bytes=args.handoff_bytes)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
