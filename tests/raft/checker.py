"""The random simulation's safety checker (tests/raft/sim.py): one per incarnation of the
simulated topic (a Raft group: a topic id), fed as things happen.

What it checks, after the step that could break it:

- election safety: one leader per term of the incarnation;
- log matching: a batch (offset, term) is created once, and wherever it is found it is the
  same batch after the same predecessor (so the same (offset, term) means the same prefix);
- acknowledged (committed) entries: the first leader to commit an offset fixes its batch;
  any node's commit agrees with it; a new leader holds every acknowledged batch from its log
  start; the acknowledged log is on a quorum of synced logs at all times (with membership
  changes: on enough voters that every quorum of the membership in force at the
  acknowledged log's end meets it; until the topic is deleted: then its replicas go, with
  what they held); and a node's synced log never loses
  an acknowledged batch it held (its coverage never goes down);
- incarnations: the acknowledged log holds only batches proposed in this incarnation (a
  replica of a deleted topic must never pass its batches to the topic created again);
- the apply loop (cluster.Applier, the controller's rule): a node applies only acknowledged
  batches, in order; and a node with no cut out has applied everything it was told is
  committed and its log holds (else it stays stale until the next commit: issue 26, item 6);
- each machine's terms never go back.
"""

from __future__ import annotations

from typing import Any

from actors.raft import Membership, Ready, Role
from tests.raft.cluster import Batch, ModelLog, Node, conf_of


def incarnation_of(ident: Any) -> Any:
    """The incarnation a batch was proposed in: the first item of its ident."""
    return ident[0] if isinstance(ident, tuple) else None


class Checker:
    """The safety properties of one incarnation (module docstring). `nodes` holds the
    replicas of this incarnation that exist now (a node that learned of the next one has
    dropped its own)."""

    def __init__(self, incarnation: int, ids: list[Any], initial: Membership,
                 memberships: bool = False) -> None:
        """`initial`: the group's membership before any change; `memberships`: changes may
        be made (the quorum check is then the one their one-step rule guarantees)."""
        self.incarnation = incarnation
        self.deleted = False  # the topic was deleted (and created again)
        self.nodes: dict[Any, Node] = {}
        self.memberships = memberships
        self.membership = initial  # in force at the end of the acknowledged log
        self.quorum = len(initial.voters) // 2 + 1
        self.leaders: dict[int, Any] = {}  # term -> the node that led it
        self.registry: dict[tuple[int, int], tuple[Any, int, Any]] = {}
        self.acked = ModelLog()  # the acknowledged log, from offset 0
        self.acked_by_base: dict[int, Batch] = {}
        self.coverage: dict[Any, int] = {i: -1 for i in ids}
        self.terms: dict[Any, int] = {i: 0 for i in ids}

    @property
    def acked_last(self) -> int:
        return self.acked.last_offset

    def retire(self, node_id: Any) -> None:
        """The node dropped its replica of this incarnation (its topic was deleted)."""
        del self.nodes[node_id]

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
            assert holder == n.id, (f"incarnation {self.incarnation}, term {m.term}: leaders "
                                    f"{holder} and {n.id}")
            self._check_complete(n)
        if rd.committed is not None:
            assert rd.committed >= commit_before, (n.id, rd.committed, commit_before)
            self._committed(n, commit_before, rd.committed)

    def _check_complete(self, n: Node) -> None:
        log = n.view
        for b in self.acked.batches:
            if b.base >= log.start:
                assert log.batch_at(b.base) == b, f"leader {n.id} lacks acked {b}: {log.batches}"

    def _committed(self, n: Node, before: int, commit: int) -> None:
        log = n.view
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
                assert incarnation_of(b.ident) == self.incarnation, (
                    f"incarnation {self.incarnation} acknowledges {b}, a batch of incarnation "
                    f"{incarnation_of(b.ident)} (node {n.id})")
                self.acked.append(b)
                self.acked_by_base[b.base] = b
                if conf_of(b.ident) is not None:
                    self.membership = conf_of(b.ident)
                grew = True
            i += 1
        if grew:
            for node in self.nodes.values():
                self.durable_changed(node)
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
        if self.deleted:
            return
        holders = {i for i, c in self.coverage.items() if c >= self.acked_last}
        if not self.memberships:
            assert len(holders) >= self.quorum, (
                f"acknowledged up to {self.acked_last}, synced on {len(holders)} nodes: "
                f"{self.coverage}")
            return
        # With membership changes an entry may commit by the majority of a change appended
        # after it (the leader's membership is its log's last), one step from the one in
        # force at the acknowledged log's end: every leader to come needs a majority of that
        # one (of each set when joint), so the holders meet every such majority: in some set
        # at least half of its voters hold it.
        m = self.membership
        sets = [m.voters, m.outgoing] if m.joint else [m.voters]
        assert any(2 * len(holders & v) >= len(v) for v in sets), (
            f"acknowledged up to {self.acked_last}, synced on {sorted(holders)}: no quorum "
            f"of {m.describe()} must meet them ({self.coverage})")

    def applied(self, n: Node) -> None:
        """What `n`'s apply loop did since the last look."""
        a = n.applier
        for b in a.fresh:
            assert self.acked_by_base.get(b.base) == b, (
                f"node {n.id} applies {b}, acknowledged {self.acked_by_base.get(b.base)}")
        a.fresh.clear()
        if n.cut is None:
            due = min(a.target, n.written.last_offset)
            assert a.applied >= due, (
                f"node {n.id} applied up to {a.applied}, not {due}: committed {a.target} "
                f"and its log ends at {n.written.last_offset} with no cut out")
