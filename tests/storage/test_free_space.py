"""The free-space guard, look by look and append by append."""

from __future__ import annotations

import pytest

from storage.free_space import FreeSpaceGuard

pytestmark = pytest.mark.timeout(10)

GiB = 1 << 30


def test_appends_between_looks_count_against_the_last_look() -> None:
    guard = FreeSpaceGuard(GiB)
    assert guard.admits(10 * GiB) and guard.free_bytes is None  # no look yet: no figure
    guard.looked(3 * GiB, guard.look_started())
    assert guard.admits(2 * GiB) and not guard.admits(2 * GiB + 1)
    guard.appended(2 * GiB)
    assert guard.alert is False and guard.free_bytes == GiB
    guard.appended(1)
    assert guard.alert and not guard.admits(0)


def test_a_look_forgets_only_what_was_appended_before_it() -> None:
    guard = FreeSpaceGuard(GiB)
    guard.looked(2 * GiB, guard.look_started())
    guard.appended(GiB // 2)
    token = guard.look_started()  # the statvfs goes to a pool thread
    guard.appended(GiB // 2 + 1)  # may or may not be in its figure: counted again
    guard.looked(2 * GiB - GiB // 2, token)
    assert guard.free_bytes == GiB - 1 and guard.alert
    guard.looked(5 * GiB, guard.look_started())  # room again: taken again
    assert not guard.alert and guard.admits(GiB)


def test_enospc_refuses_until_a_look_finds_room() -> None:
    guard = FreeSpaceGuard(GiB)
    guard.looked(4 * GiB, guard.look_started())
    guard.write_failed()
    assert guard.alert and not guard.admits(1)
    guard.looked(4 * GiB, guard.look_started())
    assert not guard.alert


def test_zero_is_no_guard() -> None:
    guard = FreeSpaceGuard(0)
    guard.looked(0, guard.look_started())
    guard.write_failed()
    assert guard.admits(GiB) and not guard.alert
