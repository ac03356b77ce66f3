"""The learner recovery throttle (actors/recovery_throttle.py) on a clock of the test's."""

from __future__ import annotations

import pytest

from actors.recovery_throttle import RecoveryThrottle

pytestmark = pytest.mark.timeout(10)

MiB = 1 << 20


def test_what_leaves_never_passes_the_rate_beyond_the_burst() -> None:
    clock = [0.0]
    throttle = RecoveryThrottle(32 * MiB, MiB, lambda: clock[0])
    sent_at = []
    for _ in range(33):  # send each MiB as soon as it may leave
        clock[0] += throttle.wait(MiB)
        throttle.take(MiB)
        sent_at.append(clock[0])
    # The burst at once, then one MiB every 1/32 s: 33 MiB by 1 s, never sooner.
    assert sent_at[0] == 0.0
    assert sent_at[1:] == pytest.approx([(i + 1) / 32 for i in range(32)])
    assert throttle.taken == 33 * MiB
    # Idle, it fills up to the burst only.
    clock[0] += 10.0
    assert throttle.wait(MiB) == 0.0
    throttle.take(MiB)
    assert throttle.wait(MiB) == pytest.approx(1 / 32)


def test_an_append_larger_than_the_burst_leaves_once_the_bucket_is_full() -> None:
    clock = [0.0]
    throttle = RecoveryThrottle(MiB, MiB // 4, lambda: clock[0])
    assert throttle.wait(MiB) == 0.0  # full: it goes, and the debt is paid after
    throttle.take(MiB)
    assert throttle.wait(MiB) == pytest.approx(1.0)  # 3/4 MiB of debt, then a full bucket
