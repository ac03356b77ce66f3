"""A virtual-time asyncio loop: timers fire in simulated time, and waiting costs nothing.

`VirtualLoop` is an ordinary selector event loop whose `time()` reads a counter instead of the
monotonic clock, and whose selector never sleeps: it polls the real file descriptors (the
simulated clients' socket pairs) without waiting, and when nothing is ready it moves the
counter on by the timeout asyncio asked for, which is exactly the time to the next timer. So
`call_later` timers of actors, clients and fault steps run in simulated time, in a fixed order,
as fast as the work between them allows:

    loop.time() == 0.0; call_later(5.0, f); nothing else to do
    select(timeout=5.0) -> no fd ready -> time moves to 5.0 -> f runs

Everything runs on the one thread that runs the loop: a simulation starts no thread, so one
seed gives one order of events. The actors' wall clock (`actors.services.now_ms`) is made to
read `wall_ns()`, a fixed epoch plus the virtual time, while a simulation runs.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["SimulationStalled", "VirtualClock", "VirtualLoop", "EPOCH_NS"]

# What the actors' wall clock reads at virtual time 0 (2024-01-01T00:00:00Z): fixed, so
# record timestamps, and everything computed from them, are the same in every run.
EPOCH_NS = 1_704_067_200 * 1_000_000_000


class SimulationStalled(RuntimeError):
    """Nothing is ready and no timer is set: the simulation can never move again."""


class VirtualClock:
    """Simulated seconds since the start of the run."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def ns(self) -> int:
        return round(self.now * 1e9)

    def wall_ns(self) -> int:
        return EPOCH_NS + round(self.now * 1e9)


class _VirtualTimeSelector(selectors.EpollSelector):
    """Polls without blocking; an idle wait advances the clock instead of sleeping."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise SimulationStalled("no timer is set and no descriptor is ready")
        self._clock.now += timeout
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a `VirtualClock` (see the module docstring)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        super().__init__(_VirtualTimeSelector(self.clock))

    def time(self) -> float:
        return self.clock.now

    def call_at_ns(self, when_ns: int, callback: Any, *args: Any) -> asyncio.TimerHandle:
        """`call_at` with a time in integer nanoseconds of the run."""
        return self.call_at(when_ns / 1e9, callback, *args)
