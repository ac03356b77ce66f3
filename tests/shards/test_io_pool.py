"""The shard's I/O pool: calls of one loop turn go out as few jobs, run by helper threads."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shards.io_pool import IoPool

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _run_turn(loop: asyncio.AbstractEventLoop, pool: IoPool, calls: int) -> list[tuple[int, int]]:
    """Hand `calls` calls to the pool in one loop turn; (call, worker thread) as each ran."""
    ran: list[tuple[int, int]] = []
    done: list[int] = []
    finished = loop.create_future()

    def call(i: int) -> int:
        ran.append((i, threading.get_ident()))
        return i

    def on_done(result: int, error: BaseException | None) -> None:
        assert error is None
        done.append(result)
        if len(done) == calls:
            finished.set_result(None)

    def submit_all() -> None:
        for i in range(calls):
            pool.run(lambda i=i: call(i), on_done)

    loop.call_soon(submit_all)
    loop.run_until_complete(asyncio.wait_for(finished, 10))
    assert sorted(done) == list(range(calls))
    return ran


@pytest.mark.parametrize(
    ("calls", "jobs"),
    [(1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3), (40, 4)],
)
def test_one_turn_s_calls_go_out_as_few_jobs(
    loop: asyncio.AbstractEventLoop, calls: int, jobs: int
) -> None:
    """Each job (one worker wake-up) takes at least `calls_per_job` calls, and there are at
    most `threads` jobs; within a job calls run in the order they were made."""
    pool = IoPool(loop, threads=4, name="test-io", calls_per_job=4)
    submitted: list[list[Any]] = []
    run_job = pool._run_job

    def counting_run_job(job: list[Any]) -> None:
        submitted.append(job)  # one job: one worker wake-up, one report back to the loop
        run_job(job)

    pool._run_job = counting_run_job  # type: ignore[method-assign]
    try:
        ran = _run_turn(loop, pool, calls)
    finally:
        pool.shutdown()
    assert len(submitted) == jobs
    assert sorted(len(job) for job in submitted) == sorted(
        len(range(j, calls, jobs)) for j in range(jobs)
    )
    # Job j took calls j, j + jobs, ... (dealt round-robin); they ran in that order.
    order = [i for i, _thread in ran]
    for j in range(jobs):
        mine = [i for i in order if i % jobs == j]
        assert mine == sorted(mine), order


def test_workers_are_helpers_that_never_preempt_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    pool = IoPool(loop, threads=2, name="test-io", calls_per_job=1)
    policies: list[int] = []
    try:
        finished = loop.create_future()

        def on_done(policy: int, error: BaseException | None) -> None:
            assert error is None
            policies.append(policy)
            if len(policies) == 2:
                finished.set_result(None)

        def submit() -> None:
            for _ in range(2):
                pool.run(lambda: os.sched_getscheduler(0), on_done)

        loop.call_soon(submit)
        loop.run_until_complete(asyncio.wait_for(finished, 10))
    finally:
        pool.shutdown()
    assert policies == [os.SCHED_BATCH, os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller (the loop) is untouched


_DEMOTE = """
import os, threading
from shards.threads import demote_helper_threads
ready, release, seen = threading.Event(), threading.Event(), []
def helper():
    ready.set(); release.wait(10); seen.append(os.sched_getscheduler(0))
thread = threading.Thread(target=helper); thread.start(); ready.wait(10)
count = demote_helper_threads(threading.get_native_id())
release.set(); thread.join(10)
print(count, seen[0] == os.SCHED_BATCH, os.sched_getscheduler(0) == os.SCHED_OTHER)
"""


def test_demote_helper_threads_leaves_the_loop_thread_alone() -> None:
    # In a process of its own: demoting would touch every thread of the test runner.
    out = subprocess.run(
        [sys.executable, "-c", _DEMOTE], capture_output=True, text=True, timeout=20, check=True
    )
    count, helper_batch, loop_default = out.stdout.split()
    assert int(count) >= 1
    assert helper_batch == "True" and loop_default == "True", out.stdout


def test_jobs_beyond_the_threads_wait_and_all_finish_before_shutdown_returns(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Turns that hand over more jobs than there are workers: the extra jobs wait in the
    backlog and a worker takes them as it finishes; shutdown waits for every job, and every
    result comes back on the loop thread."""
    pool = IoPool(loop, threads=2, name="test-io", calls_per_job=1)
    gate = threading.Event()
    results: list[tuple[int, int]] = []
    loop_thread = threading.get_ident()

    def blocking(i: int) -> int:
        gate.wait(10)  # both workers stay busy until the whole backlog is queued
        return i

    def on_done(result: int, error: BaseException | None) -> None:
        assert error is None
        results.append((result, threading.get_ident()))

    for turn in range(3):  # three turns of three calls: 2 jobs each time, the rest queues
        loop.call_soon(
            lambda t=turn: [pool.run(lambda i=t * 3 + k: blocking(i), on_done) for k in range(3)]
        )
        loop.run_until_complete(asyncio.sleep(0.01))
    assert len(pool._backlog) == 4  # 6 jobs, 2 running
    gate.set()

    async def all_back() -> None:
        for _ in range(1000):
            if len(results) == 9:
                return
            await asyncio.sleep(0.005)

    loop.run_until_complete(all_back())
    pool.shutdown()
    assert sorted(r for r, _ in results) == list(range(9))
    assert {t for _, t in results} == {loop_thread}
    assert all(not w.thread.is_alive() for w in pool._workers) and not pool._workers


def test_shutdown_of_an_idle_pool_stops_its_workers(loop: asyncio.AbstractEventLoop) -> None:
    pool = IoPool(loop, threads=3, name="test-io", calls_per_job=1)
    ran = _run_turn(loop, pool, 3)  # three workers start, finish and go idle
    threads = [w.thread for w in pool._workers]
    assert len(threads) == 3 and len(ran) == 3
    pool.shutdown()
    assert not any(t.is_alive() for t in threads)
