"""The epoch cache (actors/raft/log.py) and the progress tracker, against a log of one term
per offset kept as a plain list."""

from __future__ import annotations

import random

import pytest

from actors.raft import LogState, LogView, Membership, Range
from actors.raft.progress import Inflights, Progress, ProgressState

THREE = Membership(frozenset({1, 2, 3}))


def view_of(terms: list[int], start: int = 0, prev_term: int = 0) -> LogView:
    """A view of a log whose offset start + i has terms[i]."""
    v = LogView(LogState(start, prev_term, (), start - 1), THREE)
    for i, t in enumerate(terms):
        v.append(Range(start + i, start + i, t))
    return v


def test_term_at_and_runs() -> None:
    v = view_of([1, 1, 1, 3, 3, 3, 4, 4], start=10, prev_term=1)
    assert v.runs() == [(9, 1), (13, 3), (16, 4)]
    assert [v.term_at(o) for o in range(8, 19)] == [None, 1, 1, 1, 1, 3, 3, 3, 4, 4, None]
    assert (v.last_offset, v.last_term) == (17, 4)
    assert v.state() == LogState(10, 1, ((13, 3), (16, 4)), 17, ((9, THREE),))
    assert LogView(v.state()).runs() == v.runs()


def test_empty_log_anchor() -> None:
    v = LogView(membership=THREE)
    assert (v.log_start, v.last_offset, v.flushed_offset) == (0, -1, -1)
    assert v.term_at(-1) == 0 and v.term_at(0) is None
    assert v.is_up_to_date(-1, 0) and not v.is_up_to_date(-2, 0)


def test_ranges_split_by_term() -> None:
    v = view_of([1, 1, 2, 2, 2, 5])
    assert v.ranges(1, 5) == (Range(1, 1, 1), Range(2, 4, 2), Range(5, 5, 5))
    assert v.ranges(3, 4) == (Range(3, 4, 2),)
    assert v.ranges(4, 3) == ()


def test_truncate_and_flushed() -> None:
    v = view_of([1, 1, 2, 2, 3])
    v.flushed_offset = 4
    v.truncate_after(2)
    assert (v.last_offset, v.flushed_offset, v.runs()) == (2, 2, [(-1, 0), (0, 1), (2, 2)])
    v.append(Range(3, 5, 4))
    assert not v.mark_flushed(4, 3)  # the sync began before the truncation: term 3 is gone
    assert v.flushed_offset == 2
    assert v.mark_flushed(4, 4) and v.flushed_offset == 4
    assert not v.mark_flushed(3, 4)  # never backwards


def test_set_log_start_keeps_the_anchor() -> None:
    v = view_of([1, 1, 2, 2, 3])
    v.set_log_start(3)
    assert v.term_at(2) == 2 and v.term_at(1) is None and v.runs() == [(2, 2), (4, 3)]
    v.set_log_start(5)  # everything gone: the anchor is the last entry's term
    assert (v.last_offset, v.term_at(4), v.runs()) == (4, 3, [(4, 3)])
    v.append(Range(5, 6, 3))
    assert v.runs() == [(4, 3)]


def test_restart_at_leader_start() -> None:
    v = view_of([1, 2, 2])
    v.restart(10, 4)
    assert (v.log_start, v.last_offset, v.flushed_offset) == (10, 9, -1)
    assert v.term_at(9) == 4 and v.term_at(2) is None
    assert v.mark_flushed(9, 4)


@pytest.mark.parametrize("seed", range(20))
def test_conflict_hints_against_a_plain_list(seed: int) -> None:
    """find_conflict_by_term and first_mismatch agree with a scan of one term per offset."""
    rng = random.Random(seed)
    terms: list[int] = []
    t = 1
    for _ in range(rng.randint(0, 30)):
        t += rng.random() < 0.3
        terms.append(t)
    v = view_of(terms)
    for _ in range(50):
        offset = rng.randint(-1, len(terms) + 3)
        term = rng.randint(0, t + 1)
        want_offset = min(offset, len(terms) - 1)
        while want_offset >= 0 and terms[want_offset] > term:
            want_offset -= 1
        want_term = terms[want_offset] if want_offset >= 0 else 0
        assert v.find_conflict_by_term(offset, term) == (want_offset, want_term)
        base = rng.randint(0, len(terms))
        r = Range(base, base + rng.randint(0, 4), term)
        want = next((o for o in range(r.base, r.last + 1)
                     if o >= len(terms) or terms[o] != term), None)
        assert v.first_mismatch(r) == want


def test_probe_hint_stays_on_our_batch_ends() -> None:
    # ours: 0@1 [1-5]@1 6@3; the follower's entry at 3 has term 2 (a batch 3-3@2 of its own):
    # our offset 3 is inside a batch of ours, so the probe goes from our previous term's end.
    v = LogView(LogState(0, 0, ((0, 1), (6, 3)), 6), THREE)
    assert v.find_conflict_by_term(3, 2) == (3, 1)
    assert v.probe_hint(3, 2) == -1
    assert v.probe_hint(3, 1) == 3  # same (offset, term): the same batch, ending there
    assert v.probe_hint(9, 2) == 5  # clipped to our log, then the end of term 1


def test_inflights_window() -> None:
    w = Inflights(messages_max=3, bytes_max=1000)
    w.add(10, 400)
    w.add(20, 400)
    assert not w.full()
    w.add(30, 300)
    assert w.full() and w.bytes == 1100
    w.free_upto(20)
    assert len(w) == 1 and w.bytes == 300 and not w.full()


def test_progress_probe_then_replicate() -> None:
    pr = Progress(next_offset=10, messages_max=2, bytes_max=1 << 20)
    pr.sent_append(14, 500)  # a probe naming 10-14
    assert pr.paused and pr.next == 10
    assert not pr.maybe_decrease(5, 3)  # stale: not the outstanding probe's prev
    assert pr.maybe_update(9)
    pr.become_replicate(probe_accepted=True)  # the answer reached the probe's prev
    assert (pr.state, pr.next, len(pr.inflights)) == (ProgressState.Replicate, 15, 1)
    pr.sent_append(20, 100)
    assert pr.paused and pr.inflights.full()
    assert pr.maybe_update(20)
    pr.inflights.free_upto(20)
    assert not pr.inflights.full()
    assert pr.maybe_decrease(25, 0) and pr.next == 21  # replicate: back to match + 1


def test_memberships_ride_the_log() -> None:
    """Changes in force from their offset; cut away with it; the last one below a new log
    start becomes the anchor; an install's membership is the new anchor."""
    four = Membership(frozenset({1, 2, 3, 4}))
    joint = Membership(frozenset({1, 4}), outgoing=frozenset({1, 2, 3, 4}))
    two = Membership(frozenset({1, 4}))
    v = view_of([1, 1, 1, 2, 2, 2, 2])
    v.add_conf(2, four)
    v.add_conf(4, joint)
    v.add_conf(5, two)
    assert v.membership == two and v.last_conf_offset() == 5
    assert [v.membership_at(o) for o in (-1, 1, 2, 3, 4, 5, 6)] == [
        THREE, THREE, four, four, joint, two, two]
    assert v.confs_in(0, 4) == ((2, four), (4, joint)) and v.confs_in(5, 6) == ((5, two),)
    assert LogView(v.state()).confs() == v.confs()
    v.truncate_after(4)  # the leave is cut away: the joint configuration is in force again
    assert v.membership == joint and v.confs() == ((-1, THREE), (2, four), (4, joint))
    v.set_log_start(4)  # the change at 2 is below the start: the anchor now
    assert v.confs() == ((3, four), (4, joint)) and v.membership_at(3) == four
    assert LogView(v.state(), THREE).confs() == v.confs()  # a restart keeps the anchor
    v.restart(10, 2, two)
    assert v.confs() == ((9, two),) and v.membership == two
