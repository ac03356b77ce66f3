"""Krill beside Apache Kafka (and tansu), one run, the same client: what a user compares.

Three cases; each starts every side once, before its first round, and runs them in ABBA order
(the side order reversed every other round), each round into a fresh topic of 6 partitions:

- `vs_kafka_throughput`: 1 KiB values, acks=all, the idempotent producer (bench/cluster.py's
  `produce_max`: confluent-kafka as fast as it takes them): msg/s and broker CPU seconds per GB
  of Krill (a default node: `krill start`, one shard per core), Kafka with an fsync per batch
  (`log.flush.interval.messages=1`), Kafka on the page cache (its default) and tansu (memory).
  Per round Krill's ratio to each peer; medians and ranges.
- `vs_kafka_latency`: the same producer at fixed offered rates (5k ... 150k msg/s), latency
  p50/p99/p99.9 from each message's scheduled send time (a client or broker that falls behind
  is not hidden), each side until it cannot hold a rate (achieved < 95% of it, or p99 from
  the schedule over `HOLD_P99_MS`). Ratio of Krill's p99 to Kafka(fsync)'s at every rate
  Kafka(fsync) holds.
- `vs_kafka_cluster_latency`: the same on 3 nodes, replication factor 3: a Krill cluster (one
  shard per node, bench/cluster_nodes.py) beside a 3-node KRaft Kafka, both fsync per batch.

The peers come from `make peers` (bench/peers/fetch.py); their version, heap and settings are
in each line (`sides`). Everything runs on this one machine: every side's processes and the
client share its cores, as they share them for every side.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from bench.broker import Broker, log, tree_cpu_seconds, tree_rss_mib
from bench.cluster import PARTITIONS, VALUE_BYTES, Side, _median, _range
from bench.cluster_nodes import NODES, Cluster
from bench.peers.kafka import KafkaCluster
from bench.peers.tansu import Tansu
from bench.report import CaseError, case_failed, finish, header, ratio

__all__ = ["VS_KAFKA_CASES"]

# The targets (#28).
TARGET_MSGS_OVER_KAFKA_FSYNC = 1.0  # throughput, 1 node: Krill / Kafka(fsync) >= 1.0
TARGET_CPU_PER_GB_OVER_KAFKA_FSYNC = 1.5  # broker CPU per GB: Krill / Kafka(fsync) <= 1.5
TARGET_P99_OVER_KAFKA_FSYNC = 1.0  # p99 at each rate Kafka(fsync) holds: <= 1.0

RATES = (5_000, 10_000, 25_000, 50_000, 100_000, 150_000)
QUICK_RATES = (5_000, 25_000)
CLUSTER_RATES = (5_000, 10_000, 25_000, 50_000)
HOLD_SHARE = 0.95  # a side holds a rate when it achieves this share of it ...
HOLD_P99_MS = 1_000.0  # ... and its p99 from the schedule stays under this


class _Peer:
    """A started side's figures for the line: what it is, its CPU and memory."""

    def __init__(self, name: str, describe: dict[str, Any], bootstrap: str, replicas: int,
                 cpu: Callable[[], float], rss: Callable[[], float],
                 check: Callable[[], None]) -> None:
        self.side = Side(name, bootstrap, replicas, cpu, check)
        self.side.res.update(describe)
        self.rss = rss

    @property
    def name(self) -> str:
        return self.side.name


def _krill(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    broker = stack.enter_context(Broker(smp=os.cpu_count() or 1, krill=args.krill,
                                        data_root=args.data_root, keep=args.keep))

    def check() -> None:
        if not broker.alive():
            raise CaseError(f"krill died: {broker.log_tail(3)}")

    describe = {"broker": "krill", "nodes": 1, "smp": broker.smp, "fsync_per_batch": True}
    return _Peer("krill", describe, broker.bootstrap, 1, lambda: tree_cpu_seconds(broker.pid),
                 lambda: tree_rss_mib(broker.pid), check)


def _kafka(stack: ExitStack, args: argparse.Namespace, *, nodes: int, fsync: bool) -> _Peer:
    kafka = stack.enter_context(KafkaCluster(nodes=nodes, fsync=fsync, data_root=args.data_root,
                                             keep=args.keep))
    name = "kafka_fsync" if fsync else "kafka_page_cache"
    return _Peer(name, kafka.describe(), kafka.bootstrap, nodes, kafka.cpu_seconds,
                 kafka.rss_mib, kafka.check)


def _tansu(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    tansu = stack.enter_context(Tansu(data_root=args.data_root))
    return _Peer("tansu", tansu.describe(), tansu.bootstrap, 1, tansu.cpu_seconds,
                 tansu.rss_mib, tansu.check)


def _krill_cluster(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    cluster = stack.enter_context(Cluster(args))
    describe = {"broker": "krill", "nodes": NODES, "smp": 1, "fsync_per_batch": True}
    return _Peer("krill", describe, cluster.bootstrap, NODES, cluster.cpu_seconds,
                 cluster.rss_mib, cluster.live_check())


def _abba(rounds: int, peers: list[_Peer]) -> Iterator[tuple[int, _Peer]]:
    for r in range(rounds):
        for peer in peers if r % 2 == 0 else reversed(peers):
            yield r, peer


WARM_MESSAGES = 30_000  # per side, untimed: enough for the JVM's JIT to compile the hot paths
QUICK_WARM_MESSAGES = 3_000


def _warm(peers: list[_Peer], value: bytes, args: argparse.Namespace) -> None:
    """Untimed: connections, producer ids, code paths, the JIT."""
    n = QUICK_WARM_MESSAGES if args.quick else WARM_MESSAGES
    for peer in peers:
        peer.side.next_topic()
        peer.side.produce(n, value, args)
        peer.side.res["warm_up_messages"] = n


# --------------------------------------------------------------------------- throughput


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    case = "vs_kafka_throughput"
    rounds = args.rounds or (2 if args.quick else 4)
    n = args.messages or (20_000 if args.quick else 200_000)
    res = header(case, args)
    res.update({"value_bytes": VALUE_BYTES, "partitions": PARTITIONS, "messages_per_round": n,
                "rounds": rounds, "acks": "all", "idempotent": True, "client": "confluent-kafka"})
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    peers: list[_Peer] = []
    try:
        with ExitStack() as stack:
            peers = [_krill(stack, args), _kafka(stack, args, nodes=1, fsync=True),
                     _kafka(stack, args, nodes=1, fsync=False), _tansu(stack, args)]
            res["sides"] = {p.name: p.side.res for p in peers}
            _warm(peers, value, args)
            for r, peer in _abba(rounds, peers):
                peer.side.next_topic()
                out = peer.side.produce(n, value, args)
                peer.side.res["rounds"].append(out)
                log(f"{case} round {r + 1}/{rounds} {peer.name}: {out['msgs_per_s']} msg/s, "
                    f"{out['broker_cpu_s_per_gb']} CPU-s/GB")
            for peer in peers:
                peer.side.res["rss_end_mib"] = round(peer.rss(), 1)
    except Exception as e:
        case_failed(res, case, e)
    _summarise_throughput(res, peers)
    return finish(res, t0)


def _summarise_throughput(res: dict[str, Any], peers: list[_Peer]) -> None:
    by_name = {p.name: p.side.res for p in peers}
    for side in by_name.values():
        rs = side.get("rounds", [])
        side["msgs_per_s_median"] = _median(r["msgs_per_s"] for r in rs)
        side["msgs_per_s_range"] = _range(r["msgs_per_s"] for r in rs)
        side["broker_cpu_s_per_gb_median"] = _median(r["broker_cpu_s_per_gb"] for r in rs)
        side["broker_cpu_s_per_gb_range"] = _range(r["broker_cpu_s_per_gb"] for r in rs)
    krill = by_name.get("krill")
    if krill is None:
        return
    for name, peer in by_name.items():
        if name == "krill":
            continue
        pairs = list(zip(krill.get("rounds", []), peer.get("rounds", []), strict=False))
        msgs = [ratio(k["msgs_per_s"], p["msgs_per_s"]) for k, p in pairs]
        cpu = [ratio(k["broker_cpu_s_per_gb"], p["broker_cpu_s_per_gb"]) for k, p in pairs]
        res[f"krill_over_{name}_msgs_per_s_by_round"] = msgs
        res[f"krill_over_{name}_msgs_per_s_median"] = _median(msgs)
        res[f"krill_over_{name}_msgs_per_s_range"] = _range(msgs)
        res[f"krill_over_{name}_cpu_per_gb_by_round"] = cpu
        res[f"krill_over_{name}_cpu_per_gb_median"] = _median(cpu)
        res[f"krill_over_{name}_cpu_per_gb_range"] = _range(cpu)
    msgs_median = res.get("krill_over_kafka_fsync_msgs_per_s_median")
    cpu_median = res.get("krill_over_kafka_fsync_cpu_per_gb_median")
    res["target_met"] = {
        "msgs_per_s_ge_1_0x_kafka_fsync": None if msgs_median is None
        else msgs_median >= TARGET_MSGS_OVER_KAFKA_FSYNC,
        "cpu_per_gb_le_1_5x_kafka_fsync": None if cpu_median is None
        else cpu_median <= TARGET_CPU_PER_GB_OVER_KAFKA_FSYNC,
    }


# --------------------------------------------------------------------------- latency


def _latency(case: str, args: argparse.Namespace, rates: tuple[int, ...],
             start: Callable[[ExitStack], list[_Peer]]) -> dict[str, Any]:
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.fixed_seconds or (2.0 if args.quick else 5.0)
    res = header(case, args)
    res.update({"value_bytes": VALUE_BYTES, "partitions": PARTITIONS, "rates": list(rates),
                "rounds": rounds, "seconds_per_rate": seconds, "acks": "all",
                "idempotent": True, "client": "confluent-kafka",
                "holds": {"achieved_share_ge": HOLD_SHARE, "p99_from_schedule_ms_le": HOLD_P99_MS}})
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    peers: list[_Peer] = []
    try:
        with ExitStack() as stack:
            peers = start(stack)
            res["sides"] = {p.name: p.side.res for p in peers}
            _warm(peers, value, args)
            held = {p.name: True for p in peers}
            for rate in rates:
                live = [p for p in peers if held[p.name]]
                if not live:
                    break
                for r, peer in _abba(rounds, live):
                    out = peer.side.fixed(rate, seconds, value, args)
                    fixed = peer.side.res["fixed_rate"].setdefault(str(rate), {"rounds": []})
                    fixed["rounds"].append(out)
                    lat = out["latency_from_schedule_ms"]
                    log(f"{case} {rate} msg/s {r + 1}/{rounds} {peer.name}: achieved "
                        f"{out['achieved_msgs_per_s']}, from schedule p50 {lat.get('p50')} "
                        f"p99 {lat.get('p99')} p99.9 {lat.get('p99_9')} ms")
                for peer in live:
                    fixed = peer.side.res["fixed_rate"][str(rate)]
                    fixed["held"] = all(_holds(rate, out) for out in fixed["rounds"])
                    held[peer.name] = fixed["held"]
    except Exception as e:
        case_failed(res, case, e)
    _summarise_latency(res, peers)
    return finish(res, t0)


def _holds(rate: int, out: dict[str, Any]) -> bool:
    p99 = out["latency_from_schedule_ms"].get("p99")
    return (out["achieved_msgs_per_s"] >= HOLD_SHARE * rate and p99 is not None
            and p99 <= HOLD_P99_MS)


def _summarise_latency(res: dict[str, Any], peers: list[_Peer]) -> None:
    by_name = {p.name: p.side.res for p in peers}
    for side in by_name.values():
        for fixed in side.get("fixed_rate", {}).values():
            frs = fixed["rounds"]
            for q in ("p50", "p99", "p99_9"):
                values = [r["latency_from_schedule_ms"].get(q) for r in frs]
                fixed[f"{q}_ms_median"] = _median(values)
                fixed[f"{q}_ms_range"] = _range(values)
            fixed["achieved_msgs_per_s_median"] = _median(r["achieved_msgs_per_s"] for r in frs)
            fixed["broker_cpu_s_median"] = _median(r["broker_cpu_s"] for r in frs)
        held = [int(rate) for rate, f in side.get("fixed_rate", {}).items() if f.get("held")]
        side["highest_rate_held"] = max(held) if held else None
    krill, kafka = by_name.get("krill"), by_name.get("kafka_fsync")
    if krill is None or kafka is None:
        return
    ratios: dict[str, float | None] = {}
    for rate, theirs in kafka.get("fixed_rate", {}).items():
        ours = krill.get("fixed_rate", {}).get(rate)
        if theirs.get("held") and ours is not None:
            ratios[rate] = ratio(ours["p99_ms_median"], theirs["p99_ms_median"])
    res["krill_over_kafka_fsync_p99_by_rate"] = ratios
    values = [v for v in ratios.values() if v is not None]
    res["target_met"] = {
        "p99_le_1_0x_kafka_fsync_at_every_rate_it_holds": None if not values
        else all(v <= TARGET_P99_OVER_KAFKA_FSYNC for v in values),
    }


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    rates = QUICK_RATES if args.quick else RATES
    return _latency("vs_kafka_latency", args, rates, lambda stack: [
        _krill(stack, args), _kafka(stack, args, nodes=1, fsync=True),
        _kafka(stack, args, nodes=1, fsync=False), _tansu(stack, args)])


def run_cluster_latency(args: argparse.Namespace) -> dict[str, Any]:
    rates = QUICK_RATES[:1] if args.quick else CLUSTER_RATES
    return _latency("vs_kafka_cluster_latency", args, rates, lambda stack: [
        _krill_cluster(stack, args), _kafka(stack, args, nodes=NODES, fsync=True)])


VS_KAFKA_CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "vs_kafka_throughput": run_throughput,
    "vs_kafka_latency": run_latency,
    "vs_kafka_cluster_latency": run_cluster_latency,
}
