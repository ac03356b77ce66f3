"""The watermark table: watches fire once, past what they saw, and leave nothing behind."""

from __future__ import annotations

import pytest

from actors.watermarks import SWEEP_ENTRIES_MIN, Published, Waiter, Watermarks

pytestmark = pytest.mark.timeout(10)

KEY = ("t", 0)


def waiter(fired: list[object], name: object) -> Waiter:
    return Waiter(lambda: fired.append(name))


def test_a_watch_fires_once_when_the_watermark_passes_what_it_saw() -> None:
    table = Watermarks()
    fired: list[object] = []
    assert table.watch(KEY, 5, waiter(fired, "a"))
    table.moved(KEY, 5)  # not past 5
    assert fired == []
    table.moved(KEY, 6)
    table.moved(KEY, 7)
    assert fired == ["a"]
    assert table.waiting() == 0 and table.entries() == 0


def test_a_watch_behind_the_table_is_not_registered() -> None:
    table = Watermarks()
    table.moved(KEY, 10)
    assert not table.watch(KEY, 9, Waiter(lambda: None))
    assert table.waiting() == 0 and table.entries() == 0
    assert table.watch(KEY, 10, Waiter(lambda: None))


def test_one_waiter_on_many_partitions_fires_once_and_cancels_everywhere() -> None:
    table = Watermarks()
    fired: list[object] = []
    one = waiter(fired, "one")
    keys = [("t", p) for p in range(48)]
    for key in keys:
        assert table.watch(key, 0, one)
    assert table.waiting() == 48
    table.moved(keys[3], 1)
    table.moved(keys[7], 1)
    assert fired == ["one"]  # woken by the first partition to move, never again
    assert table.waiting() == 0  # dead on all the others at once
    other = waiter(fired, "other")
    for key in keys:
        table.watch(key, 1, other)
    other.cancel()
    for key in keys:
        table.moved(key, 2)
    assert fired == ["one"]


def test_cancelled_waiters_are_swept_and_stay_bounded() -> None:
    """A partition that never moves, under long polls that come and go for ever: its list
    of entries stays under twice what is live (and SWEEP_ENTRIES_MIN), never grows on."""
    table = Watermarks()
    live = [Waiter(lambda: None) for _ in range(5)]
    for w in live:
        table.watch(KEY, 0, w)
    for _ in range(10_000):
        gone = Waiter(lambda: None)
        table.watch(KEY, 0, gone)
        gone.cancel()
        assert table.entries() <= max(SWEEP_ENTRIES_MIN, 2 * len(live)) + 1
    assert table.waiting() == len(live)
    for w in live:
        w.cancel()
    for _ in range(SWEEP_ENTRIES_MIN):
        table.watch(KEY, 0, Waiter(lambda: None))
    assert table.waiting() == SWEEP_ENTRIES_MIN
    table.moved(KEY, 1)
    assert table.entries() == 0 and table._watches == {}


def test_only_the_watches_passed_fire() -> None:
    table = Watermarks()
    fired: list[object] = []
    for seen in (3, 5, 8):
        table.watch(KEY, seen, waiter(fired, seen))
    table.moved(KEY, 6)
    assert sorted(fired) == [3, 5]  # type: ignore[type-var]
    assert table.waiting(KEY) == 1


def test_gone_wakes_everyone_and_forgets() -> None:
    table = Watermarks()
    table.publish(KEY, Published(4, 0, 0, None))
    fired: list[object] = []
    table.watch(KEY, 4, waiter(fired, 1))
    table.watch(KEY, 4, waiter(fired, 2))
    table.gone(KEY)
    assert sorted(fired) == [1, 2]  # type: ignore[type-var]
    assert table.high_watermark(KEY) is None and table.idle_read(KEY, 4, -1) is None


def test_idle_read_answers_only_an_idle_local_partition_at_its_watermark() -> None:
    table = Watermarks()
    assert table.idle_read(KEY, 0, -1) is None  # nothing published: ask the partition
    table.moved(KEY, 3)  # heard from another shard: not ours, ask the owner
    assert table.idle_read(KEY, 3, -1) is None
    table.publish(KEY, Published(3, 1, 0, None))
    assert table.idle_read(KEY, 3, -1) == Published(3, 1, 0, None)
    assert table.idle_read(KEY, 3, 0) == Published(3, 1, 0, None)
    assert table.idle_read(KEY, 2, -1) is None  # data to read
    assert table.idle_read(KEY, 4, -1) is None  # past the watermark: the partition decides
    assert table.idle_read(KEY, 3, 1) is None  # another epoch: the partition answers it
    table.publish(KEY, Published(5, 5, 0, None))
    assert table.idle_read(KEY, 3, -1) is None  # below the log start


def test_publish_wakes_watches() -> None:
    table = Watermarks()
    fired: list[object] = []
    table.watch(KEY, 0, waiter(fired, True))
    table.publish(KEY, Published(0, 0, 0, None))
    assert fired == []
    table.publish(KEY, Published(1, 0, 0, None))
    assert fired == [True]


def test_a_partition_withdraws_only_what_it_published_itself() -> None:
    """A topic deleted and created again under its name: the new partition publishes before
    the old one stops, and the old one's withdrawal must leave the new one's state."""
    table = Watermarks()
    old = Published(7, 0, 3, None)
    table.publish(KEY, old)
    new = Published(0, 0, 1, None)
    table.publish(KEY, new)  # the new incarnation started
    table.withdraw(KEY, old)  # the old one's stop, late
    assert table.idle_read(KEY, 0, -1) == new and table.high_watermark(KEY) == 0
    table.withdraw(KEY, None)  # one that never published: the new one's state stays too
    assert table.idle_read(KEY, 0, -1) == new
    fired: list[object] = []
    table.watch(KEY, 0, waiter(fired, "long poll"))
    table.withdraw(KEY, new)  # its own: gone, and the waiter asks again
    assert fired == ["long poll"] and table.idle_read(KEY, 0, -1) is None
    table.watch(KEY, 0, waiter(fired, "again"))
    table.withdraw(KEY, None)  # nothing published: waiters woken as gone() does
    assert fired == ["long poll", "again"]
