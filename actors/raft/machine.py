"""The Raft machine of one partition: roles, terms, elections; inputs in, a Ready out.

A pure state machine after etcd-io/raft's RawNode: no sockets, files or clocks inside. Time
is `tick()`, randomness an injected `random.Random`, the network `step(message)` in and
`Ready.messages` out, the disk `Ready.log_writes` out and `flushed(offset, term)` in.

    tick() / step(msg) / propose(n) / flushed(o, t)      has_ready() -> ready() -> advance()
                     |                                               |
                  machine ----------- Ready -------------> orchestrator (the Partition actor):
                                                         persist hard_state, then write the
                                                         log, then send messages

Roles and how they change (every transition goes through one `become_*` that sets it all):

    follower --election timeout--> pre-candidate --quorum of pre-votes--> candidate
        ^  ^                            |                                   |  quorum of
        |  +--------lost / a leader-----+-----------------------------------+  votes
        |                                                                   v
        +---- a higher term; check-quorum failed (no quorum heard) ---- leader

- Elections: a randomized timeout in [election_ticks, 2 * election_ticks); pre-vote first
  (a partitioned node does not inflate terms); check-quorum (a leader that heard from no
  quorum in an election timeout steps down); the leader lease (a follower that heard its
  leader within the election timeout ignores (pre)votes, unless the vote says "leadership
  transfer").
- Persist before send: a term or vote change is in `Ready.hard_state`, and the orchestrator
  syncs it before it sends that Ready's messages. Log writes need not be synced first: an
  append is only ever acknowledged for what `flushed()` reported (follower.py), and the
  leader counts its own log only up to its flushed offset (Raft thesis §10.2.1).
- A new leader appends a no-op (a Kafka LEADER_CHANGE control batch of one record, in its
  term) only when its log ends past its known commit. The commit rule (only onto an entry
  of the current term, figure 8) holds whatever the log holds; the no-op only lets an
  earlier term's uncommitted tail commit without waiting for a proposal. A log that ends at
  its known commit has no such tail: its known commit is then the true one (known <= true
  <= its last, by leader completeness), so the high watermark is right already and the
  first proposal, the first entry of the term, commits the usual way. Offsets need no
  translation either way: the no-op is a batch at the next offset like any other.
- Leadership transfer: the leader refuses proposals, catches the transferee up and sends it
  MsgTimeoutNow; the transferee campaigns at once, without pre-vote, its votes marked
  `transfer` so that followers' leases let them through. Abandoned after an election timeout.
- Quiescence (`Config.quiesce`, after CockroachDB): an idle group stops ticking. A leader
  whose log is committed, synced and matched by every follower, its log start taken by
  each (follower.py), sends, at its next heartbeat,
  one more marked `quiesce` and goes quiet: no heartbeats, no check-quorum. A follower that
  takes it goes quiet too: no election clock, so its lease holds and it refuses others'
  votes. What keeps that safe to leave is outside: the orchestrator hears each peer's host
  (node liveness) and calls `wake(lost_touch=True)` when a quiet follower's leader, or a
  quorum of a quiet leader's followers, went silent for an election timeout; the follower
  then campaigns after the rest of a randomized timeout, the leader gets one timeout to hear
  from a quorum before check-quorum steps it down. A proposal, a transfer or any message
  that asks for work wakes a group (a vote from the follower's own leader: that leader lost
  its lead, so the lease is over). Waking changes timers only: no safety rule depends on it.
- A log write the orchestrator could not make (`log_write_failed(last)`: a disk error, or
  batches that do not continue its log) stays inside the contract: the machine forgets what
  it believed past the log's real end (none of it was flushed, so none acknowledged); a
  follower rejects at once with that end as its hint, a leader steps down.
- Static replica sets: no membership changes.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from actors.raft.config import BatchReader, Config
from actors.raft.follower import handle_append, handle_heartbeat, handle_install, maybe_ack
from actors.raft.leader import (
    broadcast_heartbeat,
    leader_acked,
    send_pending_appends,
    step_leader,
)
from actors.raft.log import LogView
from actors.raft.messages import (
    LEADER_CHANGE,
    Append,
    ConfChange,
    HardState,
    LogState,
    LogWrite,
    Message,
    MsgType,
    NodeId,
    Range,
    Ready,
    Role,
    SoftState,
)
from actors.raft.progress import Progress
from actors.raft.quorum import Membership, VoteResult, is_step

__all__ = ["BatchReader", "Config", "RaftMachine", "Status"]

_VOTES = (MsgType.MsgVote, MsgType.MsgPreVote)
_FROM_LEADER = (MsgType.MsgApp, MsgType.MsgHeartbeat, MsgType.MsgSnap)


class Status(NamedTuple):
    id: NodeId
    role: Role
    term: int
    vote: NodeId | None
    leader: NodeId | None
    commit: int
    log_start: int
    last_offset: int
    flushed_offset: int
    transferee: NodeId | None
    progress: dict[NodeId, str]  # leader only: each follower's Progress.describe()


class RaftMachine:
    """One replica's Raft state machine (see the module docstring). Not thread-safe: one
    owner drives it."""

    def __init__(self, config: Config, rng: random.Random, *,
                 hard_state: HardState | None = None, log: LogState | None = None,
                 committed: int = -1, batch_reader: BatchReader | None = None) -> None:
        """A machine restarting from what its orchestrator persisted: `hard_state`, the synced
        `log`, and a commit offset checkpointed lazily (any value up to the true one)."""
        self.config = config
        self.id = config.id
        self.rng = rng
        self.batch_reader = batch_reader
        hard_state = hard_state or HardState(0, None)
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.log = LogView(log, Membership(frozenset(config.peers),
                                           learners=frozenset(config.learners)))
        # Who decides (quorum.py), as the log says; `peers`: every other member, voters
        # first, whom a leader sends the log to.
        self.membership = self.log.membership
        self.peers: tuple[NodeId, ...] = ()
        self._set_peers()
        self.commit = max(min(committed, self.log.last_offset), self.log.log_start - 1)
        self.role = Role.Follower
        self.leader: NodeId | None = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_ticks = config.election_ticks
        self.votes: dict[NodeId, bool] = {}
        self.progress: dict[NodeId, Progress] = {}
        self.transferee: NodeId | None = None
        self.quiesced = False  # idle: ticks do nothing (module docstring)
        # follower: answering appends once flushed (follower.py)
        self.leader_match = self.commit  # the log matches the leader's up to here
        self.ack_pending = -1  # accepted appends up to here want an answer
        self.ack_due = False
        self.ack_sent = -1
        self.leader_log_start = -1  # the highest log start a leader told us (follower.py)
        # output, gathered until ready()
        self.msgs: list[Message] = []
        self.log_writes: list[LogWrite] = []
        self.want_append: dict[NodeId, bool] = {}  # leader: peer -> send even if empty
        self.unwritten_from: int | None = None  # leader: the first offset of this Ready's writes
        # what the last Ready said (compared field by field: has_ready() is called a lot)
        self._prev_term, self._prev_vote = self.term, self.vote
        self._prev_leader: NodeId | None = None
        self._prev_role = Role.Follower
        self._prev_soft_term = self.term  # a leader again in a later term is news too
        self._prev_commit = self.commit
        self._ready_out = False
        self.become_follower(self.term, None)

    # ------------------------------------------------------------------------ inputs

    @property
    def quorum(self) -> int:
        """How many voters make a majority (outside a joint configuration)."""
        return len(self.membership.voters) // 2 + 1

    @property
    def is_voter(self) -> bool:
        return self.membership.is_voter(self.id)

    @property
    def promotable(self) -> bool:
        """Whether this node may stand for election: a voter in the membership in force, or
        in the one committed (a node whose log holds an uncommitted change that makes it a
        learner or removes it must still stand: its log may be the one every other voter
        needs, and its votes are counted by the newer membership all the same; etcd stands
        by the committed one)."""
        return self.is_voter or self.log.membership_at(self.commit).is_voter(self.id)

    def tick(self) -> None:
        """One unit of the orchestrator's clock (none while quiesced)."""
        if self.quiesced:
            return
        self.election_elapsed += 1
        if self.role != Role.Leader:
            if self.election_elapsed >= self.randomized_election_ticks and self.promotable:
                self.election_elapsed = 0
                self.campaign()
            return
        self.heartbeat_elapsed += 1
        if self.election_elapsed >= self.config.election_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self.become_follower(self.term, None)
                return
            self.transferee = None  # a transfer not done within an election timeout failed
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            quiesce = self._idle()
            broadcast_heartbeat(self, quiesce)
            self.quiesced = quiesce

    def wake(self, lost_touch: bool = False) -> None:
        """Tick again (module docstring). `lost_touch`: the orchestrator has heard nothing for
        an election timeout from this follower's leader (its lease is over: it campaigns
        after the rest of its randomized timeout), or from a quorum of this leader's followers
        (check-quorum decides at the end of the next timeout)."""
        if not self.quiesced:
            return
        self.quiesced = False
        if self.role == Role.Leader:
            self.election_elapsed = 0
            self.heartbeat_elapsed = self.config.heartbeat_ticks - 1  # one at the next tick
            if lost_touch:
                for pr in self.progress.values():
                    pr.recent_active = False
        else:
            self.election_elapsed = self.config.election_ticks if lost_touch else 0

    def _idle(self) -> bool:
        """A leader with nothing to do until the next proposal: everything it holds is
        committed and synced, here and on every follower (which has taken its log start, so
        a DeleteRecords waiting on that is answered), each heard from since the last
        check-quorum round (a leader woken because it lost touch stays awake until it hears
        them again, or check-quorum steps it down)."""
        if (not self.config.quiesce or self.transferee is not None or self.msgs
                or self.want_append):
            return False
        last = self.log.last_offset
        start = self.log.log_start
        return (self.commit == last and self.log.flushed_offset == last
                and all(pr.match == last and pr.recent_active and pr.log_start >= start
                        for pr in self.progress.values()))

    def _wakes(self, m: Message) -> bool:
        """Whether `m` ends this quiesced replica's quiet: anything that asks for work. What a
        quiet follower refuses by its lease (another's vote), a repeated quiesce, and answers
        to what a quiet leader sent (nothing new in them) leave it quiet."""
        t = m.type
        if self.role == Role.Leader:
            if t == MsgType.MsgHeartbeatResp or t == MsgType.MsgUnreachable:
                return False
            if t == MsgType.MsgAppResp and not m.reject:
                pr = self.progress.get(m.sender)
                return pr is None or m.offset > pr.match
            return True
        if t == MsgType.MsgHeartbeat:
            return not (m.quiesce and m.sender == self.leader and m.term == self.term)
        if t in _VOTES:
            return m.sender == self.leader
        return t in (MsgType.MsgApp, MsgType.MsgSnap, MsgType.MsgTimeoutNow, MsgType.MsgHup)

    def campaign(self) -> None:
        """MsgHup: start an election (a pre-vote first when configured)."""
        if self.role != Role.Leader and self.promotable:  # a learner never stands
            self.wake()
            self._campaign(pre_vote=self.config.pre_vote, transfer=False)

    def propose(self, records: int, payload: Any = None) -> Range | None:
        """The leader appends a batch of `records` records: its offsets and term, None when
        refused (not the leader, or a leadership transfer is under way). `payload` comes back
        in the Ready's Append (the orchestrator may have written the batch already)."""
        assert records > 0, records
        if self.role != Role.Leader or self.transferee is not None:
            return None
        self.wake()
        return self._append_local(records, payload)

    def propose_membership(self, new: Membership) -> Range | None:
        """The leader appends a membership change (one record, payload `ConfChange`): in
        force from now on, here and on each follower as it appends it (log.py). None when
        refused: not the leader, a transfer under way, a change not yet committed (one at a
        time), no entry of this term committed yet (a new leader's change could otherwise
        be one of two different changes made in two terms on two overlapping majorities:
        the single-server bug Ongaro found), or not one step (`is_step`). A joint
        configuration is left by the leader on its own once it commits; a leader the change
        removes leads until the change that leaves it out commits, then steps down."""
        if (self.role != Role.Leader or self.transferee is not None
                or self.log.last_conf_offset() > self.commit
                or self.log.term_at(self.commit) != self.term  # nothing of its term yet
                or not is_step(self.membership, new)):
            return None
        self.wake()
        return self._append_membership(new)

    def _append_membership(self, new: Membership) -> Range:
        r = self._append_local(1, ConfChange(new))
        self.log.add_conf(r.base, new)
        self._follow_membership()
        return r

    def _follow_membership(self) -> None:
        """Act by the membership the log holds now (a change appended or cut away), and, as
        the leader, on a change that committed: leave a joint configuration, or step down
        from a group whose voters no longer include this node."""
        if self.log.membership is not self.membership:
            self.membership = self.log.membership
            self._set_peers()
            if self.role == Role.Leader:
                cfg = self.config
                for p in self.peers:
                    if p not in self.progress:
                        self.progress[p] = Progress(self.log.last_offset + 1,
                                                    cfg.inflight_messages_max,
                                                    cfg.inflight_bytes_max)
                        self.want_append[p] = True
                for p in [p for p in self.progress if p not in self.peers]:
                    del self.progress[p]
                    self.want_append.pop(p, None)
                if self.transferee is not None and not self.membership.is_voter(
                        self.transferee):
                    self.transferee = None
        if self.role != Role.Leader or self.log.last_conf_offset() > self.commit:
            return
        if self.membership.joint:
            self._append_membership(Membership(self.membership.voters,
                                               learners=self.membership.learners))
        elif not self.is_voter:
            self.become_follower(self.term, None)

    def _set_peers(self) -> None:
        """`peers` from the membership in force: the config's order first (the send order),
        then any other member, voters before learners."""
        m = self.membership
        known = [p for p in self.config.peers + self.config.learners if p in m.members]
        voters = sorted((p for p in m.all_voters if p not in known), key=str)
        learners = sorted((p for p in m.learners if p not in known), key=str)
        self.peers = tuple(p for p in known + voters + learners if p != self.id)

    def transfer_leader(self, to: NodeId) -> None:
        """MsgTransferLeader: hand leadership to `to` (a leader's; others ignore it)."""
        self.step(Message(MsgType.MsgTransferLeader, self.id, to, 0))

    def report_unreachable(self, peer: NodeId) -> None:
        """MsgUnreachable: a send to `peer` failed or its link is too slow to queue on."""
        self.step(Message(MsgType.MsgUnreachable, self.id, peer, 0))

    def set_log_start(self, offset: int) -> None:
        """Retention or DeleteRecords removed every batch below `offset` (only committed
        offsets may go: a follower that needs them gets an install of the new start). A
        leader tells its followers at once, so that they remove them too (follower.py)."""
        assert offset <= self.commit + 1, (offset, self.commit)
        self.log.set_log_start(offset)
        if self.role == Role.Leader:
            self.wake()
            for p in self.peers:
                self.want_append[p] = True
        # An append gathered for the next Ready that names what is gone cannot be sent:
        # withdraw it and probe its follower again (it gets an install if it needs one).
        for m in [m for m in self.msgs
                  if m.type == MsgType.MsgApp and m.ranges and m.ranges[0].base < offset]:
            self.msgs.remove(m)
            pr = self.progress.get(m.to)
            if pr is not None:
                pr.become_probe()
                self.want_append[m.to] = True

    def step(self, m: Message) -> None:
        """Take one message: from a peer (term > 0) or local (term 0)."""
        self._step(m)
        self._follow_membership()

    def _step(self, m: Message) -> None:
        if self.quiesced and self._wakes(m):
            # A vote from a follower's own leader: it no longer leads, the lease is over.
            self.wake(lost_touch=m.type in _VOTES and self.role != Role.Leader)
        if m.term > self.term:
            if m.type in _VOTES and not m.transfer and self._in_lease():
                return  # a leader was heard within the election timeout: it still leads
            if m.type == MsgType.MsgPreVote or (m.type == MsgType.MsgPreVoteResp
                                                and not m.reject):
                pass  # pre-votes are for a term nobody has entered yet
            else:
                self.become_follower(m.term, m.sender if m.type in _FROM_LEADER else None)
        elif 0 < m.term < self.term:
            if m.type in (MsgType.MsgApp, MsgType.MsgHeartbeat):
                # A deposed leader, or one we left behind while partitioned (pre-vote and
                # check-quorum keep us from bumping its term otherwise): tell it our term.
                self.send(Message(MsgType.MsgAppResp, m.sender, self.id, self.term))
            elif m.type == MsgType.MsgPreVote:
                self.send(Message(MsgType.MsgPreVoteResp, m.sender, self.id, self.term,
                                  reject=True))
            return
        t = m.type
        if t in _VOTES:
            self._handle_vote(m)
        elif t == MsgType.MsgHup:
            self.campaign()
        elif self.role == Role.Leader:
            step_leader(self, m)
        elif self.role == Role.Follower:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def flushed(self, offset: int, term: int) -> None:
        """The orchestrator's log is synced up to `offset`, whose batch had `term` when the
        sync began; everything written before the sync began is durable. One sync can cover
        many appends: the follower then answers them all with one message."""
        if not self.log.mark_flushed(offset, term):
            return
        if self.role == Role.Leader:
            leader_acked(self)
            self._follow_membership()
        else:
            maybe_ack(self)

    def log_write_failed(self, last_offset: int) -> None:
        """The orchestrator could not make a log write it was asked (a disk error, or bytes
        that do not continue its log): its log holds this machine's entries up to
        `last_offset` only, every write asked before now made or refused. What lies past it is
        forgotten; none of it was flushed, so none of it was acknowledged. A follower answers
        its leader at once with a rejection whose hint is where its log really ends (the leader
        probes back from its last acknowledged offset); a leader steps down: it may have been
        elected on entries it turns out not to hold."""
        log = self.log
        last_offset = max(last_offset, log.log_start - 1)
        if last_offset >= log.last_offset:
            return
        claimed = log.last_offset
        log.truncate_after(last_offset)
        # Known commit never past the log (handle_append relies on it); what the leader
        # committed comes back with its appends. The orchestrator, told more already, is
        # told nothing until the commit passes that again (ready()).
        self.commit = min(self.commit, last_offset)
        was_leader = self.role == Role.Leader
        if was_leader:
            self.become_follower(self.term, None)
        self._follow_membership()  # (a change may have been cut away)
        if was_leader:
            return
        self.leader_match = min(self.leader_match, last_offset)
        self.ack_pending = min(self.ack_pending, last_offset)
        self.ack_sent = min(self.ack_sent, last_offset)
        if self.leader is not None:
            self.send(Message(MsgType.MsgAppResp, self.leader, self.id, self.term,
                              offset=claimed, log_term=log.last_term, reject=True,
                              hint=last_offset))

    # ------------------------------------------------------------------------ output

    def has_ready(self) -> bool:
        if self.want_append:
            send_pending_appends(self)
        return bool(self.msgs or self.log_writes or self.commit > self._prev_commit
                    or self.term != self._prev_term or self.vote != self._prev_vote
                    or self._soft_changed())

    def _soft_changed(self) -> bool:
        """Who leads, or this node's role, changed since the last Ready; or it leads again
        in a later term (a one-voter group steps down and is elected again between two
        Readies: its orchestrator must learn the new term's leadership)."""
        return (self.leader != self._prev_leader or self.role != self._prev_role
                or (self.role == Role.Leader and self.term != self._prev_soft_term))

    def ready(self) -> Ready:
        """Everything gathered since the last Ready; call `advance()` once it is handled."""
        assert not self._ready_out, "ready() again before advance()"
        if self.want_append:
            send_pending_appends(self)
        hard = soft = None
        if self.term != self._prev_term or self.vote != self._prev_vote:
            hard = HardState(self.term, self.vote)
            self._prev_term, self._prev_vote = self.term, self.vote
        if self._soft_changed():
            soft = SoftState(self.leader, self.role)
            self._prev_leader, self._prev_role = self.leader, self.role
            self._prev_soft_term = self.term
        commit = None
        if self.commit > self._prev_commit:
            commit = self._prev_commit = self.commit
        rd = Ready(soft, hard, tuple(self.log_writes), tuple(self.msgs), commit)
        self.msgs.clear()
        self.log_writes.clear()
        self.unwritten_from = None
        self._ready_out = True
        return rd

    def advance(self) -> None:
        """The last Ready is handled: its hard state synced, its writes issued, its messages
        handed to the transport."""
        assert self._ready_out, "advance() without ready()"
        self._ready_out = False

    def status(self) -> Status:
        return Status(self.id, self.role, self.term, self.vote, self.leader, self.commit,
                      self.log.log_start, self.log.last_offset, self.log.flushed_offset,
                      self.transferee,
                      {p: pr.describe() for p, pr in self.progress.items()})

    def send(self, m: Message) -> None:
        self.msgs.append(m)

    # ------------------------------------------------------------------------ roles

    def _reset(self, term: int) -> None:
        if self.role == Role.Leader:
            # Appends not yet handed out name this log as it is now, which a new leader may
            # truncate before the Ready that carries them: they go, they are a leader's.
            self.msgs = [m for m in self.msgs
                         if m.type not in (MsgType.MsgApp, MsgType.MsgSnap)]
        if term != self.term:
            assert term > self.term, (term, self.term)
            self.term = term
            self.vote = None
        self.leader = None
        self.quiesced = False
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_ticks = self.config.election_ticks + self.rng.randrange(
            self.config.election_ticks)
        self.transferee = None
        self.votes = {}
        self.progress = {}
        self.want_append = {}
        self.leader_match = self.commit
        self.ack_pending = -1
        self.ack_due = False
        self.ack_sent = -1

    def become_follower(self, term: int, leader: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.Follower
        self.leader = leader

    def _become_pre_candidate(self) -> None:
        # No term or vote change: a pre-vote round persists nothing.
        self._reset(self.term)
        self.role = Role.PreCandidate

    def _become_candidate(self) -> None:
        assert self.role != Role.Leader
        self._reset(self.term + 1)
        self.role = Role.Candidate
        self.vote = self.id

    def _become_leader(self) -> None:
        assert self.role == Role.Candidate, self.role
        self._reset(self.term)
        self.role = Role.Leader
        self.leader = self.id
        cfg = self.config
        for p in self.peers:
            self.progress[p] = Progress(self.log.last_offset + 1, cfg.inflight_messages_max,
                                        cfg.inflight_bytes_max)
            self.want_append[p] = True
        if self.log.last_offset > self.commit:
            self._append_local(1, LEADER_CHANGE)  # see the module docstring

    def _append_local(self, records: int, payload: Any) -> Range:
        base = self.log.last_offset + 1
        r = Range(base, base + records - 1, self.term)
        if self.unwritten_from is None:
            self.unwritten_from = base
        self.log.append(r)
        confs = ((base, payload.membership),) if isinstance(payload, ConfChange) else ()
        self.log_writes.append(Append((r,), payload, confs))
        for p in self.peers:
            self.want_append.setdefault(p, False)
        return r

    # ------------------------------------------------------------------------ elections

    def _in_lease(self) -> bool:
        return (self.config.check_quorum and self.leader is not None
                and self.election_elapsed < self.config.election_ticks)

    def _quorum_active(self) -> bool:
        heard = [self.id, *(p for p, pr in self.progress.items() if pr.recent_active)]
        for pr in self.progress.values():
            pr.recent_active = False
        return self.membership.active(heard)

    def _campaign(self, pre_vote: bool, transfer: bool) -> None:
        if pre_vote:
            self._become_pre_candidate()
            vote_type, term = MsgType.MsgPreVote, self.term + 1
        else:
            self._become_candidate()
            vote_type, term = MsgType.MsgVote, self.term
        if self._poll(self.id, True):
            return  # a single voter: already through
        last, last_term = self.log.last_offset, self.log.last_term
        for p in self.peers:
            if self.membership.is_voter(p):  # learners' votes count for nothing
                self.send(Message(vote_type, p, self.id, term, offset=last,
                                  log_term=last_term, transfer=transfer))

    def _poll(self, voter: NodeId, granted: bool) -> bool:
        """Count a vote; True when the election is decided (and acted on)."""
        self.votes.setdefault(voter, granted)
        result = self.membership.vote_result(self.votes)
        if result == VoteResult.WON:
            if self.role == Role.PreCandidate:
                self._campaign(pre_vote=False, transfer=False)
            else:
                self._become_leader()
            return True
        if result == VoteResult.LOST:
            self.become_follower(self.term, None)
            return True
        return False

    def _handle_vote(self, m: Message) -> None:
        pre = m.type == MsgType.MsgPreVote
        can_vote = (self.vote == m.sender or (self.vote is None and self.leader is None)
                    or (pre and m.term > self.term))
        if can_vote and self.log.is_up_to_date(m.offset, m.log_term):
            resp = MsgType.MsgPreVoteResp if pre else MsgType.MsgVoteResp
            self.send(Message(resp, m.sender, self.id, m.term))
            if not pre:
                self.election_elapsed = 0
                self.vote = m.sender
        else:
            resp = MsgType.MsgPreVoteResp if pre else MsgType.MsgVoteResp
            self.send(Message(resp, m.sender, self.id, self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in _FROM_LEADER:
            self.become_follower(m.term, m.sender)  # m.term == self.term: it won this term
            self._step_follower(m)
        elif t == (MsgType.MsgPreVoteResp if self.role == Role.PreCandidate
                   else MsgType.MsgVoteResp):
            self._poll(m.sender, not m.reject)

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MsgType.MsgApp:
            self.election_elapsed = 0
            self.leader = m.sender
            handle_append(self, m)
        elif t == MsgType.MsgHeartbeat:
            self.election_elapsed = 0
            self.leader = m.sender
            handle_heartbeat(self, m)
        elif t == MsgType.MsgSnap:
            self.election_elapsed = 0
            self.leader = m.sender
            handle_install(self, m)
        elif t == MsgType.MsgTimeoutNow and self.promotable:
            # The leader chose us: no pre-vote (we are not coming back from a partition),
            # and the votes say "transfer" so that leases do not stop them.
            self._campaign(pre_vote=False, transfer=True)
