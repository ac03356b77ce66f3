"""Raft machine benchmarks: the random simulation over thousands of seeds, and what the pure
machine costs per replicated batch.

- `raft_seeds(args)`: tests/raft/sim.py over consecutive seeds (`--quick`: 300, else 3000):
  seeds per wall second, the seeds that failed (replay one with `python -m tests.raft.sim
  SEED`), and what the runs did: chaos steps, the faults by kind summed over the seeds
  (kill -9s, power losses and what they kept, recovery syncs, cuts, retention, partitions,
  topics deleted and created again, messages dropped for another incarnation, refused
  writes, ...), elections, acknowledged offsets, crashes, calm ticks.
- Within it, `steady`: three machines in one process, leader proposing one-record batches,
  every Ready handled at once and every write synced at once (no bytes, no model log): the
  machine calls per second (step, propose, flushed, ready, advance, has_ready) and the
  microseconds of machine work per committed batch (all three machines), one batch per
  loop turn and 16 per loop turn.

`python -m bench.raft [--quick]` prints the JSON line alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import time
from typing import Any

from actors.raft import Config, Message, RaftMachine, Role

SEEDS_FULL = 3000
SEEDS_QUICK = 300
STEADY_BATCHES = 20_000  # committed batches per steady figure (quick: a fifth)


def raft_seeds(args: argparse.Namespace) -> dict[str, Any]:
    from tests.raft import sim

    count = SEEDS_QUICK if args.quick else SEEDS_FULL
    failed: list[dict[str, Any]] = []
    results = []
    faults: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    for seed in range(count):
        try:
            results.append(sim.run(seed))
        except sim.SimFailure as e:
            failed.append({"seed": seed, "error": str(e)[:300]})
        else:
            faults.update(results[-1].faults)
    wall = time.perf_counter() - started
    batches = STEADY_BATCHES // 5 if args.quick else STEADY_BATCHES
    return {
        "case": "raft_seeds", "seeds": count, "seed_range": [0, count - 1],
        "chaos_steps_per_seed": sim.CHAOS_STEPS,
        "wall_s": round(wall, 1), "seeds_per_s": round(count / wall, 1),
        "failed_seeds": failed, "failures": len(failed),
        "steps": sum(r.steps for r in results),
        "faults": dict(sorted(faults.items())),
        "elections_per_seed_median": _median(r.leaders for r in results),
        "acked_offsets_per_seed_median": _median(r.acked_offsets for r in results),
        "crashes_per_seed_median": _median(r.crashes for r in results),
        "calm_ticks_max": max((r.calm_ticks for r in results), default=None),
        "steady": [steady(batches, per_turn=1), steady(batches, per_turn=16)],
        "ok": not failed,
    }


def _median(values: Any) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


class _Counting:
    """Counts calls into the machines (the harness's own work is in the wall time too)."""

    def __init__(self) -> None:
        self.calls = 0


def steady(batches: int, per_turn: int) -> dict[str, Any]:
    """Three machines replicating `batches` one-record batches, `per_turn` per loop turn."""
    ids = (1, 2, 3)
    machines = {i: RaftMachine(Config(i, ids), random.Random(i)) for i in ids}
    count = _Counting()
    inbox: list[Message] = []
    machines[1].campaign()
    _settle(machines, inbox, count)
    leader = machines[1]
    assert leader.role == Role.Leader
    count.calls = 0
    started = time.perf_counter()
    target = leader.commit + batches
    while leader.commit < target:
        for _ in range(per_turn):
            leader.propose(1)
        count.calls += per_turn
        _settle(machines, inbox, count)
    wall = time.perf_counter() - started
    return {"batches_per_turn": per_turn, "batches": batches,
            "machine_calls": count.calls,
            "machine_calls_per_s": round(count.calls / wall),
            "us_per_committed_batch": round(wall / batches * 1e6, 2)}


def _settle(machines: dict[Any, RaftMachine], inbox: list[Message], count: _Counting) -> None:
    """Handle every Ready, sync every write at once, deliver every message, until quiet."""
    while True:
        moved = False
        for m in machines.values():
            count.calls += 1
            if not m.has_ready():
                continue
            rd = m.ready()
            inbox.extend(rd.messages)
            m.advance()
            count.calls += 2
            if rd.log_writes:
                m.flushed(m.log.last_offset, m.log.last_term)
                count.calls += 1
            moved = True
        msgs = inbox[:]
        inbox.clear()
        for msg in msgs:
            machines[msg.to].step(msg)
        count.calls += len(msgs)
        if not moved and not msgs:
            return


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print(json.dumps(raft_seeds(ap.parse_args())))
