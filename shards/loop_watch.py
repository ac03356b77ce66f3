"""A shard's loop watched: how long each turn runs, which turns stall it, and the GC's pauses.

Everything a shard does runs in turns of its one event loop, so a turn that runs long delays
every request, flush answer and Raft message behind it: the tail latency the design promises
to keep flat is, first, the length of the longest turns. Seastar reports such turns as
reactor stalls (a timer signal on the reactor thread notices one and logs its backtrace);
here a watchdog thread does it, since a Python loop thread can only be looked at from outside.

- **Turns.** The loop's selector is wrapped (`_TimedSelector`): `select` is where a turn ends
  and the next begins, so two clock reads per turn give its length, observed into a histogram
  (`krill_reactor_turn_seconds`). A turn of `loop_stall_threshold_ms` or more counts as a stall
  (`krill_reactor_stalls_total`).
- **Stalls seen as they happen.** The watchdog thread wakes every half threshold; when the turn
  under way is past the threshold it takes the loop thread's stack (`sys._current_frames`)
  and logs it, once per stall and at most once per `limits.loop_stall_log_interval_s` (the
  rest are counted in the next line logged). It needs the GIL to look, so a turn stuck in a C
  call that holds the GIL is seen when it lets go: counted, perhaps not shown.
- **Where a stall's time went.** A long turn is the loop's code running long, or the thread
  not running at all: waiting for a CPU another process holds (three nodes and a client on
  two cores), or blocked in the kernel (a write throttled, a page fault, a lock). The
  watchdog reads the loop thread's scheduler times (`/proc/self/task/<tid>/schedstat`: time
  on a CPU, time runnable waiting for one) at each look, and splits each stall's window
  (from its last look before the stall to its first look after: up to a period either
  side) into running, runnable and blocked (the rest), added up in
  `krill_reactor_stall_seconds_total{state}` and said in the stall's log line. A kernel
  without schedstat gives no split.
- **GC pauses.** `gc.callbacks` time every collection, by generation
  (`krill_gc_pause_seconds`): a collection stops the loop whichever thread started it.

The watchdog is a helper thread (shards/threads.py): its wake-ups never preempt the loop.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from actors.metrics import LATENCY_BUCKETS_S, Histogram
from shards import limits
from shards.threads import run_as_helper

__all__ = ["STALL_STATES", "LoopStats", "LoopWatch", "ThreadSchedTimes"]

log = logging.getLogger(__name__)

_WATCH_PERIOD_MIN_S = 0.001  # the watchdog wakes every half threshold, never more often
# Where the loop thread was during its stalls (module docstring), in LoopStats.stall_seconds.
STALL_STATES = ("running", "runnable", "blocked")

SchedTimes = tuple[float, float]  # a thread's seconds on a CPU, and runnable waiting for one


class ThreadSchedTimes:
    """A thread's scheduler times (the kernel's schedstat), read again through one open fd:
    ~1 µs a look. `open` gives None where the kernel keeps none."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, native_id: int) -> ThreadSchedTimes | None:
        try:
            fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        reader = cls(fd)
        try:
            reader.read()
        except (OSError, ValueError):
            reader.close()
            return None
        return reader

    def read(self) -> SchedTimes:
        on_cpu, waiting = os.pread(self._fd, 64, 0).split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9

    def close(self) -> None:
        os.close(self._fd)


class LoopStats:
    """What the watch records for the shard's metrics (actors/metrics.py renders none of it
    itself: `snapshot` goes to the supervisor with the rest). Loop thread, except the GC's
    histograms, which a collection started on a helper thread observes from there."""

    __slots__ = ("turns", "stalls", "gc_pauses", "stall_seconds")

    def __init__(self) -> None:
        self.turns = Histogram(LATENCY_BUCKETS_S)
        self.stalls = 0
        self.gc_pauses = [Histogram(LATENCY_BUCKETS_S) for _ in range(3)]  # by generation
        # The stalls' windows by STALL_STATES: the watchdog thread's to add to.
        self.stall_seconds = [0.0] * len(STALL_STATES)

    def snapshot(self) -> dict[str, Any]:
        return {"turns": self.turns.snapshot(), "stalls": self.stalls,
                "gc": [h.snapshot() for h in self.gc_pauses],
                "stall_seconds": list(self.stall_seconds)}


class LoopWatch:
    """Install on a loop before it runs (`install`), from its thread; `close` after it ran."""

    def __init__(self, loop: Any, threshold_ms: int, stats: LoopStats | None,
                 name: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self._loop = loop
        self._threshold_s = threshold_ms / 1000
        self._stats = stats
        self._name = name
        self._clock = clock
        # When the turn under way began; None while the loop waits in select. Written by the
        # loop thread, read by the watchdog (a float or None: one reference, no lock).
        self.turn_started: float | None = None
        self._loop_thread = 0
        self._inner: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gc_started = 0.0
        # The watchdog's own: the turn it last showed, when it last logged, and how many
        # stalls it saw but did not show since.
        self._shown: float | None = None
        self._logged_at = -float("inf")
        self._unshown = 0
        # The loop thread's scheduler times: the reader, the last look outside a stall (its
        # time and reading), and the start of the stall under way (module docstring).
        self._sched: ThreadSchedTimes | None = None
        self._base: tuple[float, SchedTimes] | None = None
        self._stalled: float | None = None

    def install(self) -> None:
        self._loop_thread = threading.get_ident()
        if self._threshold_s > 0:  # the watchdog's to read
            self._sched = ThreadSchedTimes.open(threading.get_native_id())
        self._inner = self._loop._selector
        self._loop._selector = _TimedSelector(self._inner, self)
        if self._stats is not None:
            gc.callbacks.append(self._gc_callback)
        if self._threshold_s > 0:
            self._thread = threading.Thread(target=self._watch, name=f"{self._name}-watch",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._sched is not None:
            self._sched.close()
            self._sched = None
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        if self._inner is not None:
            self._loop._selector = self._inner
            self._inner = None

    # The loop thread's side ---------------------------------------------------------------

    def turn_ended(self, now: float) -> None:
        started = self.turn_started
        self.turn_started = None
        if started is None:
            return
        length = now - started
        stats = self._stats
        if stats is not None:
            stats.turns.observe(length)
            if length >= self._threshold_s > 0:
                stats.stalls += 1

    def turn_began(self, now: float) -> None:
        self.turn_started = now

    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = self._clock()
        elif self._stats is not None:
            self._stats.gc_pauses[info["generation"]].observe(
                self._clock() - self._gc_started)

    # The watchdog's side -----------------------------------------------------------------

    def _watch(self) -> None:
        run_as_helper()
        period = max(self._threshold_s / 2, _WATCH_PERIOD_MIN_S)
        while not self._stop.wait(period):
            self.look(self._clock())

    def look(self, now: float) -> str | None:
        """The watchdog's look: the loop thread's scheduler times kept, a stall that ended
        split by where its time went, then `check`."""
        sched = self._sched
        if sched is not None:
            times = sched.read()
            started = self.turn_started
            if self._stalled is not None and started != self._stalled:
                self._split(now, times)
                self._stalled = None
            elif (self._stalled is None and started is not None
                  and now - started >= self._threshold_s):
                self._stalled = started  # split from the look before it (`_base`)
            if self._stalled is None:
                self._base = (now, times)
        return self.check(now)

    def _where(self, now: float, times: SchedTimes) -> tuple[float, float, float] | None:
        """Seconds running, runnable and blocked since the last look outside a stall."""
        if self._base is None:
            return None
        then, (on_cpu, waiting) = self._base
        running, runnable = times[0] - on_cpu, times[1] - waiting
        return running, runnable, max(0.0, now - then - running - runnable)

    def _split(self, now: float, times: SchedTimes) -> None:
        where = self._where(now, times)
        if where is not None and self._stats is not None:
            seconds = self._stats.stall_seconds
            for i, part in enumerate(where):
                seconds[i] += part

    def check(self, now: float) -> str | None:
        """Look at the turn under way (the watchdog, every half threshold): the stack logged
        if it stalls and may be shown now, else None."""
        started = self.turn_started
        if started is None or now - started < self._threshold_s or started == self._shown:
            return None
        self._shown = started
        if now - self._logged_at < limits.loop_stall_log_interval_s:
            self._unshown += 1
            return None
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return None
        stack = "".join(traceback.format_stack(frame))
        unshown, self._unshown = self._unshown, 0
        self._logged_at = now
        where = ""
        if self._sched is not None:
            split = self._where(now, self._sched.read())
            if split is not None:
                running, runnable, blocked = (part * 1000 for part in split)
                where = (f"; so far running {running:.0f} ms, runnable {runnable:.0f} ms, "
                         f"blocked {blocked:.0f} ms")
        log.warning("%s: loop stalled, %.0f ms into a turn (threshold %.0f ms; %d stalls "
                    "since the last shown%s); the loop thread is at:\n%s", self._name,
                    (now - started) * 1000, self._threshold_s * 1000, unshown, where, stack)
        return stack


class _TimedSelector:
    """The loop's selector, with a clock read where each turn ends and the next begins."""

    def __init__(self, inner: Any, watch: LoopWatch) -> None:
        self._inner = inner
        self._watch = watch

    def select(self, timeout: float | None = None) -> Any:
        watch = self._watch
        watch.turn_ended(watch._clock())
        try:
            return self._inner.select(timeout)
        finally:
            watch.turn_began(watch._clock())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
