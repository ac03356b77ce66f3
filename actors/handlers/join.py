"""Fan-out/fan-in for handlers: one reply slot per partition, a callback when all are in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pykka import ActorDeadError, ActorRef

__all__ = ["Join", "send"]


class Join:
    """Collects `count` replies by index and calls `done(results)` once, after the last."""

    __slots__ = ("results", "_missing", "_done")

    def __init__(self, count: int, done: Callable[[list[Any]], None]) -> None:
        self.results: list[Any] = [None] * count
        self._missing = count
        self._done = done
        if count == 0:
            done(self.results)

    def slot(self, index: int) -> Callable[[Any], None]:
        def reply(result: Any) -> None:
            assert self.results[index] is None, "a join slot filled twice"
            self.results[index] = result
            self._missing -= 1
            if self._missing == 0:
                self._done(self.results)

        return reply

    def fill(self, index: int, result: Any) -> None:
        """Fill a slot at once (an error found before any message was sent)."""
        self.slot(index)(result)


def send(ref: ActorRef[Any], message: Any) -> bool:
    """Tell `ref`; False if that actor has stopped (its topic was deleted, or the shard is
    stopping), so the caller answers with an error instead of failing."""
    try:
        ref.tell(message)
    except ActorDeadError:
        return False
    return True
