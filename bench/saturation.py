"""Bench case `saturation`: the latency-versus-throughput curve of a default node.

What `krill bench saturation -p 6 -s 1024` measures (scenarios/saturation.py has the method
and the knee rule), against a node this case starts with `krill start`'s default shard count
(every usable core) on free ports: the maximum produce rate (acks=all, 1 KiB x 6 partitions),
then fixed offered rates from 10% to 120% of it, latency from each message's scheduled send
time. The line carries the maximum, p99 at 50% of it and p99.9 / p50 there (the issue's goal:
at most 5), the knee, and every step; `report.json` and `curve.png` go to
`bench/results/saturation-<time>/`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.broker import Broker, log
from bench.measure import liveness
from bench.report import case_failed, finish, header
from scenarios.saturation import FLAT_TAIL_RATIO_MAX, Plan, measure, write_report

__all__ = ["run_saturation"]

PARTITIONS = 6
MESSAGE_BYTES = 1024
QUICK_PLAN = Plan(partitions=PARTITIONS, message_bytes=MESSAGE_BYTES,
                  steps_pct=(10.0, 50.0, 100.0, 120.0), step_seconds=1.5, max_seconds=2.0)
FULL_PLAN = Plan(partitions=PARTITIONS, message_bytes=MESSAGE_BYTES)
STEP_FIELDS = ("offered_pct", "offered_msgs_per_s", "achieved_msgs_per_s", "p50_ms", "p99_ms",
               "p99_9_ms", "max_ms", "behind_max_ms", "failed", "unsent", "unacked")


def run_saturation(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    smp = len(os.sched_getaffinity(0))  # `krill start`'s default: every usable core
    res, t0 = header("saturation", args), time.monotonic()
    res.update({"smp": smp, "partitions": plan.partitions, "message_bytes": plan.message_bytes,
                "acks": plan.acks, "steps_pct": list(plan.steps_pct),
                "step_seconds": plan.step_seconds, "max_seconds": plan.max_seconds})
    broker = Broker(smp=smp, krill=args.krill, data_root=args.data_root, keep=args.keep)
    try:
        with broker:
            report = measure(broker.bootstrap, plan, alive=liveness(broker))
        out = Path(__file__).resolve().parent / "results" / time.strftime(
            "saturation-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        write_report(out, report)
        res.update(_figures(report))
        res["report_dir"] = str(out)
        log(f"saturation: maximum {res['max_msgs_per_s']} msg/s, p99 at 50% "
            f"{res['p99_ms_at_50pct']} ms, p99.9/p50 {res['p99_9_over_p50_at_50pct']}")
    except Exception as e:
        case_failed(res, "saturation", e, broker=broker)
    half = res.get("p99_9_over_p50_at_50pct")
    res["target_met"] = {
        "p99_9_over_p50_at_50pct_le_5": None if half is None else half <= FLAT_TAIL_RATIO_MAX}
    return finish(res, t0)


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    half, knee = report["at_50pct"], report["knee"]
    return {
        "max_msgs_per_s": report["maximum"]["msgs_per_s"],
        "max_mb_per_s": report["maximum"]["mb_per_s"],
        "p99_ms_at_50pct": half["p99_ms"],
        "p99_9_over_p50_at_50pct": half["p99_9_over_p50"],
        "at_50pct": half,
        "knee": None if knee is None else {
            key: knee[key] for key in ("offered_pct", "offered_msgs_per_s",
                                       "achieved_msgs_per_s", "p99_ms", "reason")},
        "spikes": report["spikes"],
        "steps": [{key: step[key] for key in STEP_FIELDS} for step in report["steps"]],
    }
