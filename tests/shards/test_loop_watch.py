"""The shard loop's watch (shards/loop_watch.py) on a real asyncio loop: each turn timed, a
long one counted as a stall and its stack logged while it runs, at most once per interval;
GC pauses by generation; an I/O pool's calls timed in their wait and their call."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator

import pytest

from shards import limits
from shards.io_pool import IoPool, IoPoolStats
from shards.loop_watch import STALL_STATES, LoopStats, LoopWatch, ThreadSchedTimes

pytestmark = pytest.mark.timeout(30)

THRESHOLD_MS = 20


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def stalling_callback_of_the_test() -> None:
    time.sleep(4 * THRESHOLD_MS / 1000)  # blocks the loop: what a stall is


def run_turns(loop: asyncio.AbstractEventLoop, *callbacks: object) -> None:
    """Run each callback in a turn of its own, then a few empty turns."""
    async def main() -> None:
        for callback in callbacks:
            loop.call_soon(callback)  # type: ignore[arg-type]
            await asyncio.sleep(0.005)
    loop.run_until_complete(main())


def test_a_long_turn_is_a_stall_counted_and_its_stack_logged_while_it_runs(
        loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture) -> None:
    stats = LoopStats()
    watch = LoopWatch(loop, THRESHOLD_MS, stats, "shard9")
    watch.install()
    try:
        with caplog.at_level(logging.WARNING, logger="shards.loop_watch"):
            run_turns(loop, lambda: None, stalling_callback_of_the_test, lambda: None)
    finally:
        watch.close()
    assert stats.stalls == 1
    counts, total = stats.turns.snapshot()
    assert sum(counts) >= 3 and total >= 4 * THRESHOLD_MS / 1000
    long_turns = sum(c for bound, c in zip((*stats.turns.bounds, float("inf")), counts,
                                           strict=True) if bound > THRESHOLD_MS / 1000)
    assert long_turns == 1
    stalled = [r.getMessage() for r in caplog.records if "loop stalled" in r.getMessage()]
    assert len(stalled) == 1, stalled
    assert "shard9" in stalled[0] and "stalling_callback_of_the_test" in stalled[0]
    assert loop._selector.__class__.__name__ != "_TimedSelector"  # type: ignore[attr-defined]


def busy_callback_of_the_test() -> None:
    deadline = time.thread_time() + 6 * THRESHOLD_MS / 1000
    while time.thread_time() < deadline:  # on a CPU (or waiting for one) all along
        pass


def test_a_stalls_time_is_split_by_where_the_loop_thread_was(
        loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture) -> None:
    """A turn asleep in the kernel is blocked; one spinning is running (or runnable, on a
    busy machine). Each window takes up to a watchdog period of the idle loop either side
    (blocked in select), so each side is compared with the other, not with zero."""
    if ThreadSchedTimes.open(__import__("threading").get_native_id()) is None:
        pytest.fail("this kernel keeps no schedstat: the split cannot be made here")
    stats = LoopStats()
    watch = LoopWatch(loop, THRESHOLD_MS, stats, "shard0")
    watch.install()
    try:
        with caplog.at_level(logging.WARNING, logger="shards.loop_watch"):
            run_turns(loop, stalling_callback_of_the_test)
            loop.run_until_complete(asyncio.sleep(0.05))  # idle: the watchdog's look after
            running, runnable, blocked = stats.stall_seconds
            assert blocked >= 3 * THRESHOLD_MS / 1000 > running, stats.stall_seconds
            run_turns(loop, busy_callback_of_the_test)
            loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        watch.close()
    assert stats.stalls == 2
    running2, runnable2, blocked2 = (after - before for after, before in zip(
        stats.stall_seconds, (running, runnable, blocked), strict=True))
    assert running2 >= 3 * THRESHOLD_MS / 1000 and running2 + runnable2 > blocked2, (
        stats.stall_seconds)
    assert stats.snapshot()["stall_seconds"] == stats.stall_seconds
    stalled = [r.getMessage() for r in caplog.records if "loop stalled" in r.getMessage()]
    assert "so far running" in stalled[0], stalled
    assert all(f"{state} " in stalled[0] for state in STALL_STATES), stalled  # each named


def test_the_watchdog_shows_a_stall_once_and_at_most_once_per_interval(
        loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "loop_stall_log_interval_s", 10.0)
    watch = LoopWatch(loop, THRESHOLD_MS, None, "shard0", clock=lambda: 0.0)
    watch._loop_thread = __import__("threading").get_ident()  # this thread plays the loop's
    watch.turn_began(100.0)
    assert watch.check(100.010) is None  # not past the threshold yet
    shown = watch.check(100.030)
    assert shown is not None and "test_the_watchdog_shows" in shown
    assert watch.check(100.050) is None  # the same stall: shown once
    watch.turn_ended(100.060)
    watch.turn_began(101.0)
    assert watch.check(101.030) is None  # another within the interval: counted, not shown
    watch.turn_ended(101.040)
    watch.turn_began(111.0)
    assert watch.check(111.030) is not None and watch._unshown == 0


def test_turns_are_timed_without_a_watchdog_thread(loop: asyncio.AbstractEventLoop) -> None:
    stats = LoopStats()
    watch = LoopWatch(loop, 0, stats, "shard0")  # 0: no watchdog, no stalls counted
    watch.install()
    try:
        assert watch._thread is None
        run_turns(loop, stalling_callback_of_the_test)
    finally:
        watch.close()
    assert sum(stats.turns.snapshot()[0]) > 0 and stats.stalls == 0


def test_gc_pauses_are_observed_by_generation(loop: asyncio.AbstractEventLoop) -> None:
    stats = LoopStats()
    watch = LoopWatch(loop, THRESHOLD_MS, stats, "shard0")
    watch.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        watch.close()
    assert sum(stats.gc_pauses[0].counts) >= 1
    seen = sum(stats.gc_pauses[2].counts)
    assert seen >= 1
    gc.collect(2)  # closed: no longer observed
    assert sum(stats.gc_pauses[2].counts) == seen


def test_an_io_pool_times_each_call_and_its_wait(loop: asyncio.AbstractEventLoop) -> None:
    stats = IoPoolStats()
    pool = IoPool(loop, 1, "timed", stats=stats)
    done: list[object] = []
    finished = loop.create_future()

    def on_done(result: object, error: BaseException | None) -> None:
        done.append(result)
        if len(done) == 2:
            finished.set_result(None)

    pool.run(lambda: time.sleep(0.03), on_done)  # one job: the second waits for the first
    pool.run(lambda: 1, on_done)
    loop.run_until_complete(asyncio.wait_for(finished, 10))
    pool.shutdown()
    calls, call_total = stats.call.snapshot()
    waits, wait_total = stats.queue_wait.snapshot()
    assert sum(calls) == sum(waits) == 2
    assert call_total >= 0.03 and wait_total >= 0.03  # the second waited behind the first
