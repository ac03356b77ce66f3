"""Scenario benchmarks: what the runner costs its clients, and the shipped library at length.

- `runner_overhead` (issue #16 target: at most 5% more client CPU at 20k msg/s): the same
  scenario (1 node, 2 shards, 6 partitions, 256-byte records, 20k msg/s, one producer
  process, one consumer process) run with the history recorded and without (the workers then
  only count, as any client must), in ABBA rounds. Figure: what recording costs the
  clients' main threads (recorded minus bare CPU per acknowledged message, medians) as a
  share of the bare clients' whole CPU per message; the whole-process ratio beside it.
- `scenario_library`: every shipped real-mode scenario at its full length (the tests run
  them short), each with its verdict, sends, p99 outside faults and every fault's recovery;
  OMB's two workloads run for `OMB_MINUTES` instead of their 15 (`--quick`: every file for
  a few seconds).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scenarios.cli import LIBRARY
from scenarios.runner import run
from scenarios.spec import load, parse

OVERHEAD_RATE = 20_000  # msg/s: the operating point
OVERHEAD_BOUND = 0.05  # what recording costs / the bare clients' CPU, per message
OMB_MINUTES = 2.0  # OMB's workload files say 15; the figures settle in well under 2


_OVERHEAD = """
name: runner-overhead
cluster: {{shards: 2}}
workload:
  topics: 1
  partitionsPerTopic: 6
  messageSize: 256
  producerRate: {rate}
  subscriptionsPerTopic: 1
  consumerPerSubscription: 1
  testDurationSeconds: {seconds}
"""


def run_runner_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Recorded and bare rounds, ABBA. Two figures: the whole client processes' CPU per
    message (what the issue names, but a librdkafka producer's own threads vary between
    rounds by several times what recording costs), and the clients' main threads' CPU, where
    every recorded operation is made and packed: its recorded-minus-bare difference is what
    recording costs, and its share of the bare clients' whole CPU is the target figure."""
    seconds = 8 if args.quick else 20
    order = [True, False] if args.quick else [True, False, False, True, True, False,
                                              False, True]
    scenario = parse(_OVERHEAD.format(rate=OVERHEAD_RATE, seconds=seconds))
    whole: dict[bool, list[float]] = {True: [], False: []}
    main: dict[bool, list[float]] = {True: [], False: []}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="krill-bench-runner-") as tmp:
        for i, recording in enumerate(order):
            report = run(scenario, Path(tmp) / f"round-{i}", quiet=True, recording=recording)
            acked = report["clients"]["producers"]["acked"]
            cpu = sum(c["cpu_load_s"] for c in report["clients"].values())
            main_cpu = sum(c["main_load_s"] for c in report["clients"].values())
            whole[recording].append(cpu / acked * 1e6)
            main[recording].append(main_cpu / acked * 1e6)
            rounds.append({"recording": recording, "client_cpu_s": round(cpu, 2),
                           "cpu_us_per_msg": round(cpu / acked * 1e6, 2),
                           "main_us_per_msg": round(main_cpu / acked * 1e6, 3)})
    recorded, bare = statistics.median(whole[True]), statistics.median(whole[False])
    cost = statistics.median(main[True]) - statistics.median(main[False])
    share = cost / bare
    return {
        "case": "runner_overhead", "rate": OVERHEAD_RATE, "seconds": seconds, "rounds": rounds,
        "cpu_us_per_msg_recorded": round(recorded, 2), "cpu_us_per_msg_bare": round(bare, 2),
        "cpu_us_per_msg_bare_range": [round(min(whole[False]), 2), round(max(whole[False]), 2)],
        "ratio_whole_process": round(recorded / bare, 3),
        "main_us_per_msg_recorded": round(statistics.median(main[True]), 3),
        "main_us_per_msg_bare": round(statistics.median(main[False]), 3),
        "recording_us_per_msg": round(cost, 3), "recording_share": round(share, 4),
        "bound": OVERHEAD_BOUND, "ok": None if args.quick else share <= OVERHEAD_BOUND,
    }


def run_scenario_library(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory(prefix="krill-bench-library-") as tmp:
        for path in sorted(LIBRARY.glob("*.yaml")):
            if path.name.startswith("sim-"):
                continue  # bench/ runs the simulated flows by seeds (sim_seeds)
            duration = 4.0 if args.quick else (OMB_MINUTES * 60 if path.name.startswith("omb-")
                                               else None)
            scenario = load(path, duration_s=duration)
            started = time.monotonic()
            report = run(scenario, Path(tmp) / path.stem, quiet=True)
            figures = report["figures"]
            results.append({
                "file": path.name, "verdict": report["verdict"],
                "seconds": round(time.monotonic() - started, 1),
                "sends": figures["sends"], "error_rate": figures["error_rate"],
                "p99_ms_outside_faults": figures["latency_ms_outside_faults"].get("p99"),
                "faults": [{k: f.get(k) for k in ("name", "recovery_ms", "outage_ms")}
                           for f in figures["faults"]],
                "anomalies": {k: len(v) for k, v in report["anomalies"].items()},
                "errors": report["errors"],
            })
    return {"case": "scenario_library", "quick": bool(args.quick), "scenarios": results,
            "ok": all(r["verdict"] == "PASS" for r in results)}


SIM_SECONDS_PER_FLOW = 60.0  # wall seconds of seeds per shipped simulated flow (quick: 10)
SIM_RATE_BOUND = 10_000  # simulated produce requests per wall second (issue #16 target)


def run_sim_seeds(args: argparse.Namespace) -> dict[str, Any]:
    """Every shipped simulated flow over consecutive seeds for a fixed wall time: each seed's
    verdict (the checker and the steps' own expectations), and simulated produce requests
    per second of wall time."""
    import logging

    from scenarios import sim
    from scenarios.runner import judge

    logging.disable(logging.CRITICAL)  # the faults' log lines, thousands of them
    budget = 10.0 if args.quick else SIM_SECONDS_PER_FLOW
    flows = []
    try:
        for path in sorted(LIBRARY.glob("sim-*.yaml")):
            rates, failed, seeds = [], [], 0
            started = time.monotonic()
            while time.monotonic() - started < budget:
                seed = seeds + 1
                scenario = load(path, seed=seed)
                begun = time.perf_counter()
                result = sim.run(scenario.document, seed)
                wall = time.perf_counter() - begun
                rates.append(result.figures["produce_requests"] / wall)
                verdict = judge(scenario, result.ops, result.faults)["verdict"]
                if verdict != "PASS" or not all(c["ok"] for c in result.step_checks):
                    failed.append(seed)
                seeds += 1
            flows.append({"file": path.name, "seeds": seeds, "failed_seeds": failed,
                          "produces_per_wall_s_median": round(statistics.median(rates)),
                          "produces_per_wall_s_range": [round(min(rates)), round(max(rates))]})
    finally:
        logging.disable(logging.NOTSET)
    best = max(f["produces_per_wall_s_median"] for f in flows)
    return {"case": "sim_seeds", "seconds_per_flow": budget, "flows": flows,
            "bound": SIM_RATE_BOUND, "ok": all(not f["failed_seeds"] for f in flows),
            "rate_met": best >= SIM_RATE_BOUND}


SCENARIO_CASES = {"runner_overhead": run_runner_overhead,
                  "scenario_library": run_scenario_library, "sim_seeds": run_sim_seeds}
