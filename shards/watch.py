"""Long polls across shards: one subscription per partition, not one per waiting request.

Every shard keeps an `actors.watermarks.Watermarks` table. Its own partitions publish into it
directly. For a partition another shard owns, the first watch registered here sends one
"watch" call to the owner, carrying the watermark this shard last read (`seen`); the owner
registers a watch of its own in its table and answers with the new watermark when the
partition moves past it (or -1 when the partition is gone); the call is shards/calls/watch.py.
The answer updates this shard's table, which wakes every local watch it passes, and if any
watch is still waiting (it read newer data than the subscription knew) a new subscription goes
out at once:

    shard 0 (connection's)                       shard 1 (owner of t-3)
    watch(t-3, seen=10) -> first one: ---watch(seen=10)-->  table.watch(t-3, 10, answer)
    watch(t-3, seen=10) -> rides along                      ...
                                                             flush: moved(t-3, 12)
    moved(t-3, 12): both wake   <----reply(hwm=12)--------   answer()

So there is at most one subscription per (partition, shard pair) at any time, whatever the
number of requests waiting: the owner's table, the Caller's pending calls and the pipe carry
that, and nothing a client does makes them longer. A subscription whose local watches were all
cancelled stays until the partition next moves; at most one per partition.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.watermarks import Waiter, Watermarks
from shards.calls import watch as watch_call
from shards.calls.base import Caller

__all__ = ["WatchService"]

Key = tuple[str, int]
GONE = -1  # the answer's watermark when the partition no longer exists on its owner


class WatchService:
    """This shard's watermark table and its subscriptions to other shards' partitions."""

    def __init__(self, shard_id: int, owner_of: Callable[[str, int], int]) -> None:
        self.table = Watermarks(on_foreign_watch=self._foreign_watch)
        self._shard_id = shard_id
        self._owner_of = owner_of
        self._is_local: Callable[[str, int], bool] = lambda _topic, _index: True
        self._router: Caller | None = None
        self._subscribed: set[Key] = set()  # partitions with a subscription outstanding
        self._served = 0  # watches held here for peers' subscriptions

        # Straight to the table: a long poll calls these for each of its partitions.
        self.watch = self.table.watch
        self.idle_read = self.table.idle_read
        self.publish = self.table.publish
        self.gone = self.table.gone
        self.withdraw = self.table.withdraw

    def bind(self, router: Caller, is_local: Callable[[str, int], bool]) -> None:
        """Join the pipe mesh; `is_local(topic, index)`: whether a partition actor runs here."""
        self._router = router
        self._is_local = is_local

    @property
    def subscriptions(self) -> int:
        """Subscriptions this shard has out to other shards' partitions."""
        return len(self._subscribed)

    @property
    def served(self) -> int:
        """Watches held here for other shards' subscriptions (at most one per partition
        and peer)."""
        return self._served

    @property
    def waiting(self) -> int:
        """Watches of this shard's own requests (long polls) waiting now."""
        return self.table.waiting() - self._served

    # Subscriptions to other shards ------------------------------------------------------------

    def _foreign_watch(self, key: Key, seen: int) -> None:
        """A watch was registered on a partition no partition here published: subscribe to
        its owner, unless a subscription is already out (or it is ours, still starting)."""
        if key not in self._subscribed and self._remote(key):
            self._subscribe(key, seen)

    def _remote(self, key: Key) -> bool:
        return self._router is not None and self._owner_of(*key) != self._shard_id

    def _subscribe(self, key: Key, seen: int) -> None:
        router = self._router
        assert router is not None
        self._subscribed.add(key)

        def answered(high_watermark: int) -> None:
            self._subscribed.discard(key)
            if high_watermark == GONE:
                self.table.gone(key)
                return
            self.table.moved(key, high_watermark)
            if self.table.waiting(key):
                self._subscribe(key, high_watermark)

        topic, index = key
        watch_call.send(router, self._owner_of(topic, index), topic, index, seen, answered)

    # The owner side: a peer's subscription ----------------------------------------------------

    def serve(self, topic: str, index: int, seen: int, answer: Callable[[int], None]) -> None:
        """A peer subscribes to one of our partitions: `answer(hwm)` once it passes `seen`."""
        key = (topic, index)
        if not self._is_local(topic, index):
            answer(GONE)
            return

        def wake() -> None:
            mark = self.table.high_watermark(key)
            answer(GONE if mark is None else mark)

        def woken() -> None:
            self._served -= 1
            wake()

        if self.table.watch(key, seen, Waiter(woken)):
            self._served += 1
        else:
            wake()
