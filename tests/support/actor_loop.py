"""One shard's loop in the test process: actors run on it as in a shard, driven by `settle`.

Tests of actors and of the cross-shard machinery (in-memory pipes) bind a fresh asyncio loop
as the actor runtime's, run it until what they wait for is true (bounded), and stop every
actor in teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from actors.runtime import bind_loop, stop_all_actors

__all__ = ["actor_loop", "settle"]

_SETTLE_STEPS = 5000  # of 1 ms: what a test may wait for its actors, at most ~5 s


def actor_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fixture body: a loop bound to the actor runtime; every actor stopped after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    bind_loop(loop)
    try:
        yield loop
    finally:
        stop_all_actors()
        loop.run_until_complete(asyncio.sleep(0.05))
        loop.close()


def settle(loop: asyncio.AbstractEventLoop, done: Callable[[], bool]) -> None:
    """Run the loop until `done()`, or fail after ~5 s."""

    async def wait() -> None:
        for _ in range(_SETTLE_STEPS):
            if done():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("not settled")

    loop.run_until_complete(wait())
