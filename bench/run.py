"""Krill bench: ``python -m bench.run [--quick] [--case NAME ...]``.

Prints ONE JSON line per case on stdout; progress and logs go to stderr. The first line is
the ``ceilings`` case (raw fdatasync loop and loopback socket echo, measured in this run);
every broker case repeats the ceiling figures it is compared with under ``vs_ceiling``.
See bench/README.md for every field.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from bench import ceilings as ceil
from bench.broker import (
    Broker,
    RssSampler,
    log,
    process_cpu_seconds,
    tree_cpu_seconds,
    tree_hwm_mib,
    tree_rss_mib,
)
from scenarios.procs import process_tree

MB = 1e6  # decimal, as in the ceilings

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
# bench/cluster.py: 3 nodes x RF=3 beside 1 node, failover, catch-up, idle heartbeats.
SPARK_CASES = ["spark_reader_plain", "spark_reader_realistic"]  # bench/spark_reader.py
SPARK_WRITER_CASES = ["spark_writer"]  # bench/spark_writer.py

CLUSTER_CASES = [
    "cluster_vs_single", "cluster_failover", "cluster_catch_up", "cluster_idle_heartbeats",
]
ALL_CASES = [
    "ceilings", *PRODUCE_CASES, "rss_100_partitions", *SHARD_CASES, *GROUP_CASES,
    *RUNNING_CASES, *LIFECYCLE_CASES, *SATURATION_CASES, *SCENARIO_CASES, *RAFT_CASES,
    *CLUSTER_CASES, *SPARK_CASES, *SPARK_WRITER_CASES,
]


class CaseError(RuntimeError):
    pass


# --------------------------------------------------------------------------- environment


def git_rev() -> tuple[str, bool | None]:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if rev.returncode != 0:
            return "uncommitted", None
        st = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return rev.stdout.strip(), bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "uncommitted", None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def finish(res: dict[str, Any], t0: float) -> dict[str, Any]:
    """The fields every case's line ends with: load at the end, wall time, error (or None)."""
    res["loadavg_end"] = loadavg()
    res["wall_s"] = round(time.monotonic() - t0, 2)
    res.setdefault("error", None)
    return res


def header(case: str, args: argparse.Namespace) -> dict[str, Any]:
    import confluent_kafka

    rev, dirty = git_rev()
    return {
        "case": case,
        "git_rev": rev,
        "git_dirty": dirty,
        "smp": args.smp,
        "quick": args.quick,
        "loadavg": loadavg(),
        "cpu_count": os.cpu_count(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
    }


def client_cpu() -> float:
    """CPU seconds of this process, every thread (librdkafka's too), to the nanosecond:
    `os.times()` counts 10 ms ticks, and a short phase can use less than one."""
    return time.process_time()


# --------------------------------------------------------------------------- kafka helpers


class StatsCollector:
    """librdkafka statistics (``statistics.interval.ms``); keeps the latest snapshot."""

    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None
        self.count = 0

    def cb(self, stats_json: str) -> None:
        self.last = json.loads(stats_json)
        self.count += 1

    def brokers(self) -> list[dict[str, Any]]:
        if not self.last:
            return []
        return [b for b in self.last.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]

    def produce_requests(self) -> int | None:
        return self.requests("Produce")

    def requests(self, kind: str) -> int | None:
        if not self.last:
            return None
        return sum(int(b.get("req", {}).get(kind, 0)) for b in self.brokers())

    def tx_bytes(self) -> int | None:
        if not self.last:
            return None
        return sum(int(b.get("txbytes", 0)) for b in self.brokers())

    def wait_fresh(self, client: Any, timeout: float = 3.0) -> None:
        """Serve callbacks until a snapshot taken from now on has arrived."""
        seen = self.count
        deadline = time.monotonic() + timeout
        while self.count <= seen and time.monotonic() < deadline:
            client.poll(0.05)


class ErrorLog:
    """error_cb: remembers (and logs) client-level errors such as 'all brokers down'."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.errors: list[str] = []

    def cb(self, err: Any) -> None:
        text = str(err)
        if len(self.errors) < 20:
            self.errors.append(text)
        log(f"{self.name} error: {text}")


def liveness(broker: Broker) -> Callable[[], None]:
    def check() -> None:
        if not broker.alive():
            tail = " | ".join(line.strip() for line in broker.log_tail(3).splitlines())
            raise CaseError(f"broker died (exit {broker.proc.poll()}); log ends: {tail}")

    return check


class EnvBroker(Broker):
    """A ``Broker`` started with extra environment variables (``KRILL_<FIELD>`` config).

    ``bench/broker.py`` passes the bench's own environment to ``krill start``; the variables
    are set only around ``start()`` (the Popen) and restored after.
    """

    def __init__(self, *, env: dict[str, str], **kw: Any) -> None:
        super().__init__(**kw)
        self.env = env

    def start(self) -> Broker:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return super().start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


_SHARD_LINE = re.compile(r"shard (\d+) \(pid (\d+)")


class ProcessCpu:
    """Broker CPU per process of the tree, labelled ``supervisor``, ``shard0``, ``shard1``...

    Shard pids come from the shard's ``shard N (pid P, core C) serving Kafka`` log line;
    a process without one is labelled ``pid<P>``.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.labels: dict[int, str] = {broker.pid: "supervisor"}

    def _read_labels(self) -> None:
        try:
            with open(self.broker.log_path, "rb") as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return
        for m in _SHARD_LINE.finditer(text):
            self.labels.setdefault(int(m.group(2)), f"shard{m.group(1)}")

    def snapshot(self) -> dict[str, float]:
        pids = process_tree(self.broker.pid)
        if any(p not in self.labels for p in pids):
            self._read_labels()
        out: dict[str, float] = {}
        for pid in pids:
            cpu = process_cpu_seconds(pid)
            if cpu is not None:
                out[self.labels.get(pid, f"pid{pid}")] = cpu
        return out

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.snapshot()
        return {k: round(v - before.get(k, 0.0), 3) for k, v in sorted(now.items())}


def idle_cpu(broker: Broker, seconds: float) -> dict[str, Any]:
    """Broker CPU while no client sends anything, per second, whole tree and per process."""
    cpu = ProcessCpu(broker)
    check = liveness(broker)
    before = cpu.snapshot()
    t0 = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - t0
    by_process = cpu.since(before)
    check()
    return {
        "seconds": round(elapsed, 3),
        "broker_cpu_s_per_s": round(sum(by_process.values()) / elapsed, 4),
        "broker_cpu_s_by_process": by_process,
    }


def _add_cpu_per_gb(phase: dict[str, Any] | None, value_bytes: int) -> float | None:
    """Adds ``broker_cpu_s_per_gb`` (broker CPU-s / GB of payload) to a phase result."""
    if not phase or not phase.get("messages"):
        return None
    gb = phase["messages"] * value_bytes / 1e9
    per_gb = round(phase["broker_cpu_s"] / gb, 3)
    phase["broker_cpu_s_per_gb"] = per_gb
    return per_gb


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> float:
    """CreateTopics via AdminClient, then wait until Metadata shows every partition led.

    Returns the seconds it took.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    t0 = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        request_timeout=timeout,
    )
    try:
        futs[name].result(timeout=timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise CaseError(f"CreateTopics {name} x{partitions} failed: {e}") from e
    except concurrent.futures.TimeoutError as e:
        raise CaseError(f"CreateTopics {name} x{partitions}: no answer in {timeout}s") from e
    deadline = time.monotonic() + timeout
    last = "no metadata"
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None:
            led = [p for p in t.partitions.values() if p.leader >= 0 and p.error is None]
            if len(led) == partitions:
                return time.perf_counter() - t0
            last = f"{len(led)}/{partitions} partitions have a leader"
        elif t is not None:
            last = str(t.error)
        time.sleep(0.1)
    raise CaseError(f"topic {name} not ready after {timeout}s: {last}")


def delete_topic(bootstrap: str, name: str, timeout: float = 30.0) -> None:
    """DeleteTopics via AdminClient; returns once the broker has answered."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.delete_topics([name], request_timeout=timeout)
    try:
        futs[name].result(timeout=timeout)
    except KafkaException as e:
        raise CaseError(f"DeleteTopics {name} failed: {e}") from e
    except concurrent.futures.TimeoutError as e:
        raise CaseError(f"DeleteTopics {name}: no answer in {timeout}s") from e


def _close_bounded(client: Any, what: str, timeout: float = 10.0) -> None:
    t = threading.Thread(target=client.close, name=f"close-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        log(f"{what}.close() did not return in {timeout}s; abandoning it")


def producer_config(bootstrap: str, stats: StatsCollector, errors: ErrorLog) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "statistics.interval.ms": 500,
        "stats_cb": stats.cb,
        "error_cb": errors.cb,
        "message.timeout.ms": 60_000,
    }


class Deliveries:
    """Delivery-report bookkeeping; per-message latency from produce() to callback."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.last_t = 0.0
        self._pc = time.perf_counter

    def cb(self, t0: float, err: Any, msg: Any) -> None:
        t = self._pc()
        self.last_t = t
        if err is None:
            self.latencies.append(t - t0)
        else:
            self.errors += 1
            if self.first_error is None:
                self.first_error = str(err)

    @property
    def done(self) -> int:
        return len(self.latencies) + self.errors


def _flush(
    producer: Any,
    dr: Deliveries,
    deadline: float,
    check: Callable[[], None],
    stall_timeout: float = 30.0,
) -> None:
    """Wait for every delivery report; fail if none arrives for ``stall_timeout`` s."""
    done, progress_at = dr.done, time.monotonic()
    while len(producer) > 0:
        now = time.monotonic()
        if dr.done != done:
            done, progress_at = dr.done, now
        elif now - progress_at > stall_timeout:
            raise CaseError(
                f"produce stalled: no delivery report for {stall_timeout}s, "
                f"{len(producer)} undelivered, {dr.done} delivered"
                + (f"; first error: {dr.first_error}" if dr.first_error else "")
            )
        if now > deadline:
            raise CaseError(f"flush timed out with {len(producer)} messages undelivered")
        producer.flush(0.5)
        check()


# --------------------------------------------------------------------------- phases


def _wait_room(
    producer: Any,
    dr: Deliveries,
    deadline: float,
    check: Callable[[], None],
    stall_timeout: float,
) -> None:
    done, since = dr.done, time.monotonic()
    while dr.done == done:
        producer.poll(0.01)
        now = time.monotonic()
        if now - since > stall_timeout or now > deadline:
            raise CaseError(
                f"produce stalled: local queue full and no delivery report for "
                f"{now - since:.0f}s ({dr.done} delivered)"
                + (f"; first error: {dr.first_error}" if dr.first_error else "")
            )
        if now - since > 1.0:
            check()


def produce_max(
    bootstrap: str,
    topic: str,
    n: int,
    value: bytes,
    partitions: int,
    *,
    timeout: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """Produce ``n`` messages as fast as the client can, round-robin over partitions."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer"), Deliveries()
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    p = Producer(producer_config(bootstrap, stats, errors))
    produce, poll, cb, pc = p.produce, p.poll, dr.cb, time.perf_counter
    deadline = time.monotonic() + timeout
    t_start = pc()
    for i in range(n):
        while True:
            try:
                produce(topic, value, partition=i % partitions, on_delivery=partial(cb, pc()))
                break
            except BufferError:
                # The local queue is full: wait for deliveries, but not forever.
                _wait_room(p, dr, deadline, check, stall_timeout)
        if not i & 63:
            poll(0)
            if not i & 8191:
                check()
                if time.monotonic() > deadline:
                    raise CaseError(f"produce timed out after {i} messages")
    t_sent = pc()
    _flush(p, dr, deadline, check, stall_timeout)
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors; first: {dr.first_error}")
    out = _max_rate_figures(
        n, len(value), dr.last_t - t_start, t_sent - t_start, stats,
        cpu_b1 - cpu_b0, cpu_c1 - cpu_c0, errors,
    )  # fmt: skip
    out["latency_ms"] = ceil.latency_summary_ms(dr.latencies)
    return out


def _max_rate_figures(
    n: int,
    value_bytes: int,
    elapsed: float,
    send_loop: float,
    stats: StatsCollector,
    broker_cpu: float,
    client_cpu_s: float,
    errors: ErrorLog,
) -> dict[str, Any]:
    """The figures of a produce phase at the client's full speed (`produce_max`,
    `produce_max_batched`): `n` messages of `value_bytes`, the last acknowledged `elapsed`
    seconds after the first was sent, the last sent after `send_loop` seconds."""
    reqs, txb = stats.produce_requests(), stats.tx_bytes()
    return {
        "messages": n,
        "elapsed_s": round(elapsed, 3),
        "send_loop_s": round(send_loop, 3),
        "msgs_per_s": round(n / elapsed, 1),
        "mb_per_s": round(n * value_bytes / elapsed / MB, 2),
        "produce_requests": reqs,
        "requests_per_s": round(reqs / elapsed, 1) if reqs else None,
        "msgs_per_request": round(n / reqs, 1) if reqs else None,
        "avg_request_bytes": round(txb / reqs) if reqs and txb else None,
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_produce_request": round(broker_cpu / reqs * 1e6, 1) if reqs else None,
        "broker_cpu_us_per_message": round(broker_cpu / n * 1e6, 2),
        "client_cpu_s": round(client_cpu_s, 3),
        "client_errors": errors.errors,
    }


# Messages per produce_batch() call in `produce_max_batched`.
PRODUCE_BATCH_MESSAGES = 1000


def produce_max_batched(
    bootstrap: str,
    topic: str,
    n: int,
    value: bytes,
    partitions: int,
    *,
    timeout: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`produce_max` with the cheapest client this Python library offers: messages handed to
    librdkafka a thousand at a time (``produce_batch``), and only failed deliveries reported
    back (``delivery.report.only.error``), so no Python runs per message once it is queued.

    It measures what the client costs at its cheapest, not latency (nothing reports when a
    message was acknowledged). Failed deliveries fail the phase. `config`: librdkafka
    settings over the bench's.
    """
    from confluent_kafka import Producer

    stats, errors = StatsCollector(), ErrorLog("producer(batched)")
    failed: list[str] = []

    def on_failure(err: Any, _msg: Any) -> None:
        failed.append(str(err))

    settings = producer_config(bootstrap, stats, errors)
    settings.update({"delivery.report.only.error": True, "on_delivery": on_failure})
    settings.update(config or {})
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    p = Producer(settings)
    deadline = time.monotonic() + timeout
    # Round-robin over the partitions, a call's worth at a time: produce_batch places every
    # message of a call in the call's partition (a message's own "partition" is ignored).
    unsent = [n // partitions + (k < n % partitions) for k in range(partitions)]
    pc = time.perf_counter
    t_start = pc()
    sent = calls = 0
    while sent < n:
        for partition in range(partitions):
            count = min(PRODUCE_BATCH_MESSAGES, unsent[partition])
            unsent[partition] -= count
            batch = [{"value": value} for _ in range(count)]
            since = time.monotonic()
            while batch:
                queued = p.produce_batch(topic, batch, partition=partition)
                sent += queued
                # A full local queue refuses the rest of the batch (each marked `_error`).
                batch = batch[queued:]
                if batch:
                    p.poll(0.01)
                    now = time.monotonic()
                    if now - since > stall_timeout or now > deadline:
                        raise CaseError(
                            f"batched produce stalled: local queue full for {now - since:.0f}s "
                            f"after {sent} messages"
                        )
            p.poll(0)
            if not calls & 7:  # the first call, then every eighth
                check()
                if time.monotonic() > deadline:
                    raise CaseError(f"batched produce timed out after {sent} messages")
            calls += 1
    t_sent = pc()
    left = p.flush(max(0.0, deadline - time.monotonic()))
    t_done = pc()
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if left:
        raise CaseError(f"batched produce: {left} messages undelivered at the deadline")
    if failed:
        raise CaseError(f"{len(failed)} delivery errors (batched); first: {failed[0]}")
    out = _max_rate_figures(
        n, len(value), t_done - t_start, t_sent - t_start, stats,
        cpu_b1 - cpu_b0, cpu_c1 - cpu_c0, errors,
    )  # fmt: skip
    out["messages_per_call"] = PRODUCE_BATCH_MESSAGES
    return out


class Paced(NamedTuple):
    messages: int
    seconds: float  # from the first send to the last
    max_backlog: int  # the most messages that were due and not yet sent


def send_paced(
    p: Any, dr: Deliveries, topic: str, value: bytes, partitions: int, *, rate: int,
    seconds: float, report: Callable[[float, float], Callable[[Any, Any], None]],
    check: Callable[[], None], stall_timeout: float,
) -> Paced:  # fmt: skip
    """Produce at ``rate`` msg/s for ``seconds`` round-robin over the partitions: each ms,
    send what is due, then poll; then flush. ``report(t_call, t_due)``: a message's delivery
    callback, made as it is handed to produce() at ``t_call``, due by the schedule at
    ``t_due``."""
    produce, poll, pc = p.produce, p.poll, time.perf_counter
    total = int(rate * seconds)
    deadline = time.monotonic() + seconds * 3 + 30
    behind_max = 0
    i = 0
    t_start = pc()
    next_check = t_start + 1.0
    while i < total:
        now = pc()
        due = min(total, int((now - t_start) * rate) + 1)
        behind_max = max(behind_max, due - i)
        while i < due:
            try:
                produce(topic, value, partition=i % partitions,
                        on_delivery=report(pc(), t_start + i / rate))
                i += 1
            except BufferError:
                _wait_room(p, dr, deadline, check, stall_timeout)
        now = pc()
        if now > next_check:
            next_check = now + 1.0
            check()
            if time.monotonic() > deadline:
                raise CaseError(f"fixed-rate produce timed out after {i} messages")
        wait = t_start + i / rate - now
        # poll() returns early when a delivery report arrives; timeouts are whole ms.
        poll(max(0.001, wait) if wait > 0 else 0)
    t_sent = pc()
    _flush(p, dr, deadline, check, stall_timeout)
    return Paced(total, t_sent - t_start, behind_max)


def produce_fixed_rate(
    bootstrap: str,
    topic: str,
    value: bytes,
    partitions: int,
    *,
    rate: int,
    seconds: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """Produce at ``rate`` msg/s for ``seconds``: each ms, send what is due, then poll."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer(fixed)"), Deliveries()
    p = Producer(producer_config(bootstrap, stats, errors))
    cb, pc = dr.cb, time.perf_counter
    # Connect and fetch metadata before the clock starts; the warm-up message isn't counted.
    p.produce(topic, value, partition=0, on_delivery=partial(cb, pc()))
    _flush(p, dr, time.monotonic() + 30, check, stall_timeout)
    if dr.errors:
        raise CaseError(f"fixed-rate warm-up message failed: {dr.first_error}")
    dr.latencies.clear()
    stats.wait_fresh(p)
    reqs0 = stats.produce_requests() or 0
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    sent = send_paced(p, dr, topic, value, partitions, rate=rate, seconds=seconds,
                      report=lambda t_call, _due: partial(cb, t_call), check=check,
                      stall_timeout=stall_timeout)
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors at fixed rate; first: {dr.first_error}")
    reqs = (stats.produce_requests() or 0) - reqs0
    broker_cpu = cpu_b1 - cpu_b0
    return {
        "target_msgs_per_s": rate,
        "achieved_msgs_per_s": round(sent.messages / sent.seconds, 1),
        "seconds": round(sent.seconds, 3),
        "messages": sent.messages,
        "max_backlog_msgs": sent.max_backlog,
        "latency_ms": ceil.latency_summary_ms(dr.latencies),
        "produce_requests": reqs,
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_produce_request": round(broker_cpu / reqs * 1e6, 1) if reqs else None,
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
    }


def consume_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    *,
    stall_timeout: float,
    timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """assign() every partition from offset 0 and read ``expected`` messages back."""
    from confluent_kafka import Consumer, TopicPartition

    errors, stats = ErrorLog("consumer"), StatsCollector()
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"krill-bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "error_cb": errors.cb,
            "statistics.interval.ms": 500,
            "stats_cb": stats.cb,
            # librdkafka stops fetching once 100k messages wait in its queue and then backs
            # off for fetch.queue.backoff.ms (1 s by default since 2.4). With 100 B messages
            # that limit is ~10 MB and the backoff, not the broker, set the consume figure:
            # half the runs read ~150k msg/s at ~50 ms per fetch, the others >1M.
            "fetch.queue.backoff.ms": 1,
        }
    )
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    pc = time.perf_counter
    try:
        t_start = pc()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        count = nbytes = gaps = 0
        next_off = [0] * partitions
        msg_errors: list[str] = []
        t_first = t_last = None
        deadline = time.monotonic() + timeout
        last_progress = time.monotonic()
        while count < expected:
            batch = c.consume(num_messages=5000, timeout=0.2)
            now = time.monotonic()
            if batch:
                for m in batch:
                    if m.error() is not None:
                        if len(msg_errors) < 5:
                            msg_errors.append(str(m.error()))
                        continue
                    part, off = m.partition(), m.offset()
                    if off != next_off[part]:
                        gaps += 1
                    next_off[part] = off + 1
                    nbytes += len(m.value())
                    count += 1
                t_last = pc()
                if t_first is None:
                    t_first = t_last
                last_progress = now
            else:
                check()
                if now - last_progress > stall_timeout:
                    raise CaseError(
                        f"consume stalled for {stall_timeout}s at {count}/{expected} messages"
                        + (f"; errors: {msg_errors}" if msg_errors else "")
                    )
            if now > deadline:
                raise CaseError(f"consume timed out at {count}/{expected} messages")
        cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
        stats.wait_fresh(c)
    finally:
        _close_bounded(c, "consumer")
    assert t_last is not None and t_first is not None
    elapsed = t_last - t_start
    steady = t_last - t_first
    fetches = stats.requests("Fetch")
    verified = gaps == 0 and count == expected and next_off == _expected_ends(expected, partitions)
    return {
        "messages": count,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed, 1),
        "mb_per_s": round(nbytes / elapsed / MB, 2),
        "first_message_after_s": round(t_first - t_start, 3),
        "steady_msgs_per_s": round(count / steady, 1) if steady > 0 else None,
        "fetch_requests": fetches,
        "ms_per_fetch": round(elapsed / fetches * 1e3, 2) if fetches else None,
        "offset_gaps": gaps,
        "verified": verified,
        "message_errors": msg_errors,
        "broker_cpu_s": round(cpu_b1 - cpu_b0, 3),
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
        "client_errors": errors.errors,
    }


def _expected_ends(n: int, partitions: int) -> list[int]:
    """End offsets after round-robin producing n messages over ``partitions`` partitions."""
    return [n // partitions + (1 if p < n % partitions else 0) for p in range(partitions)]


# --------------------------------------------------------------------------- cases


def _ratio(a: Any, b: Any, digits: int = 3) -> float | None:
    try:
        return round(float(a) / float(b), digits) if a is not None and b else None
    except (TypeError, ValueError):
        return None


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def vs_ceiling(res: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    prod, cons, fixed = res.get("produce"), res.get("consume"), res.get("fixed_rate_20k")
    out: dict[str, Any] = {
        "ceilings_used": {
            "measured": c.get("measured"),
            "fdatasync_16k_mb_per_s": _get(c, "fdatasync_16k", "mb_per_s"),
            "fdatasync_64k_mb_per_s": _get(c, "fdatasync_64k", "mb_per_s"),
            "fdatasync_64k_appends_per_s": _get(c, "fdatasync_64k", "appends_per_s"),
            "fdatasync_16k_p99_ms": _get(c, "fdatasync_16k", "p99_ms"),
            "echo_64k_mb_per_s": _get(c, "echo_64k", "mb_per_s"),
            "echo_1k_round_trips_per_s": _get(c, "echo_1k", "round_trips_per_s"),
        }
    }
    u = out["ceilings_used"]
    out["produce_mb_per_s_over_fdatasync_16k"] = _ratio(
        _get(prod, "mb_per_s"), u["fdatasync_16k_mb_per_s"]
    )
    out["produce_mb_per_s_over_fdatasync_64k"] = _ratio(
        _get(prod, "mb_per_s"), u["fdatasync_64k_mb_per_s"]
    )
    out["produce_requests_per_s_over_fdatasync_64k_appends_per_s"] = _ratio(
        _get(prod, "requests_per_s"), u["fdatasync_64k_appends_per_s"]
    )
    out["consume_mb_per_s_over_echo_64k"] = _ratio(_get(cons, "mb_per_s"), u["echo_64k_mb_per_s"])
    out["fixed_rate_p99_over_fdatasync_16k_p99"] = _ratio(
        _get(fixed, "latency_ms", "p99"), u["fdatasync_16k_p99_ms"], 2
    )
    return out


def _cmp(value: Any, op: str, limit: float) -> bool | None:
    if value is None:
        return None
    return {"ge": value >= limit, "le": value <= limit, "lt": value < limit}[op]


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


def _broker_live_figures(res: dict[str, Any], broker: Broker, rss: RssSampler) -> None:
    """``res["broker"]``: CPU since start, RSS now / peak / HWM sum, processes seen."""
    if not broker.alive():
        return
    res["broker"] = {
        "cpu_s_total": round(tree_cpu_seconds(broker.pid), 3),
        "rss_end_mib": round(tree_rss_mib(broker.pid), 1),
        "rss_hwm_sum_mib": round(tree_hwm_mib(broker.pid), 1),
    }
    rss.sample()
    res["broker"]["rss_peak_mib"] = round(rss.peak_mib, 1)
    res["broker"]["processes"] = rss.max_processes


def case_failed(res: dict[str, Any], label: str, error: Exception, **brokers: Broker) -> None:
    """Record a case's failure in `res` and log it with each named broker's log tail."""
    res["error"] = f"{type(error).__name__}: {error}"
    log(f"{label} FAILED: {res['error']}")
    for name, broker in brokers.items():
        log(f"{name} log tail:\n{broker.log_tail(30)}")


def _broker_stop_figures(res: dict[str, Any], broker: Broker) -> None:
    res.setdefault("broker", {}).update(
        {
            "stop": broker.stop_how,
            "exit_code": broker.exit_code,
            "first_log_error": broker.first_log_error or None,
        }
    )


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
                _broker_live_figures(res, broker, rss)
    except Exception as e:
        case_failed(res, case, e, broker=broker)
    finally:
        _broker_stop_figures(res, broker)
    prod, cons, fixed = res.get("produce"), res.get("consume"), res.get("fixed_rate_20k")
    res["vs_ceiling"] = vs_ceiling(res, ceilings)
    targets: dict[str, bool | None] = {}
    if case == "produce_consume_1k_x6":
        targets["produce_ge_80k_msgs_per_s"] = _cmp(
            _get(prod, "msgs_per_s"), "ge", TARGET_PRODUCE_MSGS
        )
    targets["consume_ge_150k_msgs_per_s"] = _cmp(
        _get(cons, "msgs_per_s"), "ge", TARGET_CONSUME_MSGS
    )
    targets["broker_cpu_le_150us_per_produce_request"] = _cmp(
        _get(prod, "broker_cpu_us_per_produce_request"), "le", TARGET_CPU_US_PER_PRODUCE_REQ
    )
    targets["fixed_rate_20k_p99_lt_20ms"] = _cmp(
        _get(fixed, "latency_ms", "p99"), "lt", TARGET_FIXED_RATE_P99_MS
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
            _flush(p, dr, time.monotonic() + args.phase_timeout, check, args.stall_timeout)
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
        "rss_lt_200mib_with_100_partitions": _cmp(
            res.get("rss_after_produce_mib"), "lt", TARGET_RSS_MIB_100_PARTITIONS
        )
    }
    return finish(res, t0)


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
        elif case in CLUSTER_CASES:
            from bench import cluster

            emit(cluster.CLUSTER_CASES[case](args))
        elif case in SPARK_CASES:
            from bench import spark_reader

            emit(spark_reader.from_bench_run(case, args.quick))
        elif case in SPARK_WRITER_CASES:
            from bench import spark_writer

            emit(spark_writer.from_bench_run(case, args.quick))
    log(f"done in {time.monotonic() - t0:.1f}s" + (f"; results in {out_path}" if out_path else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
