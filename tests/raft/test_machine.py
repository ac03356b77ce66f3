"""The machine's interface, beyond what the scripts show: a single-voter group, refusals,
the Ready/advance pairing, a restart from persisted state."""

from __future__ import annotations

import random

import pytest

from actors.raft import (
    LEADER_CHANGE,
    Append,
    Config,
    HardState,
    LogState,
    Message,
    MsgType,
    RaftMachine,
    Range,
    Role,
)


def test_single_voter_commits_on_its_own_sync() -> None:
    m = RaftMachine(Config("a", ("a",)), random.Random(1))
    m.campaign()
    assert m.role == Role.Leader
    rd = m.ready()
    assert rd.hard_state == HardState(1, "a") and rd.soft_state is not None
    m.advance()
    r = m.propose(3, payload="batch")
    assert r == Range(0, 2, 1)
    rd = m.ready()
    assert rd.log_writes == (Append((r,), "batch"),) and rd.committed is None
    m.advance()
    m.flushed(2, 1)
    rd = m.ready()
    assert rd.committed == 2 and rd.messages == ()
    m.advance()


def test_ready_needs_advance() -> None:
    m = RaftMachine(Config(1, (1, 2, 3)), random.Random(1))
    m.campaign()
    m.ready()
    with pytest.raises(AssertionError):
        m.ready()
    m.advance()
    with pytest.raises(AssertionError):
        m.advance()


def test_followers_refuse_proposals_and_transfers() -> None:
    m = RaftMachine(Config(1, (1, 2, 3)), random.Random(1))
    assert m.propose(1) is None
    m.transfer_leader(2)
    assert not m.has_ready()


def test_restart_keeps_term_vote_and_log() -> None:
    log = LogState(5, 2, ((7, 3),), 9)  # offsets 5-6 of term 2, 7-9 of term 3
    m = RaftMachine(Config(1, (1, 2, 3)), random.Random(1), hard_state=HardState(3, 2),
                    log=log, committed=8)
    assert (m.term, m.vote, m.commit) == (3, 2, 8)
    assert (m.log.term_at(4), m.log.term_at(6), m.log.term_at(9)) == (2, 2, 3)
    assert m.log.flushed_offset == 9  # a restarting log was synced
    # Its vote in term 3 stands: another candidate of term 3 is refused.
    m.step(Message(MsgType.MsgVote, 1, 3, 3, offset=20, log_term=3))
    (resp,) = m.ready().messages
    assert resp.type == MsgType.MsgVoteResp and resp.reject


def test_new_leader_with_uncommitted_tail_writes_leader_change() -> None:
    log = LogState(0, 0, ((0, 1),), 4)
    m = RaftMachine(Config(1, (1, 2, 3)), random.Random(1), hard_state=HardState(1, None),
                    log=log, committed=2)
    m.campaign()  # pre-vote
    for p in (2, 3):
        m.step(Message(MsgType.MsgPreVoteResp, 1, p, 2))
    for p in (2, 3):
        m.step(Message(MsgType.MsgVoteResp, 1, p, 2))
    assert m.role == Role.Leader
    rd = m.ready()
    assert rd.log_writes == (Append((Range(5, 5, 2),), LEADER_CHANGE),)
    apps = [msg for msg in rd.messages if msg.type == MsgType.MsgApp]
    assert [(msg.to, msg.offset, msg.log_term, msg.ranges) for msg in apps] == [
        (2, 4, 1, (Range(5, 5, 2),)), (3, 4, 1, (Range(5, 5, 2),))]
