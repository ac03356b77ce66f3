"""Krill bench: ``python -m bench.run [--quick] [--case NAME ...]``.

Prints ONE JSON line per case on stdout; progress and logs go to stderr. The first line is
the ``ceilings`` case (raw fdatasync loop and loopback socket echo, measured in this run);
every broker case repeats the ceiling figures it is compared with under ``vs_ceiling``.
See bench/README.md for every field.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import ceilings as ceil
from bench.broker import log
from bench.produce_consume import PRODUCE_CASES, run_produce_consume, run_rss_100_partitions
from bench.report import header, loadavg

SHARD_CASES = ["shards_1_vs_2", "cross_core_vs_local"]  # bench/shards.py
GROUP_CASES = ["offset_commit_rate", "rebalance_time"]  # bench/groups.py
# bench/running.py: a node left running (idle long polls, cold reads, metrics, soak).
RUNNING_CASES = ["idle_consumers", "cold_reads", "metrics_overhead", "soak"]
# bench/lifecycle.py: retention holding the disk, compaction.
LIFECYCLE_CASES = ["retention_steady", "compaction"]
# bench/saturation.py: latency against offered load, the knee (krill bench saturation).
SATURATION_CASES = ["saturation"]
# bench/scenarios.py: what recording a history costs the clients; the library at length.
SCENARIO_CASES = ["runner_overhead", "scenario_library", "sim_seeds"]
# bench/raft.py: the pure Raft machine over seeded random clusters (actors/raft/).
RAFT_CASES = ["raft_seeds", "node_rpc"]  # bench/raft.py, bench/node_rpc.py
SPARK_CASES = ["spark_reader_plain", "spark_reader_realistic"]  # bench/spark_reader.py
SPARK_WRITER_CASES = ["spark_writer"]  # bench/spark_writer.py
# bench/cluster.py: 3 nodes x RF=3 beside 1 node, failover, catch-up, idle heartbeats;
# bench/cluster_move.py: a partition moved under a fixed-rate producer.
CLUSTER_CASES = [
    "cluster_vs_single", "cluster_failover", "cluster_catch_up", "cluster_idle_heartbeats",
    "cluster_move",
]
# bench/vs_kafka.py: Krill beside Apache Kafka (fsync per batch, page cache) and tansu.
VS_KAFKA_CASES = ["vs_kafka_throughput", "vs_kafka_latency", "vs_kafka_cluster_latency",
                  "vs_kafka_end_to_end", "vs_kafka_consume", "vs_kafka_spark_source"]
# bench/budget.py: where a produce's milliseconds go, stage by stage (1 node, 3 nodes).
BUDGET_CASES = ["latency_budget"]
# bench/storage_modes.py: buffered beside direct storage mode, one node.
STORAGE_MODE_CASES = ["storage_modes"]
# bench/direct_io.py: direct mode's disk mechanisms without a broker (writes in flight, reads).
DIRECT_IO_CASES = ["direct_io"]
ALL_CASES = [
    "ceilings", *PRODUCE_CASES, "rss_100_partitions", *SHARD_CASES, *GROUP_CASES,
    *RUNNING_CASES, *LIFECYCLE_CASES, *SATURATION_CASES, *SCENARIO_CASES, *RAFT_CASES,
    *CLUSTER_CASES, *SPARK_CASES, *SPARK_WRITER_CASES, *VS_KAFKA_CASES, *BUDGET_CASES,
    *STORAGE_MODE_CASES, *DIRECT_IO_CASES,
]


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k messages, short phases (<2 min)")
    ap.add_argument(
        "--case", action="append", choices=ALL_CASES, metavar="NAME",
        help=f"run only this case (repeatable): {', '.join(ALL_CASES)}",
    )  # fmt: skip
    ap.add_argument("--messages", type=int, default=0, help="override the message count")
    ap.add_argument("--fixed-seconds", type=float, default=0.0, help="fixed-rate phase length")
    ap.add_argument(
        "--rounds", type=int, default=0,
        help="produce rounds per side in the shard cases (default 10, 2 with --quick)",
    )  # fmt: skip
    ap.add_argument("--smp", type=int, default=1, help="passed to krill start --smp")
    ap.add_argument("--krill", default=None, help="path to the krill executable")
    ap.add_argument("--data-root", default=None, help="where temp data dirs go (default $TMPDIR)")
    ap.add_argument("--phase-timeout", type=float, default=120.0, help="bound on each phase, s")
    ap.add_argument("--stall-timeout", type=float, default=30.0, help="consume stall bound, s")
    ap.add_argument("--keep", action="store_true", help="keep broker data dirs and logs")
    ap.add_argument("--soak-minutes", type=float, default=10.0, help="soak length (default 10)")
    ap.add_argument("--long", action="store_true", help="soak for 3 hours")
    ap.add_argument(
        "--baseline-krill", default=None,
        help="also run idle_consumers and cold_reads against this krill (another checkout)",
    )
    ap.add_argument(
        "--ceilings-once", action="store_true",
        help="compare every case with the first ceilings line instead of re-measuring "
        "(1 s per ceiling) just before each produce case",
    )  # fmt: skip
    ap.add_argument(
        "--out", default=None,
        help="also append the JSON lines to this file (default bench/results/<time>.jsonl; "
        "'-' for none)",
    )  # fmt: skip
    args = ap.parse_args(argv)

    cases = args.case or ALL_CASES
    out_path: Path | None = None
    if args.out != "-":
        out_path = Path(
            args.out
            or Path(__file__).resolve().parent / "results" / time.strftime("%Y%m%d-%H%M%S.jsonl")
        )
        out_path.parent.mkdir(parents=True, exist_ok=True)

    failed = False

    def emit(res: dict[str, Any]) -> None:
        nonlocal failed
        failed = failed or bool(res.get("error"))
        line = json.dumps(res, separators=(",", ":"))
        print(line, flush=True)
        if out_path is not None:
            with out_path.open("a") as f:
                f.write(line + "\n")

    t0 = time.monotonic()
    # Ceilings always run (every case is compared with them); printed first.
    c_res = header("ceilings", args)
    c_res.update(ceil.measure(args.data_root, quick=args.quick))
    c_res["error"] = None
    errs = [k for k, v in c_res.items() if isinstance(v, dict) and v.get("error")]
    if errs:
        c_res["error"] = f"ceilings failed: {', '.join(errs)}"
    c_res["loadavg_end"] = loadavg()
    emit(c_res)

    for case in cases:
        if case == "ceilings":
            continue
        log(f"=== {case}")
        if case in PRODUCE_CASES:
            local = c_res
            if not args.ceilings_once:
                # Load on this shared machine drifts: compare with a ceiling taken just now.
                local = ceil.measure(args.data_root, quick=True)
            emit(run_produce_consume(case, args, local))
        elif case == "rss_100_partitions":
            emit(run_rss_100_partitions(args))
        elif case == "shards_1_vs_2":
            from bench import shards

            local = c_res if args.ceilings_once else ceil.measure(args.data_root, quick=True)
            emit(shards.run_shards_1_vs_2(args, local))
        elif case == "cross_core_vs_local":
            from bench import shards

            emit(shards.run_cross_core_vs_local(args))
        elif case in GROUP_CASES:
            from bench import groups

            emit(groups.GROUP_CASES[case](args))
        elif case in RUNNING_CASES:
            from bench import running

            emit(running.RUNNING_CASES[case](args))
        elif case in LIFECYCLE_CASES:
            from bench import lifecycle

            emit(lifecycle.LIFECYCLE_CASES[case](args))
        elif case in SATURATION_CASES:
            from bench import saturation

            emit(saturation.run_saturation(args))
        elif case in SCENARIO_CASES:
            from bench import scenarios

            emit(scenarios.SCENARIO_CASES[case](args))
        elif case in RAFT_CASES:
            if case == "node_rpc":
                from bench import node_rpc

                emit(node_rpc.node_rpc(args))
            else:
                from bench import raft

                emit(raft.raft_seeds(args))
        elif case == "cluster_move":
            from bench import cluster_move

            emit(cluster_move.run_cluster_move(args))
        elif case in CLUSTER_CASES:
            from bench import cluster

            emit(cluster.CLUSTER_CASES[case](args))
        elif case in SPARK_CASES:
            from bench import spark_reader

            emit(spark_reader.from_bench_run(case, args.quick))
        elif case in SPARK_WRITER_CASES:
            from bench import spark_writer

            emit(spark_writer.from_bench_run(case, args.quick))
        elif case in VS_KAFKA_CASES:
            from bench import vs_kafka

            emit(vs_kafka.VS_KAFKA_CASES[case](args))
        elif case in BUDGET_CASES:
            from bench import budget

            emit(budget.BUDGET_CASES[case](args))
        elif case in STORAGE_MODE_CASES:
            from bench import storage_modes

            emit(storage_modes.STORAGE_MODE_CASES[case](args))
        elif case in DIRECT_IO_CASES:
            from bench import direct_io

            emit(direct_io.DIRECT_IO_CASES[case](args))
    log(f"done in {time.monotonic() - t0:.1f}s" + (f"; results in {out_path}" if out_path else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
