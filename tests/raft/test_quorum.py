"""Who decides in a group (actors/raft/quorum.py): majorities of voters, of both sets in a
joint configuration, and learners that count for nothing."""

from __future__ import annotations

import itertools

import pytest

from actors.raft.quorum import Membership, VoteResult, is_step, majority_offset

pytestmark = pytest.mark.timeout(10)


def test_majority_offset() -> None:
    assert majority_offset([1], {1: 5}) == 5
    assert majority_offset([1, 2, 3], {1: 7, 2: 3, 3: 5}) == 5
    assert majority_offset([1, 2, 3, 4], {1: 1, 2: 9, 3: 9, 4: 2}) == 2  # 3 of 4 reach 2
    assert majority_offset([1, 2, 3, 4, 5], {1: 4, 2: 8, 3: 6, 5: 10}) == 6  # 4: nothing
    assert majority_offset([1, 2, 3], {}) == -1


def test_a_joint_commit_needs_a_majority_of_each_set_and_learners_count_for_nothing() -> None:
    m = Membership({1, 2, 3}, outgoing={1, 2, 4}, learners={5})
    assert m.joint and m.all_voters == {1, 2, 3, 4} and m.members == {1, 2, 3, 4, 5}
    assert m.committed({1: 9, 2: 7, 3: 4, 4: 2, 5: 9}) == 7
    assert m.committed({1: 9, 3: 8, 4: 1, 5: 9}) == 1  # {1,2,4}: only 1 reaches past 1
    plain = Membership({1, 2, 3}, learners={4, 5})
    assert plain.committed({1: 3, 4: 9, 5: 9}) == -1  # the learners' 9s make no majority
    assert plain.committed({1: 3, 2: 2, 4: 9, 5: 9}) == 2


@pytest.mark.parametrize("votes, result", [
    ({1: True}, VoteResult.PENDING),
    ({1: True, 3: True}, VoteResult.PENDING),  # {1,2,3} won, {1,2,4} has one of three
    ({1: True, 3: True, 4: True}, VoteResult.WON),
    ({1: True, 2: False, 4: False}, VoteResult.LOST),  # {1,2,4} cannot reach two
    ({3: False, 2: False}, VoteResult.LOST),  # nor can {1,2,3}
    ({1: True, 2: True, 5: False}, VoteResult.WON),  # the learner's no is not counted
])
def test_a_joint_election_needs_both_majorities(votes: dict[int, bool],
                                                result: VoteResult) -> None:
    assert Membership({1, 2, 3}, outgoing={1, 2, 4}, learners={5}).vote_result(votes) == result


def test_vote_results_agree_with_counting_every_outcome() -> None:
    """Against a brute force over every vote assignment of 5 voters (3 of them incoming)."""
    def outcome(votes: dict[int, bool], voters: set[int]) -> str:
        yes = sum(votes.get(v) is True for v in voters)
        undecided = sum(v not in votes for v in voters)
        return "won" if yes >= 2 else "lost" if yes + undecided < 2 else "pending"

    m = Membership({1, 2, 3}, outgoing={3, 4, 5})
    for answers in itertools.product([None, True, False], repeat=5):
        votes = {n: a for n, a in zip(range(1, 6), answers, strict=True) if a is not None}
        a, b = outcome(votes, {1, 2, 3}), outcome(votes, {3, 4, 5})
        expected = ("lost" if "lost" in (a, b) else "won" if a == b == "won" else "pending")
        assert m.vote_result(votes).value == expected, votes


def test_check_quorum_and_the_sets_are_checked() -> None:
    m = Membership({1, 2, 3}, learners={4})
    assert m.active([1, 2]) and not m.active([1, 4])
    assert m.describe() == "voters=(1 2 3) learners=(4)"
    with pytest.raises(AssertionError):
        Membership({1, 2}, learners={2})
    with pytest.raises(AssertionError):
        Membership(set())


def test_one_step_at_a_time() -> None:
    three = Membership({1, 2, 3}, learners={4})
    assert is_step(three, Membership({1, 2, 3, 4}))  # a learner promoted: one voter more
    assert is_step(three, Membership({1, 2}, learners={4}))  # one voter less
    assert is_step(three, Membership({1, 2, 3}, learners={4, 5}))  # learners only
    assert not is_step(three, Membership({1, 2, 4, 5}))  # two voters differ: joint first
    assert not is_step(three, three)
    joint = Membership({1, 4, 5}, outgoing={1, 2, 3})
    assert is_step(three, joint)
    assert not is_step(three, Membership({1, 4, 5}, outgoing={1, 2}))  # not what was
    assert is_step(joint, Membership({1, 4, 5}))  # leaving it
    assert is_step(joint, Membership({1, 4, 5}, learners={2}))
    assert not is_step(joint, Membership({1, 4}))  # only leaving it, to its incoming voters
    assert not is_step(joint, Membership({1, 2, 3}))
