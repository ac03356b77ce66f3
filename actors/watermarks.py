"""High watermarks as the shard last heard them, and the long polls waiting for them to move.

A long-poll fetch (`max_wait_ms`, `min_bytes`) waits until one of its partitions has more to
read. The partition actor owns its high watermark; every move is published here, on the shard's
loop thread, and wakes the fetches waiting on that partition. Registering and cancelling a wait
are dict operations, not messages, so a long poll of idle partitions costs nothing between
appends, and what a request registers is gone when the request ends or its connection closes:

    fetch reads, not enough:  token = watch(key, seen=hwm it read, wake)   # None: moved already
    partition flushes:        moved(key, hwm)   -> wake() for every watch with seen < hwm
    fetch answers or aborts:  cancel(key, token)

A watch fires once and is then gone. `seen` closes the race between a read and its watch: a
partition that moved in between fires the watch at once (`watch` returns None).

A partition of this shard publishes its log start and leader epoch with its watermark
(`publish`), so a fetch at the high watermark of an idle local partition is answered from the
table, without a message to the partition (`idle_read`): that is every partition of an idle
long poll, every round. Only the owner writes its entry; everyone on the loop may read it,
as Seastar code on the owning shard calls the partition directly.

The table knows nothing of shards. For a partition another shard owns, the shard runtime feeds
`moved` from that shard's notices (shards/watch.py); until one arrives the table holds no
watermark for it and every watch waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Published", "Watermarks"]

Key = tuple[str, int]


class Published(NamedTuple):
    """What a partition of this shard last published."""

    high_watermark: int
    log_start_offset: int
    leader_epoch: int


class Watermarks:
    """The shard's table of watermarks and waiting watches. Loop thread only."""

    def __init__(self) -> None:
        self._marks: dict[Key, int] = {}
        self._published: dict[Key, Published] = {}  # this shard's partitions only
        self._watches: dict[Key, dict[int, tuple[int, Callable[[], None]]]] = {}
        self._next_token = 1

    def high_watermark(self, key: Key) -> int | None:
        """The last high watermark published for `key`, or None if none was."""
        return self._marks.get(key)

    def watch(self, key: Key, seen: int, wake: Callable[[], None]) -> int | None:
        """Call `wake()` once, when the watermark of `key` passes `seen`. Returns the token to
        cancel with, or None when it has already passed (nothing is registered)."""
        mark = self._marks.get(key)
        if mark is not None and mark > seen:
            return None
        token = self._next_token
        self._next_token += 1
        self._watches.setdefault(key, {})[token] = (seen, wake)
        return token

    def publish(self, key: Key, state: Published) -> None:
        """A partition of this shard changed: record it, and wake the watches it passes."""
        self._published[key] = state
        if self._marks.get(key) != state.high_watermark:
            self.moved(key, state.high_watermark)

    def idle_read(self, key: Key, offset: int, leader_epoch: int) -> Published | None:
        """The partition's published state if a read at `offset` would find nothing (a local
        partition, idle at exactly that offset, and the epoch the reader expects); else None:
        ask the partition."""
        state = self._published.get(key)
        if (
            state is None
            or offset != state.high_watermark
            or offset < state.log_start_offset
            or (leader_epoch >= 0 and leader_epoch != state.leader_epoch)
        ):
            return None
        return state

    def cancel(self, key: Key, token: int) -> None:
        watches = self._watches.get(key)
        if watches is not None and watches.pop(token, None) is not None and not watches:
            del self._watches[key]

    def moved(self, key: Key, high_watermark: int) -> None:
        """The watermark of `key` is now `high_watermark`: wake the watches below it."""
        self._marks[key] = high_watermark
        watches = self._watches.get(key)
        if not watches:
            return
        ready = [token for token, (seen, _) in watches.items() if seen < high_watermark]
        wakes = [watches.pop(token)[1] for token in ready]
        if not watches:
            del self._watches[key]
        for wake in wakes:
            wake()

    def gone(self, key: Key) -> None:
        """The partition is gone (deleted, or its shard stops): wake every watch and forget
        it, so each waiting fetch reads again and answers the error it finds."""
        self._marks.pop(key, None)
        self._published.pop(key, None)
        watches = self._watches.pop(key, None)
        for _, wake in (watches or {}).values():
            wake()

    def waiting(self, key: Key | None = None) -> int:
        """Watches registered, for one partition or all (tests, metrics)."""
        if key is not None:
            return len(self._watches.get(key, ()))
        return sum(len(w) for w in self._watches.values())

    def published(self) -> dict[Key, Published]:
        """This shard's partitions as they last published (metrics, health)."""
        return self._published
