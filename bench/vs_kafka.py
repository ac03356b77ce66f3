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
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from bench import ceilings as ceil
from bench.broker import Broker, RssSampler, log, tree_cpu_seconds, tree_rss_mib
from bench.clients import (
    MB,
    Deliveries,
    consume_all,
    flush_deliveries,
    produce_max,
    wait_room,
)
from bench.cluster import PARTITIONS, VALUE_BYTES, Side, median_of, producer_config, range_of
from bench.cluster_nodes import NODES, Cluster, create_topic
from bench.measure import ErrorLog, StatsCollector, liveness
from bench.peers.kafka import KafkaCluster
from bench.peers.tansu import Tansu
from bench.report import CaseError, case_failed, finish, header, ratio
from bench.running import evict_page_cache

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
                 check: Callable[[], None], pid: int = 0,
                 data_dir: Path | None = None) -> None:
        self.side = Side(name, bootstrap, replicas, cpu, check)
        self.side.res.update(describe)
        self.rss = rss
        self.pid = pid  # a one-node side's process (its tree's CPU is the broker's)
        self.data_dir = data_dir  # where its partitions' directories are (None: memory)

    @property
    def name(self) -> str:
        return self.side.name


def _krill(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    broker = stack.enter_context(Broker(smp=os.cpu_count() or 1, krill=args.krill,
                                        data_root=args.data_root, keep=args.keep))
    describe = {"broker": "krill", "nodes": 1, "smp": broker.smp, "fsync_per_batch": True}
    return _Peer("krill", describe, broker.bootstrap, 1, lambda: tree_cpu_seconds(broker.pid),
                 lambda: tree_rss_mib(broker.pid), liveness(broker), broker.pid,
                 Path(broker.data_dir))


def _kafka(stack: ExitStack, args: argparse.Namespace, *, nodes: int, fsync: bool) -> _Peer:
    kafka = stack.enter_context(KafkaCluster(nodes=nodes, fsync=fsync, data_root=args.data_root,
                                             keep=args.keep))
    name = "kafka_fsync" if fsync else "kafka_page_cache"
    return _Peer(name, kafka.describe(), kafka.bootstrap, nodes, kafka.cpu_seconds,
                 kafka.rss_mib, kafka.check, kafka.pids[0], kafka.nodes[0].log_dir)


def _tansu(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    tansu = stack.enter_context(Tansu(data_root=args.data_root))
    return _Peer("tansu", tansu.describe(), tansu.bootstrap, 1, tansu.cpu_seconds,
                 tansu.rss_mib, tansu.check, tansu.pid)


def _krill_cluster(stack: ExitStack, args: argparse.Namespace) -> _Peer:
    cluster = stack.enter_context(Cluster(args))
    describe = {"broker": "krill", "nodes": NODES, "smp": 1, "fsync_per_batch": True}
    return _Peer("krill", describe, cluster.bootstrap, NODES, cluster.cpu_seconds,
                 cluster.rss_mib, cluster.live_check())


def _one_node_sides(stack: ExitStack, args: argparse.Namespace) -> list[_Peer]:
    """Krill, Kafka with an fsync per batch, Kafka on the page cache, tansu: one node each."""
    return [_krill(stack, args), _kafka(stack, args, nodes=1, fsync=True),
            _kafka(stack, args, nodes=1, fsync=False), _tansu(stack, args)]


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
            peers = _one_node_sides(stack, args)
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
        side["msgs_per_s_median"] = median_of(r["msgs_per_s"] for r in rs)
        side["msgs_per_s_range"] = range_of(r["msgs_per_s"] for r in rs)
        side["broker_cpu_s_per_gb_median"] = median_of(r["broker_cpu_s_per_gb"] for r in rs)
        side["broker_cpu_s_per_gb_range"] = range_of(r["broker_cpu_s_per_gb"] for r in rs)
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
        res[f"krill_over_{name}_msgs_per_s_median"] = median_of(msgs)
        res[f"krill_over_{name}_msgs_per_s_range"] = range_of(msgs)
        res[f"krill_over_{name}_cpu_per_gb_by_round"] = cpu
        res[f"krill_over_{name}_cpu_per_gb_median"] = median_of(cpu)
        res[f"krill_over_{name}_cpu_per_gb_range"] = range_of(cpu)
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
                fixed[f"{q}_ms_median"] = median_of(values)
                fixed[f"{q}_ms_range"] = range_of(values)
            fixed["achieved_msgs_per_s_median"] = median_of(r["achieved_msgs_per_s"] for r in frs)
            fixed["broker_cpu_s_median"] = median_of(r["broker_cpu_s"] for r in frs)
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
    return _latency("vs_kafka_latency", args, rates,
                    lambda stack: _one_node_sides(stack, args))


def run_cluster_latency(args: argparse.Namespace) -> dict[str, Any]:
    rates = QUICK_RATES[:1] if args.quick else CLUSTER_RATES
    return _latency("vs_kafka_cluster_latency", args, rates, lambda stack: [
        _krill_cluster(stack, args), _kafka(stack, args, nodes=NODES, fsync=True)])


# --------------------------------------------------------------------------- consume


CONSUME_BYTES = 1_000_000_000  # written once per side, then read back cold and warm
QUICK_CONSUME_BYTES = 50_000_000


def run_consume(args: argparse.Namespace) -> dict[str, Any]:
    """1 GB written into 6 partitions, then read back from offset 0 by one consumer: first
    cold (the side's segment files dropped from the page cache), then warm. tansu keeps its
    records in memory: its cold read is a warm one."""
    case = "vs_kafka_consume"
    total = QUICK_CONSUME_BYTES if args.quick else CONSUME_BYTES
    n = args.messages or total // VALUE_BYTES
    res = header(case, args)
    res.update({"value_bytes": VALUE_BYTES, "partitions": PARTITIONS, "messages": n,
                "client": "confluent-kafka"})
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    peers: list[_Peer] = []
    try:
        with ExitStack() as stack:
            peers = [_krill(stack, args), _kafka(stack, args, nodes=1, fsync=True),
                     _tansu(stack, args)]
            res["sides"] = {p.name: p.side.res for p in peers}
            for peer in peers:
                peer.side.next_topic()
                out = produce_max(peer.side.bootstrap, peer.side.topic, n, value, PARTITIONS,
                                  timeout=args.phase_timeout * 5, stall_timeout=args.stall_timeout,
                                  check=peer.side.check, broker_pid=peer.pid)
                peer.side.res["written_msgs_per_s"] = out["msgs_per_s"]
            for how in ("cold", "warm"):
                for peer in peers:
                    left = _drop_cache(peer) if how == "cold" else None
                    out = consume_all(peer.side.bootstrap, peer.side.topic, PARTITIONS, n,
                                      stall_timeout=args.stall_timeout,
                                      timeout=args.phase_timeout * 5, check=peer.side.check,
                                      broker_pid=peer.pid)
                    out["cached_bytes_left_before"] = left
                    peer.side.res[how] = out
                    log(f"{case} {how} {peer.name}: {out['msgs_per_s']} msg/s, "
                        f"{out['mb_per_s']} MB/s")
    except Exception as e:
        case_failed(res, case, e)
    by_name = {p.name: p.side.res for p in peers}
    krill = by_name.get("krill", {})
    for name, side in by_name.items():
        if name != "krill":
            for how in ("cold", "warm"):
                ours, theirs = krill.get(how), side.get(how)
                if ours and theirs:
                    res[f"krill_over_{name}_{how}_msgs_per_s"] = ratio(ours["msgs_per_s"],
                                                                      theirs["msgs_per_s"])
    return finish(res, t0)


def _drop_cache(peer: _Peer) -> int | None:
    """Drop the side's segment files of its topic from the page cache; the bytes still
    cached after (None: a memory broker)."""
    if peer.data_dir is None:
        return None
    topic = peer.side.topic
    return sum(evict_page_cache(peer.data_dir / f"{topic}-{k}") for k in range(PARTITIONS))


# --------------------------------------------------------------------------- end to end

E2E_RATE = 10_000


def run_end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """A producer at a fixed rate and a consumer in this process reading the same topic as
    it grows: each message's latency from its scheduled send time (in its first 8 bytes) to
    the consumer's poll returning it, through the broker's flush and high watermark."""
    case = "vs_kafka_end_to_end"
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.fixed_seconds or (2.0 if args.quick else 10.0)
    res = header(case, args)
    res.update({"value_bytes": VALUE_BYTES, "partitions": PARTITIONS, "rate": E2E_RATE,
                "seconds": seconds, "rounds": rounds, "acks": "all", "idempotent": True,
                "client": "confluent-kafka", "consumer": "assign, fetch.wait.max.ms 10"})
    t0 = time.monotonic()
    peers: list[_Peer] = []
    try:
        with ExitStack() as stack:
            peers = _one_node_sides(stack, args)
            res["sides"] = {p.name: p.side.res for p in peers}
            _warm(peers, os.urandom(VALUE_BYTES), args)
            for r, peer in _abba(rounds, peers):
                peer.side.next_topic()
                out = _e2e_round(peer, E2E_RATE, seconds, args)
                peer.side.res["rounds"].append(out)
                lat = out["latency_ms"]
                log(f"{case} {r + 1}/{rounds} {peer.name}: p50 {lat.get('p50')} p99 "
                    f"{lat.get('p99')} p99.9 {lat.get('p99_9')} ms")
    except Exception as e:
        case_failed(res, case, e)
    by_name = {p.name: p.side.res for p in peers}
    for side in by_name.values():
        for q in ("p50", "p99", "p99_9"):
            values = [r["latency_ms"].get(q) for r in side.get("rounds", [])]
            side[f"{q}_ms_median"] = median_of(values)
            side[f"{q}_ms_range"] = range_of(values)
    krill = by_name.get("krill", {})
    for name, side in by_name.items():
        if name != "krill":
            res[f"krill_over_{name}_p99"] = ratio(krill.get("p99_ms_median"),
                                                  side.get("p99_ms_median"))
    return finish(res, t0)


_STAMP = struct.Struct("<d")


def _e2e_round(peer: _Peer, rate: int, seconds: float,
               args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

    side, total = peer.side, int(rate * seconds)
    latencies: list[float] = []
    consumer = Consumer({"bootstrap.servers": side.bootstrap, "group.id": "bench-e2e",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(side.topic, k, OFFSET_END) for k in range(PARTITIONS)])
    consumer.consume(num_messages=1, timeout=1.0)  # connected and positioned before sending
    stop = threading.Event()

    def read() -> None:
        pc, unpack = time.perf_counter, _STAMP.unpack_from
        while len(latencies) < total and not stop.is_set():
            # Whatever has arrived, within 5 ms: a batch's wait must not add to its latency.
            for m in consumer.consume(num_messages=10_000, timeout=0.005):
                value = m.value()
                if m.error() is None and value is not None:
                    latencies.append(pc() - unpack(value)[0])

    reader = threading.Thread(target=read, name="e2e-reader", daemon=True)
    reader.start()
    stats, errors = StatsCollector(), ErrorLog("producer(e2e)")
    p = Producer(producer_config(side.bootstrap, stats, errors))
    dr, pad = Deliveries(), os.urandom(VALUE_BYTES - _STAMP.size)
    pc = time.perf_counter
    for k in range(PARTITIONS):  # connected, its producer id, every leader known: untimed
        p.produce(side.topic, _STAMP.pack(pc()) + pad, partition=k)
    flush_deliveries(p, dr, time.monotonic() + 30, side.check, args.stall_timeout)
    seen_by = time.monotonic() + 30
    while len(latencies) < PARTITIONS:  # and the consumer has read them
        if time.monotonic() > seen_by:
            raise CaseError(f"{peer.name}: the consumer did not read the warm-up messages")
        time.sleep(0.01)
    latencies.clear()
    cpu0 = side.cpu()
    t_start = pc()
    deadline = time.monotonic() + seconds * 3 + 30
    for i in range(total):
        due = t_start + i / rate
        while (now := pc()) < due:
            p.poll(min(0.001, due - now))
        while True:
            try:
                p.produce(side.topic, _STAMP.pack(due) + pad, partition=i % PARTITIONS,
                          on_delivery=partial(dr.cb, due))
                break
            except BufferError:
                wait_room(p, dr, deadline, side.check, args.stall_timeout)
    flush_deliveries(p, dr, deadline, side.check, args.stall_timeout)
    reader.join(timeout=max(1.0, deadline - time.monotonic()))
    stop.set()
    reader.join(timeout=5)
    consumer.close()
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors end to end; first: {dr.first_error}")
    if len(latencies) < total:
        raise CaseError(f"the consumer read {len(latencies)} of {total} messages")
    return {"messages": total, "latency_ms": ceil.latency_summary_ms(latencies),
            "broker_cpu_s": round(side.cpu() - cpu0, 3),
            "mb_per_s_offered": round(rate * VALUE_BYTES / MB, 2)}


# --------------------------------------------------------------------------- Spark's source

TARGET_SPARK_KAFKA_SOURCE_OVER_KAFKA = 0.8  # Spark's Kafka source: Krill / Kafka rows/s
SPARK_RECORDS, QUICK_SPARK_RECORDS = 1_000_000, 200_000
SPARK_VALUE_BYTES = 100
SPARK_PARTITIONS = 4


def run_spark_source(args: argparse.Namespace) -> dict[str, Any]:
    """The same records (100-byte values over 4 partitions) in Krill and in Kafka, read
    whole into Spark's `noop` sink by Spark's own Kafka source (`format("kafka")`, the
    connector `make peers` fetches) from each, and by Krill's data source (`format("krill")`)
    from Krill, in turns in one warm `local[2]` session: rows/s, the CPU of Spark's JVM and
    its Python workers per row, and the peak RSS of Spark's processes."""
    from bench.spark_reader import SparkReads, in_turns, medians  # PySpark: imported here

    case = "vs_kafka_spark_source"
    rounds = args.rounds or (2 if args.quick else 5)
    n = args.messages or (QUICK_SPARK_RECORDS if args.quick else SPARK_RECORDS)
    res = header(case, args)
    res.update({"records": n, "value_bytes": SPARK_VALUE_BYTES, "partitions": SPARK_PARTITIONS,
                "rounds": rounds, "spark": "local[2]"})
    value = os.urandom(SPARK_VALUE_BYTES)
    t0 = time.monotonic()
    try:
        with ExitStack() as stack:
            broker = stack.enter_context(Broker(smp=os.cpu_count() or 1, krill=args.krill,
                                                data_root=args.data_root, keep=args.keep))
            kafka = stack.enter_context(KafkaCluster(nodes=1, fsync=True,
                                                     data_root=args.data_root, keep=args.keep))
            res["sides"] = {"krill": {"broker": "krill", "smp": broker.smp},
                            "kafka": kafka.describe()}
            topic = "spark-source"
            for bootstrap, pid, check in ((broker.bootstrap, broker.pid, liveness(broker)),
                                          (kafka.bootstrap, kafka.pids[0], kafka.check)):
                create_topic(bootstrap, topic, SPARK_PARTITIONS, 1)
                produce_max(bootstrap, topic, n, value, SPARK_PARTITIONS,
                            timeout=args.phase_timeout * 5, stall_timeout=args.stall_timeout,
                            check=check, broker_pid=pid)
            reads = SparkReads(broker.reader_address, kafka_connector=True)
            stack.callback(reads.stop)
            ways = {
                "kafka_source_from_krill": lambda: reads.read_kafka(broker.bootstrap, topic, n),
                "kafka_source_from_kafka": lambda: reads.read_kafka(kafka.bootstrap, topic, n),
                "krill_source_from_krill": lambda: reads.read(topic, n),
            }
            with RssSampler(reads.jvm_pid) as rss:
                runs = in_turns(ways, rounds)
            res["ways"] = medians(runs)
            res["spark_rss_peak_mib"] = round(rss.peak_mib, 1)
    except Exception as e:
        case_failed(res, case, e)
    ways_res = res.get("ways", {})
    ours = ways_res.get("kafka_source_from_krill", {}).get("rows_per_s")
    theirs = ways_res.get("kafka_source_from_kafka", {}).get("rows_per_s")
    res["kafka_source_krill_over_kafka_rows_per_s"] = ratio(ours, theirs)
    got = res["kafka_source_krill_over_kafka_rows_per_s"]
    res["target_met"] = {"kafka_source_krill_ge_0_8x_kafka": None if got is None
                         else got >= TARGET_SPARK_KAFKA_SOURCE_OVER_KAFKA}
    return finish(res, t0)


VS_KAFKA_CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "vs_kafka_throughput": run_throughput,
    "vs_kafka_latency": run_latency,
    "vs_kafka_cluster_latency": run_cluster_latency,
    "vs_kafka_end_to_end": run_end_to_end,
    "vs_kafka_consume": run_consume,
    "vs_kafka_spark_source": run_spark_source,
}
