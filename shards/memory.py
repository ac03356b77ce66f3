"""The shard's budget of bytes in flight: what keeps memory bounded under any load.

Every request frame a connection reads is charged to the budget until its response is
written; bytes waiting in a full pipe count too. Over budget, connections stop reading their
sockets (`when_under` resumes them), so the kernel's socket buffers and TCP flow control push
back on the clients: memory stays bounded and no request is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryBudget"]


class MemoryBudget:
    def __init__(self, limit_bytes: int, backlog: Callable[[], int] = lambda: 0) -> None:
        assert limit_bytes > 0
        self.limit_bytes = limit_bytes
        self.in_flight_bytes = 0
        self.peak_bytes = 0
        self._backlog = backlog  # bytes queued in pipes waiting for a full peer
        self._waiters: list[Callable[[], None]] = []

    def acquire(self, nbytes: int) -> None:
        self.in_flight_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.in_flight_bytes)

    def release(self, nbytes: int) -> None:
        self.in_flight_bytes -= nbytes
        assert self.in_flight_bytes >= 0, "released more than was acquired"
        if self._waiters and not self.over():
            self.wake()

    def over(self) -> bool:
        return self.in_flight_bytes + self._backlog() >= self.limit_bytes

    def when_under(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once, the next time the budget has room (at once if it has)."""
        if not self.over():
            callback()
        else:
            self._waiters.append(callback)

    def wake(self) -> None:
        """Run the waiters while there is room (also called when a pipe drains)."""
        while self._waiters and not self.over():
            self._waiters.pop(0)()
