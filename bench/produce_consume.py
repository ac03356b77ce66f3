"""The produce/consume cases: one node (or a peer) under a producer at full speed, then at a
fixed rate, and a consumer reading everything back; and the memory of 100 partitions.

`produce_consume_*` runs Krill and each peer the same way and sets the figures beside this
run's ceilings; `rss_100_partitions` checks a node's memory with many open partitions.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.broker import (
    Broker,
    RssSampler,
    log,
    tree_cpu_seconds,
    tree_hwm_mib,
    tree_rss_mib,
)
from bench.clients import (
    Deliveries,
    consume_all,
    create_topic,
    flush_deliveries,
    produce_fixed_rate,
    produce_max,
    producer_config,
)
from bench.measure import (
    ErrorLog,
    ProcessCpu,
    StatsCollector,
    broker_live_figures,
    broker_stop_figures,
    liveness,
)
from bench.report import (
    CaseError,
    case_failed,
    compare,
    finish,
    get_path,
    header,
    vs_ceiling,
)

# The targets (all measured with --smp as given, default 1).
TARGET_PRODUCE_MSGS = 80_000  # 1 KiB x 6 partitions, acks=all
TARGET_CONSUME_MSGS = 150_000
TARGET_CPU_US_PER_PRODUCE_REQ = 150.0
TARGET_RSS_MIB_100_PARTITIONS = 200.0
TARGET_FIXED_RATE_P99_MS = 20.0
FIXED_RATE = 20_000

PRODUCE_CASES = {
    "produce_consume_1k_x6": {"value_bytes": 1024, "partitions": 6},
    "produce_consume_100b_x1": {"value_bytes": 100, "partitions": 1},
}


def _run_workload(
    res: dict[str, Any],
    broker: Broker,
    topic: str,
    n: int,
    value: bytes,
    parts: int,
    fixed_s: float,
    args: argparse.Namespace,
    label: str,
    by_process: bool = False,
) -> None:
    """Produce ``n`` as fast as possible, consume them back, then the fixed-rate phase.

    Fills ``res["produce"]``, ``res["consume"]`` and ``res["fixed_rate_20k"]`` as each phase
    ends (a failure leaves the earlier ones). ``by_process`` adds each phase's broker CPU
    per process of the tree (``broker_cpu_s_by_process``).
    """
    check = liveness(broker)
    cpu = ProcessCpu(broker) if by_process else None

    def phase(key: str, fn: Callable[[], dict[str, Any]]) -> None:
        before = cpu.snapshot() if cpu else None
        out = fn()
        if cpu and before is not None:
            out["broker_cpu_s_by_process"] = cpu.since(before)
        res[key] = out

    log(f"{label}: producing {n} x {len(value)} B to {parts} partition(s)")
    phase("produce", lambda: produce_max(
        broker.bootstrap, topic, n, value, parts,
        timeout=args.phase_timeout, stall_timeout=args.stall_timeout,
        check=check, broker_pid=broker.pid,
    ))  # fmt: skip
    log(f"{label}: produce {res['produce']['msgs_per_s']} msg/s; consuming")
    phase("consume", lambda: consume_all(
        broker.bootstrap, topic, parts, n,
        stall_timeout=args.stall_timeout, timeout=args.phase_timeout,
        check=check, broker_pid=broker.pid,
    ))  # fmt: skip
    log(f"{label}: consume {res['consume']['msgs_per_s']} msg/s; fixed rate")
    phase("fixed_rate_20k", lambda: produce_fixed_rate(
        broker.bootstrap, topic, value, parts,
        rate=FIXED_RATE, seconds=fixed_s, stall_timeout=args.stall_timeout,
        check=check, broker_pid=broker.pid,
    ))  # fmt: skip


def run_produce_consume(
    case: str, args: argparse.Namespace, ceilings: dict[str, Any]
) -> dict[str, Any]:
    spec = PRODUCE_CASES[case]
    vbytes, parts = spec["value_bytes"], spec["partitions"]
    n = args.messages or (20_000 if args.quick else 200_000)
    fixed_s = args.fixed_seconds or (2.0 if args.quick else 5.0)
    res = header(case, args)
    res.update({"messages": n, "value_bytes": vbytes, "partitions": parts, "acks": "all"})
    value = os.urandom(vbytes)
    topic = f"bench-{case}"
    t0 = time.monotonic()
    broker = Broker(smp=args.smp, krill=args.krill, data_root=args.data_root, keep=args.keep)
    try:
        with broker, RssSampler(broker.pid) as rss:
            res["broker_pid"] = broker.pid
            res["broker_start_s"] = round(time.monotonic() - t0, 3)
            res["topic_create_s"] = round(create_topic(broker.bootstrap, topic, parts), 3)
            try:
                _run_workload(res, broker, topic, n, value, parts, fixed_s, args, case)
            finally:
                broker_live_figures(res, broker, rss)
    except Exception as e:
        case_failed(res, case, e, broker=broker)
    finally:
        broker_stop_figures(res, broker)
    prod, cons, fixed = res.get("produce"), res.get("consume"), res.get("fixed_rate_20k")
    res["vs_ceiling"] = vs_ceiling(res, ceilings)
    targets: dict[str, bool | None] = {}
    if case == "produce_consume_1k_x6":
        targets["produce_ge_80k_msgs_per_s"] = compare(
            get_path(prod, "msgs_per_s"), "ge", TARGET_PRODUCE_MSGS
        )
    targets["consume_ge_150k_msgs_per_s"] = compare(
        get_path(cons, "msgs_per_s"), "ge", TARGET_CONSUME_MSGS
    )
    targets["broker_cpu_le_150us_per_produce_request"] = compare(
        get_path(prod, "broker_cpu_us_per_produce_request"), "le", TARGET_CPU_US_PER_PRODUCE_REQ
    )
    targets["fixed_rate_20k_p99_lt_20ms"] = compare(
        get_path(fixed, "latency_ms", "p99"), "lt", TARGET_FIXED_RATE_P99_MS
    )
    res["target_met"] = targets
    return finish(res, t0)


def run_rss_100_partitions(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Producer

    parts, per_part = 100, 10
    res = header("rss_100_partitions", args)
    res.update({"partitions": parts, "messages_per_partition": per_part, "value_bytes": 1024})
    t0 = time.monotonic()
    broker = Broker(smp=args.smp, krill=args.krill, data_root=args.data_root, keep=args.keep)
    try:
        with broker, RssSampler(broker.pid) as rss:
            check = liveness(broker)
            res["broker_pid"] = broker.pid
            time.sleep(0.5)
            res["rss_idle_mib"] = round(tree_rss_mib(broker.pid), 1)
            res["topic_create_s"] = round(create_topic(broker.bootstrap, "bench-rss", parts), 3)
            time.sleep(0.5)
            res["rss_after_create_mib"] = round(tree_rss_mib(broker.pid), 1)
            stats, errors, dr = StatsCollector(), ErrorLog("producer"), Deliveries()
            p = Producer(producer_config(broker.bootstrap, stats, errors))
            value = os.urandom(1024)
            for i in range(parts * per_part):
                p.produce("bench-rss", value, partition=i % parts,
                          on_delivery=partial(dr.cb, time.perf_counter()))  # fmt: skip
            flush_deliveries(
                p, dr, time.monotonic() + args.phase_timeout, check, args.stall_timeout
            )
            if dr.errors:
                raise CaseError(f"{dr.errors} delivery errors; first: {dr.first_error}")
            res["produced"] = dr.done
            time.sleep(1.0)
            check()
            res["rss_after_produce_mib"] = round(tree_rss_mib(broker.pid), 1)
            res["rss_hwm_sum_mib"] = round(tree_hwm_mib(broker.pid), 1)
            rss.sample()
            res["rss_peak_mib"] = round(rss.peak_mib, 1)
            res["processes"] = rss.max_processes
            res["broker_cpu_s_total"] = round(tree_cpu_seconds(broker.pid), 3)
    except Exception as e:
        case_failed(res, "rss_100_partitions", e, broker=broker)
    finally:
        res["broker_stop"] = broker.stop_how
        res["broker_exit_code"] = broker.exit_code
        res["broker_first_log_error"] = broker.first_log_error or None
    res["target_met"] = {
        "rss_lt_200mib_with_100_partitions": compare(
            res.get("rss_after_produce_mib"), "lt", TARGET_RSS_MIB_100_PARTITIONS
        )
    }
    return finish(res, t0)
