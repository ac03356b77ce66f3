"""The watermark table: watches fire once, past what they saw, and leave nothing behind."""

from __future__ import annotations

import pytest

from actors.watermarks import Published, Watermarks

pytestmark = pytest.mark.timeout(10)

KEY = ("t", 0)


def test_a_watch_fires_once_when_the_watermark_passes_what_it_saw() -> None:
    table = Watermarks()
    fired: list[str] = []
    assert table.watch(KEY, 5, lambda: fired.append("a")) is not None
    table.moved(KEY, 5)  # not past 5
    assert fired == []
    table.moved(KEY, 6)
    table.moved(KEY, 7)
    assert fired == ["a"]
    assert table.waiting() == 0


def test_a_watch_behind_the_table_is_not_registered() -> None:
    table = Watermarks()
    table.moved(KEY, 10)
    assert table.watch(KEY, 9, lambda: None) is None
    assert table.waiting() == 0
    assert table.watch(KEY, 10, lambda: None) is not None


def test_cancelled_watches_leave_nothing() -> None:
    table = Watermarks()
    tokens = [table.watch(KEY, 0, lambda: None) for _ in range(1000)]
    for token in tokens:
        assert token is not None
        table.cancel(KEY, token)
    assert table.waiting() == 0 and table._watches == {}
    table.cancel(KEY, 12345)  # unknown token: nothing happens


def test_only_the_watches_passed_fire() -> None:
    table = Watermarks()
    fired: list[int] = []
    for seen in (3, 5, 8):
        table.watch(KEY, seen, lambda seen=seen: fired.append(seen))
    table.moved(KEY, 6)
    assert sorted(fired) == [3, 5]
    assert table.waiting(KEY) == 1


def test_gone_wakes_everyone_and_forgets() -> None:
    table = Watermarks()
    table.publish(KEY, Published(4, 0, 0))
    fired: list[int] = []
    table.watch(KEY, 4, lambda: fired.append(1))
    table.watch(KEY, 4, lambda: fired.append(2))
    table.gone(KEY)
    assert sorted(fired) == [1, 2]
    assert table.high_watermark(KEY) is None and table.idle_read(KEY, 4, -1) is None


def test_idle_read_answers_only_an_idle_local_partition_at_its_watermark() -> None:
    table = Watermarks()
    assert table.idle_read(KEY, 0, -1) is None  # nothing published: ask the partition
    table.moved(KEY, 3)  # heard from another shard: not ours, ask the owner
    assert table.idle_read(KEY, 3, -1) is None
    table.publish(KEY, Published(3, 1, 0))
    assert table.idle_read(KEY, 3, -1) == Published(3, 1, 0)
    assert table.idle_read(KEY, 3, 0) == Published(3, 1, 0)
    assert table.idle_read(KEY, 2, -1) is None  # data to read
    assert table.idle_read(KEY, 4, -1) is None  # past the watermark: the partition decides
    assert table.idle_read(KEY, 3, 1) is None  # another epoch: the partition answers it
    table.publish(KEY, Published(5, 5, 0))
    assert table.idle_read(KEY, 3, -1) is None  # below the log start


def test_publish_wakes_watches() -> None:
    table = Watermarks()
    fired: list[bool] = []
    table.watch(KEY, 0, lambda: fired.append(True))
    table.publish(KEY, Published(0, 0, 0))
    assert fired == []
    table.publish(KEY, Published(1, 0, 0))
    assert fired == [True]
