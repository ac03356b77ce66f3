"""Bench cases for a node that can be left running: idle long polls, cold reads, the price
of metrics, and a soak.

- `idle_consumers`: 4 consumers assigned 48 idle partitions each, `fetch.wait.max.ms=10`,
  1 shard: the node's CPU as a fraction of one core, and its RSS over a minute and after
  the consumers close. Target: CPU <= 0.15 of a core, RSS flat.
- `cold_reads`: 1 GB produced to one partition, then, on the same shard, a producer at a fixed
  20k msg/s while a consumer reads that GB from the start at 100 MB/s, the GB either in the
  page cache (warm) or evicted from it (cold), rounds interleaved warm, cold, cold, warm.
  Target: the producer's p99 beside a cold reader within 1.5x of its p99 beside a warm one.
- `metrics_overhead`: produce as fast as the client can (1 KiB x 6 partitions, acks=all)
  against a node recording metrics and one started with `--disable-metrics`, alternately.
  Target: with metrics, at least 0.97x the msg/s without.
- `soak`: at least 10 minutes (`--soak-minutes`, `--long` for 3 hours) of a steady producer,
  a consumer group reading it, consumers long-polling idle partitions and clients that
  connect and vanish mid-request; RSS, open fds and the producer's p99 sampled every 10 s,
  with their slopes after a 2-minute warm-up. Target: RSS and fd slopes under 1 MiB and
  1 fd per 10 minutes.

Every figure is also in bench/README.md. `--baseline-krill PATH` runs `idle_consumers` and
`cold_reads` against a second `krill` too (another checkout), in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import ceilings as ceil
from bench.broker import Broker, log, tree_cpu_seconds, tree_open_fds, tree_rss_mib
from bench.clients import create_topic, delete_topic, produce_fixed_rate, produce_max
from bench.lifecycle import create
from bench.measure import liveness
from bench.report import CaseError, case_failed, finish, header

__all__ = ["RUNNING_CASES"]

MiB = 1024 * 1024
TARGET_IDLE_CPU_FRACTION = 0.15
TARGET_COLD_P99_RATIO = 1.5
TARGET_METRICS_THROUGHPUT_RATIO = 0.97
TARGET_SLOPE_PER_10_MIN = 1.0  # MiB of RSS, and open fds
IDLE_PARTITIONS, IDLE_CONSUMERS = 48, 4
COLD_RATE, COLD_READ_MB_PER_S = 20_000, 100
# The soak's records are small: it looks for what clients' requests leave behind, and the
# log's own growth (indexes ~0.5% of the bytes stored, 3 fds a segment, both bounded only by
# retention) would hide it; at 2,000 x 16 B a second that is ~0.2 MiB per 10 minutes.
SOAK_RATE, SOAK_VALUE_BYTES = 2000, 1024
# The soak topic keeps 4 MiB a partition in 1 MiB segments (retention looking every second):
# the log's own size, its indexes and fds stay flat, so any growth left is the node's.
SOAK_TOPIC_CONFIGS = {"retention.bytes": str(4 * 1024 * 1024), "segment.bytes": str(1024 * 1024),
                      "file.delete.delay.ms": "1000"}


def _metric(broker: Broker, name: str, **labels: str) -> float:
    """A metric from the node's /metrics, summed over the series with `labels` (0 if the
    node serves no metrics: an older krill)."""
    from prometheus_client.parser import text_string_to_metric_families

    if not broker.admin_port:
        return 0.0
    url = f"http://127.0.0.1:{broker.admin_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:  # a krill from before the admin endpoint took the flag and ignored it
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _slope_per_10_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) samples, per 10 minutes."""
    if len(samples) < 3:
        return None
    xs, ys = zip(*samples, strict=True)
    return round(statistics.linear_regression(xs, ys).slope * 600, 4)


def _brokers(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(label, krill executable) of the nodes a case compares: this one, then a baseline."""
    out: list[tuple[str, str | None]] = [("krill", args.krill)]
    if getattr(args, "baseline_krill", None):
        out.append(("baseline", args.baseline_krill))
    return out


# idle_consumers -----------------------------------------------------------------------------


def _idle_consumers_on(args: argparse.Namespace, krill: str | None) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    seconds = 20.0 if args.quick else 60.0
    with Broker(smp=1, krill=krill, data_root=args.data_root, keep=args.keep) as broker:
        check = liveness(broker)
        create_topic(broker.bootstrap, "idle", IDLE_PARTITIONS)
        consumers = []
        for i in range(IDLE_CONSUMERS):
            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"idle-{i}",
                          "fetch.wait.max.ms": 10, "enable.auto.commit": False})
            c.assign([TopicPartition("idle", p, 0) for p in range(IDLE_PARTITIONS)])
            consumers.append(c)
        stop = threading.Event()
        threads = [threading.Thread(target=_poll_until, args=(c, stop), daemon=True)
                   for c in consumers]
        for thread in threads:
            thread.start()
        try:
            time.sleep(10)  # warm-up
            check()
            fetches0 = _fetches(broker)  # the first scrape also sets up the admin server's side
            rss = [(0.0, tree_rss_mib(broker.pid))]
            cpu0, t0 = tree_cpu_seconds(broker.pid), time.monotonic()
            while (elapsed := time.monotonic() - t0) < seconds:
                time.sleep(min(5.0, seconds - elapsed))
                rss.append((time.monotonic() - t0, tree_rss_mib(broker.pid)))
            cpu1, fetches1, t1 = tree_cpu_seconds(broker.pid), _fetches(broker), time.monotonic()
            check()
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            for c in consumers:
                c.close()
        time.sleep(5)
        after = tree_rss_mib(broker.pid)
    fraction = (cpu1 - cpu0) / (t1 - t0)
    fetches = fetches1 - fetches0
    return {
        "broker_cpu_us_per_fetch": round((cpu1 - cpu0) / fetches * 1e6, 1) if fetches else None,
        "seconds": round(t1 - t0, 1),
        "broker_cpu_fraction_of_core": round(fraction, 4),
        "fetch_requests_per_s": round(fetches / (t1 - t0), 1) or None,
        "rss_start_mib": round(rss[0][1], 1),
        "rss_end_mib": round(rss[-1][1], 1),
        "rss_growth_mib": round(rss[-1][1] - rss[0][1], 2),
        "rss_samples_mib": [round(r, 2) for _, r in rss],
        "rss_after_close_mib": round(after, 1),
        "met_cpu": fraction <= TARGET_IDLE_CPU_FRACTION,
        "met_rss_flat": rss[-1][1] - rss[0][1] < TARGET_SLOPE_PER_10_MIN,
    }


def _fetches(broker: Broker) -> float:
    return _metric(broker, "krill_kafka_request_latency_seconds_count", api="Fetch")


def _poll_until(consumer: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        consumer.poll(0.1)


def run_idle_consumers(args: argparse.Namespace) -> dict[str, Any]:
    res, t0 = header("idle_consumers", args), time.monotonic()
    res.update({"shards": 1, "consumers": IDLE_CONSUMERS, "partitions": IDLE_PARTITIONS,
                "fetch_wait_max_ms": 10, "target_cpu_fraction": TARGET_IDLE_CPU_FRACTION})
    try:
        for label, krill in _brokers(args):
            res[label] = _idle_consumers_on(args, krill)
    except Exception as e:
        case_failed(res, "idle_consumers", e)
    return finish(res, t0)


# cold_reads ---------------------------------------------------------------------------------


def evict_page_cache(directory: Path) -> int:
    """Drop a partition's segment files from the page cache (clean pages of one file: no
    privilege needed); the bytes still cached after, which should be 0."""
    from storage.page_cache import cached

    left = 0
    for path in directory.glob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            left += 0 if not cached(fd, 0, size) else size
        finally:
            os.close(fd)
    return left


def _warm(directory: Path) -> None:
    from storage.page_cache import warm

    for path in directory.glob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            warm(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)


def _read_at(bootstrap: str, mb_per_s: float, stop: threading.Event, out: dict[str, Any]) -> None:
    """Read `history` from offset 0 at `mb_per_s` at most until told to stop."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time()}",
                         "enable.auto.commit": False, "fetch.max.bytes": 8 * MiB})
    consumer.assign([TopicPartition("history", 0, 0)])
    read, t0 = 0, time.perf_counter()
    try:
        while not stop.is_set():
            for message in consumer.consume(500, 0.2):
                if message.error() is None:
                    read += len(message.value() or b"")
            ahead = read / (mb_per_s * 1e6) - (time.perf_counter() - t0)
            if ahead > 0:
                stop.wait(ahead)
    finally:
        consumer.close()
        out["mb_read"] = round(read / 1e6, 1)
        out["mb_per_s"] = round(read / 1e6 / (time.perf_counter() - t0), 1)


def _cold_round(args: argparse.Namespace, broker: Broker, cold: bool) -> dict[str, Any]:
    directory = Path(broker.data_dir) / "history-0"
    if cold:
        left = evict_page_cache(directory)
        if left:
            raise CaseError(f"{left} bytes stayed in the page cache: cannot measure cold reads")
    else:
        _warm(directory)
    reads0 = _metric(broker, "krill_storage_cold_reads_total")
    stop, reader = threading.Event(), dict[str, Any]()
    thread = threading.Thread(target=_read_at, args=(broker.bootstrap, COLD_READ_MB_PER_S,
                                                     stop, reader), daemon=True)
    thread.start()
    try:
        produced = produce_fixed_rate(
            broker.bootstrap, "live", b"x" * 1024, 1, rate=COLD_RATE,
            seconds=5.0 if args.quick else 10.0, stall_timeout=args.stall_timeout,
            check=liveness(broker), broker_pid=broker.pid,
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(15)
    return {"cache": "cold" if cold else "warm", "producer_latency_ms": produced["latency_ms"],
            "achieved_msgs_per_s": produced["achieved_msgs_per_s"], "reader": reader,
            "cold_reads": _metric(broker, "krill_storage_cold_reads_total") - reads0}


def _cold_reads_on(args: argparse.Namespace, krill: str | None) -> dict[str, Any]:
    gigabytes = 0.25 if args.quick else 1.0
    with Broker(smp=1, krill=krill, data_root=args.data_root, keep=args.keep) as broker:
        create_topic(broker.bootstrap, "history", 1)
        create_topic(broker.bootstrap, "live", 1)
        n = int(gigabytes * 1e9 / 1024)
        produce_max(broker.bootstrap, "history", n, b"h" * 1024, 1, timeout=args.phase_timeout * 3,
                    stall_timeout=args.stall_timeout, check=liveness(broker),
                    broker_pid=broker.pid)
        order = [False, True] if args.quick else [False, True, True, False]
        rounds = [_cold_round(args, broker, cold) for cold in order]
    p99 = {kind: statistics.median(r["producer_latency_ms"]["p99"] for r in rounds
                                   if r["cache"] == kind) for kind in ("warm", "cold")}
    ratio = p99["cold"] / p99["warm"] if p99["warm"] else None
    return {"gigabytes": gigabytes, "rounds": rounds, "p99_warm_median_ms": p99["warm"],
            "p99_cold_median_ms": p99["cold"],
            "p99_cold_over_warm": None if ratio is None else round(ratio, 3),
            "met": ratio is not None and ratio <= TARGET_COLD_P99_RATIO}


def run_cold_reads(args: argparse.Namespace) -> dict[str, Any]:
    res, t0 = header("cold_reads", args), time.monotonic()
    res.update({"shards": 1, "producer_rate": COLD_RATE, "reader_mb_per_s": COLD_READ_MB_PER_S,
                "target_p99_ratio": TARGET_COLD_P99_RATIO})
    try:
        for label, krill in _brokers(args):
            res[label] = _cold_reads_on(args, krill)
    except Exception as e:
        case_failed(res, "cold_reads", e)
    return finish(res, t0)


# metrics_overhead ---------------------------------------------------------------------------


def run_metrics_overhead(args: argparse.Namespace) -> dict[str, Any]:
    res, t0 = header("metrics_overhead", args), time.monotonic()
    n = 20_000 if args.quick else 500_000
    rounds = 2 if args.quick else 6
    res.update({"messages": n, "value_bytes": 1024, "partitions": 6, "rounds_per_side": rounds,
                "target_ratio": TARGET_METRICS_THROUGHPUT_RATIO})
    sides: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    try:
        with (
            Broker(smp=args.smp, krill=args.krill, data_root=args.data_root) as on,
            Broker(smp=args.smp, krill=args.krill, data_root=args.data_root,
                   extra_args=("--disable-metrics",)) as off,
        ):
            order = ["on", "off", "off", "on"] * (rounds // 2)  # ABBA
            for i, side in enumerate(order):
                broker = on if side == "on" else off
                topic = f"m{i}"
                create_topic(broker.bootstrap, topic, 6)
                phase = produce_max(broker.bootstrap, topic, n, b"v" * 1024, 6,
                                    timeout=args.phase_timeout,
                                    stall_timeout=args.stall_timeout, check=liveness(broker),
                                    broker_pid=broker.pid)
                phase["broker_cpu_us_per_msg"] = round(phase["broker_cpu_s"] / n * 1e6, 3)
                sides[side].append(phase)
                # Each phase starts from the same page cache: left in place, the GBs written
                # grow the cache into memory this VM has not touched yet, and the kernel's
                # time per message triples (sys 0.7 -> 2.7 µs/msg after ~2 GB, user flat),
                # which swamps a 3% effect (an A/A run read 0.95).
                delete_topic(broker.bootstrap, topic)
        for side, phases in sides.items():
            res[f"msgs_per_s_{side}"] = [p["msgs_per_s"] for p in phases]
            res[f"broker_cpu_us_per_msg_{side}"] = [p["broker_cpu_us_per_msg"] for p in phases]
        rate = {s: statistics.median(res[f"msgs_per_s_{s}"]) for s in sides}
        cpu = {s: statistics.median(res[f"broker_cpu_us_per_msg_{s}"]) for s in sides}
        res["msgs_per_s_on_over_off"] = round(rate["on"] / rate["off"], 4)
        res["broker_cpu_per_msg_on_over_off"] = round(cpu["on"] / cpu["off"], 4)
        met = res["msgs_per_s_on_over_off"] >= TARGET_METRICS_THROUGHPUT_RATIO
        # 2 rounds of 0.1 s a side are a smoke test: within the noise, so not judged.
        res["met"] = None if args.quick else met
    except Exception as e:
        case_failed(res, "metrics_overhead", e)
    return finish(res, t0)


# soak ---------------------------------------------------------------------------------------


class _SteadyProducer(threading.Thread):
    """A fixed-rate acks=all producer whose latencies are read out per window."""

    def __init__(self, bootstrap: str, topic: str, rate: int, stop: threading.Event) -> None:
        super().__init__(name="steady-producer", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "linger.ms": 1, "message.timeout.ms": 60_000})
        self.topic, self.rate, self.stop = topic, rate, stop
        self.latencies: list[float] = []
        self.errors = 0

    def _delivered(self, sent: float, error: Any, _message: Any) -> None:
        if error is not None:
            self.errors += 1
        else:
            self.latencies.append(time.perf_counter() - sent)

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    def run(self) -> None:
        value, sent, t0 = b"s" * SOAK_VALUE_BYTES, 0, time.perf_counter()
        while not self.stop.is_set():
            due = int((time.perf_counter() - t0) * self.rate)
            while sent < due:
                self.producer.produce(self.topic, value,
                                      on_delivery=partial(self._delivered, time.perf_counter()))
                sent += 1
            self.producer.poll(0.001)
        self.producer.flush(30)


def _long_poll_frame(topic: str, partitions: int) -> bytes:
    """A whole Fetch v12 request: a 30 s long poll of every partition of `topic`."""
    from wire.messages import request_header_version
    from wire.messages.fetch import FetchRequest
    from wire.messages.request_header import RequestHeader
    from wire.primitives import Writer

    fetch = FetchRequest(
        replica_id=-1, max_wait_ms=30_000, min_bytes=1, max_bytes=MiB, session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0,
                                        partition_max_bytes=MiB)
            for p in range(partitions)])],
    )
    writer = Writer()
    size_at = writer.reserve_int32()
    RequestHeader(request_api_key=1, request_api_version=12, correlation_id=1,
                  client_id="vanishing").encode(writer, request_header_version(1, 12))
    fetch.encode(writer, 12)
    writer.patch_int32(size_at, writer.size - 4)
    return writer.getvalue()


def _vanishing_clients(bootstrap: str, stop: threading.Event, per_s: float) -> None:
    """`per_s` times a second: connect, send half a long poll or a whole one, vanish."""
    host, port = bootstrap.rsplit(":", 1)
    frame = _long_poll_frame("quiet", IDLE_PARTITIONS)
    i = 0
    while not stop.wait(1 / per_s):
        i += 1
        try:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(frame[: len(frame) // 2] if i % 2 else frame)
        except OSError:
            pass


def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    res, t0 = header("soak", args), time.monotonic()
    minutes = 180.0 if args.long else (2.0 if args.quick else args.soak_minutes)
    warmup_s = 30.0 if args.quick else 120.0
    res.update({"minutes": minutes, "warmup_s": warmup_s, "shards": 2,
                "producer_rate": SOAK_RATE, "value_bytes": SOAK_VALUE_BYTES,
                "topic_configs": SOAK_TOPIC_CONFIGS,
                "target_slope_per_10_min": TARGET_SLOPE_PER_10_MIN})
    stop = threading.Event()
    samples: list[dict[str, Any]] = []
    try:
        with Broker(smp=2, krill=args.krill, data_root=args.data_root, keep=args.keep,
                    extra_args=("--log-cleanup-interval-ms", "1000")) as broker:
            check = liveness(broker)
            create(broker.bootstrap, "soak", SOAK_TOPIC_CONFIGS, partitions=6)
            create_topic(broker.bootstrap, "quiet", IDLE_PARTITIONS)
            producer = _SteadyProducer(broker.bootstrap, "soak", SOAK_RATE, stop)
            readers = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "readers",
                                 "auto.offset.reset": "earliest"}) for _ in range(2)]
            idlers = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"idle{i}",
                                "fetch.wait.max.ms": 100}) for i in range(2)]
            for reader in readers:
                reader.subscribe(["soak"])
            for idler in idlers:
                idler.assign([TopicPartition("quiet", p, 0) for p in range(IDLE_PARTITIONS)])
            threads = [producer] + [
                threading.Thread(target=_poll_until, args=(c, stop), daemon=True)
                for c in readers + idlers
            ] + [threading.Thread(target=_vanishing_clients,
                                  args=(broker.bootstrap, stop, 20.0), daemon=True)]
            for thread in threads:
                thread.start()
            try:
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < minutes * 60:
                    stop.wait(10.0)
                    check()
                    window = producer.take()
                    samples.append({
                        "t_s": round(time.monotonic() - started, 1),
                        "rss_mib": round(tree_rss_mib(broker.pid), 2),
                        "open_fds": tree_open_fds(broker.pid),
                        "p99_ms": ceil.latency_summary_ms(window).get("p99"),
                        "delivered": len(window),
                        "watches": _metric(broker, "krill_long_poll_watches"),
                        "connections": _metric(broker, "krill_kafka_connections"),
                        "segments": len(list(Path(broker.data_dir).glob("*/*.log"))),
                        "stored_mb": round(sum(p.stat().st_size for p in
                                               Path(broker.data_dir).glob("*/*.log")) / 1e6, 1),
                    })
                    log(f"soak {elapsed / 60:.1f} min: {json.dumps(samples[-1])}")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(30)
                for consumer in readers + idlers:
                    consumer.close()
        steady = [s for s in samples if s["t_s"] >= warmup_s]
        res["samples"] = samples
        res["rss_slope_mib_per_10_min"] = _slope_per_10_min(
            [(s["t_s"], s["rss_mib"]) for s in steady])
        res["fds_slope_per_10_min"] = _slope_per_10_min(
            [(s["t_s"], s["open_fds"]) for s in steady])
        res["p99_slope_ms_per_10_min"] = _slope_per_10_min(
            [(s["t_s"], s["p99_ms"]) for s in steady if s["p99_ms"] is not None])
        p99s = [s["p99_ms"] for s in steady if s["p99_ms"] is not None]
        res["p99_ms_median"] = statistics.median(p99s) if p99s else None
        res["delivery_errors"] = producer.errors
        rss, fds = res["rss_slope_mib_per_10_min"], res["fds_slope_per_10_min"]
        met = (rss is not None and abs(rss) < TARGET_SLOPE_PER_10_MIN
               and fds is not None and abs(fds) < TARGET_SLOPE_PER_10_MIN)
        # 90 s of samples cannot show a slope per 10 minutes (2 fds in 90 s read as 13).
        res["met"] = None if args.quick else met
    except Exception as e:
        case_failed(res, "soak", e)
    return finish(res, t0)


RUNNING_CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "idle_consumers": run_idle_consumers,
    "cold_reads": run_cold_reads,
    "metrics_overhead": run_metrics_overhead,
    "soak": run_soak,
}
