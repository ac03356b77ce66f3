"""A seeded random simulation of 3 to 5 Raft machines, with a checker after every step.

One seed decides everything: the cluster's size and settings, and each step of a chaos phase
(deliver a random message in flight, so in any order, or drop it, or deliver it twice;
handle a Ready; begin a sync, or complete one, or complete a cut; tick (with quiescence in
half the seeds: a host that wakes quiet machines which lost touch); propose; cut links or
heal them; crash a node and restart it; move a log start; transfer the lead; in a third of
the seeds, a failing disk that refuses a Ready's appends now and then; in about half of the
rest, the topic deleted and created again; in half of all seeds, on their own random
stream, membership changes: one node more, a learner at first, and now and then a change
proposed by a leader (a learner promoted, a voter demoted or removed, a learner removed, a
joint change to random voters, a jump straight to them that must be refused), with the
controller stopping, some steps after, the nodes a committed change removed).
Then a calm phase (links healed, nodes restarted, every node on the topic's last
incarnation, nothing lost) in which a leader must be elected and commit a proposal, and
every member learn it and apply it, within a bounded number of ticks (with membership
changes: until the change under way completed, its removed nodes stopped and a member
leads).

The faults, as Krill meets them:

- A crash is a kill -9 or a power loss. A kill -9 keeps every write made (the page cache)
  and loses the process: its machine, the writes waiting behind a cut, what a sync in
  flight would have reported. A power loss keeps what was synced, and may keep a prefix of
  what was written since (or a reset half made). After a kill -9 the node syncs what
  recovery kept before its machine starts (the recovery sync, actors/partition.py); a power
  loss may come first.
- A truncation or a reset (a cut) is made at once, durable when its ticket completes; the
  writes behind it wait for that, and no sync begins meanwhile (actors/replica.py).
- Retention moves a node's log start (its leader's start then reaches the followers with
  its appends: `AdvanceStart`); a log start is kept with the term before it, across
  restarts (storage/log.py).
- Delete and create again: the topic gets a new id (an incarnation: a new Raft group, empty
  logs and hard states). Nodes take the new table when they can hear the others; a node
  down or cut off meanwhile goes on running its replica of the old one, with its old log
  and terms, until it does. Messages are routed by topic and id, and a node drops one for
  another incarnation than its own (shards/shard_cluster.py `raft_receive`).
- Every node applies its committed log with the cluster controller's apply loop
  (cluster.Applier).

What is checked: tests/raft/checker.py, one checker per incarnation (with membership
changes its quorum check is the one their one-step rule guarantees); and, at the end of each
calm stretch, that every member applied exactly its committed log.

The knobs below the limits make the broken variants test_random.py proves the checker
catches (each is what Krill did before an item of issue 26).

`run(seed)` returns a `Result` (or raises `SimFailure` naming the seed); replay a failure
with `python -m tests.raft.sim SEED`.
"""

from __future__ import annotations

import collections
import itertools
import random
import sys
from typing import Any, NamedTuple

from actors.raft import Append, Membership, Message, Role
from tests.raft.checker import Checker
from tests.raft.cluster import Node, make_config

CHAOS_STEPS = 10000  # random steps per seed before the calm phase
CALM_TICKS_MAX = 300  # ticks of calm in which a leader must commit and every node learn it
CALM_DELIVERY_ROUNDS_MAX = 5000  # message rounds per calm tick before it is called a livelock
# Retention that removes everything committed (else up to a random batch), how often; and a
# crash of the node right after a retention, how often (the window issue 26's item 5 was in).
P_RETENTION_TO_COMMIT = 0.3
# With membership changes: how often a chaos step ends with the controller stopping the
# replicas a committed change removed (so some stay up a while, as in a real cluster), and
# how many commit rounds the calm phase gives a change under way to complete.
P_STOP_REMOVED = 0.05
CALM_MEMBERSHIP_ROUNDS_MAX = 3
P_CRASH_AFTER_RETENTION = 0.2

# Broken variants (test_random.py): a restart that lost the term before its log start (a
# log start moved by a version that did not keep it), how often; a kill -9 restart whose
# machine takes what the page cache kept as synced (no recovery sync); messages routed by
# topic name only, whatever the incarnation.
P_START_TERM_LOST = 0.0
RECOVERY_SYNC = True
ROUTE_BY_TOPIC_ID = True


class SimFailure(AssertionError):
    pass


class Result(NamedTuple):
    seed: int
    nodes: int
    steps: int
    acked_offsets: int  # offsets acknowledged, all incarnations together
    leaders: int  # distinct terms with a leader, all incarnations together
    crashes: int  # kill -9s and power losses
    calm_ticks: int  # ticks the calm phase needed
    quiesced: int  # times a leader went quiet
    woken: int  # times the host woke a quiet machine that lost touch
    disk_errors: int  # Readies whose appends the disk refused
    faults: dict[str, int]  # by kind (Sim.faults)


class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        n = rng.choice((3, 3, 4, 5))
        # Membership changes in half the seeds (their own stream: the other seeds' runs are
        # as they were): one more node, a learner at first, and changes proposed now and then.
        self.conf_rng = random.Random(f"membership {seed}")
        self.p_conf = self.conf_rng.choice((0.0, 0.0, 0.002, 0.01))
        learners = 1 if self.p_conf else 0
        self.config = dict(election_ticks=rng.choice((5, 10)), heartbeat_ticks=rng.choice((1, 2)),
                           pre_vote=rng.random() < 0.8, check_quorum=rng.random() < 0.8,
                           inflight_messages_max=rng.choice((1, 2, 8, 64)),
                           append_bytes_max=rng.choice((300, 1000, 1 << 20)),
                           quiesce=rng.random() < 0.5)
        self.ids = list(range(1, n + learners + 1))
        self.learners = learners
        self.use_reader = {i: rng.random() < 0.8 for i in self.ids}
        self.incarnation = 0  # the topic's id now, as the controller has it
        self.initial = make_config(1, len(self.ids), learners=learners)
        self.checkers = {0: self._checker(0)}
        self.removed: set[Any] = set()  # stopped in the calm phase: out of the membership
        self.nodes: dict[Any, Node] = {}  # each node's replica of the topic (its incarnation)
        for i in self.ids:
            self._new_replica(i)
        self.net: list[tuple[int, Message]] = []  # (the sender's incarnation, message)
        self.cut: set[tuple[int, int]] = set()  # (sender, receiver) links that drop
        self.recovering: set[Any] = set()  # down, the recovery sync out
        self.proposals = 0
        self.quiesced = self.woken = 0
        self.steps = 0
        self.faults: collections.Counter[str] = collections.Counter()
        self.p_drop = rng.choice((0.0, 0.05, 0.2))
        self.p_dup = rng.choice((0.0, 0.05))
        self.p_kill = rng.choice((0.25, 0.5, 0.75))  # a crash is a kill -9 (else a power loss)
        # A failing disk in a third of the seeds: a Ready's appends refused now and then.
        self.disk = random.Random(f"disk errors {seed}")
        self.p_disk_error = self.disk.choice((0.0, 0.0, 0.03))
        # Delete and create again in a third of the seeds (not those with a failing disk,
        # nor those with membership changes, whose removed replicas stay stopped).
        recreate = 0.0 if self.p_disk_error else rng.choice((0.0, 0.0003, 0.0008))
        if self.p_conf:
            recreate = 0.0
        # The step mix, some of it per seed: a slow disk keeps syncs and cuts in flight
        # across truncations, a crashy node loses more of what it wrote.
        weighted = [
            (0.35, self._deliver_one), (0.20, self._ready_one), (0.08, self._flush_begin_one),
            (rng.choice((0.02, 0.08)), self._io_end_one), (0.19, self._tick_one),
            (0.07, self._propose_one), (0.01, self.partition),
            (rng.choice((0.002, 0.005, 0.01)), self._crash_one), (0.007, self._restart_one),
            (rng.choice((0.004, 0.02)), self._retention_one), (0.004, self._transfer_one),
            (recreate, self.recreate), (0.02 if recreate else 0.0, self._learn_one),
            (self.p_conf, self._conf_one)]
        self.actions = [a for _, a in weighted]
        self.cum_weights = list(itertools.accumulate(w for w, _ in weighted))

    def _checker(self, incarnation: int) -> Checker:
        return Checker(incarnation, self.ids,
                       Membership(frozenset(self.initial.peers),
                                  learners=frozenset(self.initial.learners)),
                       memberships=bool(self.p_conf))

    @property
    def checker(self) -> Checker:
        """The checker of the topic's incarnation now."""
        return self.checkers[self.incarnation]

    def _new_replica(self, i: Any) -> Node:
        n = Node(make_config(i, len(self.ids), learners=self.learners, **self.config),
                 seed=self.rng.randrange(1 << 30),
                 use_reader=self.use_reader[i], defer_cuts=True, incarnation=self.incarnation)
        self.nodes[i] = n
        self.checkers[self.incarnation].nodes[i] = n
        return n

    # ------------------------------------------------------------------ actions

    def process_ready(self, n: Node) -> None:
        checker = self.checkers[n.incarnation]
        commit_before = n.commit
        rd = n.machine.ready()
        view = n.view
        log_before = len(view.batches)
        truncated = any(not isinstance(w, Append) for w in rd.log_writes)
        fail = (self.p_disk_error > 0 and any(isinstance(w, Append) for w in rd.log_writes)
                and self.disk.random() < self.p_disk_error)
        self.faults["disk_errors"] += fail
        msgs = n.handle_ready(rd, fail_appends=fail)
        if rd.log_writes:
            start = 0 if truncated or n.view is not view else log_before
            for i in range(start, len(n.view.batches)):
                checker.register(n.view, i)
            n.check_view()
        if rd.committed is not None and rd.committed > n.view.last_offset:
            # A write refused (the machine is told after this Ready, or once the cut out is
            # durable): the host holds its commit to what its log holds (actors/partition.py).
            n.commit = max(commit_before, min(rd.committed, n.view.last_offset))
            rd = rd._replace(committed=n.commit if n.commit > commit_before else None)
        checker.ready(n, rd, commit_before)
        checker.applied(n)
        self.net.extend((n.incarnation, m) for m in msgs)

    def deliver(self, i: int, duplicate: bool = False) -> None:
        inc, m = self.net[i] if duplicate else self.net.pop(i)
        to = self.nodes[m.to]
        if not to.up or (m.sender, m.to) in self.cut:
            sender = self.nodes[m.sender]
            if sender.up and self.rng.random() < 0.3 and sender.incarnation == inc:
                sender.machine.report_unreachable(m.to)
            return
        if self._routed(inc, to):
            to.machine.step(m)

    def _routed(self, inc: int, to: Node) -> bool:
        """Whether a message of incarnation `inc` reaches `to`, the replica its node runs."""
        if to.incarnation == inc or not ROUTE_BY_TOPIC_ID:
            return True
        self.faults["dropped_other_incarnation"] += 1
        return False

    def io_end(self, n: Node, kind: str) -> None:
        """A sync, a cut or a recovery sync of `n` completes."""
        checker = self.checkers[n.incarnation]
        if kind == "flush":
            n.flush_end()
        elif kind == "cut":
            n.cut_end()
            self.faults["cuts"] += 1
            checker.applied(n)
        else:
            self.recovering.discard(n.id)
            n.recovery_sync()
            self._start(n)
        checker.durable_changed(n)

    def crash(self, n: Node, kill: bool) -> None:
        """A kill -9 of `n`'s node, or a power loss of it (a node whose recovery sync is out
        too)."""
        if kill:
            assert n.up, n.id
            n.kill()
            self.faults["kills"] += 1
        else:
            self.recovering.discard(n.id)
            left = n.crash(torn=self.rng)
            self.faults["power_losses"] += 1
            if left != "synced":
                self.faults[f"power_losses_{left}"] += 1
            self.checkers[n.incarnation].durable_changed(n)

    def restart(self, n: Node) -> None:
        """Restart `n`'s node: what the page cache kept is synced before the machine starts
        (if anything it holds is not synced yet)."""
        if n.written.start > 0 and P_START_TERM_LOST and self.rng.random() < P_START_TERM_LOST:
            n.written.prev_term = n.durable.prev_term = 0
            self.faults["start_terms_lost"] += 1
        self.faults["restarts"] += 1
        if RECOVERY_SYNC and not n.written.same(n.durable):
            self.recovering.add(n.id)
            self.faults["recovery_syncs"] += 1
        else:
            self._start(n)

    def _start(self, n: Node) -> None:
        n.restart()
        self.checkers[n.incarnation].terms[n.id] = n.machine.term

    def retention(self, n: Node) -> bool:
        """Move the log start to a batch boundary at most the commit + 1, as the orchestrator
        does over what its log holds and the commit it was told (often all of it); on the
        synced log too, as deleting segments does, so only where that one is the written
        log. Whether it moved."""
        m = n.machine
        if m.log_writes or n.flushing or n.cut is not None:
            return False  # (a sync in flight would make an older image durable under the new start)
        commit = n.commit  # as the Readies told it: the machine's may be ahead
        bases = [b.base for b in n.written.batches if b.base <= commit + 1]
        if commit == n.written.last_offset:
            bases.append(commit + 1)
        if not bases:
            return False
        offset = bases[-1] if self.rng.random() < P_RETENTION_TO_COMMIT else self.rng.choice(bases)
        if n.durable.batch_at(offset - 1) not in (None, n.written.batch_at(offset - 1)):
            return False  # the synced log is not the written one there yet
        m.set_log_start(offset)
        n.written.set_start(offset)
        n.durable.retain_from(offset)
        n.check_view()
        self.checkers[n.incarnation].durable_changed(n)
        self.faults["retentions"] += 1
        return True

    def partition(self) -> None:
        ids = list(self.ids)
        self.cut.clear()
        kind = self.rng.random()
        if kind < 0.4:
            return  # healed
        self.faults["partitions"] += 1
        if kind < 0.7:  # one node cut off
            x = self.rng.choice(ids)
            groups = [[x], [i for i in ids if i != x]]
        else:  # a random split
            self.rng.shuffle(ids)
            k = self.rng.randrange(1, len(ids))
            groups = [ids[:k], ids[k:]]
        for a in groups[0]:
            for b in groups[1]:
                self.cut.add((a, b))
                if self.rng.random() < 0.8:  # most cuts both ways
                    self.cut.add((b, a))

    def propose(self, n: Node) -> None:
        self.proposals += 1
        n.machine.propose(self.rng.randint(1, 4), (n.incarnation, f"p{self.proposals}"))

    def recreate(self) -> None:
        """The topic is deleted and created again (a new id) while some node is down or cut
        off: the nodes that hear the others take the new table now, the rest later."""
        if not self.cut and all(n.up for n in self.nodes.values()):
            return
        self.checker.deleted = True
        self.incarnation += 1
        self.checkers[self.incarnation] = self._checker(self.incarnation)
        self.faults["recreations"] += 1
        for i in self.ids:
            self.learn(i)

    def learn(self, i: Any) -> None:
        """Node `i` takes the controller's table, if it is up and hears every other node:
        a replica of an older incarnation is dropped with its log and hard state, and one of
        the topic as it is now starts empty."""
        old = self.nodes[i]
        if (old.incarnation == self.incarnation or not old.up
                or any((j, i) in self.cut for j in self.ids)):
            return
        self.checkers[old.incarnation].retire(i)
        self._new_replica(i)
        self.faults["replicas_replaced"] += 1

    # ------------------------------------------------------------------ phases

    def chaos_step(self) -> None:
        action = self.rng.choices(self.actions, cum_weights=self.cum_weights)[0]
        action()
        self.steps += 1
        if self.p_conf and self.conf_rng.random() < P_STOP_REMOVED:
            self._stop_removed()  # the controller, some time after a removal commits

    def _deliver_one(self) -> None:
        if self.net:
            i = self.rng.randrange(len(self.net))
            if self.rng.random() < self.p_drop:
                self.net.pop(i)
            else:
                self.deliver(i, duplicate=self.rng.random() < self.p_dup)

    def _up(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.up]

    def _leaders(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.up and n.machine.role == Role.Leader]

    def _ready_one(self) -> None:
        ready = [n for n in self._up() if n.machine.has_ready()]
        if ready:
            self.process_ready(self.rng.choice(ready))

    def _flush_begin_one(self) -> None:
        dirty = [n for n in self._up() if n.unflushed()]
        if dirty:
            self.rng.choice(dirty).flush_begin()

    def _io_end_one(self) -> None:
        pending = [(n, "flush") for n in self._up() if n.flushing]
        pending += [(n, "cut") for n in self._up() if n.cut is not None]
        pending += [(self.nodes[i], "recovery") for i in sorted(self.recovering)]
        if pending:
            self.io_end(*self.rng.choice(pending))

    def tick(self, n: Node) -> None:
        """One tick, after the host's liveness check a quiesced machine relies on: a quiet
        follower whose leader it cannot hear, or a quiet leader that cannot hear a quorum,
        is woken (`lost_touch`), as shards/raft_host.py does from its peers' keepalives."""
        m = n.machine
        if m.quiesced:
            heard = [p for p in m.peers if self.nodes[p].up and (p, n.id) not in self.cut]
            if (m.leader not in heard if m.role != Role.Leader
                    else not m.membership.active([n.id, *heard])):
                m.wake(lost_touch=True)
                self.woken += 1
        quiet = m.quiesced
        m.tick()
        self.quiesced += m.quiesced and not quiet

    def _tick_one(self) -> None:
        up = self._up()  # (a controller stopping removed nodes may leave none up)
        if up:
            self.tick(self.rng.choice(up))

    def _propose_one(self) -> None:
        leaders = self._leaders()
        if leaders:
            self.propose(self.rng.choice(leaders))

    def _crash_one(self) -> None:
        up = self._up()
        kill = self.rng.random() < self.p_kill
        candidates = up if kill else up + [self.nodes[i] for i in sorted(self.recovering)]
        if len(up) > 1:
            self.crash(self.rng.choice(candidates), kill)

    def _restart_one(self) -> None:
        down = [n for n in self.nodes.values()
                if not n.up and n.id not in self.recovering and n.id not in self.removed]
        if down:
            self.restart(self.rng.choice(down))

    def _retention_one(self) -> None:
        up = self._up()
        if not up:
            return
        n = self.rng.choice(up)
        if (self.retention(n) and self.rng.random() < P_CRASH_AFTER_RETENTION
                and len(self._up()) > 1):
            self.crash(n, kill=self.rng.random() < self.p_kill)

    def _transfer_one(self) -> None:
        leaders = self._leaders()
        if leaders:
            self.rng.choice(leaders).machine.transfer_leader(self.rng.choice(self.ids))
            self.faults["transfers"] += 1

    def _conf_one(self) -> None:
        """A leader proposes a membership change: a learner promoted, a voter demoted to a
        learner or removed, a learner removed, a joint change to a random set of voters
        (among the nodes not stopped), or a jump straight to one (refused unless it is one
        voter in or out). It may refuse (a change pending, nothing of its term committed).
        A removed node is stopped for good (`_stop_removed`): adding one back is a new
        replica's business (#30)."""
        leaders = self._leaders()
        if not leaders:
            return
        n = self.conf_rng.choice(leaders)
        m = n.machine.membership
        if m.joint:
            return  # the leader leaves it by itself
        rng = self.conf_rng
        ids = [i for i in self.ids if i not in self.removed]
        kind = rng.choice(("promote", "demote", "remove", "drop", "joint", "jump"))
        new = None
        if kind == "promote" and m.learners:
            x = rng.choice(sorted(m.learners))
            new = Membership(m.voters | {x}, learners=m.learners - {x})
        elif kind in ("demote", "remove") and len(m.voters) > 1:
            x = rng.choice(sorted(m.voters))
            learners = m.learners | {x} if kind == "demote" else m.learners
            new = Membership(m.voters - {x}, learners=learners)
        elif kind == "drop" and m.learners:
            new = Membership(m.voters, learners=m.learners - {rng.choice(sorted(m.learners))})
        elif kind in ("joint", "jump"):  # a jump to other voters at once is refused
            voters = frozenset(rng.sample(ids, rng.randint(1, len(ids))))
            if kind == "joint":
                new = Membership(voters, outgoing=m.voters,
                                 learners=m.learners - voters - m.voters)
            else:
                new = Membership(voters, learners=m.learners - voters)
        if new is not None and n.machine.propose_membership(new) is not None:
            self.faults[f"membership_{kind}"] += 1

    def _learn_one(self) -> None:
        self.learn(self.rng.choice(self.ids))

    def calm(self) -> int:
        """Heal everything, restart every node, let every node take the topic as it is now,
        and run in lockstep until a leader commits a new proposal and every node knows it;
        the ticks it took. A proposal a deposed leader took is made again to the next one."""
        self.cut.clear()
        for n in list(self.nodes.values()):
            if not n.up and n.id not in self.recovering and n.id not in self.removed:
                self.restart(n)
        self._end_recoveries()
        for i in self.ids:
            self.learn(i)
        ticks = self._commit_in_calm()
        for _ in range(CALM_MEMBERSHIP_ROUNDS_MAX if self.p_conf else 0):
            # A change under way completes with that commit: its removed nodes stop, and a
            # leader it removed steps down for one among the members, who must commit again.
            self._stop_removed()
            settled = self.checker.membership
            if not settled.joint and all(
                    n.machine.membership == settled and (n.machine.role != Role.Leader
                                                         or settled.is_voter(n.id))
                    for n in self._members()) and any(
                    n.machine.role == Role.Leader for n in self._members()):
                break
            ticks += self._commit_in_calm()
        if self.config["quiesce"]:
            ticks += self._quiet_then_leader_lost()
        return ticks

    def _stop_removed(self) -> None:
        """The controller stops a replica its group no longer has: nodes outside the
        membership the acknowledged log ends with, and outside every member's own, are stopped
        (kill -9) and stay down (in the calm phase once it committed everything; in the
        chaos now and then)."""
        members = set(self.checker.membership.members)
        for i in list(members):  # nor one a change under way on a member adds back
            members |= self.nodes[i].machine.membership.members
        for n in list(self.nodes.values()):
            if n.id not in members and n.id not in self.removed:
                if n.up:
                    n.kill()
                self.recovering.discard(n.id)
                self.removed.add(n.id)
                self.faults["replicas_removed"] += 1

    def _members(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.id not in self.removed]

    def _end_recoveries(self) -> None:
        for i in sorted(self.recovering):
            self.io_end(self.nodes[i], "recovery")

    def _quiet_then_leader_lost(self) -> int:
        """With quiescence: the idle group goes quiet within a few heartbeats, then sends
        nothing for three election timeouts; its leader crashes, and the followers' hosts,
        hearing nothing from it, wake them: a new leader must commit as before."""
        config = next(iter(self.nodes.values())).config
        quieting = 0
        for _ in range(4 * config.heartbeat_ticks + 4):
            quieting += 1
            for n in self._members():
                self.tick(n)
            self.settle()
            if all(n.machine.quiesced for n in self._members()):
                break
        else:
            raise AssertionError("an idle group did not go quiet: "
                                 f"{[n.machine.status() for n in self.nodes.values()]}")
        for _ in range(3 * config.election_ticks):
            for n in self._members():
                self.tick(n)
            assert not self.net and not any(n.machine.has_ready() for n in self._members()), (
                f"a quiet group sent {self.net}")
        leader = next(n for n in self._members() if n.machine.role == Role.Leader)
        if len(leader.machine.membership.voters) < 3:  # (membership changes left it so)
            return quieting + 3 * config.election_ticks  # no majority without the leader
        self.crash(leader, kill=self.rng.random() < self.p_kill)
        ticks = self._commit_in_calm(skip=leader)
        self.restart(leader)
        self._end_recoveries()
        return quieting + 3 * config.election_ticks + ticks

    def _commit_in_calm(self, skip: Node | None = None) -> int:
        """Ticks until a leader commits a new proposal and every node up knows it and has
        applied its whole committed log."""
        up = [n for n in self._members() if n is not skip]
        target: tuple[int, int, Any] | None = None  # (base, leader's term, ident)
        for tick in range(CALM_TICKS_MAX):
            for n in up:
                self.tick(n)
            self.settle()
            leaders = [n for n in up if n.machine.role == Role.Leader]
            if leaders:
                leader = max(leaders, key=lambda n: n.machine.term)
                if target is None or target[1] != leader.machine.term:
                    ident = (self.incarnation, f"calm{tick}")
                    r = leader.machine.propose(1, ident)
                    if r is not None:
                        target = (r.base, r.term, ident)
                        self.settle()
            if target is not None:
                acked = self.checker.acked_by_base.get(target[0])
                members = self.checker.membership.members  # the others get nothing more
                knowing = [n for n in up if n.id in members]
                if (acked is not None and acked.ident == target[2]
                        and all(n.machine.commit >= target[0] for n in knowing)):
                    for n in knowing:
                        assert n.applier.applied == n.machine.commit, (
                            f"calm: node {n.id} applied up to {n.applier.applied}, its "
                            f"commit is {n.machine.commit}")
                    return tick + 1
        raise AssertionError(f"no leader committed within {CALM_TICKS_MAX} calm ticks "
                             f"(target {target}): "
                             f"{[n.machine.status() for n in self.nodes.values()]}")

    def settle(self) -> None:
        for _ in range(CALM_DELIVERY_ROUNDS_MAX):
            moved = False
            for n in self.nodes.values():
                if not n.up or n.id in self.removed:
                    continue
                if n.machine.has_ready():
                    self.process_ready(n)
                    moved = True
                if n.unflushed():
                    n.flush_begin()
                while n.flushing:
                    self.io_end(n, "flush")
                    moved = True
                if n.cut is not None:
                    self.io_end(n, "cut")
                    moved = True
            net, self.net = self.net, []
            for inc, m in net:
                to = self.nodes[m.to]
                if to.up and to.id not in self.removed and self._routed(inc, to):
                    to.machine.step(m)
                moved = True
            if not moved:
                return
        raise AssertionError("calm phase: messages never settle")


def run(seed: int, chaos_steps: int = CHAOS_STEPS) -> Result:
    sim = Sim(seed)
    try:
        for _ in range(chaos_steps):
            sim.chaos_step()
        calm_ticks = sim.calm()
    except AssertionError as e:
        raise SimFailure(f"seed {seed} at step {sim.steps}: {e}") from e
    checkers = sim.checkers.values()
    faults = sim.faults
    return Result(seed, len(sim.nodes), sim.steps, sum(c.acked_last + 1 for c in checkers),
                  sum(len(c.leaders) for c in checkers),
                  faults["kills"] + faults["power_losses"], calm_ticks, sim.quiesced,
                  sim.woken, faults["disk_errors"], dict(sorted(faults.items())))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(run(int(arg)))
