"""The shard's blocking-I/O pool, batched per loop turn.

Actors hand blocking calls (fdatasync above all) to the pool with `run(fn, done)`. Calls made
during one loop turn are gathered and handed to the worker threads as a few jobs, not one
each, and each job reports all its results back with a single `call_soon_threadsafe`.

Why: every hand-off wakes a thread, and every wake-up makes it fight the loop thread for the
GIL. Measured on this machine with one produce request touching six partitions, one job per
fdatasync spent a third of the loop thread's time handing jobs over. Batching keeps the
number of thread wake-ups per loop turn at most `threads`, whatever the number of
partitions, and each job takes at least `calls_per_job` calls: a wake-up costs more CPU here
than the ~0.25 ms a further fdatasync adds to the job (with three partitions per shard on two
shards, one job instead of three cut the node's CPU per GB by a quarter). Calls in one job
run in order; jobs run in parallel, so with many partitions fdatasyncs of different files
still overlap on the device.

How a worker is woken matters as much as how often:
- Workers are helpers (shards/threads.py, SCHED_BATCH): a woken worker does not preempt the
  loop thread, which holds the GIL it would need at once; it runs when the loop waits.
- Each worker sleeps in `os.read` on an eventfd of its own, and the loop wakes it with
  `os.write`, which lets go of the GIL for the system call. (A `queue.SimpleQueue` or a
  `threading.Condition` wakes the worker while the loop still holds the GIL.) Against a
  `ThreadPoolExecutor` of SCHED_BATCH workers: 7–13% less CPU per GB in one A/B run; in a
  second, 6% less with two shards and 3% more with one (within the noise).

With `stats`, each call's time is observed in two parts: its wait, from `run` to a worker
starting it (the loop turn that gathers it, the hand-off, the calls before it in its job, a
backlog), and its call itself (the fdatasync in the kernel): `krill_io_queue_wait_seconds`
and `krill_io_call_seconds`, by pool.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from actors.metrics import LATENCY_BUCKETS_S, Histogram
from shards.threads import run_as_helper

__all__ = ["IoPool", "IoPoolStats"]

Done = Callable[[Any, BaseException | None], None]
Job = list[tuple[Callable[[], Any], Done, float]]  # the call, its callback, when it was run
# What a job gives back per call: its callback, result, error, wait and call time (seconds).
Outcome = tuple[Done, Any, BaseException | None, float, float]


class IoPoolStats:
    """A pool's calls timed (module docstring). Loop thread only."""

    __slots__ = ("queue_wait", "call")

    def __init__(self) -> None:
        self.queue_wait = Histogram(LATENCY_BUCKETS_S)
        self.call = Histogram(LATENCY_BUCKETS_S)

    def snapshot(self) -> dict[str, Any]:
        return {"queue_wait": self.queue_wait.snapshot(), "call": self.call.snapshot()}

_ONE = (1).to_bytes(8, "little")  # an eventfd write: add 1 to its counter


class IoPool:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, threads: int, name: str, calls_per_job: int = 1,
        stats: IoPoolStats | None = None,
    ) -> None:
        self._loop = loop
        self.stats = stats
        self._threads = threads
        self._calls_per_job = max(1, calls_per_job)
        self._name = name
        self._pending: Job = []
        self._outstanding = 0  # calls handed to `run` whose `done` has not been called yet
        # Shared with the workers, under `_lock`: who waits for a job, and jobs nobody took.
        # The backlog is bounded by the callers: a partition has one flush in flight at most,
        # the reader endpoint `reader_requests_in_flight_max` reads.
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._backlog: collections.deque[Job] = collections.deque()
        self._closed = False
        self._workers: list[_Worker] = []  # the loop thread's own list, for shutdown

    @property
    def busy(self) -> bool:
        """Whether any call is still out (a stopping shard waits for its flushes)."""
        return self._outstanding > 0

    @property
    def outstanding(self) -> int:
        """Calls handed to `run` and not yet called back (bounded by the callers)."""
        return self._outstanding

    def run(self, fn: Callable[[], Any], done: Done) -> None:
        """Run `fn` on a worker; `done(result, error)` is called back on the loop thread."""
        if not self._pending:
            self._loop.call_soon(self._dispatch)
        self._pending.append((fn, done, time.perf_counter()))
        self._outstanding += 1

    def shutdown(self) -> None:
        """Finish every job handed over, then stop the workers."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            os.write(worker.wake_fd, _ONE)
        for worker in self._workers:
            worker.thread.join()
            os.close(worker.wake_fd)
        self._workers = []

    def _dispatch(self) -> None:
        calls, self._pending = self._pending, []
        jobs = min(self._threads, -(-len(calls) // self._calls_per_job))
        wake: list[_Worker] = []
        with self._lock:
            for j in range(jobs):
                job = calls[j::jobs]
                if self._idle:
                    worker = self._idle.pop()
                    worker.job = job
                    wake.append(worker)
                elif len(self._workers) < self._threads:
                    self._workers.append(_Worker(self, job, f"{self._name}_{len(self._workers)}"))
                else:
                    self._backlog.append(job)  # the next worker to finish takes it
        for worker in wake:
            os.write(worker.wake_fd, _ONE)

    def _next_job(self, worker: _Worker) -> Job | None:
        """A job for `worker` (from the backlog), or None: it is idle now, or told to stop."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            if not self._closed:
                self._idle.append(worker)
            return None

    def _run_job(self, calls: Job) -> None:
        outcomes: list[Outcome] = []
        clock = time.perf_counter
        for fn, done, queued in calls:
            started = clock()
            try:
                result, error = fn(), None
            except Exception as e:  # handed back to the caller, who decides what it means
                result, error = None, e
            outcomes.append((done, result, error, started - queued, clock() - started))
        self._loop.call_soon_threadsafe(self._deliver, outcomes)

    def _deliver(self, outcomes: list[Outcome]) -> None:
        self._outstanding -= len(outcomes)
        stats = self.stats
        for done, result, error, waited, took in outcomes:
            if stats is not None:
                stats.queue_wait.observe(waited)
                stats.call.observe(took)
            done(result, error)


class _Worker:
    """One thread of the pool: runs the job it is given, then the backlog, then sleeps on its
    eventfd until the loop hands it another (or the pool closes)."""

    def __init__(self, pool: IoPool, job: Job, name: str) -> None:
        self.pool = pool
        self.job: Job | None = job  # set by the loop before it writes to wake_fd
        self.wake_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        run_as_helper()
        pool = self.pool
        while True:
            job, self.job = self.job, None
            while job is not None:
                pool._run_job(job)
                job = pool._next_job(self)  # None: idle now, or the pool is closing
            if pool._closed:
                return
            # Idle. The loop (or shutdown) takes a worker off the idle list before it writes
            # to its eventfd, so every wake-up brings a job, or the close.
            os.read(self.wake_fd, 8)
            if self.job is None:
                return  # the pool closed

