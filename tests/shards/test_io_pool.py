"""The shard's I/O pool: calls of one loop turn go out as few jobs, run by helper threads."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

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
    executor = pool._executor
    submitted: list[object] = []
    submit = executor.submit

    def counting_submit(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        submitted.append(args[0])  # the job: its list of calls
        return submit(fn, *args, **kwargs)

    executor.submit = counting_submit  # type: ignore[method-assign]
    try:
        ran = _run_turn(loop, pool, calls)
    finally:
        pool.shutdown()
    assert len(submitted) == jobs
    assert sorted(len(job) for job in submitted) == sorted(  # type: ignore[arg-type]
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
