"""The leader's half of replication: appends out, answers in, the commit offset.

Appends are not sent when asked for but gathered (`want_append`: peer -> send even if empty)
and sent when the Ready is built, so every proposal, answer and commit move of one loop turn
goes to a follower as one MsgApp naming ranges (prev offset and term, then one Range per
term), never one per batch:

    propose(5), propose(3), an answer   ready()
                  |                        |
          want_append[2] = False ------> MsgApp to 2: prev 9/1, ranges [10-17@2], commit 9

How much one follower gets is its Progress's business (progress.py): everything from `next`
in replicate state, within the in-flight window, one probe at a time in probe state. A
follower whose `next` fell below the log start gets MsgSnap (restart at my log start).
Every append and heartbeat carries the leader's log start, and every answer the follower's
(messages.py): a follower moves its start up to the leader's, and `Progress.log_start` says
how far each one has.

The commit offset is the quorum offset of the followers' matches and the leader's own flushed
offset, and moves only onto an entry of the current term (figure 8 of the Raft paper: an
entry of an earlier term on a majority can still be overwritten). Every answer from a
follower marks it recently active for check-quorum, so an append stands in for a heartbeat.
"""

from __future__ import annotations

from actors.raft.messages import Message, MsgType, NodeId, Range
from actors.raft.progress import Progress, ProgressState
from actors.raft.state import RaftState

__all__ = ["broadcast_heartbeat", "leader_acked", "send_pending_appends", "step_leader"]


def send_pending_appends(r: RaftState) -> None:
    """Send the appends gathered in `want_append` (leader only), as many per follower as
    its progress allows."""
    if not r.want_append:
        return
    want, r.want_append = r.want_append, {}
    for p in r.peers:
        force = want.get(p)
        if force is not None and _send_append(r, p, force):
            while _send_append(r, p, False):
                pass


def _send_append(r: RaftState, to: NodeId, force: bool) -> bool:
    pr = r.progress[to]
    if pr.paused:
        return False
    log = r.log
    prev = pr.next - 1
    prev_term = log.term_at(prev)
    if prev_term is None:
        return _send_install(r, to, pr)
    last = log.last_offset
    ranges: tuple[Range, ...] = ()
    size = 0
    if pr.next <= last and not (pr.state == ProgressState.Replicate and pr.inflights.full()):
        end = last
        # The reader sizes what the orchestrator's log holds; the offsets of this Ready's
        # own writes (proposals since the last Ready, the no-op) are named whole, unsized.
        stored = last if r.unwritten_from is None else r.unwritten_from - 1
        if r.batch_reader is not None and pr.next <= stored:
            end, size = r.batch_reader(pr.next, stored, r.config.append_bytes_max)
            assert pr.next <= end <= stored, (pr.next, end, stored)
            if end == stored:
                end = last
        ranges = log.ranges(pr.next, end)
    commit = r.commit
    if not ranges and not force and not (commit > pr.sent_commit
                                         and pr.sent_commit < pr.next - 1):
        return False  # nothing to send, and the follower's commit is as far as it can go
    confs = log.confs_in(ranges[0].base, ranges[-1].last) if ranges else ()
    r.send(Message(MsgType.MsgApp, to, r.id, r.term, offset=prev, log_term=prev_term,
                   ranges=ranges, commit=commit, log_start=log.log_start, confs=confs))
    pr.sent_append(ranges[-1].last if ranges else None, size)
    pr.sent_commit = commit
    return True


def _send_install(r: RaftState, to: NodeId, pr: Progress) -> bool:
    if not pr.recent_active:
        return False  # not to a follower that answers nothing: wait for it to come back
    log = r.log
    start = log.log_start
    # Our first entry, if any: a follower that holds it matches our log up to there, even
    # where we do not know the term before our start (follower.py).
    first = () if start > log.last_offset else (Range(start, start, log.term_at(start) or 0),)
    r.send(Message(MsgType.MsgSnap, to, r.id, r.term, offset=start - 1,
                   log_term=log.term_at(start - 1) or 0, ranges=first, commit=r.commit,
                   confs=((start - 1, log.membership_at(start - 1)),)))
    pr.sent_install(start)
    return True


def broadcast_heartbeat(r: RaftState, quiesce: bool = False) -> None:
    """Heartbeat every follower (`quiesce`: the last before the group goes quiet). Cheap to
    drop: the orchestrator may skip a heartbeat to a peer that got an append of this group
    within the heartbeat interval (an append resets the follower's election timer too, and
    its answer marks it active), and batch the rest per node pair."""
    for p in r.peers:
        # Never past its match: the follower may not hold our log beyond it.
        match = r.progress[p].match
        r.send(Message(MsgType.MsgHeartbeat, p, r.id, r.term, commit=min(match, r.commit),
                       quiesce=quiesce, log_start=r.log.log_start))


def leader_acked(r: RaftState) -> None:
    """The leader's own flushed offset moved."""
    if _maybe_commit(r):
        _want_all(r)


def _maybe_commit(r: RaftState) -> bool:
    match = {p: pr.match for p, pr in r.progress.items()}
    match[r.id] = r.log.flushed_offset
    q = r.membership.committed(match)  # learners count for nothing
    if q > r.commit and r.log.term_at(q) == r.term:
        r.commit = q
        return True
    return False


def _want_all(r: RaftState) -> None:
    for p in r.peers:
        r.want_append.setdefault(p, False)


def step_leader(r: RaftState, m: Message) -> None:
    pr = r.progress.get(m.sender)
    if pr is None:
        return  # not a peer (or ourselves: a transfer to the leader is a no-op)
    t = m.type
    if m.term:
        pr.recent_active = True
    if m.log_start >= 0:  # an answer: where the follower's log starts now
        took_start = pr.log_start < r.log.log_start <= m.log_start
        pr.log_start = m.log_start
        if took_start and m.sender == r.transferee and _can_take_over(r, pr):
            r.send(Message(MsgType.MsgTimeoutNow, m.sender, r.id, r.term))
    if t == MsgType.MsgAppResp:
        _handle_append_resp(r, m, pr)
    elif t == MsgType.MsgHeartbeatResp:
        pr.paused = False
        if pr.match < r.log.last_offset or pr.state == ProgressState.Probe:
            r.want_append[m.sender] = True
    elif t == MsgType.MsgUnreachable:
        if pr.state == ProgressState.Replicate:
            pr.become_probe()  # what was in flight is probably lost
    elif t == MsgType.MsgTransferLeader and r.membership.is_voter(m.sender):
        _transfer(r, m.sender, pr)  # (a learner cannot lead)


def _handle_append_resp(r: RaftState, m: Message, pr: Progress) -> None:
    if m.reject:
        # The follower's hint (offset, term) names its last entry of a term <= our prev
        # term; the largest offset of ours at or below it with a term <= that is where the
        # logs can first match: skip a whole term per round trip, not one batch.
        hint = r.log.probe_hint(m.hint, m.log_term)
        if pr.maybe_decrease(m.offset, hint):
            if pr.state == ProgressState.Replicate:
                pr.become_probe()
            r.want_append[m.sender] = True
        return
    probe_accepted = m.offset >= pr.next - 1  # in probe state, next - 1 is the probe's prev
    if not (pr.maybe_update(m.offset)
            or (pr.match == m.offset and pr.state == ProgressState.Probe)):
        return
    if pr.state == ProgressState.Probe:
        pr.become_replicate(probe_accepted)
    else:
        pr.inflights.free_upto(m.offset)
    if _maybe_commit(r):
        _want_all(r)
    else:
        r.want_append.setdefault(m.sender, False)
    if m.sender == r.transferee and _can_take_over(r, pr):
        r.send(Message(MsgType.MsgTimeoutNow, m.sender, r.id, r.term))


def _can_take_over(r: RaftState, pr: Progress) -> bool:
    """Whether a transferee has all we have: our whole log, and our log start (else records
    DeleteRecords or retention removed here would be served again)."""
    return pr.match == r.log.last_offset and pr.log_start >= r.log.log_start


def _transfer(r: RaftState, to: NodeId, pr: Progress) -> None:
    if r.transferee == to:
        return
    r.transferee = to
    r.election_elapsed = 0  # it has one election timeout to finish
    if _can_take_over(r, pr):
        r.send(Message(MsgType.MsgTimeoutNow, to, r.id, r.term))
    else:
        r.want_append[to] = True
