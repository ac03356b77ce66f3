"""A seeded random simulation of 3 to 5 Raft machines, with a checker after every step.

One seed decides everything: the cluster's size and settings, and each step of a chaos phase
(deliver a random message in flight, so in any order, or drop it, or deliver it twice;
handle a Ready; begin or complete a sync; tick (with quiescence in half the seeds: a host
that wakes quiet machines which lost touch); propose; cut links or heal them; crash a
node, losing what it had not synced, and restart it (sometimes with the term before its
log start forgotten); move a log start; transfer the lead; in a third of the seeds, a
failing disk that refuses a Ready's appends now and then).
Then a calm phase (links healed, nodes restarted, nothing lost) in which a leader must be
elected and commit a proposal, and every node learn it, within a bounded number of ticks.

What is checked (`Checker`), after the step that could break it:

- election safety: one leader per term;
- log matching: a batch (offset, term) is created once, and wherever it is found it is the
  same batch after the same predecessor (so the same (offset, term) means the same prefix);
- acknowledged (committed) entries: the first leader to commit an offset fixes its batch;
  any node's commit agrees with it; a new leader holds every acknowledged batch from its log
  start; the acknowledged log is on a quorum of synced logs at all times; and a node's synced
  log never loses an acknowledged batch it held (its coverage never goes down);
- each machine's view of its log is the model log; terms and commits never go back.

`run(seed)` returns a `Result` (or raises `SimFailure` naming the seed); replay a failure
with `python -m tests.raft.sim SEED`.
"""

from __future__ import annotations

import itertools
import random
import sys
from typing import Any, NamedTuple

from actors.raft import Append, Message, Ready, Role
from tests.raft.cluster import Batch, ModelLog, Node, make_config

CHAOS_STEPS = 10000  # random steps per seed before the calm phase
CALM_TICKS_MAX = 300  # ticks of calm in which a leader must commit and every node learn it
CALM_DELIVERY_ROUNDS_MAX = 5000  # message rounds per calm tick before it is called a livelock
# A restart whose log lost the term of the entry before its start (it reads as 0): how often.
P_FORGET_START_TERM = 0.2


class SimFailure(AssertionError):
    pass


class Result(NamedTuple):
    seed: int
    nodes: int
    steps: int
    acked_offset: int  # the acknowledged log's end
    leaders: int  # distinct terms with a leader
    crashes: int
    calm_ticks: int  # ticks the calm phase needed
    quiesced: int  # times a leader went quiet
    woken: int  # times the host woke a quiet machine that lost touch
    disk_errors: int  # Readies whose appends the disk refused


class Checker:
    """The safety properties (module docstring), fed by the simulation as things happen."""

    def __init__(self, nodes: dict[Any, Node]) -> None:
        self.nodes = nodes
        self.quorum = len(nodes) // 2 + 1
        self.leaders: dict[int, Any] = {}  # term -> the node that led it
        self.registry: dict[tuple[int, int], tuple[Any, int, Any]] = {}
        self.acked = ModelLog()  # the acknowledged log, from offset 0
        self.acked_by_base: dict[int, Batch] = {}
        self.coverage: dict[Any, int] = {i: -1 for i in nodes}
        self.terms: dict[Any, int] = {i: 0 for i in nodes}

    @property
    def acked_last(self) -> int:
        return self.acked.last_offset

    def register(self, log: ModelLog, index: int) -> None:
        """The batch at `index` of `log` was just written there."""
        b = log.batches[index]
        pred = ((log.batches[index - 1].base, log.batches[index - 1].term) if index
                else ("start", log.start, log.prev_term))
        seen = self.registry.setdefault((b.base, b.term), (b.ident, b.last, pred))
        assert seen[:2] == (b.ident, b.last), f"two batches at ({b.base}, {b.term}): {b}, {seen}"
        if index and not isinstance(seen[2][0], str) and not isinstance(pred[0], str):
            assert seen[2] == pred, f"batch {b} after {pred}, elsewhere after {seen[2]}"

    def ready(self, n: Node, rd: Ready, commit_before: int) -> None:
        m = n.machine
        assert m.term >= self.terms[n.id], (n.id, m.term, self.terms[n.id])
        self.terms[n.id] = m.term
        if rd.soft_state is not None and rd.soft_state.role == Role.Leader:
            holder = self.leaders.setdefault(m.term, n.id)
            assert holder == n.id, f"term {m.term}: leaders {holder} and {n.id}"
            self._check_complete(n)
        if rd.committed is not None:
            assert rd.committed >= commit_before, (n.id, rd.committed, commit_before)
            self._committed(n, commit_before, rd.committed)

    def _check_complete(self, n: Node) -> None:
        log = n.written
        for b in self.acked.batches:
            if b.base >= log.start:
                assert log.batch_at(b.base) == b, f"leader {n.id} lacks acked {b}: {log.batches}"

    def _committed(self, n: Node, before: int, commit: int) -> None:
        log = n.written
        first = max(before + 1, log.start)
        if first > commit:
            return
        i = log.index_of(first)
        grew = False
        while i < len(log.batches) and log.batches[i].base <= commit:
            b = log.batches[i]
            assert b.last <= commit, f"commit {commit} inside batch {b}"
            if b.base <= self.acked_last:
                assert self.acked_by_base.get(b.base) == b, (
                    f"node {n.id} commits {b}, acknowledged {self.acked_by_base.get(b.base)}")
            else:
                # Only a leader moves the commit first (it may have stepped down since, the
                # Ready telling it comes after): one that led a term of this batch or later.
                assert any(who == n.id and term >= b.term for term, who in self.leaders.items()), (
                    f"node {n.id}, no leader since term {b.term}, commits {b} first")
                self.acked.append(b)
                self.acked_by_base[b.base] = b
                grew = True
            i += 1
        if grew:
            for i in self.nodes:
                self.durable_changed(self.nodes[i])
            self.check_quorum_durable()

    def durable_changed(self, n: Node) -> None:
        cov = self._coverage(n.durable)
        assert cov >= self.coverage[n.id], (
            f"node {n.id} lost acknowledged entries: covered {self.coverage[n.id]}, now {cov}")
        self.coverage[n.id] = cov

    def _coverage(self, log: ModelLog) -> int:
        """How far `log` holds the acknowledged log (entries below its start count as held)."""
        hi = min(log.last_offset, self.acked_last)
        if hi < log.start:
            return log.start - 1
        i = log.index_of(hi)
        while i >= 0:
            b = log.batches[i]
            if self.acked_by_base.get(b.base) == b:
                return b.last
            i -= 1
        return log.start - 1

    def check_quorum_durable(self) -> None:
        held = sum(c >= self.acked_last for c in self.coverage.values())
        assert held >= self.quorum, (
            f"acknowledged up to {self.acked_last}, synced on {held} nodes: {self.coverage}")


class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        rng = self.rng = random.Random(seed)
        n = rng.choice((3, 3, 4, 5))
        kw = dict(election_ticks=rng.choice((5, 10)), heartbeat_ticks=rng.choice((1, 2)),
                  pre_vote=rng.random() < 0.8, check_quorum=rng.random() < 0.8,
                  inflight_messages_max=rng.choice((1, 2, 8, 64)),
                  append_bytes_max=rng.choice((300, 1000, 1 << 20)),
                  quiesce=rng.random() < 0.5)
        self.nodes: dict[Any, Node] = {i: Node(make_config(i, n, **kw), seed=rng.randrange(1 << 30),
                              use_reader=rng.random() < 0.8) for i in range(1, n + 1)}
        self.net: list[Message] = []
        self.cut: set[tuple[int, int]] = set()  # (sender, receiver) links that drop
        self.checker = Checker(self.nodes)
        self.proposals = 0
        self.crashes = 0
        self.quiesced = self.woken = 0
        self.steps = 0
        self.p_drop = rng.choice((0.0, 0.05, 0.2))
        self.p_dup = rng.choice((0.0, 0.05))
        # A failing disk in a third of the seeds: a Ready's appends refused now and then. Its
        # own generator, so the seeds without one run as they did before it.
        self.disk = random.Random(f"disk errors {seed}")
        self.p_disk_error = self.disk.choice((0.0, 0.0, 0.03))
        self.disk_errors = 0
        # The step mix, some of it per seed: a slow disk keeps syncs in flight across
        # truncations, a crashy node loses more of what it wrote.
        weighted = [
            (0.35, self._deliver_one), (0.20, self._ready_one), (0.08, self._flush_begin_one),
            (rng.choice((0.02, 0.08)), self._flush_end_one), (0.19, self._tick_one),
            (0.07, self._propose_one), (0.01, self.partition),
            (rng.choice((0.002, 0.005, 0.01)), self._crash_one), (0.007, self._restart_one),
            (0.004, self._retention_one), (0.004, self._transfer_one)]
        self.actions = [a for _, a in weighted]
        self.cum_weights = list(itertools.accumulate(w for w, _ in weighted))

    # ------------------------------------------------------------------ actions

    def process_ready(self, n: Node) -> None:
        commit_before = n.commit
        rd = n.machine.ready()
        log_before = len(n.written.batches)
        truncated = any(not isinstance(w, Append) for w in rd.log_writes)
        fail = (self.p_disk_error > 0 and any(isinstance(w, Append) for w in rd.log_writes)
                and self.disk.random() < self.p_disk_error)
        self.disk_errors += fail
        msgs = n.handle_ready(rd, fail_appends=fail)
        if rd.log_writes:
            start = 0 if truncated else log_before
            for i in range(start, len(n.written.batches)):
                self.checker.register(n.written, i)
            n.check_view()
        if fail and rd.committed is not None:
            # The host holds its commit to what its log holds (actors/partition.py).
            n.commit = max(commit_before, min(rd.committed, n.written.last_offset))
            rd = rd._replace(committed=n.commit if n.commit > commit_before else None)
        self.checker.ready(n, rd, commit_before)
        self.net.extend(msgs)

    def deliver(self, i: int, duplicate: bool = False) -> None:
        m = self.net[i] if duplicate else self.net.pop(i)
        to = self.nodes[m.to]
        if not to.up or (m.sender, m.to) in self.cut:
            sender = self.nodes[m.sender]
            if sender.up and self.rng.random() < 0.3:
                sender.machine.report_unreachable(m.to)
            return
        to.machine.step(m)

    def flush_end(self, n: Node) -> None:
        n.flush_end()
        self.checker.durable_changed(n)

    def crash(self, n: Node) -> None:
        n.crash()
        self.crashes += 1

    def restart(self, n: Node) -> None:
        if n.durable.start > 0 and self.rng.random() < P_FORGET_START_TERM:
            n.durable.prev_term = 0  # a log start moved by a version that did not keep it
        n.restart()
        self.checker.terms[n.id] = n.machine.term

    def retention(self, n: Node) -> None:
        """Move the log start to a batch boundary at most the commit + 1, as the orchestrator
        does over what its log holds and the commit it was told; on the synced log too, as
        deleting segments does, so only where that one is the written log."""
        m = n.machine
        if m.log_writes or n.flushing:
            return  # (a sync in flight would make an older image durable under the new start)
        commit = n.commit  # as the Readies told it: the machine's may be ahead
        bases = [b.base for b in n.written.batches if b.base <= commit + 1]
        if commit == n.written.last_offset:
            bases.append(commit + 1)
        if not bases:
            return
        offset = self.rng.choice(bases)
        if n.durable.batch_at(offset - 1) not in (None, n.written.batch_at(offset - 1)):
            return  # the synced log is not the written one there yet
        m.set_log_start(offset)
        n.written.set_start(offset)
        n.durable.retain_from(offset)
        n.check_view()
        self.checker.durable_changed(n)

    def partition(self) -> None:
        ids = list(self.nodes)
        self.cut.clear()
        kind = self.rng.random()
        if kind < 0.4:
            return  # healed
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
        n.machine.propose(self.rng.randint(1, 4), f"p{self.proposals}")

    # ------------------------------------------------------------------ phases

    def chaos_step(self) -> None:
        action = self.rng.choices(self.actions, cum_weights=self.cum_weights)[0]
        action()
        self.steps += 1

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

    def _flush_end_one(self) -> None:
        flushing = [n for n in self._up() if n.flushing]
        if flushing:
            self.flush_end(self.rng.choice(flushing))

    def tick(self, n: Node) -> None:
        """One tick, after the host's liveness check a quiesced machine relies on: a quiet
        follower whose leader it cannot hear, or a quiet leader that cannot hear a quorum,
        is woken (`lost_touch`), as shards/raft_host.py does from its peers' keepalives."""
        m = n.machine
        if m.quiesced:
            heard = [p for p in m.peers if self.nodes[p].up and (p, n.id) not in self.cut]
            if (m.leader not in heard if m.role != Role.Leader
                    else 1 + len(heard) < m.quorum):
                m.wake(lost_touch=True)
                self.woken += 1
        quiet = m.quiesced
        m.tick()
        self.quiesced += m.quiesced and not quiet

    def _tick_one(self) -> None:
        self.tick(self.rng.choice(self._up()))

    def _propose_one(self) -> None:
        leaders = self._leaders()
        if leaders:
            self.propose(self.rng.choice(leaders))

    def _crash_one(self) -> None:
        up = self._up()
        if len(up) > 1:
            self.crash(self.rng.choice(up))

    def _restart_one(self) -> None:
        down = [n for n in self.nodes.values() if not n.up]
        if down:
            self.restart(self.rng.choice(down))

    def _retention_one(self) -> None:
        self.retention(self.rng.choice(self._up()))

    def _transfer_one(self) -> None:
        leaders = self._leaders()
        if leaders:
            self.rng.choice(leaders).machine.transfer_leader(self.rng.choice(list(self.nodes)))

    def calm(self) -> int:
        """Heal everything and run in lockstep until a leader commits a new proposal and every
        node knows it; the ticks it took. A proposal a deposed leader took is made again to
        the next one."""
        self.cut.clear()
        for n in self.nodes.values():
            if not n.up:
                self.restart(n)
        ticks = self._commit_in_calm()
        if next(iter(self.nodes.values())).config.quiesce:
            ticks += self._quiet_then_leader_lost()
        return ticks

    def _quiet_then_leader_lost(self) -> int:
        """With quiescence: the idle group goes quiet within a few heartbeats, then sends
        nothing for three election timeouts; its leader crashes, and the followers' hosts,
        hearing nothing from it, wake them: a new leader must commit as before."""
        config = next(iter(self.nodes.values())).config
        quieting = 0
        for _ in range(4 * config.heartbeat_ticks + 4):
            quieting += 1
            for n in self.nodes.values():
                self.tick(n)
            self.settle()
            if all(n.machine.quiesced for n in self.nodes.values()):
                break
        else:
            raise AssertionError("an idle group did not go quiet: "
                                 f"{[n.machine.status() for n in self.nodes.values()]}")
        for _ in range(3 * config.election_ticks):
            for n in self.nodes.values():
                self.tick(n)
            assert not self.net and not any(n.machine.has_ready() for n in self.nodes.values()), (
                f"a quiet group sent {self.net}")
        leader = next(n for n in self.nodes.values() if n.machine.role == Role.Leader)
        self.crash(leader)
        ticks = self._commit_in_calm(skip=leader)
        self.restart(leader)
        return quieting + 3 * config.election_ticks + ticks

    def _commit_in_calm(self, skip: Node | None = None) -> int:
        """Ticks until a leader commits a new proposal and every node up knows it."""
        up = [n for n in self.nodes.values() if n is not skip]
        target: tuple[int, int, str] | None = None  # (base, leader's term, ident)
        for tick in range(CALM_TICKS_MAX):
            for n in up:
                self.tick(n)
            self.settle()
            leaders = [n for n in up if n.machine.role == Role.Leader]
            if leaders:
                leader = max(leaders, key=lambda n: n.machine.term)
                if target is None or target[1] != leader.machine.term:
                    ident = f"calm{tick}"
                    r = leader.machine.propose(1, ident)
                    if r is not None:
                        target = (r.base, r.term, ident)
                        self.settle()
            if target is not None:
                acked = self.checker.acked_by_base.get(target[0])
                if (acked is not None and acked.ident == target[2]
                        and all(n.machine.commit >= target[0] for n in up)):
                    return tick + 1
        raise AssertionError(f"no leader committed within {CALM_TICKS_MAX} calm ticks "
                             f"(target {target}): "
                             f"{[n.machine.status() for n in self.nodes.values()]}")

    def settle(self) -> None:
        for _ in range(CALM_DELIVERY_ROUNDS_MAX):
            moved = False
            for n in self.nodes.values():
                if not n.up:
                    continue
                if n.machine.has_ready():
                    self.process_ready(n)
                    moved = True
                if n.unflushed():
                    n.flush_begin()
                while n.flushing:
                    self.flush_end(n)
                    moved = True
            net, self.net = self.net, []
            for m in net:
                if self.nodes[m.to].up:
                    self.nodes[m.to].machine.step(m)
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
    return Result(seed, len(sim.nodes), sim.steps, sim.checker.acked_last,
                  len(sim.checker.leaders), sim.crashes, calm_ticks, sim.quiesced, sim.woken,
                  sim.disk_errors)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(run(int(arg)))
