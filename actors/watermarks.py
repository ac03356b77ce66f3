"""High watermarks as the shard last heard them, and the long polls waiting for them to move.

A long-poll fetch (`max_wait_ms`, `min_bytes`) waits until one of its partitions has more to
read. The partition actor owns its high watermark; every move is published here, on the shard's
loop thread, and wakes the fetches waiting on that partition. Registering and cancelling a wait
cost a list append and a flag, not messages, so a long poll of idle partitions costs nothing
between appends, and what a request registers is dead when the request ends or its connection
closes:

    fetch reads, not enough:  waiter = Waiter(wake)
                              watch(key, seen=hwm it read, waiter)  # per partition; False:
                                                                    # it moved already
    partition flushes:        moved(key, hwm)   -> wake() of each live waiter with seen < hwm
    fetch answers or aborts:  waiter.cancel()   # every partition's entry at once

A waiter fires once and is then dead. `seen` closes the race between a read and its watch: a
partition that moved in between answers `watch` with False and nothing is registered. Dead
entries are swept from a partition's list when it grows past twice what was live at the last
sweep (at least `SWEEP_ENTRIES_MIN`): a list stays bounded by the requests waiting on it.

A partition of this shard publishes its log start and leader epoch with its watermark
(`publish`), so a fetch at the high watermark of an idle local partition is answered from the
table, without a message to the partition (`idle_read`): that is every partition of an idle
long poll, every round. Only the owner writes its entry; everyone on the loop may read it,
as Seastar code on the owning shard calls the partition directly.

A read_committed fetch waits on the same notices: a partition's last stable offset moves
only when its high watermark does (a transaction's marker counts once it is committed,
actors/txn_state.py), so no second mark is kept.

The table knows nothing of shards. For a partition another shard owns, the shard runtime feeds
`moved` from that shard's notices (shards/watch.py); until one arrives the table holds no
watermark for it and every watch waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Published", "SWEEP_ENTRIES_MIN", "Waiter", "Watermarks"]

Key = tuple[str, int]

# A partition's list of waiters is swept of dead ones when it reaches this many entries, or
# twice what was live after the last sweep if more: amortized, one check per registration.
SWEEP_ENTRIES_MIN = 64


class Waiter:
    """One waiting round of one request, on all its partitions: woken once, by the first of
    them to move past what it read, or cancelled; either way dead after."""

    __slots__ = ("wake", "live")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.live = True

    def cancel(self) -> None:
        self.live = False


class Published(NamedTuple):
    """What a partition of this shard last published."""

    high_watermark: int
    log_start_offset: int
    leader_epoch: int
    at_end: Any  # what a read at the high watermark answers (made once, not per fetch)


class Watermarks:
    """The shard's table of watermarks and waiting watches. Loop thread only."""

    def __init__(self, on_foreign_watch: Callable[[Key, int], None] | None = None) -> None:
        """`on_foreign_watch(key, seen)`: called for each watch registered on a partition no
        partition of this shard has published (another shard's: the runtime subscribes)."""
        self._on_foreign_watch = on_foreign_watch
        self._marks: dict[Key, int] = {}
        self._published: dict[Key, Published] = {}  # this shard's partitions only
        self._watches: dict[Key, list[tuple[int, Waiter]]] = {}  # (seen, waiter), some dead
        self._sweep_at: dict[Key, int] = {}  # a partition's list length that triggers a sweep

    def high_watermark(self, key: Key) -> int | None:
        """The last high watermark published for `key`, or None if none was."""
        return self._marks.get(key)

    def watch(self, key: Key, seen: int, waiter: Waiter) -> bool:
        """Wake `waiter` when the watermark of `key` passes `seen`. False when it already has
        (nothing is registered)."""
        mark = self._marks.get(key)
        if mark is not None and mark > seen:
            return False
        entries = self._watches.get(key)
        if entries is None:
            entries = self._watches[key] = []
        entries.append((seen, waiter))
        if len(entries) >= self._sweep_at.get(key, SWEEP_ENTRIES_MIN):
            entries[:] = [entry for entry in entries if entry[1].live]
            self._sweep_at[key] = max(SWEEP_ENTRIES_MIN, 2 * len(entries))
        if self._on_foreign_watch is not None and key not in self._published:
            self._on_foreign_watch(key, seen)
        return True

    def publish(self, key: Key, state: Published) -> None:
        """A partition of this shard changed: record it, and wake the watches it passes."""
        self._published[key] = state
        if self._marks.get(key) != state.high_watermark:
            self.moved(key, state.high_watermark)

    def withdraw(self, key: Key, state: Published | None) -> None:
        """A partition that last published `state` (None: nothing) stops publishing: `gone`,
        unless what the table holds for `key` is another's (a topic deleted and created
        again under its name, whose new partition already published, shards/shard_topics.py)."""
        published = self._published.get(key)
        if published is None or published is state:
            self.gone(key)

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

    def moved(self, key: Key, high_watermark: int) -> None:
        """The watermark of `key` is now `high_watermark`: wake the waiters below it."""
        self._marks[key] = high_watermark
        entries = self._watches.get(key)
        if not entries:
            return
        ready = [waiter for seen, waiter in entries if waiter.live and seen < high_watermark]
        entries[:] = [e for e in entries if e[1].live and e[0] >= high_watermark]
        if not entries:
            del self._watches[key]
            self._sweep_at.pop(key, None)
        for waiter in ready:
            if waiter.live:  # a waiter woken by an earlier one's wake cancels itself
                waiter.live = False
                waiter.wake()

    def gone(self, key: Key) -> None:
        """The partition is gone (deleted, or its shard stops): wake every waiter and forget
        it, so each waiting fetch reads again and answers the error it finds."""
        self._marks.pop(key, None)
        self._published.pop(key, None)
        self._sweep_at.pop(key, None)
        for _, waiter in self._watches.pop(key, ()):
            if waiter.live:
                waiter.live = False
                waiter.wake()

    def waiting(self, key: Key | None = None) -> int:
        """Live waiters registered, on one partition or all (tests, metrics): counted, so
        O(entries), for scrapes and tests only."""
        lists = [self._watches.get(key, [])] if key is not None else self._watches.values()
        return sum(1 for entries in lists for _, waiter in entries if waiter.live)

    def entries(self) -> int:
        """Entries held, dead ones not yet swept included (what the bound is about)."""
        return sum(len(entries) for entries in self._watches.values())

    def published(self) -> dict[Key, Published]:
        """This shard's partitions as they last published (metrics, health)."""
        return self._published
