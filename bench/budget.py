"""Where a produce's milliseconds go: the latency budget (issue #29, part one).

`latency_budget`: one node (one shard per core) and a 3-node cluster (replication factor 3,
one shard per node), each started with `--trace-produce-every` (actors/trace.py), at fixed
offered rates (10k and 50k msg/s; 1 KiB values, 6 partitions, acks=all, the idempotent
producer, bench/cluster.py's `produce_fixed_rate`). Per rate, from the nodes' /metrics read
before and after it (summed over shards and nodes):

- `client_ms`: the producer's own p50/p99/p99.9, from each message's scheduled send time;
- `stages_ms`: p50 and p99 of each traced request's stage (decode, route, append, flush_wait,
  flush, replicate, answer) and the stages' p50s summed (`stages_p50_sum`), to set beside
  the client's p50 (what is left is the client and the network);
- `loop`: loop turns over the threshold (stalls), the turns' p99, the stalls' time by where
  the loop thread was (`stall_ms`: running, runnable waiting for a CPU, blocked in the
  kernel), GC collections by generation with their p99 (shards/loop_watch.py);
- `io`: the fdatasync pool's queue wait and call, p50 and p99 (shards/io_pool.py).

Percentiles come from the histograms' buckets, linear inside a bucket: a stage's p99 is known
to its bucket's width (2-2.5x), enough to say where the time goes, not to compare runs closely.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.request
from contextlib import ExitStack
from typing import Any

from actors.metrics import PRODUCE_STAGES as STAGES
from bench.broker import Broker, log, tree_cpu_seconds
from bench.cluster import PARTITIONS, VALUE_BYTES, Side
from bench.cluster_nodes import NODES, Cluster
from bench.measure import liveness
from bench.report import CaseError, case_failed, finish, header
from shards.loop_watch import STALL_STATES

__all__ = ["BUDGET_CASES", "scrape", "window_figures"]

RATES = (10_000, 50_000)
QUICK_RATES = (5_000,)
TRACE_EVERY = 20  # one request in this many traced: ~tens per second at these rates
WARM_MESSAGES = 20_000
QUICK_WARM_MESSAGES = 2_000

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(admin_ports: list[int]) -> Scrape:
    """Every sample of every node's /metrics, summed over nodes (same name and labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Scrape = {}
    for port in admin_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "shard"))
                key = (s.name, labels)
                out[key] = out.get(key, 0.0) + s.value
    return out


def _buckets(before: Scrape, after: Scrape, name: str, **labels: str
             ) -> list[tuple[float, float]]:
    """(upper bound, count in the window) of a histogram's buckets, cumulative, by bound."""
    want = set(labels.items())
    cum: dict[float, float] = {}
    for (sample, lbls), v in after.items():
        if sample != f"{name}_bucket" or not want <= set(lbls):
            continue
        rest = dict(lbls)
        if set(rest) - {"le"} != set(labels):
            continue
        bound = float(rest["le"])
        cum[bound] = cum.get(bound, 0.0) + v - before.get((sample, lbls), 0.0)
    return sorted(cum.items())


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile (seconds) of cumulative buckets, linear inside the bucket it falls in."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return lower


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def window_figures(before: Scrape, after: Scrape) -> dict[str, Any]:
    stages: dict[str, Any] = {}
    for stage in STAGES:
        b = _buckets(before, after, "krill_produce_stage_seconds", stage=stage)
        stages[stage] = {"p50": _ms(_quantile(b, 0.5)), "p99": _ms(_quantile(b, 0.99)),
                         "traced": int(b[-1][1]) if b else 0}
    p50s = [s["p50"] for s in stages.values() if s["p50"] is not None]
    turns = _buckets(before, after, "krill_reactor_turn_seconds")
    stall_key = ("krill_reactor_stalls_total", ())
    stall_ms = {}
    for state in STALL_STATES:
        key = ("krill_reactor_stall_seconds_total", (("state", state),))
        stall_ms[state] = _ms(after.get(key, 0.0) - before.get(key, 0.0))
    gc = {}
    for generation in "012":
        g = _buckets(before, after, "krill_gc_pause_seconds", generation=generation)
        gc[generation] = {"collections": int(g[-1][1]) if g else 0,
                          "p99_ms": _ms(_quantile(g, 0.99))}
    io = {}
    for part in ("queue_wait", "call"):
        name = "krill_io_queue_wait_seconds" if part == "queue_wait" else "krill_io_call_seconds"
        b = _buckets(before, after, name, pool="io")
        io[part] = {"p50_ms": _ms(_quantile(b, 0.5)), "p99_ms": _ms(_quantile(b, 0.99))}
    return {
        "stages_ms": stages,
        "stages_p50_sum": round(sum(p50s), 3) if p50s else None,
        "loop": {"stalls": int(after.get(stall_key, 0) - before.get(stall_key, 0)),
                 "turns": int(turns[-1][1]) if turns else 0,
                 "turn_p99_ms": _ms(_quantile(turns, 0.99)), "stall_ms": stall_ms, "gc": gc},
        "io": io,
    }


def _topology(name: str, side: Side, admin_ports: list[int], rates: tuple[int, ...],
              value: bytes, args: argparse.Namespace, res: dict[str, Any]) -> None:
    seconds = args.fixed_seconds or (2.0 if args.quick else 10.0)
    side.next_topic()
    side.produce(QUICK_WARM_MESSAGES if args.quick else WARM_MESSAGES, value, args)
    out: dict[str, Any] = {}
    for rate in rates:
        side.next_topic()
        before = scrape(admin_ports)
        fixed = side.fixed(rate, seconds, value, args)
        window = window_figures(before, scrape(admin_ports))
        window["client_ms"] = fixed["latency_from_schedule_ms"]
        window["achieved_msgs_per_s"] = fixed["achieved_msgs_per_s"]
        window["broker_cpu_s"] = fixed["broker_cpu_s"]
        out[str(rate)] = window
        stages = window["stages_ms"]
        log(f"latency_budget {name} {rate} msg/s: client p50 {window['client_ms'].get('p50')} "
            f"p99 {window['client_ms'].get('p99')} ms; stage p50s " + " ".join(
                f"{s}={stages[s]['p50']}" for s in STAGES) + f"; stalls {window['loop']['stalls']}")
    res[name] = out


def run_budget(args: argparse.Namespace) -> dict[str, Any]:
    case = "latency_budget"
    res = header(case, args)
    rates = QUICK_RATES if args.quick else RATES
    res.update({"rates": list(rates), "value_bytes": VALUE_BYTES, "partitions": PARTITIONS,
                "acks": "all", "idempotent": True, "trace_produce_every": TRACE_EVERY,
                "client": "confluent-kafka"})
    value = os.urandom(VALUE_BYTES)
    traced = ("--trace-produce-every", str(TRACE_EVERY))
    t0 = time.monotonic()
    try:
        with ExitStack() as stack:
            broker = stack.enter_context(Broker(smp=os.cpu_count() or 1, krill=args.krill,
                                                data_root=args.data_root, keep=args.keep,
                                                extra_args=traced))
            if not broker.admin_port:
                raise CaseError("this krill serves no /metrics (no --admin-port)")
            check = liveness(broker)
            side = Side("krill", broker.bootstrap, 1, lambda: tree_cpu_seconds(broker.pid),
                        check)
            res["one_node_smp"] = broker.smp
            _topology("one_node", side, [broker.admin_port], rates, value, args, res)
        with ExitStack() as stack:
            cluster = stack.enter_context(Cluster(args, traced))
            side = Side("krill3", cluster.bootstrap, NODES, cluster.cpu_seconds,
                        cluster.live_check())
            ports = [cluster.node(i + 1).admin_port for i in range(NODES)]
            _topology("three_nodes", side, ports, rates, value, args, res)
    except Exception as e:
        case_failed(res, case, e)
    return finish(res, t0)


BUDGET_CASES = {"latency_budget": run_budget}
