"""The seeded random simulation (tests/raft/sim.py): a few hundred seeds, each a cluster of
3 to 5 machines through drops, duplicates, reordering, partitions, kill -9s and power losses,
retention, cuts that writes wait behind, quiescence, refused log writes and a topic deleted
and created again, then a calm phase that must elect a leader, commit and apply. A failure
names its seed; replay it with `python -m tests.raft.sim SEED`. bench/raft.py runs thousands.

Each broken variant below is what Krill did before an item of issue 26 (or a machine bug, or
a membership rule broken): the checker must catch it within a bounded number of seeds."""

from __future__ import annotations

import collections
import re
from typing import Any

import pytest

from tests.raft import cluster, sim

SEEDS = 480  # a few hundred keep `make test` short; bench/raft.py (raft_seeds) runs thousands
SEEDS_PER_TEST = 40
# The seeds a broken variant may take to be caught (most are caught in a few).
CAUGHT_WITHIN_SEEDS = 200


@pytest.mark.timeout(90)
@pytest.mark.parametrize("first", range(0, SEEDS, SEEDS_PER_TEST))
def test_random_seeds(first: int) -> None:
    results = [sim.run(seed) for seed in range(first, first + SEEDS_PER_TEST)]
    # The chaos must have done something: elections and commits, crashes.
    assert sum(r.leaders for r in results) > 2 * len(results)
    assert sum(r.acked_offsets > 0 for r in results) > len(results) // 2
    assert sum(r.crashes for r in results) > len(results)
    # Quiescence (half the seeds): groups went quiet, and hosts woke quiet ones that lost
    # touch with their leader or quorum, and still every calm phase committed.
    assert sum(r.quiesced > 0 for r in results) > len(results) // 5
    assert sum(r.woken for r in results) > 0
    assert sum(r.disk_errors for r in results) > 0  # and through refused log writes
    # Each fault kind of issue 26 happened: both kinds of crash, restarts that synced what
    # the page cache kept, power losses that kept part of the unsynced tail, cuts that
    # writes waited behind, retention, and topics deleted and created again while a node
    # ran its old replica (its messages dropped by the others).
    faults = sum((collections.Counter(r.faults) for r in results), collections.Counter())
    for kind in ("kills", "power_losses", "recovery_syncs", "power_losses_tail", "cuts",
                 "retentions", "recreations", "replicas_replaced", "dropped_other_incarnation"):
        assert faults[kind] > 0, (kind, faults)
    # And membership changes (half the seeds): promotions, removals, joint changes.
    assert sum(v for k, v in faults.items() if k.startswith("membership_")) > 0, faults


def test_a_seed_replays_the_same_run() -> None:
    assert sim.run(7) == sim.run(7)


def _caught(pattern: str, seeds: int = CAUGHT_WITHIN_SEEDS) -> str:
    """The first failure, within `seeds` seeds, whose message matches `pattern` (the check
    meant to catch it, not any assertion)."""
    for seed in range(seeds):
        try:
            sim.run(seed)
        except sim.SimFailure as e:
            if re.search(pattern, str(e)):
                return str(e)
    raise AssertionError(f"no seed of {seeds} caught /{pattern}/")


@pytest.mark.timeout(120)
def test_a_safety_bug_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker is not blind: followers that answer before their sync lose acknowledged
    entries in a crash, and some seed shows it."""
    from actors.raft import follower

    def ack_unsynced(r: Any) -> None:
        if r.ack_due and r.leader is not None:
            r.send(follower.Message(follower.MsgType.MsgAppResp, r.leader, r.id, r.term,
                                    offset=r.leader_match))
            r.ack_due = False

    monkeypatch.setattr(follower, "maybe_ack", ack_unsynced)
    _caught("acknowledged up to .* synced on|lost acknowledged|lacks acked")


@pytest.mark.timeout(120)
def test_a_restart_that_takes_the_page_cache_as_synced_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26, item 4: a node restarted after kill -9 whose machine takes what recovery
    kept from the page cache as synced acknowledges it before any sync, and a power loss
    then loses it: the acknowledged log is not on a quorum of synced logs."""
    monkeypatch.setattr(sim, "RECOVERY_SYNC", False)
    _caught("acknowledged up to .* synced on")


@pytest.mark.timeout(180)
def test_a_lost_term_before_the_log_start_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26, item 5: a log whose start retention moved, restarted without the term
    before its start (read as 0). Emptied by retention, it votes for any candidate: one
    that lacks acknowledged entries is elected. It takes a leader down or cut off, a stale
    node and the emptied one's vote (about 1 seed in 300 of the usual mix): retention here
    always removes all that is committed and is followed by a crash half the time (about 1
    seed in 40)."""
    monkeypatch.setattr(sim, "P_START_TERM_LOST", 1.0)
    monkeypatch.setattr(sim, "P_RETENTION_TO_COMMIT", 1.0)
    monkeypatch.setattr(sim, "P_CRASH_AFTER_RETENTION", 0.5)
    _caught("lacks acked", seeds=2 * CAUGHT_WITHIN_SEEDS)


@pytest.mark.timeout(120)
def test_routing_by_topic_name_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26, item 2: with messages routed by (topic, partition) alone, a node still
    running its replica of the deleted topic reaches the new one's replicas: the new
    incarnation acknowledges a batch of the old."""
    monkeypatch.setattr(sim, "ROUTE_BY_TOPIC_ID", False)
    _caught(r"incarnation \d+ acknowledges .* a batch of incarnation")


@pytest.mark.timeout(120)
def test_no_apply_after_a_cut_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26, item 6: an apply loop that applies only when a commit is reported leaves
    the entries that came with a cut (or after a refused write) unapplied until the next
    commit, which an idle cluster never makes."""
    monkeypatch.setattr(cluster.Applier, "reapply_on_write", False)
    _caught("applied up to")


def _break_membership(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    from actors.raft import log as raft_log
    from actors.raft import machine, quorum

    if variant == "any_step":  # other voters at once, without a joint configuration
        monkeypatch.setattr(machine, "is_step",
                            lambda old, new: new != old and not new.joint and not old.joint)
    elif variant == "no_pending":  # a second change before the first commits
        def propose(self: Any, new: Any) -> Any:
            if self.role != machine.Role.Leader or not quorum.is_step(self.membership, new):
                return None
            return self._append_membership(new)
        monkeypatch.setattr(machine.RaftMachine, "propose_membership", propose)
    elif variant == "learners_count":  # a learner's match counts for a commit
        monkeypatch.setattr(quorum.Membership, "committed",
                            lambda self, match: quorum.majority_offset(self.members, match))
    elif variant == "no_revert":  # a truncation keeps the changes it cut away
        truncate = raft_log.LogView.truncate_after

        def keep_confs(self: Any, offset: int) -> None:
            confs = list(self._conf_offsets), list(self._confs)
            truncate(self, offset)
            self._conf_offsets, self._confs = confs
        monkeypatch.setattr(raft_log.LogView, "truncate_after", keep_confs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant, pattern", [
    ("any_step", "no quorum of|lacks acked|leaders"),
    ("no_pending", "no quorum of|lacks acked|leaders"),
    ("learners_count", "no quorum of|lacks acked"),
    ("no_revert", "LogState"),  # the machine's memberships are not its log's
])
def test_membership_bugs_are_caught(monkeypatch: pytest.MonkeyPatch, variant: str,
                                    pattern: str) -> None:
    """The membership rules (actors/raft/quorum.py, machine.py), each broken in turn: a jump
    to other voters without a joint step, a second change before the first commits, a
    learner counted for commits, a change that a truncation does not take away."""
    _break_membership(monkeypatch, variant)
    _caught(pattern)
