"""The shard's blocking-I/O pool, batched per loop turn.

Actors hand blocking calls (fdatasync above all) to the pool with `run(fn, done)`. Calls made
during one loop turn are gathered and handed to the worker threads as a few jobs, not one
each, and each job reports all its results back with a single `call_soon_threadsafe`.

Why: every hand-off wakes a thread, and every wake-up makes it fight the loop thread for the
GIL. Measured on this machine with one produce request touching six partitions, one job per
fdatasync spent a third of the loop thread's time inside `ThreadPoolExecutor.submit`.
Batching keeps the number of thread wake-ups per loop turn at most `threads`, whatever the
number of partitions, and each job takes at least `calls_per_job` calls: a wake-up costs more
CPU here than the ~0.25 ms a further fdatasync adds to the job (with three partitions per
shard on two shards, one job instead of three cut the node's CPU per GB by a quarter; see
bench/README.md). Calls in one job run in order; jobs run in parallel, so with many
partitions fdatasyncs of different files still overlap on the device. The workers run as
helpers (shards/threads.py): waking one never preempts the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

from shards.threads import run_as_helper

__all__ = ["IoPool"]

Done = Callable[[Any, BaseException | None], None]


class IoPool:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, threads: int, name: str, calls_per_job: int = 1
    ) -> None:
        self._loop = loop
        self._threads = threads
        self._calls_per_job = max(1, calls_per_job)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=name, initializer=run_as_helper
        )
        self._pending: list[tuple[Callable[[], Any], Done]] = []

    def run(self, fn: Callable[[], Any], done: Done) -> None:
        """Run `fn` on a worker; `done(result, error)` is called back on the loop thread."""
        if not self._pending:
            self._loop.call_soon(self._dispatch)
        self._pending.append((fn, done))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def _dispatch(self) -> None:
        calls, self._pending = self._pending, []
        jobs = min(self._threads, -(-len(calls) // self._calls_per_job))
        for j in range(jobs):
            self._executor.submit(self._run_job, calls[j::jobs])

    def _run_job(self, calls: list[tuple[Callable[[], Any], Done]]) -> None:
        outcomes: list[tuple[Done, Any, BaseException | None]] = []
        for fn, done in calls:
            try:
                outcomes.append((done, fn(), None))
            except Exception as e:  # handed back to the caller, who decides what it means
                outcomes.append((done, None, e))
        self._loop.call_soon_threadsafe(_deliver, outcomes)


def _deliver(outcomes: list[tuple[Done, Any, BaseException | None]]) -> None:
    for done, result, error in outcomes:
        done(result, error)
