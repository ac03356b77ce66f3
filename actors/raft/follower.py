"""The follower's half of replication: appends in, answers out once flushed.

An append (MsgApp) names the leader's prev (offset, term) and ranges. The follower

1. skips what its commit covers (the committed prefix is in every leader's log);
2. rejects if it does not hold prev with that term, with a hint: its largest offset at or
   below prev whose term is <= the prev term, and that term (the leader skips a term);
3. finds the first range offset it does not hold with the range's term, truncates its tail
   from there (never below its commit) and appends the rest: `TruncateAfter` and `Append`
   (with the message's payload: the batches' bytes) in the Ready; the membership changes
   among what it appended (the message's `confs`) are in force from now on, and those the
   truncation removed no longer are (the machine acts on both);
4. notes that its log matches the leader's up to the message's end (`leader_match`) and that
   an answer is owed up to there (`ack_pending`).

An answer says "my log matches yours and is synced up to offset X", so it is sent only when
`flushed()` reports the sync: X = min(flushed offset, leader_match). Several appends written
before one sync get one answer; a duplicate of what is synced already is answered at once
(a probing leader waits for it). Rejections claim nothing durable and go out at once.

    MsgApp ..10  MsgApp ..14  MsgApp ..20   flushed(20, t)
        |            |            |               |
    Append       Append       Append        MsgAppResp 20    ack_pending 20 -> answered

The entry just before the log start (its anchor, `log_start - 1`) matches whatever term the
log kept for it: a log start moves only below the commit, so that entry is committed and in
every leader's log alike. A log whose start moved before a restart that did not keep the
term there reads it as 0; checking the term would reject the leader's match point there for
good, when the whole log after it diverges. A leader whose own start forgot it sends prev
term 0 there: holding the append's first entry with its term proves the match as well.

Heartbeats carry the commit offset clipped to what the leader knows we match; an install
(MsgSnap) restarts the log at the leader's log start when ours does not reach it.

The leader's log start comes with its appends and heartbeats (`log_start`, as in Kafka's
fetch answers): the follower moves its own start up to it, never past its commit + 1 (what
it knows is the leader's log too), with an `AdvanceStart` write; every answer says where the
follower's start is.

A write the orchestrator could not make (`RaftMachine.log_write_failed`) is answered at once
with a rejection of the offset we had claimed, hinting where the log really ends: a leader
streaming to us probes back from what we acknowledged.
"""

from __future__ import annotations

from actors.raft.messages import (
    AdvanceStart,
    Append,
    InstallStart,
    Message,
    MsgType,
    Range,
    TruncateAfter,
)
from actors.raft.state import RaftState

__all__ = ["follow_log_start", "handle_append", "handle_heartbeat", "handle_install",
           "maybe_ack"]


def handle_append(r: RaftState, m: Message) -> None:
    _note_leader_start(r, m)
    prev, prev_term, ranges = m.offset, m.log_term, m.ranges
    if prev < r.commit:
        if not ranges or ranges[-1].last <= r.commit:
            _accept(r, r.commit, m.commit)
            return
        prev, prev_term, ranges = _skip_committed(ranges, r.commit)
    log = r.log
    if not _holds(r, prev, prev_term, ranges):
        hint, hint_term = log.find_conflict_by_term(min(prev, log.last_offset), prev_term)
        follow_log_start(r)
        r.send(Message(MsgType.MsgAppResp, m.sender, r.id, r.term, offset=prev,
                       log_term=hint_term, reject=True, hint=hint,
                       log_start=log.log_start))
        return
    for i, rg in enumerate(ranges):
        first = log.first_mismatch(rg)
        if first is None:
            continue
        assert first > r.commit, (first, r.commit)  # a committed entry never changes
        if first <= log.last_offset:
            log.truncate_after(first - 1)
            r.log_writes.append(TruncateAfter(first - 1))
        new = (Range(first, rg.last, rg.term), *ranges[i + 1:])
        for x in new:
            log.append(x)
        confs = tuple((offset, membership) for offset, membership in m.confs
                      if offset >= first)
        for offset, membership in confs:  # in force as appended (log.py)
            log.add_conf(offset, membership)
        r.log_writes.append(Append(new, m.payload, confs))
        break
    _accept(r, ranges[-1].last if ranges else prev, m.commit)


def _holds(r: RaftState, prev: int, prev_term: int, ranges: tuple[Range, ...]) -> bool:
    """Whether our log holds the leader's entry at `prev` (its term `prev_term`). The entry
    before our log start is committed, so it is the leader's, whatever term we kept for it
    (module docstring). And where the leader's own log start forgot the term before it
    (`prev_term` 0), holding the leader's next entry is enough: the same offset and term is
    the same entry after the same prefix (log matching)."""
    log = r.log
    if prev == log.log_start - 1 or log.term_at(prev) == prev_term:
        return True
    return bool(ranges) and ranges[0].base == prev + 1 and log.term_at(prev + 1) == ranges[0].term


def _skip_committed(ranges: tuple[Range, ...],
                    commit: int) -> tuple[int, int, tuple[Range, ...]]:
    """The part of `ranges` after `commit` (at a batch boundary: commits always are), and the
    leader's term at `commit` as the new prev."""
    for i, rg in enumerate(ranges):
        if rg.last > commit:
            if rg.base > commit:
                return commit, ranges[i - 1].term, ranges[i:]
            return commit, rg.term, (Range(commit + 1, rg.last, rg.term), *ranges[i + 1:])
    raise AssertionError((ranges, commit))


def handle_heartbeat(r: RaftState, m: Message) -> None:
    _note_leader_start(r, m)
    commit = min(m.commit, r.log.last_offset)
    if commit > r.commit:
        r.commit = commit
    follow_log_start(r)
    r.send(Message(MsgType.MsgHeartbeatResp, m.sender, r.id, r.term,
                   log_start=r.log.log_start))
    if m.quiesce:
        r.quiesced = True  # the leader has nothing to send until its next proposal


def handle_install(r: RaftState, m: Message) -> None:
    """MsgSnap: the leader's log starts after `m.offset`, which has term `m.log_term`; its
    first entry is `m.ranges[0]`, if it has one."""
    before_start = m.offset
    if before_start <= r.commit:
        _accept(r, r.commit, m.commit)
    elif _holds(r, before_start, m.log_term, m.ranges):
        _accept(r, before_start, m.commit)
    else:
        membership = m.confs[0][1] if m.confs else None
        r.log.restart(before_start + 1, m.log_term, membership)
        r.log_writes.append(InstallStart(before_start + 1, m.log_term, r.log.membership))
        r.commit = before_start  # all below the leader's log start is committed
        r.leader_match = before_start
        _accept(r, before_start, m.commit)


def _accept(r: RaftState, upto: int, leader_commit: int) -> None:
    """Our log matches the leader's up to `upto`; the append that told us wants an answer."""
    if upto > r.leader_match:
        r.leader_match = upto
    if upto > r.ack_pending:
        r.ack_pending = upto
    r.ack_due = True
    commit = min(leader_commit, r.leader_match)
    if commit > r.commit:
        r.commit = commit
    follow_log_start(r)
    maybe_ack(r)


def _note_leader_start(r: RaftState, m: Message) -> None:
    if m.log_start > r.leader_log_start:
        r.leader_log_start = m.log_start


def follow_log_start(r: RaftState) -> None:
    """Move the log start up to the leader's, as far as the commit allows: what is below
    the leader's start and at or below our commit is committed, so gone from its log too."""
    start = min(r.leader_log_start, r.commit + 1)
    if start > r.log.log_start:
        r.log.set_log_start(start)
        r.log_writes.append(AdvanceStart(start))


def maybe_ack(r: RaftState) -> None:
    """Answer the leader for what is both synced and known to match its log."""
    if not r.ack_due or r.leader is None:
        return
    ackable = min(r.log.flushed_offset, r.leader_match)
    if ackable >= r.ack_pending or ackable > r.ack_sent:
        r.send(Message(MsgType.MsgAppResp, r.leader, r.id, r.term, offset=ackable,
                       log_start=r.log.log_start))
        r.ack_sent = ackable
        if ackable >= r.ack_pending:
            r.ack_due = False
