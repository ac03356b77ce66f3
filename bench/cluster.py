"""Issue #17's cluster benchmark: 3 nodes x RF=3 beside 1 node x RF=1, failover, a follower
catching up, and what an idle cluster's heartbeats cost.

Four cases, each starting its own nodes (`krill start --seeds ...`, one process group per
node, `--smp 1`, free 127.0.0.1 ports, data under one temp dir):

- `cluster_vs_single`: a 1-node `--smp 1` broker (RF=1) and a 3-node cluster (RF=3), both
  running for the whole case, the same client (confluent-kafka, `acks=all`, idempotent):
  produce rounds in ABBA order (each into a fresh topic of 6 partitions, 1 KiB values), then
  fixed offered rates (5k and 20k msg/s) per side, again ABBA. Target: the cluster's msg/s at
  least 0.25x the single node's (median of the per-round ratios).
- `cluster_failover`: a 3-node cluster under a paced producer; the node leading the most
  partitions is killed with -9 (or stopped with SIGTERM: leadership transfer), alternating,
  and restarted after each. Per stop: the time until a survivor says it leads each partition
  that node led (its admin API), and until each of them has acknowledged a message again.
  Targets: <= 3 s after kill -9 at the default election timeout, <= 0.5 s after SIGTERM
  (medians; the maxima beside them).
- `cluster_catch_up`: a follower stopped (SIGTERM), N MB produced to the other two, the
  follower restarted; the time until its log end equals the leader's on every partition,
  read from each node's admin API (bench/cluster_nodes.py).
- `cluster_idle_heartbeats`: 1,000 partitions x RF=3 created, nothing produced: each node's
  CPU (its process group, from the CPU clocks of /proc's processes) over 30 s, as a share of
  one core; before the topic, the same for the bare cluster. Target: < 10% of a core per
  node.

    python -m bench.run --case cluster_vs_single --case cluster_failover \
        --case cluster_catch_up --case cluster_idle_heartbeats [--quick]

See bench/README.md ("Cluster") for every field.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from bench import ceilings as ceil
from bench.broker import (
    Broker,
    log,
    process_cpu_seconds,
    start_time,
    tree_cpu_seconds,
    tree_rss_mib,
)
from bench.clients import (
    MB,
    Deliveries,
    close_bounded,
    flush_deliveries,
    max_rate_figures,
    send_all,
    send_paced,
)
from bench.cluster_nodes import (
    NODES,
    POLL_S,
    Cluster,
    ClusterNode,
    catch_up_state,
    create_topic,
    delete_topic,
    dir_bytes,
    leaders_by_node,
    node_processes,
    replicas,
    wait_caught_up,
)
from bench.measure import ErrorLog, StatsCollector
from bench.report import CaseError, case_failed, finish, header

__all__ = ["CLUSTER_CASES", "FAILOVER_KINDS"]

# The targets.
TARGET_CLUSTER_OVER_SINGLE_MSGS = 0.25  # 3 nodes x RF=3 produce msg/s over 1 node x RF=1
TARGET_FAILOVER_KILL_S = 3.0  # kill -9 of a leader: every partition writable again
TARGET_FAILOVER_SIGTERM_S = 0.5  # clean stop: leadership transfer
TARGET_IDLE_CORE_SHARE = 0.10  # an idle node with 1,000 partitions x RF=3, of one core

VALUE_BYTES = 1024
PARTITIONS = 6  # the produce_consume_1k_x6 workload
FIXED_RATES = (5_000, 20_000)  # offered msg/s of the latency phases
IDLE_PARTITIONS = 1_000
FAILOVER_WINDOW_S = 20.0  # a stop not recovered from within this is an error
CATCH_UP_TIMEOUT_S = 300.0  # a restarted follower to have the leaders' log ends
ADMIN_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------- the client


def producer_config(
    bootstrap: str, stats: StatsCollector, errors: ErrorLog, **more: Any
) -> dict[str, Any]:
    """The bench's producer (bench/run.py's), idempotent: acks=all, linger.ms 5."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "statistics.interval.ms": 500,
        "stats_cb": stats.cb,
        "error_cb": errors.cb,
        "message.timeout.ms": 60_000,
        **more,
    }


def _warm_up(p: Any, topic: str, partitions: int, check: Callable[[], None]) -> None:
    """One message per partition, acknowledged before any clock starts (connections, the
    producer id, Metadata)."""
    dr = Deliveries()
    for k in range(partitions):
        p.produce(topic, b"warm-up", partition=k, on_delivery=partial(dr.cb, time.perf_counter()))
    flush_deliveries(p, dr, time.monotonic() + 60, check)
    if dr.errors:
        raise CaseError(f"warm-up failed: {dr.first_error}")


def produce_max(
    bootstrap: str, topic: str, n: int, value: bytes, partitions: int, *,
    cpu: Callable[[], float], check: Callable[[], None], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """bench/run.py's `produce_max` with the idempotent producer and the CPU of any set of
    processes (`cpu`: one node's tree, or three)."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer"), Deliveries()
    p = Producer(producer_config(bootstrap, stats, errors))
    _warm_up(p, topic, partitions, check)
    stats.wait_fresh(p)
    reqs0, txb0 = stats.produce_requests() or 0, stats.tx_bytes() or 0
    deadline = time.monotonic() + args.phase_timeout
    cpu_b0, cpu_c0 = cpu(), time.process_time()
    t_start = time.perf_counter()
    t_sent = send_all(p, dr, topic, value, n, partitions, deadline, check, args.stall_timeout)
    flush_deliveries(p, dr, deadline, check, args.stall_timeout)
    cpu_b1, cpu_c1 = cpu(), time.process_time()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors; first: {dr.first_error}")
    out = max_rate_figures(
        n, len(value), dr.last_t - t_start, t_sent - t_start, _Since(stats, reqs0, txb0),
        cpu_b1 - cpu_b0, cpu_c1 - cpu_c0, errors,
    )  # fmt: skip
    out["latency_ms"] = ceil.latency_summary_ms(dr.latencies)
    out["broker_cpu_s_per_gb"] = round(out["broker_cpu_s"] / (n * len(value) / 1e9), 3)
    close_bounded(p, "producer")
    return out


class _Since:
    """A StatsCollector's request and byte counts less those before the timed phase."""

    def __init__(self, stats: StatsCollector, reqs0: int, txb0: int) -> None:
        self.stats, self.reqs0, self.txb0 = stats, reqs0, txb0

    def produce_requests(self) -> int | None:
        reqs = self.stats.produce_requests()
        return None if reqs is None else reqs - self.reqs0

    def tx_bytes(self) -> int | None:
        txb = self.stats.tx_bytes()
        return None if txb is None else txb - self.txb0


def produce_fixed_rate(
    bootstrap: str, topic: str, value: bytes, partitions: int, *, rate: int, seconds: float,
    cpu: Callable[[], float], check: Callable[[], None], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """bench/run.py's `produce_fixed_rate` (its `send_paced`; latency from produce() to the
    delivery report) with the idempotent producer. Also the latency
    from each message's scheduled time (`latency_from_schedule_ms`), which counts the time
    a loop that fell behind kept it waiting."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer(fixed)"), Deliveries()
    p = Producer(producer_config(bootstrap, stats, errors))
    _warm_up(p, topic, partitions, check)
    stats.wait_fresh(p)
    reqs0 = stats.produce_requests() or 0
    scheduled = Deliveries()  # the same reports, timed from the schedule

    def both(t_call: float, t_due: float, err: Any, msg: Any) -> None:
        dr.cb(t_call, err, msg)
        scheduled.cb(t_due, err, msg)

    cpu_b0, cpu_c0 = cpu(), time.process_time()
    sent = send_paced(p, dr, topic, value, partitions, rate=rate, seconds=seconds,
                      report=lambda t_call, t_due: partial(both, t_call, t_due), check=check,
                      stall_timeout=args.stall_timeout)
    cpu_b1, cpu_c1 = cpu(), time.process_time()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors at fixed rate; first: {dr.first_error}")
    close_bounded(p, "producer")
    return {
        "target_msgs_per_s": rate,
        "achieved_msgs_per_s": round(sent.messages / sent.seconds, 1),
        "seconds": round(sent.seconds, 3),
        "messages": sent.messages,
        "max_backlog_msgs": sent.max_backlog,
        "latency_ms": ceil.latency_summary_ms(dr.latencies),
        "latency_from_schedule_ms": ceil.latency_summary_ms(scheduled.latencies),
        "produce_requests": (stats.produce_requests() or 0) - reqs0,
        "broker_cpu_s": round(cpu_b1 - cpu_b0, 3),
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
    }


def median_of(values: Any) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def range_of(values: Any) -> list[float] | None:
    values = [v for v in values if v is not None]
    return [round(min(values), 3), round(max(values), 3)] if values else None


def ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# --------------------------------------------------------------------------- cluster_vs_single


class Side:
    """One set-up of `cluster_vs_single`: where its client connects, its topics' replicas,
    the CPU of its processes, and its rounds."""

    def __init__(
        self, name: str, bootstrap: str, replicas: int, cpu: Callable[[], float],
        check: Callable[[], None],
    ) -> None:  # fmt: skip
        self.name = name
        self.bootstrap = bootstrap
        self.replicas = replicas
        self.cpu = cpu
        self.check = check
        self.topic = ""
        self.topics_made = 0
        self.res: dict[str, Any] = {"replicas": replicas, "partitions": PARTITIONS,
                                    "rounds": [], "fixed_rate": {}}  # fmt: skip

    def next_topic(self) -> None:
        """Delete this side's topic, then create a fresh one: the page cache holds one
        round's data (bench/shards.py's module doc)."""
        if self.topic:
            delete_topic(self.bootstrap, self.topic)
        self.topic = f"bench-{self.name}-{self.topics_made}"
        self.topics_made += 1
        took = create_topic(self.bootstrap, self.topic, PARTITIONS, self.replicas)
        self.res.setdefault("topic_create_s", []).append(round(took, 3))

    def produce(self, n: int, value: bytes, args: argparse.Namespace) -> dict[str, Any]:
        return produce_max(self.bootstrap, self.topic, n, value, PARTITIONS,
                           cpu=self.cpu, check=self.check, args=args)  # fmt: skip

    def fixed(self, rate: int, seconds: float, value: bytes,
              args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
        return produce_fixed_rate(self.bootstrap, self.topic, value, PARTITIONS, rate=rate,
                                  seconds=seconds, cpu=self.cpu, check=self.check, args=args)


def _abba(rounds: int, a: Side, b: Side) -> Iterator[tuple[int, Side]]:
    for r in range(rounds):
        for side in (a, b) if r % 2 == 0 else (b, a):
            yield r, side


def _produce_rounds(
    a: Side, b: Side, rounds: int, n: int, value: bytes, args: argparse.Namespace
) -> None:
    for r, side in _abba(rounds, a, b):
        side.next_topic()
        out = side.produce(n, value, args)
        side.res["rounds"].append(out)
        log(f"cluster_vs_single round {r + 1}/{rounds} {side.name}: {out['msgs_per_s']} msg/s,"
            f" {out['broker_cpu_s_per_gb']} CPU-s/GB, p99 {out['latency_ms'].get('p99')} ms")


def _fixed_rounds(
    a: Side, b: Side, rounds: int, seconds: float, value: bytes, args: argparse.Namespace
) -> None:
    for rate in FIXED_RATES:
        for r, side in _abba(rounds, a, b):
            out = side.fixed(rate, seconds, value, args)
            side.res["fixed_rate"].setdefault(str(rate), {"rounds": []})["rounds"].append(out)
            lat = out["latency_ms"]
            log(f"cluster_vs_single {rate} msg/s {r + 1}/{rounds} {side.name}: p50 "
                f"{lat.get('p50')} p99 {lat.get('p99')} p99.9 {lat.get('p99_9')} ms")


def _summarise_sides(a: dict[str, Any], b: dict[str, Any], res: dict[str, Any]) -> None:
    """Each side's medians and ranges; the per-round ratios of `b` (the cluster) over `a`."""
    for side in (a, b):
        rs = side["rounds"]
        side["produce_median"] = {
            "msgs_per_s": median_of(r["msgs_per_s"] for r in rs),
            "msgs_per_s_range": range_of(r["msgs_per_s"] for r in rs),
            "mb_per_s": median_of(r["mb_per_s"] for r in rs),
            "broker_cpu_s_per_gb": median_of(r["broker_cpu_s_per_gb"] for r in rs),
            "latency_p99_ms": median_of(r["latency_ms"].get("p99") for r in rs),
            "msgs_per_request": median_of(r["msgs_per_request"] for r in rs),
            "client_cpu_s": median_of(r["client_cpu_s"] for r in rs),
        }
        for fixed in side["fixed_rate"].values():
            frs = fixed["rounds"]
            for q in ("p50", "p99", "p99_9"):
                values = [r["latency_ms"].get(q) for r in frs]
                fixed[f"{q}_ms_median"] = median_of(values)
                fixed[f"{q}_ms_range"] = range_of(values)
            fixed["achieved_msgs_per_s_median"] = median_of(r["achieved_msgs_per_s"] for r in frs)
            fixed["from_schedule_p99_ms_median"] = median_of(
                r["latency_from_schedule_ms"].get("p99") for r in frs)
            fixed["broker_cpu_s_median"] = median_of(r["broker_cpu_s"] for r in frs)
    pairs = list(zip(a["rounds"], b["rounds"], strict=False))
    msgs = [ratio(y["msgs_per_s"], x["msgs_per_s"]) for x, y in pairs]
    cpu = [ratio(y["broker_cpu_s_per_gb"], x["broker_cpu_s_per_gb"]) for x, y in pairs]
    res["cluster_over_single_msgs_per_s_by_round"] = msgs
    res["cluster_over_single_msgs_per_s_median"] = median_of(msgs)
    res["cluster_over_single_msgs_per_s_range"] = range_of(msgs)
    res["cluster_over_single_cpu_per_gb_by_round"] = cpu
    res["cluster_over_single_cpu_per_gb_median"] = median_of(cpu)
    for rate in FIXED_RATES:
        fa, fb = a["fixed_rate"].get(str(rate)), b["fixed_rate"].get(str(rate))
        if fa and fb:
            res[f"fixed_{rate}_p99_cluster_over_single"] = ratio(
                fb["p99_ms_median"], fa["p99_ms_median"])


def run_cluster_vs_single(args: argparse.Namespace) -> dict[str, Any]:
    rounds = args.rounds or (2 if args.quick else 10)
    fixed_rounds = 1 if args.quick else 2
    n = args.messages or (10_000 if args.quick else 200_000)
    seconds = args.fixed_seconds or (2.0 if args.quick else 5.0)
    res = header("cluster_vs_single", args)
    res["smp"] = 1
    res.update({"nodes": [1, NODES], "value_bytes": VALUE_BYTES, "partitions": PARTITIONS,
                "messages_per_round": n, "rounds": rounds, "fixed_rate_rounds": fixed_rounds,
                "fixed_rate_seconds": seconds, "acks": "all", "idempotent": True,
                "client_placement": "unpinned"})  # fmt: skip
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    broker = Broker(smp=1, krill=args.krill, data_root=args.data_root, keep=args.keep)
    cluster = Cluster(args)
    try:
        with broker, cluster:
            res["single_pid"] = broker.pid
            single = Side("single", broker.bootstrap, 1, lambda: tree_cpu_seconds(broker.pid),
                          _broker_check(broker))  # fmt: skip
            multi = Side("cluster", cluster.bootstrap, NODES, cluster.cpu_seconds,
                         cluster.live_check())  # fmt: skip
            res["single"], res["cluster"] = single.res, multi.res
            multi.res["node_cores"] = [nd.core for nd in cluster.nodes]
            for side in (single, multi):  # untimed: connections, code paths, the page cache
                side.next_topic()
                side.produce(min(n, 3_000), value, args)
            _produce_rounds(single, multi, rounds, n, value, args)
            _fixed_rounds(single, multi, fixed_rounds, seconds, value, args)
            for side, rss in ((single, tree_rss_mib(broker.pid)), (multi, cluster.rss_mib())):
                side.res["rss_end_mib"] = round(rss, 1)
    except Exception as e:
        case_failed(res, "cluster_vs_single", e, single=broker)
    finally:
        res.setdefault("single", {})["first_log_error"] = broker.first_log_error or None
        res.setdefault("cluster", {}).update(cluster.figures())
    if "rounds" in res["single"] and "rounds" in res["cluster"]:
        _summarise_sides(res["single"], res["cluster"], res)
    res["target_met"] = {
        "cluster_ge_0_25x_single_msgs_per_s": _ge(
            res.get("cluster_over_single_msgs_per_s_median"), TARGET_CLUSTER_OVER_SINGLE_MSGS),
    }
    return finish(res, t0)


def _broker_check(broker: Broker) -> Callable[[], None]:
    def check() -> None:
        if not broker.alive():
            raise CaseError(f"the single node died: {broker.log_tail(3)}")

    return check


def _ge(value: Any, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _le(value: Any, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _lt(value: Any, limit: float) -> bool | None:
    return None if value is None else value < limit


# --------------------------------------------------------------------------- cluster_failover

FAILOVER_RATE = 1_000  # msg/s of the paced producer during a trial, over the partitions
FAILOVER_VALUE_BYTES = 100
FAILOVER_BEFORE_S = 2.0  # produced before the stop
FAILOVER_AFTER_S = 1.0  # produced after every partition is writable again
FAILOVER_TRIALS = 3  # per kind; 1 with --quick
FAILOVER_KINDS = ("kill9", "sigterm")


class LeaderWatch:
    """From the stop on, asks each survivor every `POLL_S` (1) for its replicas' roles (its
    admin API) and (2) for Metadata (a Kafka request to that node itself, not to whichever
    broker a client library picks). Per partition the victim led: `led_at`, when a survivor
    first said it leads it; `metadata_at`, when every survivor's Metadata first named a
    survivor as its leader, what a client asking any of them is then told."""

    def __init__(self, survivors: list[ClusterNode], topic: str, partitions: list[int],
                 t_stop: float) -> None:  # fmt: skip
        self.survivors, self.topic, self.partitions = survivors, topic, set(partitions)
        self.t_stop = t_stop
        self.led_at: dict[int, float] = {}  # partition -> perf_counter
        self.metadata_at: dict[int, float] = {}
        self._told: dict[int, set[int]] = {}  # partition -> survivors naming a live leader
        self.polls = 0
        self.errors: list[str] = []
        self._clients: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.done():
                for nd in self.survivors:
                    self._roles(nd)
                    self._metadata(nd)
                self.polls += 1
                self._stop.wait(POLL_S)
        finally:
            for client in self._clients.values():
                client.close()

    def done(self) -> bool:
        return set(self.led_at) == set(self.metadata_at) == self.partitions

    def _error(self, nd: ClusterNode, e: Exception) -> None:
        if len(self.errors) < 5:
            self.errors.append(f"node {nd.node_id}: {type(e).__name__}: {e}")

    def _roles(self, nd: ClusterNode) -> None:
        try:
            states = replicas(nd)
        except (OSError, CaseError) as e:
            self._error(nd, e)
            return
        now = time.perf_counter()
        for p in self.partitions - set(self.led_at):
            r = states.get((self.topic, p))
            if r is not None and r["role"] == "leader":
                self.led_at[p] = now

    def _metadata(self, nd: ClusterNode) -> None:
        from tests.support.raw_client import RawClient, request

        live = {s.node_id for s in self.survivors}
        try:
            client = self._clients.get(nd.node_id)
            if client is None:
                client = self._clients[nd.node_id] = RawClient(nd.bootstrap, "bench-watch")
            answer = client.call(3, 9, request(3, topics=None))
        except Exception as e:  # OSError, a codec error on a cut answer
            self._error(nd, e)
            self._clients.pop(nd.node_id, None)
            return
        now = time.perf_counter()
        for t in answer.topics:
            if t.name != self.topic:
                continue
            for part in t.partitions:
                p = part.partition_index
                if p in self.partitions and p not in self.metadata_at and part.leader_id in live:
                    told = self._told.setdefault(p, set())
                    told.add(nd.node_id)
                    if told == live:
                        self.metadata_at[p] = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _failover_trial(
    cluster: Cluster, topic: str, kind: str, args: argparse.Namespace
) -> dict[str, Any]:
    """A paced producer; the node leading the most partitions stopped (`kind`) while it
    runs; the times until every one of them is led by a survivor and has acknowledged a
    message again; then the node started again and caught up."""
    from confluent_kafka import Producer

    by_node = leaders_by_node(cluster, topic)
    victim_id = max(by_node, key=lambda k: len(by_node[k]))
    victim = cluster.node(victim_id)
    led = by_node[victim_id]
    survivors = [nd for nd in cluster.nodes if nd is not victim]
    out: dict[str, Any] = {"kind": kind, "victim": victim_id, "victim_led": led,
                           "leaders_before": by_node}  # fmt: skip
    stats, errors = StatsCollector(), ErrorLog(f"producer(failover {kind})")
    p = Producer(producer_config(cluster.bootstrap, stats, errors))
    _warm_up(p, topic, PARTITIONS, cluster.check)
    acks: list[tuple[float, int]] = []  # (perf_counter, partition) of each success
    failed: list[str] = []

    def cb(err: Any, msg: Any) -> None:
        if err is None:
            acks.append((time.perf_counter(), msg.partition()))
        elif len(failed) < 5:
            failed.append(str(err))

    value = os.urandom(FAILOVER_VALUE_BYTES)
    pc = time.perf_counter
    t_start = pc()
    t_stop: float | None = None
    watch: LeaderWatch | None = None
    done_at: float | None = None
    exited_at: float | None = None  # a SIGTERM's node gone
    i = 0
    try:
        while True:
            now = pc()
            while i < int((now - t_start) * FAILOVER_RATE) + 1:
                try:
                    p.produce(topic, value, partition=i % PARTITIONS, on_delivery=cb)
                except BufferError:  # the client's queue is full: serve reports first
                    break
                i += 1
            p.poll(0.001)
            now = pc()
            if t_stop is None and now - t_start >= FAILOVER_BEFORE_S:
                t_stop = pc()
                if kind == "kill9":
                    victim.kill9()
                else:
                    victim.sigterm()
                watch = LeaderWatch(survivors, topic, led, t_stop)
                log(f"failover {kind}: node {victim_id} stopped (led {led})")
            elif t_stop is not None and watch is not None:
                if exited_at is None and not victim.alive():
                    exited_at = now
                if (done_at is None and watch.done()
                        and _writable(acks, watch.led_at, led) is not None):
                    done_at = now
                if done_at is not None and now - done_at >= FAILOVER_AFTER_S:
                    break
                if now - t_stop > FAILOVER_WINDOW_S:
                    raise CaseError(
                        f"failover {kind} of node {victim_id}: not writable after "
                        f"{FAILOVER_WINDOW_S:g}s (led by survivors: {sorted(watch.led_at)}, "
                        f"in Metadata: {sorted(watch.metadata_at)} "
                        f"of {led}; watcher errors {watch.errors})")
        left = p.flush(30)
    finally:
        if watch is not None:
            watch.close()
        close_bounded(p, "producer")
    assert t_stop is not None and watch is not None
    if kind == "sigterm":
        victim.wait_exit()
        exited_at = exited_at or time.perf_counter()
        out["sigterm_to_exit_s"] = round(exited_at - t_stop, 3)
    writable = _writable(acks, watch.led_at, led)
    out.update({
        "leaders_s": round(max(watch.led_at.values()) - t_stop, 3),
        "metadata_s": round(max(watch.metadata_at.values()) - t_stop, 3),
        "writable_s": round(writable - t_stop, 3) if writable is not None else None,
        "ack_gap_s": round(_ack_gap(acks, led, t_stop), 3),
        "ack_gap_other_partitions_s": round(
            _ack_gap(acks, [q for q in range(PARTITIONS) if q not in led], t_stop), 3),
        "sent": i, "acknowledged": len(acks), "undelivered": left,
        "delivery_errors": failed, "watch_polls": watch.polls,
        "watch_errors": watch.errors,
    })  # fmt: skip
    victim.start()
    back = wait_caught_up(cluster, topic, victim, CATCH_UP_TIMEOUT_S)
    out["restart_ready_s"] = _round(back["ready_s"])
    out["restart_caught_up_s"] = _round(back["caught_up_s"])
    log(f"failover {kind}: leaders {out['leaders_s']} s, Metadata {out['metadata_s']} s, "
        f"writable {out['writable_s']} s, "
        f"ack gap {out['ack_gap_s']} s; node {victim_id} back in {out['restart_caught_up_s']} s")
    return out


def _writable(acks: list[tuple[float, int]], led_at: dict[int, float],
              led: list[int]) -> float | None:  # fmt: skip
    """When the last of the `led` partitions acknowledged a message after a survivor was
    seen leading it; None until each has."""
    first: dict[int, float] = {}
    for t, q in reversed(acks):  # the newest first: stop once every partition is placed
        if q in led_at and t >= led_at[q]:
            first[q] = t  # keeps going back: ends on the earliest such ack
    if any(q not in first for q in led):
        return None
    return max(first[q] for q in led)


def _ack_gap(acks: list[tuple[float, int]], partitions: list[int], t_stop: float) -> float:
    """The longest time any of `partitions` went without an acknowledgement, over the
    stretch from a second before the stop to the end: what the client saw of the outage."""
    worst = 0.0
    for q in partitions:
        times = [t for t, part in acks if part == q and t >= t_stop - 1.0]
        times.sort()
        for a, b in zip(times, times[1:], strict=False):
            worst = max(worst, b - a)
    return worst


def run_cluster_failover(args: argparse.Namespace) -> dict[str, Any]:
    from shards.config import NodeConfig

    trials = 1 if args.quick else FAILOVER_TRIALS
    res = header("cluster_failover", args)
    res["smp"] = 1
    res.update({"nodes": NODES, "partitions": PARTITIONS, "replicas": NODES,
                "raft_election_timeout_ms": NodeConfig.raft_election_timeout_ms,
                "raft_heartbeat_interval_ms": NodeConfig.raft_heartbeat_interval_ms,
                "producer_msgs_per_s": FAILOVER_RATE, "value_bytes": FAILOVER_VALUE_BYTES,
                "trials_per_kind": trials})  # fmt: skip
    t0 = time.monotonic()
    cluster = Cluster(args)
    try:
        with cluster:
            res["trials"] = trials_out = []
            topic = ""
            for k in range(trials * len(FAILOVER_KINDS)):
                # A fresh topic per trial: each starts from an empty topic (see the README).
                if topic:
                    delete_topic(cluster.bootstrap, topic)
                topic = f"bench-failover-{k}"
                create_topic(cluster.bootstrap, topic, PARTITIONS, NODES)
                kind = FAILOVER_KINDS[k % len(FAILOVER_KINDS)]
                trials_out.append(_failover_trial(cluster, topic, kind, args))
    except Exception as e:
        case_failed(res, "cluster_failover", e)
    finally:
        res["cluster"] = cluster.figures()
    for kind in FAILOVER_KINDS:
        done = [t for t in res.get("trials", []) if t["kind"] == kind]
        res[kind] = {
            f"{what}_{how}": f(t.get(what) for t in done)
            for what in ("leaders_s", "metadata_s", "writable_s", "ack_gap_s")
            for how, f in (("median", median_of), ("range", range_of))
        }
    kill, term = res["kill9"].get("writable_s_range"), res["sigterm"].get("writable_s_range")
    res["target_met"] = {
        "kill9_writable_median_le_3s": _le(res["kill9"].get("writable_s_median"),
                                            TARGET_FAILOVER_KILL_S),
        "kill9_writable_max_le_3s": _le(kill and kill[1], TARGET_FAILOVER_KILL_S),
        "sigterm_writable_median_le_0_5s": _le(res["sigterm"].get("writable_s_median"),
                                                TARGET_FAILOVER_SIGTERM_S),
        "sigterm_writable_max_le_0_5s": _le(term and term[1], TARGET_FAILOVER_SIGTERM_S),
    }  # fmt: skip
    return finish(res, t0)


# --------------------------------------------------------------------------- cluster_catch_up

CATCH_UP_ROUNDS = 3  # one per node as the follower; 1 with --quick


def _catch_up_round(
    cluster: Cluster, topic: str, follower: ClusterNode, n: int, value: bytes,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """`follower` stopped cleanly, `n` x `value` produced to the other two, `follower`
    started again: how long until its log end is the leader's on every partition."""
    out: dict[str, Any] = {"follower": follower.node_id,
                           "leaders_before": leaders_by_node(cluster, topic)}  # fmt: skip
    log_end_before = catch_up_state(cluster, topic, follower)[1]
    follower.sigterm()
    follower.wait_exit()
    others = [nd for nd in cluster.nodes if nd is not follower]
    deadline = time.monotonic() + FAILOVER_WINDOW_S
    while sum(len(v) for v in leaders_by_node(cluster, topic).values()) < PARTITIONS:
        if time.monotonic() > deadline:
            raise CaseError(f"catch-up: partitions leaderless after stopping node "
                            f"{follower.node_id}: {leaders_by_node(cluster, topic)}")
        time.sleep(POLL_S)
    out["produced"] = produce_max(
        ",".join(nd.bootstrap for nd in others), topic, n, value, PARTITIONS,
        cpu=lambda: sum(nd.cpu_seconds() for nd in others), check=cluster.check, args=args,
    )  # fmt: skip
    bytes_before = dir_bytes(follower.data_dir)
    cpu_before = {nd.node_id: nd.cpu_seconds() for nd in others}
    follower.start()
    times = wait_caught_up(cluster, topic, follower, CATCH_UP_TIMEOUT_S, log_end_before)
    cpu = {nd.node_id: nd.cpu_seconds() - cpu_before[nd.node_id] for nd in others}
    cpu[follower.node_id] = follower.cpu_seconds()
    payload_mb = n * len(value) / MB
    copied_mb = (dir_bytes(follower.data_dir) - bytes_before) / MB
    ready, caught_up = times["ready_s"] or 0.0, times["caught_up_s"] or 0.0
    first = times["first_progress_s"]
    # From the first poll that saw its log grow: at most one poll's worth copied before.
    copying = None if first is None else caught_up - first
    out.update({
        "payload_mb": round(payload_mb, 2),
        "log_mb_copied": round(copied_mb, 2),
        "restart_to_ready_s": _round(ready),
        "restart_to_first_progress_s": _round(times["first_progress_s"]),
        "restart_to_caught_up_s": _round(caught_up),
        "ready_to_caught_up_s": _round(caught_up - ready),
        "copy_s": _round(copying),
        "mb_per_s": _rate(payload_mb, caught_up),
        "mb_per_s_after_ready": _rate(payload_mb, caught_up - ready),
        "mb_per_s_copying": _rate(payload_mb, copying) if copying is not None else None,
        "cpu_s_by_node": {str(k): round(v, 3) for k, v in sorted(cpu.items())},
    })  # fmt: skip
    log(f"catch-up of node {follower.node_id}: {payload_mb:.0f} MB in {caught_up:.2f} s from "
        f"its restart ({out['mb_per_s']} MB/s), ready after {ready:.2f} s")
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _rate(mb: float, seconds: float) -> float | None:
    return round(mb / seconds, 2) if seconds > 0 else None


def run_cluster_catch_up(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 1 if args.quick else CATCH_UP_ROUNDS
    n = args.messages or (10_000 if args.quick else 100_000)
    res = header("cluster_catch_up", args)
    res["smp"] = 1
    res.update({"nodes": NODES, "partitions": PARTITIONS, "replicas": NODES,
                "value_bytes": VALUE_BYTES, "messages_per_round": n,
                "rounds": rounds})  # fmt: skip
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    cluster = Cluster(args)
    try:
        with cluster:
            topic = "bench-catch-up-0"
            create_topic(cluster.bootstrap, topic, PARTITIONS, NODES)
            res["round_results"] = done = []
            for r in range(rounds):
                if r:  # a fresh topic: the page cache holds one round
                    delete_topic(cluster.bootstrap, topic)
                    topic = f"bench-catch-up-{r}"
                    create_topic(cluster.bootstrap, topic, PARTITIONS, NODES)
                follower = cluster.nodes[(r + 1) % NODES]
                done.append(_catch_up_round(cluster, topic, follower, n, value, args))
    except Exception as e:
        case_failed(res, "cluster_catch_up", e)
    finally:
        res["cluster"] = cluster.figures()
    done = res.get("round_results", [])
    for what in ("mb_per_s", "mb_per_s_after_ready", "mb_per_s_copying",
                 "restart_to_caught_up_s", "ready_to_caught_up_s", "restart_to_ready_s",
                 "restart_to_first_progress_s", "copy_s"):  # fmt: skip
        res[f"{what}_median"] = median_of(r.get(what) for r in done)
        res[f"{what}_range"] = range_of(r.get(what) for r in done)
    res["target_met"] = {}  # the issue names no figure to reach
    return finish(res, t0)


# --------------------------------------------------------------------------- idle heartbeats

IDLE_SECONDS = 30.0  # 5 with --quick
IDLE_SETTLE_S = 5.0  # after every partition is led, before the window (2 with --quick)


def idle_window(cluster: Cluster, seconds: float) -> dict[str, Any]:
    """Each node's CPU over `seconds` of nothing sent: seconds, share of one core, by
    process of its group (the CPU clocks of the processes /proc lists)."""
    labels = {nd.node_id: node_processes(nd) for nd in cluster.nodes}

    def snap() -> dict[int, dict[int, float]]:
        return {nd.node_id: {pid: process_cpu_seconds(pid) or 0.0 for pid in labels[nd.node_id]
                             if start_time(pid) is not None} for nd in cluster.nodes}  # fmt: skip

    before = snap()
    t0 = time.perf_counter()
    time.sleep(seconds)
    after = snap()
    elapsed = time.perf_counter() - t0
    cluster.live_check()()
    nodes = {}
    for node_id, pids in after.items():
        by_process = {labels[node_id][pid]: round(cpu - before[node_id].get(pid, 0.0), 3)
                      for pid, cpu in pids.items()}  # fmt: skip
        total = sum(by_process.values())
        nodes[str(node_id)] = {"cpu_s": round(total, 3),
                               "core_share": round(total / elapsed, 4),
                               "cpu_s_by_process": by_process}  # fmt: skip
    return {"seconds": round(elapsed, 3), "nodes": nodes,
            "core_share_max": max(v["core_share"] for v in nodes.values())}


def run_cluster_idle_heartbeats(
    args: argparse.Namespace, partitions: int = IDLE_PARTITIONS, seconds: float = 0.0
) -> dict[str, Any]:
    """`partitions` and `seconds` (the window; default 30, 5 with --quick) are for the
    smoke test (tests/bench/test_cluster_bench.py)."""
    seconds = seconds or (5.0 if args.quick else IDLE_SECONDS)
    res = header("cluster_idle_heartbeats", args)
    res["smp"] = 1
    res.update({"nodes": NODES, "partitions": partitions, "replicas": NODES,
                "window_s": seconds})  # fmt: skip
    t0 = time.monotonic()
    cluster = Cluster(args)
    try:
        with cluster:
            time.sleep(2.0 if args.quick else IDLE_SETTLE_S)
            res["bare"] = idle_window(cluster, seconds)
            log(f"idle, no topic: {res['bare']['core_share_max']} of a core at most")
            res["topic_create_s"] = round(create_topic(
                cluster.bootstrap, "bench-idle", partitions, NODES), 3)
            log(f"{partitions} partitions x RF={NODES} led after {res['topic_create_s']} s")
            time.sleep(2.0 if args.quick else IDLE_SETTLE_S)
            res["leaders_by_node"] = {
                str(k): len(v) for k, v in leaders_by_node(cluster, "bench-idle").items()}
            res["idle"] = idle_window(cluster, seconds)
            res["rss_mib_by_node"] = {str(nd.node_id): round(tree_rss_mib(nd.pid), 1)
                                      for nd in cluster.nodes}  # fmt: skip
            log(f"idle, {partitions} partitions: {res['idle']['core_share_max']} of a core at most")
    except Exception as e:
        case_failed(res, "cluster_idle_heartbeats", e)
    finally:
        res["cluster"] = cluster.figures()
    share = _get_share(res)
    res["target_met"] = {"idle_lt_0_1_core_per_node": _lt(share, TARGET_IDLE_CORE_SHARE)}
    return finish(res, t0)


def _get_share(res: dict[str, Any]) -> float | None:
    idle = res.get("idle")
    return idle.get("core_share_max") if isinstance(idle, dict) else None


CLUSTER_CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "cluster_vs_single": run_cluster_vs_single,
    "cluster_failover": run_cluster_failover,
    "cluster_catch_up": run_cluster_catch_up,
    "cluster_idle_heartbeats": run_cluster_idle_heartbeats,
}
