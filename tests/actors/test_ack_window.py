"""The produce ack window as a pure machine: flush coalescing, acks=1 and acks=all under a
local and a quorum commit, min.insync.replicas above a majority, write.caching, failed flushes
(with one out and more queued), the order of answers, and a seeded random run checked against
what the window may never do.

Waiters are strings here; a step is what the Partition would carry out."""

from __future__ import annotations

import random

import pytest

from actors.ack_window import Acks, AckWindow, CommitSource, Step

LEADER, ALL = Acks.LEADER, Acks.ALL


def window(offset: int = 0, write_caching: bool = False,
           commit_source: CommitSource = CommitSource.LOCAL) -> AckWindow[str]:
    return AckWindow(offset, write_caching, commit_source)


def flush(w: AckWindow[str]) -> Step[str]:
    """Start a flush and have it succeed."""
    w.flush_started()
    return w.flush_done(w.written_offset)


# Coalescing ---------------------------------------------------------------------------------


def test_one_flush_at_a_time_and_the_next_covers_everything_appended_meanwhile() -> None:
    w = window()
    assert w.appended(9, "a") == Step(start_flush=True)
    assert w.flush_started() == 10 and w.flush_in_flight
    assert w.appended(14, "b") == Step()  # one is out: wait for it
    assert w.appended(19, "c") == Step()
    assert w.flush_wanted and w.flush_covers == 10
    assert w.flush_done(10) == Step(acked=("a",), high_watermark=10, start_flush=True)
    assert w.flush_started() == 20  # one fdatasync for both
    assert w.flush_done(20) == Step(acked=("b", "c"), high_watermark=20)
    assert not w.flush_wanted and not w.flush_in_flight and w.waiting == 0


def test_nothing_appended_meanwhile_no_next_flush() -> None:
    w = window(100)
    assert w.high_watermark == 100
    w.appended(104, "a")
    assert flush(w) == Step(acked=("a",), high_watermark=105)
    with pytest.raises(AssertionError):
        w.flush_started()  # nothing to flush


def test_acks_0_waits_for_nothing_but_its_bytes_are_flushed_and_counted() -> None:
    w = window()
    assert w.appended(4) == Step(start_flush=True)  # no waiter
    assert w.waiting == 0 and w.high_watermark == 0  # not readable before its flush
    assert flush(w) == Step(high_watermark=5)


def test_a_flush_that_made_less_durable_than_it_covered_answers_only_that() -> None:
    w = window()
    w.appended(4, "a")
    w.appended(9, "b")
    w.flush_started()
    assert w.flush_done(5) == Step(acked=("a",), high_watermark=5, start_flush=True)


# acks=1 and acks=all --------------------------------------------------------------------------


def test_local_commit_answers_acks_1_and_all_on_the_same_flush_in_offset_order() -> None:
    w = window()
    w.appended(0, "one-1", LEADER)
    w.appended(1, "all-2", ALL)
    w.appended(2, "one-3", LEADER)
    assert flush(w) == Step(acked=("one-1", "all-2", "one-3"), high_watermark=3)


def test_quorum_commit_answers_acks_1_on_the_local_flush_and_acks_all_on_the_commit() -> None:
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(0, "one", LEADER)
    w.appended(1, "all", ALL)
    assert flush(w) == Step(acked=("one",))  # durable here; the high watermark waits
    assert w.flushed_offset == 2 and w.high_watermark == 0
    assert w.committed(1) == Step(high_watermark=1)  # "all" needs offset 1 too
    assert w.committed(1) == Step()  # old news
    assert w.committed(2) == Step(acked=("all",), high_watermark=2)


def test_quorum_ahead_of_this_disk_answers_acks_1_too() -> None:
    # Raft may commit on followers' flushes before the leader's own returns.
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(4, "one", LEADER)
    w.appended(9, "all", ALL)
    w.flush_started()
    assert w.committed(10) == Step(acked=("one", "all"), high_watermark=10)
    assert w.flush_done(10) == Step()


def test_only_a_quorum_window_takes_a_commit_and_never_past_its_log() -> None:
    with pytest.raises(AssertionError):
        window().committed(0)
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(4, "a")
    with pytest.raises(AssertionError):
        w.committed(6)


# min.insync.replicas above a majority (QUORUM) -------------------------------------------------


def test_acks_all_waits_for_min_insync_replicas_while_the_watermark_moves_with_the_commit(
) -> None:
    w = window(commit_source=CommitSource.QUORUM)
    assert w.insync(0) == Step()  # 3 of 3 asked, none flushed yet
    w.appended(4, "one", LEADER)
    w.appended(9, "all", ALL)
    assert flush(w) == Step(acked=("one",))  # acks=1: the leader's flush, as before
    assert w.committed(10) == Step(high_watermark=10)  # a majority: readable, not answered
    assert w.insync(5) == Step()
    assert w.insync(10) == Step(acked=("all",))  # the third replica flushed it
    assert w.high_watermark == 10


def test_min_insync_replicas_ahead_of_the_commit_still_waits_for_the_commit() -> None:
    # Raft commits only entries of its own term: every replica may have an earlier term's.
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(9, "all", ALL)
    flush(w)
    assert w.insync(10) == Step()
    assert w.committed(10) == Step(acked=("all",), high_watermark=10)


def test_insync_may_move_back_and_none_asks_only_the_commit_again() -> None:
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(9, "a", ALL)
    w.appended(19, "b", ALL)
    flush(w)
    w.insync(20)
    assert w.insync(0) == Step()  # a new leader that has heard from nobody yet
    assert w.committed(20) == Step(high_watermark=20)
    assert w.insync(10) == Step(acked=("a",))
    assert w.insync(None) == Step(acked=("b",))  # min.insync.replicas lowered to a majority


def test_only_a_quorum_window_takes_an_insync_offset() -> None:
    with pytest.raises(AssertionError):
        window().insync(3)
    assert window().insync(None) == Step()


def test_fail_acks_takes_only_that_level_s_waiters_in_order() -> None:
    w = window(commit_source=CommitSource.QUORUM)
    w.insync(0)
    w.appended(4, "all-1", ALL)
    w.appended(9, "one", LEADER)
    w.appended(14, "all-2", ALL)
    w.wait(4, "dup-of-all-1", ALL)
    w.committed(5)  # a majority has the first: min.insync.replicas not yet
    assert w.fail_acks(ALL) == ("all-1", "dup-of-all-1", "all-2")
    assert w.waiting == 1
    assert flush(w) == Step(acked=("one",))
    assert w.insync(15) == Step()  # nothing left to answer


# write.caching --------------------------------------------------------------------------------


def test_write_caching_answers_at_once_and_flushes_behind() -> None:
    w = window(write_caching=True)
    assert w.appended(4, "a", ALL) == Step(acked=("a",), high_watermark=5, start_flush=True)
    w.flush_started()
    assert w.appended(9, "b", LEADER) == Step(acked=("b",), high_watermark=10)
    assert w.flush_done(5) == Step(start_flush=True)  # the high watermark is ahead already
    assert w.flushed_offset == 5 and w.high_watermark == 10


def test_write_caching_turned_on_answers_what_is_written_and_off_waits_again() -> None:
    w = window()
    w.appended(4, "a")
    w.flush_started()
    assert w.set_write_caching(True) == Step(acked=("a",), high_watermark=5)
    assert w.flush_done(5) == Step()
    assert w.set_write_caching(False) == Step()
    assert w.appended(9, "b") == Step(start_flush=True)  # waits for its flush again
    assert flush(w) == Step(acked=("b",), high_watermark=10)


# Failed flushes -------------------------------------------------------------------------------


def test_a_failed_flush_fails_its_waiters_and_the_watermark_stays_at_flushed() -> None:
    w = window(10)
    w.appended(10, "one-record")
    w.appended(14, "a")
    w.flush_started()
    assert w.flush_failed() == Step(failed=("one-record", "a"))
    assert (w.written_offset, w.flushed_offset, w.high_watermark) == (10, 10, 10)
    assert not w.flush_wanted and not w.flush_in_flight and w.waiting == 0
    # Writes go on from the cut: the next append starts a flush of its own.
    assert w.appended(12, "b") == Step(start_flush=True)
    assert flush(w) == Step(acked=("b",), high_watermark=13)


def test_a_failure_with_more_queued_behind_the_flush_fails_all_in_order_and_flushes_none() -> None:
    w = window()
    w.appended(4, "a")
    flush(w)
    w.appended(9, "b", LEADER)
    w.flush_started()  # covers 10
    w.appended(14, "c", ALL)  # queued for the next flush
    w.appended(19)  # acks=0, queued too
    w.appended(24, "d", LEADER)
    assert w.flush_wanted
    assert w.flush_failed() == Step(failed=("b", "c", "d"))  # everything past 5 was cut
    assert (w.written_offset, w.flushed_offset, w.high_watermark) == (5, 5, 5)
    assert not w.flush_wanted  # what was queued is gone with the cut


def test_a_failure_under_write_caching_takes_the_watermark_back_to_flushed() -> None:
    w = window(write_caching=True)
    w.appended(4, "a")
    flush(w)
    w.appended(9, "b")
    w.flush_started()
    assert w.high_watermark == 10  # "b" was answered and may have been read
    assert w.flush_failed() == Step(high_watermark=5)


def test_a_failure_under_a_quorum_fails_only_the_waiters_past_the_cut() -> None:
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(4, "durable", ALL)
    flush(w)  # flushed here, not yet committed
    w.appended(9, "cut", ALL)
    w.flush_started()
    assert w.flush_failed() == Step(failed=("cut",))
    assert w.committed(5) == Step(acked=("durable",), high_watermark=5)


# Order of answers, duplicates, failing everything ----------------------------------------------


def test_a_duplicate_waits_for_its_original_offset_and_is_answered_in_offset_order() -> None:
    w = window()
    w.appended(9, "a")
    w.appended(19, "b")
    w.appended(29, "c")
    assert w.wait(14, "dup-of-b-half") == Step(start_flush=True)
    assert w.wait(9, "dup-of-a") == Step(start_flush=True)  # ties: after "a"
    w.flush_started()
    assert w.flush_done(30) == Step(
        acked=("a", "dup-of-a", "dup-of-b-half", "b", "c"), high_watermark=30)


def test_a_duplicate_of_something_committed_is_answered_at_once() -> None:
    w = window()
    w.appended(9, "a")
    flush(w)
    assert w.wait(9, "dup", LEADER) == Step(acked=("dup",))
    with pytest.raises(AssertionError):
        w.wait(10, "never appended")


def test_fail_all_answers_every_waiter_in_order_and_keeps_the_watermark() -> None:
    w = window(commit_source=CommitSource.QUORUM)
    w.appended(4, "a", ALL)
    w.appended(9, "b", LEADER)
    w.flush_started()
    w.appended(14, "c", ALL)
    assert w.fail_all() == ("a", "b", "c")
    assert w.waiting == 0 and w.high_watermark == 0
    assert w.flush_done(10) == Step(start_flush=True)  # the flush still returns


# A seeded random run ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("source", list(CommitSource))
def test_random_runs_answer_each_produce_once_and_never_before_its_rule(
    seed: int, source: CommitSource
) -> None:
    """Events in random order, with what the Partition does with each step; checks: every
    waiter is answered exactly once, acked only when its rule covers it, failed only when a
    cut took its offsets; the high watermark never passes what the rule allows."""
    rng = random.Random(seed)
    w = AckWindow[tuple[int, Acks, int]](0, rng.random() < 0.3, source)
    answered: dict[int, str] = {}
    pending: dict[int, int] = {}  # waiter -> the end offset it needs
    serial = 0
    quorum_flushed = 0  # what "the other replicas" have: never past what was written
    insync: int | None = None  # what min.insync.replicas replicas have (None: not asked)
    high_watermark = 0

    def carry_out(step: Step[tuple[int, Acks, int]], committed: int | None = None) -> None:
        nonlocal high_watermark
        if step.high_watermark is not None:
            moved, high_watermark = step.high_watermark, w.high_watermark
            assert moved == high_watermark
            if committed is not None:  # a quorum's commit moved it
                assert moved == committed
            elif source is CommitSource.LOCAL and step.failed == () and moved > 0:
                assert moved == (w.written_offset if w.write_caching else w.flushed_offset)
        assert w.high_watermark == high_watermark  # every move was in a step
        ends = [end for _, _, end in step.acked]
        assert ends == sorted(ends)  # answered in offset order
        for n, acks, end in step.acked:
            assert n not in answered
            del pending[n]
            answered[n] = "acked"
            local = w.written_offset if w.write_caching else w.flushed_offset
            acks_all = w.high_watermark if insync is None else min(w.high_watermark, insync)
            assert end <= (acks_all if acks is ALL else max(local, w.high_watermark))
        for n, _, end in step.failed:
            assert n not in answered
            del pending[n]
            answered[n] = "failed"
            assert end > w.written_offset
        if step.start_flush:
            w.flush_started()

    for _ in range(300):
        event = rng.random()
        if event < 0.4:
            serial += 1
            last = w.written_offset + rng.randrange(5)
            acks = rng.choice([LEADER, ALL])
            pending[serial] = last + 1
            carry_out(w.appended(last, (serial, acks, last + 1), acks))
        elif event < 0.5 and w.written_offset > 0:
            serial += 1
            last = rng.randrange(w.written_offset)
            acks = rng.choice([LEADER, ALL])
            pending[serial] = last + 1
            carry_out(w.wait(last, (serial, acks, last + 1), acks))
        elif event < 0.75 and w.flush_covers is not None:
            done = rng.randrange(w.flushed_offset, w.flush_covers) + 1
            carry_out(w.flush_done(done))
        elif event < 0.8 and w.flush_covers is not None:
            carry_out(w.flush_failed())
            assert all(end <= w.written_offset for end in pending.values())  # none left cut
            quorum_flushed = min(quorum_flushed, w.written_offset)
        elif event < 0.9 and source is CommitSource.QUORUM:
            quorum_flushed = rng.randrange(quorum_flushed, w.written_offset + 1)
            carry_out(w.committed(quorum_flushed), quorum_flushed)
        elif event < 0.93 and source is CommitSource.QUORUM:
            insync = rng.choice([None, rng.randrange(w.written_offset + 1)])
            carry_out(w.insync(insync))
        elif event < 0.94 and source is CommitSource.QUORUM:
            for n, acks, _ in w.fail_acks(ALL):
                assert n not in answered and acks is ALL
                del pending[n]
                answered[n] = "not enough replicas"
        elif event < 0.96:
            carry_out(w.set_write_caching(not w.write_caching))
        assert w.flushed_offset <= w.written_offset and w.high_watermark <= w.written_offset
    for n, _, _ in w.fail_all():
        assert n not in answered
        answered[n] = "stopped"
    assert sorted(answered) == list(range(1, serial + 1))
