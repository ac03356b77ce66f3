"""The in-sync replica set as a pure piece (actors/isr.py): a new leader's grace, a follower
that falls behind leaving after replica.lag.time.max.ms and not before, one that keeps up a
round trip behind a steady load staying, a node known down leaving at once and coming back
only once caught up, the samples' bound; and a seeded random run checked against the rule
computed from the whole history.

Replicas are letters here; times are milliseconds, offsets the leader's last offset."""

from __future__ import annotations

import random

import pytest

from actors.isr import InSyncReplicas

A, B, C = "a", "b", "c"
REPLICAS = (A, B, C)
LAG_MS = 3000
NOBODY: frozenset[str] = frozenset()


def leader(now_ms: int = 0, log_end: int = 9, down: frozenset[str] = NOBODY,
           samples_max: int = 16) -> InSyncReplicas[str]:
    return InSyncReplicas(A, REPLICAS, LAG_MS, now_ms, log_end, down, samples_max)


def test_the_docstring_example() -> None:
    isr = leader()
    assert isr.isr == (A, B, C)
    assert isr.observe(300, 9, {B: 9, C: 4}, NOBODY) is None  # c has its grace
    assert isr.observe(3100, 9, {B: 9, C: 4}, NOBODY) == (A, B)
    assert isr.observe(3400, 9, {B: 9, C: 9}, NOBODY) == (A, B, C)
    assert isr.observe(3700, 9, {B: 9, C: 9}, {B}) == (A, C)


def test_a_new_leader_gives_every_live_follower_one_lag_to_show_it_caught_up() -> None:
    isr = leader(now_ms=1000, down=frozenset({C}))
    assert isr.isr == (A, B)  # known down: not in, even for a grace
    unknown = {B: -1, C: -1}  # no answer yet from either
    assert isr.observe(1000 + LAG_MS, 9, unknown, NOBODY) is None  # b: the last moment
    assert isr.observe(1001 + LAG_MS, 9, unknown, NOBODY) == (A,)


def test_a_follower_that_stops_leaves_after_the_lag_and_not_before() -> None:
    isr = leader(log_end=0)
    matches = {B: 0, C: 0}
    end = 0
    for now in range(100, 2001, 100):  # both keep up with a steady load
        end += 10
        matches = {B: end, C: end}
        assert isr.observe(now, end, matches, NOBODY) is None
    stopped = 2000  # c stops there: it has everything the leader had at 2000
    for now in range(2100, stopped + LAG_MS + 1, 100):
        end += 10
        matches[B] = end
        assert isr.observe(now, end, matches, NOBODY) is None, now
    assert isr.observe(stopped + LAG_MS + 100, end + 10, {**matches, B: end + 10},
                       NOBODY) == (A, B)


def test_a_follower_a_round_trip_behind_a_steady_load_stays_in_sync() -> None:
    isr = leader(log_end=0)
    ends = {0: 0}
    for now in range(100, 60_001, 100):
        ends[now] = now // 10  # the log grows every tick, forever
        behind = ends[now - 200] if now >= 200 else 0  # c has what the leader had 200 ms ago
        assert isr.observe(now, ends[now], {B: ends[now], C: behind}, NOBODY) is None, now


def test_a_node_known_down_leaves_at_once_and_an_idle_one_comes_back_at_once() -> None:
    isr = leader()
    caught_up = {B: 9, C: 9}
    assert isr.observe(100, 9, caught_up, {C}) == (A, B)  # caught up, but its node is down
    assert isr.observe(5000, 9, caught_up, {C}) is None
    assert isr.observe(5100, 9, caught_up, NOBODY) == (A, B, C)  # it has the whole log


def test_one_back_from_down_rejoins_only_once_it_has_an_end_from_after_its_return() -> None:
    isr = leader(log_end=0)
    for now in range(100, 1001, 100):
        assert isr.observe(now, now, {B: now, C: now}, NOBODY) is None
    # c's node is down from 1100 to 1500; its match stays at 1000 meanwhile.
    assert isr.observe(1100, 1100, {B: 1100, C: 1000}, {C}) == (A, B)
    for now in range(1200, 1501, 100):
        isr.observe(now, now, {B: now, C: 1000}, {C})
    # Back, within the lag of its last catch-up, yet with only what the leader had at 1000.
    assert isr.observe(1600, 1600, {B: 1600, C: 1000}, NOBODY) is None
    assert isr.observe(1700, 1700, {B: 1700, C: 1400}, NOBODY) is None  # had it while down
    assert isr.observe(1800, 1800, {B: 1800, C: 1600}, NOBODY) == (A, B, C)


def test_the_set_keeps_the_replicas_order_and_always_holds_the_leader() -> None:
    isr = InSyncReplicas(B, (C, B, A), LAG_MS, 0, 5, frozenset({A, C}))
    assert isr.isr == (B,)
    assert isr.observe(10, 5, {A: 5, C: 5}, NOBODY) == (C, B, A)


def test_a_wall_clock_that_steps_back_is_taken_as_standing_still() -> None:
    isr = leader()
    assert isr.observe(5000, 20, {B: 20, C: 9}, NOBODY) == (A, B)  # c: not since 0
    assert isr.observe(1000, 25, {B: 25, C: 20}, NOBODY) == (A, B, C)  # had 20 at "5000"
    assert isr.observe(7900, 25, {B: 25, C: 20}, NOBODY) is None
    assert isr.observe(8001, 25, {B: 25, C: 20}, NOBODY) == (A, B)


def test_samples_stay_bounded_and_an_idle_log_keeps_one() -> None:
    isr = leader(log_end=0, samples_max=4)
    for now in range(1, 100_000, 7):
        isr.observe(now, now, {B: now, C: now}, NOBODY)
    assert len(isr._samples) <= 6  # samples_max + 2
    idle = leader(samples_max=4)
    for now in range(1, 100_000, 7):
        idle.observe(now, 9, {B: 9, C: 9}, NOBODY)
    assert len(idle._samples) == 1


@pytest.mark.parametrize("seed", range(30))
def test_random_runs_match_the_rule_over_the_whole_history(seed: int) -> None:
    """The log grows by bursts with idle stretches, followers' matches move up by their own
    randomness, nodes go down and come back. The piece's set is checked against the rule
    computed from every observation: never in sync when the rule says out; and in sync
    whenever the rule finds a catch-up inside the lag by at least one span (the samples'
    precision), from at least that long after its last down."""
    rng = random.Random(seed)
    samples_max = rng.choice([2, 4, 16])
    lag_ms = rng.choice([1000, 3000])
    now, end = 0, rng.randrange(100)
    isr = InSyncReplicas(A, REPLICAS, lag_ms, now, end, NOBODY, samples_max)
    history = [(now, end)]  # every observation: (time, the leader's end)
    matches = {B: -1, C: -1}
    down_at = {B: -(10**9), C: -(10**9)}  # when each follower was last seen down
    never = -(10**9)
    caught_up = {B: 0, C: 0}  # the rule's own answer (the grace from 0)
    surely = {B: 0, C: 0}  # the same, counting only catch-ups far enough from a down
    precision_ms = lag_ms // samples_max
    for _ in range(600):
        now += rng.choice([1, 50, 100, 300, 1000])
        if rng.random() < 0.5:
            end += rng.randrange(1, 20)
        down = frozenset(f for f in (B, C) if rng.random() < 0.05)
        for f in (B, C):
            if rng.random() < 0.6:
                matches[f] = rng.randrange(matches[f], end + 1)
        history.append((now, end))
        isr.observe(now, end, matches, down)
        for f in (B, C):
            if f in down:
                down_at[f] = now
                caught_up[f] = surely[f] = never
                continue
            reached = max((t for t, e in history if e <= matches[f]), default=never)
            if reached >= down_at[f]:
                caught_up[f] = max(caught_up[f], reached)
            if reached >= down_at[f] + precision_ms:
                surely[f] = max(surely[f], reached)
            in_rule = now - caught_up[f] <= lag_ms
            surely_in = now - surely[f] <= lag_ms - precision_ms
            assert not (f in isr.isr and not in_rule), (f, now, isr)
            assert not (surely_in and f not in isr.isr), (f, now, isr)
        assert A in isr.isr
