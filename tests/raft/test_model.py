"""The simulation's model of a replica's disk and host (tests/raft/cluster.py): what a kill -9
and a power loss keep, the recovery sync, writes waiting behind a cut, the apply loop. The
broken variants in test_random.py rely on these being right."""

from __future__ import annotations

import random

import pytest

from actors.raft import Append, InstallStart, Range, TruncateAfter
from tests.raft.cluster import Applier, Batch, ModelLog, Node, make_config


def node_with(*terms: int, synced: int, defer_cuts: bool = True) -> Node:
    """A follower whose log holds one one-record batch per term given, synced up to the
    first `synced` of them (the rest only written)."""
    log = ModelLog()
    for offset, term in enumerate(terms[:synced]):
        log.append(Batch(offset, offset, term, (0, f"b{offset}")))
    n = Node(make_config(1, 3), seed=1, log=log, defer_cuts=defer_cuts)
    for offset, term in enumerate(terms[synced:], start=synced):
        n.ask(Append((Range(offset, offset, term),), (Batch(offset, offset, term,
                                                             (0, f"b{offset}")),)))
    return n


def test_kill_keeps_what_was_written_and_power_loss_what_was_synced() -> None:
    killed = node_with(1, 1, 2, 2, synced=2)
    killed.kill()
    assert killed.written.last_offset == 3 and killed.durable.last_offset == 1
    lost = node_with(1, 1, 2, 2, synced=2)
    lost.crash()
    assert lost.written.last_offset == 1 and lost.durable.last_offset == 1


def test_a_torn_power_loss_keeps_a_prefix_of_the_unsynced_tail() -> None:
    kept = set()
    for seed in range(20):
        n = node_with(1, 1, 2, 2, 2, synced=2)
        assert n.crash(torn=random.Random(seed)) in ("synced", "tail")
        assert n.written.same(n.durable)
        kept.add(n.written.last_offset)
    assert kept == {1, 2, 3, 4}


def test_the_recovery_sync_makes_the_kept_tail_durable_before_the_machine_starts() -> None:
    n = node_with(1, 1, 2, 2, synced=2)
    n.kill()
    n.recovery_sync()
    n.restart()
    assert n.durable.last_offset == 3
    assert n.machine.log.flushed_offset == 3 == n.machine.log.last_offset


def test_writes_wait_behind_a_cut_and_the_cut_stays_cut() -> None:
    n = node_with(1, 1, 2, 2, synced=4)
    n.flush_begin()  # a sync begun before the cut: it must not bring the cut batches back
    n.ask(TruncateAfter(1))
    n.ask(Append((Range(2, 3, 3),), (Batch(2, 3, 3, (0, "new")),)))
    assert n.cut == TruncateAfter(1)
    assert n.written.last_offset == 1 and n.view.last_offset == 3
    assert not n.unflushed()  # no sync begins while a cut is out
    n.cut_end()
    assert n.cut is None and n.view is n.written
    assert n.written.batch_at(2) == Batch(2, 3, 3, (0, "new"))
    assert n.durable.last_offset == 1
    n.flush_end()  # the sync begun before the cut ends
    assert n.durable.last_offset == 1


def test_a_reset_half_made_by_a_power_loss_forgets_the_term_before_its_start() -> None:
    left = set()
    for seed in range(20):
        n = node_with(1, 1, synced=2)
        n.ask(InstallStart(10, 4))
        left.add((n.crash(torn=random.Random(seed)), n.written.start, n.written.prev_term))
    assert left == {("synced", 0, 0), ("half_reset", 10, 0)}


@pytest.mark.parametrize(("reapply", "applied"), [(True, 3), (False, 1)])
def test_the_apply_loop_applies_what_a_cut_held_back(monkeypatch: pytest.MonkeyPatch,
                                                      reapply: bool, applied: int) -> None:
    """(False: the broken variant, before issue 26's item 6.)"""
    monkeypatch.setattr(Applier, "reapply_on_write", reapply)
    n = node_with(1, 1, 2, 2, synced=4)
    n.applier.committed(1, n.written)
    n.ask(TruncateAfter(1))
    n.ask(Append((Range(2, 3, 3),), (Batch(2, 3, 3, (0, "new")),)))
    n.applier.committed(3, n.written)  # reported with the cut, the log ending at 1 until then
    assert n.applier.applied == 1
    n.cut_end()
    assert n.applier.applied == applied
