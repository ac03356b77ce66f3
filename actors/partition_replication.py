"""A replicated partition's side of Raft: the `ReplicaHost` a Partition gives its `Replica`.

A partition with more than one replica (a topic's replication factor, DESIGN.md §7) is one
Raft group; its `Partition` actor keeps its log, its ack window and its producer table, and
holds one `Replication` (as it holds a `LogLifecycle`), which owns the group's `Replica`
(actors/replica.py: the pure machine and the I/O it asks for) and answers the partition's
questions about its role:

    leader       takes produces: `before_append`, append in the term's epoch, `proposed`;
                 serves fetches, list offsets, epoch lookups; its high watermark is Raft's
                 commit (the ack window in QUORUM mode: acks=all waits for it, acks=1 for its
                 own flush)
    follower     takes the leader's batches (`appended`: producer state, the ack window's
                 written offset, a flush); refuses clients with NOT_LEADER_OR_FOLLOWER
    any          every flush that returns is reported to the machine with the term of the
                 last batch it covered when it began (`flushed`): a flush whose batches were
                 cut meanwhile acknowledges nothing

The leader keeps the partition's in-sync replicas (actors/isr.py: Kafka's
replica.lag.time.max.ms rule over the machine's progress, and a node known down leaves at
once), checked on every tick, and reports each change as a new version of its leader report
(shards/raft_host.py), which Metadata and the admin API read. min.insync.replicas has Kafka's
meaning on top of Raft: an acks=all produce is refused NOT_ENOUGH_REPLICAS while the in-sync
replicas are fewer, NOT_ENOUGH_REPLICAS_AFTER_APPEND when they become fewer while it waits
(actors/partition_flush.py), and is answered once max(majority, min.insync.replicas) replicas have
flushed it: beyond a majority, the ack window's second offset (`insync_offset`, from the
progress's matches) holds it; the high watermark still moves with the majority.

Stepping down, a leader answers the produces still waiting REQUEST_TIMED_OUT: whether they
commit is the next leader's to decide, and an idempotent producer's retry is answered with its
original offset if they did (producer state is kept on every replica, rebuilt after a cut).

A new leader's high watermark may start behind its predecessor's, so until it has committed
every entry its log held when it was elected (its no-op, or nothing), ListOffsets latest is
answered OFFSET_NOT_AVAILABLE (KIP-207) rather than an offset that goes backwards. Until an
entry of its own term has committed (`settling`) it refuses no write by its producer state
(actors/partition_held.py): a refusal needs a log that no later leader can contradict. A
leader whose election placed no no-op places one when such a write comes.

A group is named by its `GroupKey` (topic, index, topic id) wherever it crosses time or nodes:
Raft messages, ticks, leader reports, and its term and vote in the shard's table. Two
incarnations of one topic name (deleted and created again) never meet: each node's directory
says which incarnation it holds (storage/partition_dir.py), and a replica of one drops the
other's messages (shards/shard_cluster.py). A partition of replication factor 1 on a cluster has no
group: its `LoneLeader` reports its leadership as a group's leader does.

The log start is replicated as Kafka replicates it: the leader's goes with its appends and
heartbeats, and a follower moves its own up to it (`advance_log_start`: through the same
path as DeleteRecords, actors/log_lifecycle.py), so what DeleteRecords or retention removed
on the leader does not come back when a follower leads, and ListOffsets EARLIEST does not go
backwards. DeleteRecords is answered once every follower whose node is heard from has taken
the new start (its answers say where its log starts: Kafka's low watermark), or
REQUEST_TIMED_OUT after `limits.delete_records_replicas_wait_ms`.

Everything here runs on the partition's loop, inside the partition's own message handling or
its Replica's once-a-turn processing.
"""

from __future__ import annotations

import collections
import functools
import logging
import random
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from actors import limits
from actors.controller import CompleteMove
from actors.isr import InSyncReplicas
from actors.partition_messages import DeleteRecordsReply
from actors.raft import Config, LogState, Membership, Message, RaftMachine, Role, SoftState
from actors.recovery_throttle import RecoveryThrottle
from actors.replica import Replica, log_batch_reader
from actors.replica_memberships import recovered
from storage.log import Log
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader

if TYPE_CHECKING:
    from actors.services import Services
    from actors.topic_config import TopicSettings
    from storage import DiskLog

__all__ = ["AckWindowHost", "GroupKey", "LoneLeader", "RaftServices", "Replication",
           "group_name", "legacy_group_name"]

log = logging.getLogger(__name__)

Address = tuple[int, int]  # a replica's home: (node, shard)


class GroupKey(NamedTuple):
    """A Raft group's name wherever it crosses time or nodes: routing, ticks, leader reports.

    A topic deleted and created again under its name is another group: the topic id (a
    UUID fixed at creation) tells the incarnations apart, so a replica of the old one never
    hears or answers the new one's messages (storage/partition_dir.py keeps its directory
    apart). The controller's group is ("", 0, b"")."""

    topic: str
    partition: int
    topic_id: bytes


def group_name(key: GroupKey) -> str:
    """A partition's Raft group in the shard's hard-state table ('/' is in no topic name)."""
    return f"{key.topic}/{key.partition}/{key.topic_id.hex()}"


def legacy_group_name(topic: str, index: int) -> str:
    """The name before topic ids: read only for a directory adopted from then
    (storage/partition_dir.py, ADOPTED)."""
    return f"{topic}/{index}"


class RaftServices:
    """What the shard gives its replicated partitions (implemented in shards/raft_host.py)."""

    address: Address  # this shard's (node, shard)
    election_ticks: int
    heartbeat_ticks: int
    hard_states: Any  # actors.hard_state.HardStateStore

    def send(self, key: GroupKey, messages: list[Message]) -> None: ...
    lost: AbstractSet[Address]  # peers not heard from for an election timeout
    # What leaders send learners (a move's new replicas) is throttled (None: it is not).
    recovery: RecoveryThrottle | None

    def later(self, delay_s: float, fn: Callable[[], None]) -> None: ...

    def register(self, key: GroupKey, tick: Callable[[], None],
                 replicas: tuple[Address, ...] = ()) -> None: ...
    def unregister(self, key: GroupKey) -> None: ...
    def schedule(self, fn: Callable[[], None]) -> None: ...
    def leader_changed(self, key: GroupKey, leader: Address | None, epoch: int,
                       isr: tuple[Address, ...]) -> None:
        """`leader` leads in `epoch`; `isr`: its in-sync replicas when the report is the
        leader's own (a new version each time they change)."""


class LoneLeader:
    """A cluster's partition of replication factor 1: one copy, no Raft group to elect it. It
    leads from its start, at epoch 0 (nothing can depose it), and reports that as a group's
    leader reports its election (shards/raft_host.py), so every shard of every node names it
    in Metadata and coordinators follow it; the shard's periodic refresh repeats the report,
    and a node that starts asks for it."""

    def __init__(self, raft: RaftServices, key: GroupKey,
                 replicas: tuple[Address, ...]) -> None:
        assert replicas == (raft.address,), (key, replicas, raft.address)
        self.raft, self.key, self.replicas = raft, key, replicas

    def start(self) -> None:
        self.raft.leader_changed(self.key, self.raft.address, 0, self.replicas)

    def stop(self) -> None:
        self.raft.unregister(self.key)  # its report is no longer repeated


def log_state(log_: Log, confs: tuple[tuple[int, Membership], ...] = ()) -> LogState:
    """The log as a restarting machine sees it: start, the epoch cache, end, and the
    memberships it holds (actors/replica_memberships.py `recovered`)."""
    before = log_.epoch_before_start
    return LogState(log_.log_start_offset, before or 0,
                    tuple((start, epoch) for epoch, start in log_.epochs()),
                    log_.next_offset - 1, confs)


class ReplicationHost(Protocol):
    """What a Replication needs of its partition (actors/partition.py's Partition): who it is,
    its log and settings, and where to say what Raft decided."""

    topic: str
    index: int
    topic_id: bytes
    services: Services
    settings: TopicSettings

    @property
    def high_watermark(self) -> int: ...
    @property
    def leader_epoch_is_leader(self) -> bool: ...
    def log_or_none(self) -> DiskLog | None: ...
    def now_ms(self) -> int: ...
    def replicated_append(self, last_offset: int, headers: list[BatchHeader],
                          data: bytes | bytearray | memoryview) -> None: ...
    def log_rewritten(self) -> None: ...
    def follow_log_start(self, offset: int) -> None: ...
    def role_changed(self, leading: bool, term: int, was_leading: bool) -> None: ...
    def retry_held(self) -> None: ...


class AckWindowHost(Protocol):
    """What a Replication tells its partition's ack window (actors/partition_flush.py's
    Flushes): Raft's commit, the in-sync replicas' flushes, a cut's end."""

    def written_offset(self) -> int: ...
    def quorum_committed(self, high_watermark: int) -> None: ...
    def insync_moved(self, offset: int | None) -> None: ...
    def in_sync_changed(self, in_sync: int, wanted: int) -> None: ...
    def cut_complete(self) -> None: ...


class Replication:
    def __init__(self, partition: ReplicationHost, replicas: tuple[Address, ...],
                 raft: RaftServices, window: AckWindowHost,
                 voters: tuple[Address, ...] | None = None,
                 target: tuple[Address, ...] | None = None) -> None:
        """`replicas`: every replica (the preferred leader first); `voters`: the group's first
        membership, where its log holds none (the replicas before a move under way);
        `target`: that move's target (module docstring, moves)."""
        self.partition = partition
        self.window = window
        self.replicas = replicas
        self.voters = voters or replicas
        self.target = target
        self._move_asked = -1  # the tick a CompleteMove was last asked for
        # Appends to learners waiting for the recovery throttle, per learner, in order.
        self._throttled: dict[Any, collections.deque[Message]] = {}
        self._throttle_timer = False  # a `_send_throttled` is scheduled
        self.raft = raft
        self.key = GroupKey(partition.topic, partition.index, partition.topic_id)
        self.group = group_name(self.key)
        self.replica: Replica | None = None
        self._ready_at = 0  # a leader's log end when elected (KIP-207, module docstring)
        self._settled_term = -1  # the last term in which this leader committed an entry
        self._commit_target = 0  # the high watermark Raft gave, maybe past what is written
        self._ticks = 0
        # DeleteRecords waiting for the followers' log starts: (offset, deadline ms, reply).
        self._start_waiters: list[tuple[int, int, DeleteRecordsReply]] = []
        self.isr: InSyncReplicas[Address] | None = None  # while leading (module docstring)

    # Lifecycle ----------------------------------------------------------------------------

    def start(self, log_: Log, adopted: bool = False) -> None:
        """`adopted`: the log's directory was made before topic ids, so its term and vote
        may be under the group's name from then."""
        raft = self.raft
        learner = () if raft.address in self.voters else (raft.address,)
        config = Config(raft.address, self.voters, election_ticks=raft.election_ticks,
                        heartbeat_ticks=raft.heartbeat_ticks, quiesce=True, learners=learner)
        hard_state = raft.hard_states.get(self.group)
        if hard_state is None and adopted:
            hard_state = raft.hard_states.get(legacy_group_name(self.key.topic, self.key.partition))
        confs, exact = recovered(log_)
        machine = RaftMachine(
            config, random.Random(), hard_state=hard_state,
            log=log_state(log_, confs), committed=log_.log_start_offset - 1,
            batch_reader=log_batch_reader(log_))
        self.replica = Replica(self.group, machine, self, raft.hard_states, raft.schedule,
                               confs_saved=exact)
        raft.register(self.key, self.tick, self.replicas)
        if self.replicas[0] == raft.address and not learner:
            # The preferred leader (placement spreads them over nodes and shards) asks for
            # votes at once: a new topic has its leaders where placement put them, without
            # waiting out a timeout. Where a leader is already heard (a restart), the others'
            # lease refuses the pre-vote and nothing changes.
            self.replica.campaign()

    def stop(self) -> None:
        """The partition stops (a shard stopping: hand leadership over if we lead)."""
        self.raft.unregister(self.key)
        if self.replica is not None:
            self.replica.close()
        self._answer_start_waiters()

    def forget(self) -> None:
        """The topic was deleted: its term and vote go from the shard's table."""
        self.raft.hard_states.forget(self.group, lambda _error: None)

    # Inputs from the shard ------------------------------------------------------------------

    def tick(self) -> None:
        replica = self.replica
        if replica is None or replica.closed:
            return
        replica.tick(self.raft.lost)
        if self._settled_term != self.machine.term and self.is_leader():
            # Writes held while settling look again: a transfer that kept the no-op out
            # may have been given up, leaving nothing else to wake them.
            self.partition.retry_held()
        self._answer_start_waiters()
        self._observe_isr()
        if self.target is not None:
            self._move()
        self._ticks += 1
        if self._ticks % (self.raft.election_ticks * limits.preferred_leader_check_timeouts) == 0:
            self._hand_back()

    def _hand_back(self) -> None:
        """A leader that is not its partition's preferred replica hands leadership back to it
        once it has everything (Kafka's auto.leader.rebalance.enable): placement spread the
        preferred leaders over nodes and shards, and elections after a restart or a failover
        gather them on the nodes that stayed up."""
        machine = self.machine
        preferred = self.replicas[0]
        if (machine.role != Role.Leader or preferred == self.raft.address
                or not machine.membership.is_voter(preferred)):
            return
        progress = machine.progress.get(preferred)
        if (progress is not None and progress.recent_active and machine.transferee is None
                and progress.match == machine.log.last_offset):
            assert self.replica is not None
            self.replica.transfer_leadership(preferred)

    def receive(self, messages: list[Message]) -> None:
        replica = self.replica
        if replica is None or replica.closed:
            return
        for m in messages:
            replica.receive(m)
        self._answer_start_waiters()
        self._flushes_moved()

    def unreachable(self, peer: Address) -> None:
        if self.replica is not None and not self.replica.closed:
            self.replica.unreachable(peer)

    def transfer_leadership(self) -> bool:
        """Hand leadership to the most caught-up follower (a clean shutdown); False if this
        replica does not lead or there is nobody to hand it to."""
        replica = self.replica
        if replica is None or replica.machine.role != Role.Leader:
            return False
        progress = replica.machine.progress
        peers = [peer for peer in progress if peer != self.raft.address]
        if not peers:
            return False
        replica.transfer_leadership(max(peers, key=lambda peer: progress[peer].match))
        return True

    # Moves (actors/cluster/moves.py) -----------------------------------------------------------

    def reassign(self, replicas: tuple[Address, ...],
                 target: tuple[Address, ...] | None) -> None:
        """The controller moved the replicas (a move began, was redirected or completed)."""
        self.replicas, self.target = replicas, target
        self._move_asked = -1
        if self.isr is not None and self.raft.address in replicas:
            # Replicas the move adds start out of sync: in once they have caught up.
            old = set(self.isr.replicas)
            self.isr = self._new_isr(self.raft.lost | {r for r in replicas if r not in old})
            self.raft.leader_changed(self.key, self.raft.address, self.machine.term,
                                     self.isr.isr)
            self.window.in_sync_changed(len(self.isr.isr),
                                        self.partition.settings.min_insync_replicas)
        if self.target is not None:
            self._move()

    def _new_isr(self, down: AbstractSet[Address]) -> InSyncReplicas[Address]:
        """This leader's in-sync replicas from now, `down` out until they catch up."""
        p = self.partition
        return InSyncReplicas(self.raft.address, self.replicas,
                              p.services.settings.replica_lag_time_max_ms, p.now_ms(),
                              self.machine.log.last_offset, down)

    def _move(self) -> None:
        """A leader takes its group one step toward the move's target, each step once the one
        before it has committed (the first once an entry of its term has: a no-op if need
        be): the target's new replicas join as learners; once they have
        caught up the voters become the target's (a joint configuration when more than one
        changes, which the machine leaves by itself); learners the target does not hold
        leave. When the committed membership is the target's alone, the controller is told
        (CompleteMove), again every `limits.move_complete_retry_timeouts` election timeouts
        until its table says the move is done."""
        replica = self.replica
        if replica is None or replica.closed or self.target is None:
            return
        machine = replica.machine
        if machine.role != Role.Leader or machine.log.last_conf_offset() > machine.commit:
            return
        if machine.log.term_at(machine.commit) != machine.term:
            # A change waits for an entry of the leader's term to commit (Raft's rule): an
            # idle partition gets a no-op for it, as a settling leader does.
            if machine.log.last_run()[1] != machine.term:
                replica.propose_no_op()
            return
        m = machine.membership
        if m.joint:
            return  # the leader leaves it on its own once it commits
        target = frozenset(self.target)
        joining = target - m.voters
        if not joining <= m.learners or m.learners - target:
            replica.propose_membership(Membership(m.voters, learners=joining))
            return
        if m.voters != target:
            if all(self._caught_up(p) for p in joining):
                outgoing = m.voters if len(m.voters ^ target) > 1 else frozenset()
                replica.propose_membership(Membership(target, outgoing))
            return
        retry = self.raft.election_ticks * limits.move_complete_retry_timeouts
        if self._move_asked < 0 or self._ticks - self._move_asked >= retry:
            self._move_asked = self._ticks
            self._ask_complete()

    def _caught_up(self, peer: Address) -> bool:
        """Whether a learner has the leader's log up to its commit and its node is heard
        from (the host's liveness: an idle group's own stops with quiescence)."""
        machine = self.machine
        progress = machine.progress.get(peer)
        return (progress is not None and peer not in self.raft.lost
                and progress.match >= machine.commit)

    def _ask_complete(self) -> None:
        target = self.target
        assert target is not None
        p = self.partition
        log.info("%s: members are the move's target %s: completing it", p,
                 [node for node, _ in target])

        def answered(error: Any) -> None:
            if error != ErrorCode.NONE:
                log.info("%s: completing the move: %s", p, getattr(error, "name", error))

        p.services.controller().tell(CompleteMove(p.topic, p.topic_id, p.index, target,
                                                  answered))

    # Questions the partition asks --------------------------------------------------------------

    @property
    def machine(self) -> RaftMachine:
        assert self.replica is not None
        return self.replica.machine

    def is_leader(self) -> bool:
        return self.replica is not None and self.machine.role == Role.Leader

    def refuse_append(self) -> ErrorCode | None:
        """Why this replica may not take a produce now, or None. Writes the machine already
        placed in the log first (a new leader's no-op), so the produce takes the next offset."""
        replica = self.replica
        if replica is None or replica.closed:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        replica.before_append()
        machine = replica.machine
        if machine.role != Role.Leader or machine.transferee is not None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        log_ = self.partition.log_or_none()
        if log_ is None or log_.cut_pending:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None

    def proposed(self, base_offset: int, records: int, data: memoryview) -> None:
        """The leader appended `records` offsets from `base_offset` (refuse_append said yes
        in this same turn, so the machine takes them); `data` holds their batches."""
        assert self.replica is not None
        proposed = self.replica.propose(records, bytes(data))
        assert proposed is not None and proposed.base == base_offset, (proposed, base_offset)

    def writes_waiting(self) -> bool:
        """Whether the log does not end where Raft's does yet (writes behind a cut or the
        memberships file): a leader's produces wait, held, until `writes_resumed`."""
        return self.replica is not None and self.replica.writes_waiting

    def change_membership(self, new: Membership) -> bool:
        """The leader appends a membership change (Raft's rules: actors/raft/machine.py
        `propose_membership`); whether it did."""
        replica = self.replica
        return replica is not None and not replica.closed and replica.propose_membership(new)

    def leader_ready(self) -> bool:
        """Whether this leader's high watermark has caught up with its election (KIP-207)."""
        return self.partition.high_watermark >= self._ready_at

    def settling(self) -> bool:
        """Whether this replica leads and has yet to commit an entry of its term, so that a
        write its producer state refuses waits (actors/partition_held.py says why). Asked
        then only: a leader whose election placed no no-op (its log ended at its known
        commit: actors/raft/machine.py) places one now, so that the write need not wait for
        another; the usual first write is taken at once and is itself that entry."""
        if not self.is_leader():
            return False
        machine = self.machine
        if self._settled_term == machine.term or machine.term <= 1:
            return False  # (in term 1 nobody led before: no replica holds what it lacks)
        start, term = machine.log.last_run()
        if term != machine.term:
            assert self.replica is not None
            if not self.replica.propose_no_op():
                return True  # a transfer under way; if given up, a tick looks again
            start = machine.log.last_run()[0]
        if self.partition.high_watermark <= start:
            return True
        self._settled_term = machine.term
        return False

    def flushed(self, offset: int, term: int | None) -> None:
        if term is not None and self.replica is not None and not self.replica.closed:
            self.replica.flushed(offset, term)
            if self.insync_offset() is not None:
                # Once the flush's own step is carried out (Partition._flush_done): a step
                # from here could start the next flush before that one does.
                self.raft.schedule(self._flushes_moved)

    def log_start_moved(self, offset: int) -> None:
        """Retention or DeleteRecords moved the log start (below the high watermark, so
        committed)."""
        if self.replica is None:
            return
        machine = self.machine
        if offset <= machine.commit + 1 and offset > machine.log.log_start:
            machine.set_log_start(offset)

    def answer_when_replicas_start_at(self, offset: int, reply: DeleteRecordsReply) -> None:
        """DeleteRecords moved this leader's log start to `offset`: answer once every live
        follower's has followed (module docstring)."""
        deadline = self.partition.now_ms() + limits.delete_records_replicas_wait_ms
        self._start_waiters.append((offset, deadline, reply))
        self._answer_start_waiters()

    def _answer_start_waiters(self) -> None:
        if not self._start_waiters:
            return
        replica = self.replica
        if replica is None or replica.closed or replica.machine.role != Role.Leader:
            waiters, self._start_waiters = self._start_waiters, []
            for _offset, _deadline, reply in waiters:
                reply((ErrorCode.NOT_LEADER_OR_FOLLOWER, -1))
            return
        low = self._low_watermark()
        now = self.partition.now_ms()
        waiting = []
        for offset, deadline, reply in self._start_waiters:
            if low >= offset:
                reply((ErrorCode.NONE, low))
            elif now >= deadline:
                reply((ErrorCode.REQUEST_TIMED_OUT, -1))
            else:
                waiting.append((offset, deadline, reply))
        self._start_waiters = waiting

    def _low_watermark(self) -> int:
        """The lowest log start of this leader and of its followers whose nodes are heard
        from (Kafka's, which counts the replicas on live brokers)."""
        machine = self.machine
        low = machine.log.log_start
        lost = self.raft.lost
        for peer, progress in machine.progress.items():
            if peer not in lost:
                low = min(low, progress.log_start)
        return low

    # The in-sync replicas and min.insync.replicas (module docstring) ------------------------

    def in_sync_replicas(self) -> tuple[Address, ...]:
        """This leader's in-sync replicas, itself first among them in replica order; () when
        it does not lead."""
        return () if self.isr is None else self.isr.isr

    def insync_offset(self) -> int | None:
        """The end offset that the topic's min.insync.replicas replicas have flushed (this
        leader's own flush and its followers' matches), when that is more than Raft's
        majority; None when the majority's commit is all it asks, or this replica does not
        lead."""
        machine = self.machine
        wanted = self.partition.settings.min_insync_replicas
        if machine.role != Role.Leader or wanted <= machine.quorum:
            return None
        flushed = [machine.log.flushed_offset, *(pr.match for pr in machine.progress.values())]
        if wanted > len(flushed):
            return 0  # never: more than there are replicas
        flushed.sort(reverse=True)
        return flushed[wanted - 1] + 1

    def settings_changed(self) -> None:
        """The topic's settings changed (min.insync.replicas among them)."""
        self._flushes_moved()
        if self.isr is not None:
            self.window.in_sync_changed(len(self.isr.isr),
                                       self.partition.settings.min_insync_replicas)

    def _flushes_moved(self) -> None:
        """A follower's answer or this replica's own flush came in: what min.insync.replicas
        replicas have flushed may have moved."""
        if self.replica is not None and not self.replica.closed:
            self.window.insync_moved(self.insync_offset())

    def _observe_isr(self) -> None:
        isr, machine = self.isr, self.machine
        if isr is None or machine.role != Role.Leader:
            return
        matches: dict[Any, int] = {peer: pr.match for peer, pr in machine.progress.items()}
        changed = isr.observe(self.partition.now_ms(), machine.log.last_offset, matches,
                              self.raft.lost)
        if changed is None:
            return
        log.info("%s: in-sync replicas now nodes %s of %s", self.partition,
                 [node for node, _ in changed], [node for node, _ in self.replicas])
        self.raft.leader_changed(self.key, self.raft.address, machine.term, changed)
        self.window.in_sync_changed(len(changed), self.partition.settings.min_insync_replicas)

    def status(self) -> list[Any]:
        """[role, leader node or -1, term, {follower node: matched offset}, quiesced,
        in-sync replica nodes (a leader's; [] elsewhere)] for the admin."""
        if self.replica is None:
            return ["follower", -1, 0, {}, False, []]
        machine = self.machine
        followers = {}
        if machine.role == Role.Leader:
            followers = {str(peer[0]): pr.match  # type: ignore[index]
                         for peer, pr in machine.progress.items() if peer != self.raft.address}
        leader = machine.leader[0] if isinstance(machine.leader, tuple) else -1
        isr = [node for node, _ in self.in_sync_replicas()]
        return [machine.role.name.lower(), leader, machine.term, followers, machine.quiesced,
                isr]

    # ReplicaHost ------------------------------------------------------------------------------

    def replica_log(self) -> Log:
        log_ = self.partition.log_or_none()
        assert log_ is not None
        return log_

    def appended(self, last_offset: int, headers: list[BatchHeader],
                 data: bytes | bytearray | memoryview) -> None:
        self.partition.replicated_append(last_offset, headers, data)
        if self._commit_target > self.window.written_offset():
            return
        if self._commit_target:
            self.window.quorum_committed(self._commit_target)

    def log_rewritten(self) -> None:
        self.partition.log_rewritten()

    def advance_log_start(self, offset: int) -> None:
        self.partition.follow_log_start(offset)

    def cut_complete(self) -> None:
        self.window.cut_complete()

    def writes_resumed(self) -> None:
        self.partition.retry_held()

    def committed(self, high_watermark: int) -> None:
        self._commit_target = max(self._commit_target, high_watermark)
        self.window.quorum_committed(min(high_watermark, self.window.written_offset()))

    def role_changed(self, soft: SoftState, term: int) -> None:
        p = self.partition
        was_leader = p.leader_epoch_is_leader
        leader = soft.leader if isinstance(soft.leader, tuple) else None
        self.isr = None
        if soft.role == Role.Leader:
            log_ = p.log_or_none()
            self._ready_at = log_.next_offset if log_ is not None else 0
            log.info("%s: leader in term %d", p, term)
            self.isr = self._new_isr(self.raft.lost)
        p.role_changed(soft.role == Role.Leader, term, was_leader)
        self.raft.leader_changed(self.key, leader, term, self.in_sync_replicas())
        self._answer_start_waiters()
        self._flushes_moved()

    def send(self, messages: list[Message]) -> None:
        """To the group's peers; an append to a learner (a move's new replica catching up)
        waits in that learner's queue for the shard's recovery throttle
        (actors/recovery_throttle.py)."""
        throttle = self.raft.recovery
        learners = self.machine.membership.learners if self.replica is not None else ()
        if throttle is not None and (learners or self._throttled):
            if any(peer not in learners for peer in self._throttled):
                self._send_throttled()  # a learner promoted: its queue first, in order
            now = []
            for m in messages:
                if m.payload is not None and m.to in learners:
                    queue = self._throttled.setdefault(m.to, collections.deque())
                    base = m.ranges[0].base
                    while queue and queue[-1].ranges[0].base >= base:
                        queue.pop()  # sent again from `base`: the queued copies are stale
                    queue.append(m)
                else:
                    now.append(m)
            messages = now
            self._send_throttled()
        if messages:
            self.raft.send(self.key, messages)

    def _send_throttled(self, timer: bool = False) -> None:
        """Send learners' queued appends as the throttle allows; the rest when it will."""
        if timer:
            self._throttle_timer = False
        throttle, replica = self.raft.recovery, self.replica
        if throttle is None or replica is None or replica.closed \
                or replica.machine.role != Role.Leader:
            self._throttled.clear()
            return
        machine = replica.machine
        learners = machine.membership.learners
        for peer, queue in list(self._throttled.items()):
            progress = machine.progress.get(peer)
            while queue:
                m = queue[0]
                if m.term != machine.term or progress is None \
                        or m.ranges[-1].last <= progress.match:
                    queue.popleft()  # of a past term, a peer gone, or acknowledged already
                    continue
                if peer not in learners:  # a voter now: what it lacks goes at once, in order
                    queue.popleft()
                    self.raft.send(self.key, [m])
                    continue
                wait = throttle.wait(len(m.payload))
                if wait > 0:
                    if not self._throttle_timer:
                        self._throttle_timer = True
                        self.raft.later(wait, functools.partial(self._send_throttled, True))
                    break
                throttle.take(len(m.payload))
                queue.popleft()
                self.raft.send(self.key, [m])
            if not queue:
                del self._throttled[peer]

    def run_io(self, fn: Callable[[], Any],
               done: Callable[[Any, BaseException | None], None]) -> None:
        self.partition.services.run_blocking(fn, done)

    def read_io(self, fn: Callable[[], Any],
                done: Callable[[Any, BaseException | None], None]) -> None:
        self.partition.services.read_blocking(fn, done)

    def now_ms(self) -> int:
        return self.partition.now_ms()

    def leader_change_ids(self) -> tuple[int, list[int]]:
        return self.raft.address[0], [node for node, _ in self.replicas]
