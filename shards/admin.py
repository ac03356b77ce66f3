"""The admin HTTP endpoint, served by the supervisor: metrics for Prometheus, health checks.

    GET /metrics                    every metric, Prometheus text format
    GET /public_metrics             the `redpanda_*` ones only (Redpanda's dashboards read them)
    GET /v1/status/ready            200 once every shard serves, else 503 (load balancers)
    GET /v1/status/live             200 while every shard process runs, else 503
    GET /v1/cluster/health_overview is the cluster healthy: nodes down, leaderless partitions,
                                    under-replicated ones among those this node leads
    GET /v1/node                    this node: id, addresses, shards, uptime
    GET /v1/partitions              this node's replicas of replicated partitions: role,
                                    leader, term, high watermark, log end, followers' match
                                    (their last offset), quiesced (an idle group that stopped
                                    ticking), replicas, in-sync replicas (a leader's) and
                                    min.insync.replicas

Failure probes, after Redpanda's `/v1/failure-probes`, for fault-injection tests and the
scenario runner's slow-disk and fdatasync-error faults (storage/probes.py). They answer 403
unless the node runs with `enable_failure_injection: true`. Each request goes to every shard;
the answer is JSON, `{"probes": {name: {...}}, "shards": [probes of shard 0, ...]}`, 200 once
every shard took it, 503 if one did not answer (then some shards may have it: retry).

    GET    /v1/failure-probes                              the probes set
    PUT    /v1/failure-probes/storage/fdatasync/exception  every later partition-log fdatasync
                                                            fails with EIO (the real failure
                                                            path: logs cut back, acks refused)
    PUT    /v1/failure-probes/storage/fdatasync/delay?ms=N every one takes N ms more, slept
                                                            on the I/O thread (a slow disk)
    DELETE /v1/failure-probes                              clear every probe
    DELETE /v1/failure-probes/storage/fdatasync/{exception,delay}   clear one

The supervisor runs it on a thread of its own, off every shard's core loop. Each request for
metrics or health asks every shard for a snapshot over its stats socket (shards/stats.py) and
builds the answer from those: what a shard records costs it a counter increment
(actors/metrics.py); formatting, summing and consumer-group lag (a partition's high watermark
less a group's committed offset) happen here.

Names follow Redpanda's public metrics where one exists (`redpanda_kafka_request_bytes_total`,
`redpanda_kafka_max_offset`, `redpanda_kafka_consumer_group_lag_sum`, ...), with Redpanda's
labels, so its dashboards work unchanged; the rest are `krill_*`, labelled by shard.
Replication is told by each partition's leader, as Redpanda's and Kafka's brokers tell it:
`redpanda_kafka_under_replicated_replicas` (per partition this node leads: its replicas out of
the in-sync set), and Kafka's ReplicaManager gauges as `krill_under_replicated_partitions`
and `krill_under_min_isr_partitions` (per shard), with `krill_out_of_sync_replicas` by the node
that holds them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgpack
import zmq
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from actors.metrics import FLUSH_BYTES_BUCKETS, LATENCY_BUCKETS_S, STAGE_BUCKETS_S
from shards import limits
from shards.loop_watch import STALL_STATES
from shards.stats import stats_path
from storage.probes import PROBE_NAMES
from wire.messages import API_KEYS

__all__ = [
    "AdminServer",
    "Node",
    "controller_state",
    "gather",
    "health_overview",
    "partitions_overview",
    "render_metrics",
    "replicated_partitions",
]

log = logging.getLogger(__name__)

_PRODUCE, _FETCH = 0, 1
_PROBES_PATH = "/v1/failure-probes"
_NAMESPACE = "kafka"


@dataclass(frozen=True)
class Node:
    """What the admin server knows of its node without asking a shard."""

    node_id: int
    data_dir: str
    kafka_address: str
    shards: int
    run_dir: str
    started: float
    metrics_enabled: bool
    shard_pids: Callable[[], list[int | None]]  # None: that shard's process is not running
    failure_injection: bool = False  # /v1/failure-probes may be used


# Snapshots ----------------------------------------------------------------------------------


def gather(node: Node, timeout_s: float = limits.stats_timeout_s) -> list[dict[str, Any] | None]:
    """Every shard's snapshot, in shard order; None for a shard that did not answer in time."""
    return ask_shards(node, {"q": "snapshot"}, timeout_s)


def ask_shards(
    node: Node, request: dict[str, Any], timeout_s: float = limits.stats_timeout_s
) -> list[dict[str, Any] | None]:
    """Send `request` to every shard's stats socket; the answers in shard order, None for a
    shard that did not answer in time."""
    context: zmq.Context[Any] = zmq.Context.instance()
    sockets = []
    try:
        for shard in range(node.shards):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect("ipc://" + stats_path(node.run_dir, shard))
            sock.send(msgpack.packb(request))
            sockets.append(sock)
        answers: list[dict[str, Any] | None] = [None] * node.shards
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        waiting = node.shards
        while waiting and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(int(left * 1000) + 1):
                index = sockets.index(sock)
                answers[index] = msgpack.unpackb(sock.recv(), strict_map_key=False)
                poller.unregister(sock)
                waiting -= 1
        return answers
    finally:
        for sock in sockets:
            sock.close(linger=0)


def _proc(pid: int | None) -> dict[str, float]:
    """Resident bytes, open fds and CPU seconds of one shard process, from /proc."""
    if pid is None:
        return {}
    try:
        with open(f"/proc/{pid}/statm") as f:
            resident_pages = int(f.read().split()[1])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return {}
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "resident_bytes": resident_pages * os.sysconf("SC_PAGE_SIZE"),
        "open_fds": fds,
        "cpu_seconds": (int(fields[11]) + int(fields[12])) / ticks,
    }


# Metrics ------------------------------------------------------------------------------------


def _histogram(
    family: HistogramMetricFamily, labels: list[str], counts: list[int], total: float,
    bounds: tuple[float, ...],
) -> None:
    buckets = []
    running = 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
    family.add_metric(labels, buckets, total)


class _Collector:
    """Turns one scrape's snapshots into metric families (a prometheus_client collector)."""

    def __init__(self, node: Node, snapshots: list[dict[str, Any] | None], public: bool) -> None:
        self.node = node
        self.snapshots = snapshots
        self.public = public

    def collect(self) -> Iterator[Metric]:
        live = [(i, s) for i, s in enumerate(self.snapshots) if s is not None]
        yield from self._public(live)
        if not self.public:
            yield from self._internal(live)

    # redpanda_* ---------------------------------------------------------------------------

    def _public(self, live: list[tuple[int, dict[str, Any]]]) -> Iterator[Metric]:
        hwm: dict[tuple[str, int], int] = {}
        for _, snapshot in live:
            for topic, index, high_watermark, _ in snapshot["partitions"]:
                hwm[(topic, index)] = high_watermark
        metrics = [s["metrics"] for _, s in live if s.get("metrics") is not None]

        by_topic: dict[str, list[int]] = {}  # bytes in, records in, bytes out, records out
        for m in metrics:
            for topic, _index, b_in, r_in, b_out, r_out in m["partitions"]:
                sums = by_topic.setdefault(topic, [0, 0, 0, 0])
                for i, value in enumerate((b_in, r_in, b_out, r_out)):
                    sums[i] += value
        request_bytes = CounterMetricFamily(
            "redpanda_kafka_request_bytes", "Bytes produced to or fetched from a topic",
            labels=["redpanda_namespace", "redpanda_topic", "redpanda_request"])
        produced = CounterMetricFamily(
            "redpanda_kafka_records_produced", "Records produced to a topic",
            labels=["redpanda_namespace", "redpanda_topic"])
        fetched = CounterMetricFamily(
            "redpanda_kafka_records_fetched", "Records fetched from a topic",
            labels=["redpanda_namespace", "redpanda_topic"])
        for topic, (b_in, r_in, b_out, r_out) in sorted(by_topic.items()):
            request_bytes.add_metric([_NAMESPACE, topic, "produce"], b_in)
            request_bytes.add_metric([_NAMESPACE, topic, "consume"], b_out)
            produced.add_metric([_NAMESPACE, topic], r_in)
            fetched.add_metric([_NAMESPACE, topic], r_out)
        yield from (request_bytes, produced, fetched)

        max_offset = GaugeMetricFamily(
            "redpanda_kafka_max_offset", "The partition's high watermark",
            labels=["redpanda_namespace", "redpanda_topic", "redpanda_partition"])
        partitions: dict[str, int] = {}
        for (topic, index), high_watermark in sorted(hwm.items()):
            max_offset.add_metric([_NAMESPACE, topic, str(index)], high_watermark)
            partitions[topic] = partitions.get(topic, 0) + 1
        yield max_offset
        per_topic = GaugeMetricFamily(
            "redpanda_kafka_partitions", "Partitions of a topic served by this node",
            labels=["redpanda_namespace", "redpanda_topic"])
        for topic, count in sorted(partitions.items()):
            per_topic.add_metric([_NAMESPACE, topic], count)
        yield per_topic
        under = GaugeMetricFamily(
            "redpanda_kafka_under_replicated_replicas",
            "Replicas of a partition this node leads that are not in its in-sync set",
            labels=["redpanda_namespace", "redpanda_topic", "redpanda_partition"])
        out_of_sync = {(r["topic"], r["partition"]): len(r["replicas"]) - len(r["isr"])
                       for r in _led(self.snapshots)}
        for topic, index in sorted(set(hwm) | set(out_of_sync)):  # a lone copy: none
            under.add_metric([_NAMESPACE, topic, str(index)], out_of_sync.get((topic, index), 0))
        yield under
        yield GaugeMetricFamily("redpanda_cluster_topics", "Topics", value=len(partitions))
        yield GaugeMetricFamily("redpanda_cluster_partitions", "Partitions", value=len(hwm))
        yield GaugeMetricFamily("redpanda_cluster_brokers", "Brokers in the cluster", value=1)

        latency = HistogramMetricFamily(
            "redpanda_kafka_request_latency_seconds",
            "Latency of produce and fetch requests, from decode to answer",
            labels=["redpanda_request"])
        for key, name in ((_PRODUCE, "produce"), (_FETCH, "consume")):
            counts, total = _sum_histograms(m["requests"].get(key) for m in metrics)
            if counts:
                _histogram(latency, [name], counts, total, LATENCY_BUCKETS_S)
        yield latency
        yield _gauge_with(
            "redpanda_rpc_active_connections", "Open client connections", ["redpanda_server"],
            [(["kafka"], sum(m["connections"] for m in metrics))])
        yield from _group_metrics(metrics, hwm)
        try:
            disk = os.statvfs(self.node.data_dir)
            yield GaugeMetricFamily("redpanda_storage_disk_free_bytes", "Free space on the data "
                                    "directory's disk", value=disk.f_bavail * disk.f_frsize)
            yield GaugeMetricFamily("redpanda_storage_disk_total_bytes", "Size of the data "
                                    "directory's disk", value=disk.f_blocks * disk.f_frsize)
        except OSError:
            pass
        # Redpanda's values: 0 ok, 1 low space, 2 degraded (under storage_min_free_bytes:
        # produces refused). Krill has no low-space warning level: 0 or 2.
        alert = any(s.get("disk_alert") for _, s in live)
        yield GaugeMetricFamily("redpanda_storage_disk_free_space_alert", "2 while a shard "
                                "refuses produces for want of free space, else 0",
                                value=2 if alert else 0)
        yield CounterMetricFamily("redpanda_application_uptime_seconds", "Node uptime",
                                  value=time.time() - self.node.started)

    # krill_* ------------------------------------------------------------------------------

    def _internal(self, live: list[tuple[int, dict[str, Any]]]) -> Iterator[Metric]:
        shard_labels = ["shard"]
        gauges = {
            "memory_in_flight": ("krill_memory_in_flight_bytes",
                                 "Request bytes read and not yet answered"),
            "memory_backlog": ("krill_memory_pipe_backlog_bytes",
                               "Bytes waiting for room in a full pipe to another shard"),
            "memory_limit": ("krill_memory_budget_bytes",
                             "In-flight bytes past which connections stop reading"),
            "long_poll_watches": ("krill_long_poll_watches", "Long-poll fetches' waits"),
            "watch_subscriptions": ("krill_long_poll_subscriptions",
                                    "Subscriptions to other shards' watermarks"),
            "watch_subscriptions_served": ("krill_long_poll_subscriptions_served",
                                           "Other shards' subscriptions to ours"),
            "cross_shard_pending": ("krill_cross_shard_calls_pending",
                                    "Calls to other shards awaiting their answer"),
            "arena_used": ("krill_arena_used_bytes", "Shared-memory arena bytes held"),
            "arena_regions": ("krill_arena_regions", "Shared-memory arena regions held"),
            "io_outstanding": ("krill_io_pool_outstanding", "Calls out on the I/O pool"),
            "read_io_outstanding": ("krill_read_pool_outstanding",
                                    "Bulk reads out on the read pool"),
            "snapshot_seconds": ("krill_stats_snapshot_seconds",
                                 "Loop time the last snapshot took"),
        }
        for key, (name, help_text) in gauges.items():
            yield _gauge_with(name, help_text, shard_labels,
                              [([str(i)], s[key]) for i, s in live])
        start = GaugeMetricFamily("krill_partition_log_start_offset",
                                  "The partition's first offset (retention, DeleteRecords)",
                                  labels=["topic", "partition", "shard"])
        for i, s in live:
            for topic, index, _, log_start in s["partitions"]:
                start.add_metric([topic, str(index), str(i)], log_start)
        yield start
        yield _gauge_with("krill_storage_disk_free_bytes", "Free bytes on the data disk as "
                          "the shard's guard counts them (last look less appends since)",
                          shard_labels, [([str(i)], s["disk_free_bytes"]) for i, s in live
                                         if s.get("disk_free_bytes") is not None])
        yield _gauge_with("krill_storage_disk_free_space_alert", "1 while the shard refuses "
                          "produces: free space under storage_min_free_bytes", shard_labels,
                          [([str(i)], s.get("disk_alert", 0)) for i, s in live])
        yield _counter_with("krill_kafka_connections_refused", "Connections refused over "
                            "kafka_connections_max", shard_labels,
                            [([str(i)], s["connections_refused"]) for i, s in live])
        yield from _replication_gauges(self.snapshots)
        yield _counter_with("krill_raft_messages_dropped", "Raft messages that found no replica "
                            "of their group on the shard: none started (yet, or any more), or "
                            "one of another incarnation of the topic name", ["reason", "shard"],
                            [([reason, str(i)], count) for i, s in live
                             for reason, count in (s.get("raft_dropped") or {}).items()])
        ready = [([str(i)], 1 if s is not None and s["ready"] else 0)
                 for i, s in enumerate(self.snapshots)]
        yield _gauge_with("krill_shard_ready", "1 while the shard serves", shard_labels, ready)
        pids = self.node.shard_pids()
        procs = [(str(i), _proc(pid)) for i, pid in enumerate(pids)]
        yield _gauge_with("krill_shard_resident_memory_bytes", "Shard process RSS",
                          shard_labels, [([i], p["resident_bytes"]) for i, p in procs if p])
        yield _gauge_with("krill_shard_open_fds", "Shard process open files", shard_labels,
                          [([i], p["open_fds"]) for i, p in procs if p])
        yield _counter_with("krill_shard_cpu_seconds", "Shard process CPU time", shard_labels,
                            [([i], p["cpu_seconds"]) for i, p in procs if p])
        recorded = [(str(i), s["metrics"]) for i, s in live if s.get("metrics") is not None]
        if recorded:
            yield from _recorded(recorded)


def _replication_gauges(snapshots: list[dict[str, Any] | None]) -> Iterator[Metric]:
    """Kafka's ReplicaManager gauges, over the partitions each shard leads (a node in a
    cluster); and the replicas out of sync by the node that holds them."""
    under = {i: 0 for i, s in enumerate(snapshots) if s is not None and "raft" in s}
    under_min = dict(under)
    out_of_sync: dict[int, int] = {}
    for r in _led(snapshots):
        missing = [node for node in r["replicas"] if node not in r["isr"]]
        under[r["shard"]] += bool(missing)
        under_min[r["shard"]] += len(r["isr"]) < r["min_insync"]
        for node in missing:
            out_of_sync[node] = out_of_sync.get(node, 0) + 1
    yield _gauge_with("krill_under_replicated_partitions", "Partitions the shard leads with "
                      "fewer replicas in sync than replicas (Kafka's UnderReplicatedPartitions)",
                      ["shard"], [([str(i)], n) for i, n in sorted(under.items())])
    yield _gauge_with("krill_under_min_isr_partitions", "Partitions the shard leads with fewer "
                      "replicas in sync than min.insync.replicas: acks=all is refused "
                      "(Kafka's UnderMinIsrPartitionCount)", ["shard"],
                      [([str(i)], n) for i, n in sorted(under_min.items())])
    yield _gauge_with("krill_out_of_sync_replicas", "Replicas on a node that are out of the "
                      "in-sync set of a partition this node leads", ["node"],
                      [([str(node)], n) for node, n in sorted(out_of_sync.items())])


def _recorded(recorded: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    """What shards count themselves (actors/metrics.py), by shard."""
    latency = HistogramMetricFamily(
        "krill_kafka_request_latency_seconds", "Request latency by API, from decode to answer",
        labels=["api", "shard"])
    fdatasync = HistogramMetricFamily(
        "krill_storage_fdatasync_latency_seconds", "fdatasync of a partition's flush",
        labels=["shard"])
    flush_bytes = HistogramMetricFamily(
        "krill_storage_flush_bytes", "Bytes one fdatasync made durable", labels=["shard"])
    for shard, m in recorded:
        for key, (counts, total) in sorted(m["requests"].items()):
            _histogram(latency, [API_KEYS.get(key, str(key)), shard], counts, total,
                       LATENCY_BUCKETS_S)
        counts, total = m["fdatasync"]
        _histogram(fdatasync, [shard], counts, total, LATENCY_BUCKETS_S)
        counts, total = m["flush_bytes"]
        _histogram(flush_bytes, [shard], counts, total, FLUSH_BYTES_BUCKETS)
    yield from (latency, fdatasync, flush_bytes)
    labels = ["topic", "partition", "shard"]
    names = (("produced_bytes", "Bytes appended"), ("produced_records", "Records appended"),
             ("fetched_bytes", "Bytes sent to consumers by this shard"),
             ("fetched_records", "Records sent to consumers by this shard"))
    families = [CounterMetricFamily(f"krill_partition_{name}", text, labels=labels)
                for name, text in names]
    for shard, m in recorded:
        for topic, index, *values in m["partitions"]:
            for family, value in zip(families, values, strict=True):
                family.add_metric([topic, str(index), shard], value)
    yield from families
    yield _gauge_with("krill_kafka_connections", "Open Kafka connections", ["shard"],
                      [([s], m["connections"]) for s, m in recorded])
    yield _counter_with("krill_kafka_connections_accepted", "Kafka connections accepted",
                        ["shard"], [([s], m["connections_accepted"]) for s, m in recorded])
    yield _counter_with("krill_storage_fdatasync_errors", "Flushes whose fdatasync failed "
                        "(the log cut back to its flushed offset, their produces refused)",
                        ["shard"], [([s], m.get("fdatasync_errors", 0)) for s, m in recorded])
    yield _counter_with("krill_storage_write_errors", "Segment writes that failed (ENOSPC, "
                        "EIO) and were undone", ["shard"],
                        [([s], m.get("write_errors", 0)) for s, m in recorded])
    yield _counter_with("krill_storage_cold_reads", "Reads that missed the page cache and "
                        "were read in on the I/O pool first", ["shard"],
                        [([s], m["cold_reads"]) for s, m in recorded])
    for key, name, help_text in _LIFECYCLE_COUNTERS:
        yield _counter_with(name, help_text, ["shard"],
                            [([s], m["lifecycle"][key]) for s, m in recorded])
    yield from _loop_and_pools(recorded)


def _loop_and_pools(recorded: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    """The shard loop's turns, stalls and GC pauses, and its I/O pools' calls
    (shards/loop_watch.py, shards/io_pool.py)."""
    turns = HistogramMetricFamily(
        "krill_reactor_turn_seconds", "How long each turn of the shard's loop ran",
        labels=["shard"])
    gc_pauses = HistogramMetricFamily(
        "krill_gc_pause_seconds", "Python garbage collections, by generation (each stops "
        "the shard's loop)", labels=["generation", "shard"])
    waits = HistogramMetricFamily(
        "krill_io_queue_wait_seconds", "From a blocking call handed to an I/O pool to a "
        "worker starting it", labels=["pool", "shard"])
    calls = HistogramMetricFamily(
        "krill_io_call_seconds", "A blocking call on an I/O pool (fdatasync, a cold read)",
        labels=["pool", "shard"])
    stages = HistogramMetricFamily(
        "krill_produce_stage_seconds", "A traced produce request's time in each stage "
        "(trace_produce_every; actors/trace.py)", labels=["stage", "shard"])
    stalls = []
    stall_seconds = []
    for shard, m in recorded:
        for stage, (counts, total) in (m.get("produce_stages") or {}).items():
            _histogram(stages, [stage, shard], counts, total, STAGE_BUCKETS_S)
        loop = m.get("loop")
        if loop is not None:
            counts, total = loop["turns"]
            _histogram(turns, [shard], counts, total, LATENCY_BUCKETS_S)
            for generation, (counts, total) in enumerate(loop["gc"]):
                _histogram(gc_pauses, [str(generation), shard], counts, total,
                           LATENCY_BUCKETS_S)
            stalls.append(([shard], loop["stalls"]))
            for state, seconds in zip(STALL_STATES, loop["stall_seconds"], strict=True):
                stall_seconds.append(([state, shard], seconds))
        for pool, pool_stats in sorted((m.get("io_pools") or {}).items()):
            for family, key in ((waits, "queue_wait"), (calls, "call")):
                counts, total = pool_stats[key]
                _histogram(family, [pool, shard], counts, total, LATENCY_BUCKETS_S)
    yield from (turns, gc_pauses, waits, calls, stages)
    yield _counter_with("krill_reactor_stalls", "Turns of the shard's loop that ran "
                        "loop_stall_threshold_ms or longer (Seastar's reactor stalls)",
                        ["shard"], stalls)
    yield _counter_with("krill_reactor_stall_seconds", "The loop thread's time across its "
                        "stalls (each from the watchdog's look before it to its look after), "
                        "by where it was: running on a CPU, runnable (waiting for one), or "
                        "blocked in the kernel", ["state", "shard"], stall_seconds)
    yield from _direct_chunks(recorded)


def _direct_chunks(recorded: list[tuple[str, dict[str, Any]]]) -> Iterator[Metric]:
    """Direct mode's chunk pools (storage/appender.py), one per shard."""
    pools = [(shard, m["chunks"]) for shard, m in recorded if m.get("chunks")]
    if not pools:
        return
    chunks = GaugeMetricFamily("krill_storage_direct_chunks", "Chunks of a shard's write "
                               "memory, by state (free: neither unwritten bytes nor cache)",
                               labels=["state", "shard"])
    for shard, pool in pools:
        chunks.add_metric(["all", shard], pool["chunks"])
        chunks.add_metric(["free", shard], pool["free"])
    yield chunks
    yield _counter_with("krill_storage_direct_overflow_chunks", "Chunks made beyond "
                        "direct_memory_bytes: every chunk held bytes not yet written",
                        ["shard"], [([shard], pool["overflow"]) for shard, pool in pools])
    yield _counter_with("krill_storage_direct_evictions", "Written chunks taken back from "
                        "the cache for new bytes", ["shard"],
                        [([shard], pool["evictions"]) for shard, pool in pools])
    yield _counter_with("krill_storage_direct_reads", "Reads of direct-mode segments: from "
                        "the chunks in memory (hit) or from the file (miss)", ["result", "shard"],
                        [([result, shard], pool[key]) for shard, pool in pools
                         for result, key in (("hit", "cache_hits"), ("miss", "cache_misses"))])
    windows = GaugeMetricFamily("krill_storage_direct_read_window_bytes", "Bytes of a shard's "
                                "read windows (O_DIRECT reads of what the chunks no longer "
                                "hold, storage/direct_read.py)", labels=["shard"])
    for shard, pool in pools:
        windows.add_metric([shard], pool["window_bytes"])
    yield windows
    yield _counter_with("krill_storage_direct_read_window_fills", "Read windows read in "
                        "with O_DIRECT (a miss, with its readahead)", ["shard"],
                        [([shard], pool["window_fills"]) for shard, pool in pools])
    yield _counter_with("krill_storage_direct_read_window_fill_bytes", "Bytes read into "
                        "read windows", ["shard"],
                        [([shard], pool["window_fill_bytes"]) for shard, pool in pools])
    yield _counter_with("krill_storage_direct_read_window_hits", "Reads served from a read "
                        "window", ["shard"],
                        [([shard], pool["window_hits"]) for shard, pool in pools])


_LIFECYCLE_COUNTERS = (
    ("segments_removed", "krill_storage_segments_removed",
     "Segments retention (or a DeleteRecords start) removed"),
    ("bytes_removed", "krill_storage_removed_bytes", "Bytes of the segments removed"),
    ("cleans", "krill_storage_compactions", "Compactions that replaced segments"),
    ("clean_bytes_read", "krill_storage_compaction_read_bytes",
     "Bytes compaction read (every pass, those that changed nothing too)"),
    ("clean_bytes_written", "krill_storage_compaction_written_bytes",
     "Bytes compaction wrote"),
    ("clean_records_removed", "krill_storage_compaction_removed_records",
     "Records compaction removed"),
)


def _group_metrics(
    metrics: list[dict[str, Any]], hwm: dict[tuple[str, int], int]
) -> Iterator[Metric]:
    committed = GaugeMetricFamily(
        "redpanda_kafka_consumer_group_committed_offset", "A group's committed offset",
        labels=["redpanda_group", "redpanda_topic", "redpanda_partition"])
    consumers = GaugeMetricFamily("redpanda_kafka_consumer_group_consumers",
                                  "Members of a group", labels=["redpanda_group"])
    topics = GaugeMetricFamily("redpanda_kafka_consumer_group_topics",
                               "Topics a group has committed offsets for",
                               labels=["redpanda_group"])
    lag_max = GaugeMetricFamily("redpanda_kafka_consumer_group_lag_max",
                                "The largest lag of a group over its partitions",
                                labels=["redpanda_group"])
    lag_sum = GaugeMetricFamily("redpanda_kafka_consumer_group_lag_sum",
                                "A group's lag summed over its partitions",
                                labels=["redpanda_group"])
    for m in metrics:
        for group, info in sorted((m.get("groups") or {}).items()):
            consumers.add_metric([group], info["members"])
            lags = []
            names = set()
            for topic, index, offset in info["offsets"]:
                committed.add_metric([group, topic, str(index)], offset)
                names.add(topic)
                high_watermark = hwm.get((topic, index))
                if high_watermark is not None:
                    lags.append(max(0, high_watermark - offset))
            topics.add_metric([group], len(names))
            lag_max.add_metric([group], max(lags, default=0))
            lag_sum.add_metric([group], sum(lags))
    yield from (committed, consumers, topics, lag_max, lag_sum)


def _sum_histograms(parts: Iterator[Any]) -> tuple[list[int], float]:
    counts: list[int] = []
    total = 0.0
    for part in parts:
        if part is None:
            continue
        part_counts, part_total = part
        counts = [a + b for a, b in zip(counts, part_counts, strict=True)] if counts else list(
            part_counts)
        total += part_total
    return counts, total


def _gauge_with(
    name: str, help_text: str, labels: list[str], samples: Sequence[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _counter_with(
    name: str, help_text: str, labels: list[str], samples: Sequence[tuple[list[str], float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def render_metrics(node: Node, snapshots: list[dict[str, Any] | None], public: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(node, snapshots, public))  # type: ignore[arg-type]
    return generate_latest(registry)


# Health -------------------------------------------------------------------------------------


def health_overview(node: Node, snapshots: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Redpanda's /v1/cluster/health_overview, for one node: healthy when every shard serves
    and every partition of the topic table is served by its owner. In a cluster (shard 0
    reports the controller), see `_cluster_health`."""
    down = [i for i, s in enumerate(snapshots) if s is None or not s["ready"]]
    controller = controller_state(snapshots)
    if controller is not None:
        return _cluster_health(node, snapshots, controller, down)
    served = {(t, p) for s in snapshots if s is not None for t, p, _, _ in s["partitions"]}
    table = snapshots[0]["topics"] if snapshots and snapshots[0] is not None else []
    leaderless = [
        {"topic": name, "partition": index}
        for name, count in table
        for index in range(count)
        if (name, index) not in served
    ]
    return {
        "is_healthy": not down and not leaderless and snapshots[0] is not None,
        "controller_id": node.node_id,
        "all_nodes": [node.node_id],
        "nodes_down": [node.node_id] if down else [],
        "shards_down": down,
        "leaderless_count": len(leaderless),
        "leaderless_partitions": leaderless[: limits.health_partitions_listed_max],
        "under_replicated_count": 0,  # one replica each: nothing to be under
        "under_replicated_partitions": [],
    }


# Replication --------------------------------------------------------------------------------
#
# In a cluster each shard's snapshot carries "raft": one entry per replica it hosts,
# [topic, partition, role, leader node (-1: none known), term, high watermark, log end,
# followers, quiesced, isr, replicas, min.insync.replicas], followers being {node: matched
# offset (its last)} and isr the in-sync replica nodes on a leader, {} and [] elsewhere;
# replicas every replica's node. Shard 0's carries "controller": {"leader": node or -1, "term":
# int, "nodes": [registered ids]}. A node of its own has neither key.

RAFT_ROLES = ("leader", "follower", "candidate", "precandidate")


def replicated_partitions(snapshots: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """This node's replicas of replicated partitions, by topic and partition; empty for a node
    of its own (or shards that do not say)."""
    replicas = []
    for shard, snapshot in enumerate(snapshots):
        for entry in (snapshot or {}).get("raft") or ():
            (topic, partition, role, leader, term, high_watermark, log_end, followers,
             quiesced, isr, nodes, min_insync) = entry
            replicas.append({
                "topic": topic, "partition": partition, "shard": shard, "role": role,
                "leader": leader, "term": term, "high_watermark": high_watermark,
                "log_end": log_end,
                "followers": {str(n): offset for n, offset in sorted((followers or {}).items())},
                "quiesced": quiesced, "replicas": list(nodes), "isr": list(isr),
                "min_insync": min_insync,
            })
    replicas.sort(key=lambda r: (r["topic"], r["partition"]))
    return replicas


def _led(snapshots: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The replicated partitions this node leads, with their in-sync replicas."""
    return [r for r in replicated_partitions(snapshots) if r["role"] == "leader" and r["isr"]]


def controller_state(snapshots: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Shard 0's view of the controller group, None for a node of its own (or when shard 0
    did not answer)."""
    first = snapshots[0] if snapshots else None
    controller = None if first is None else first.get("controller")
    if controller is None:
        return None
    # A shard that does not give the term yet: -1, rather than a 500 for the whole overview.
    return {"leader": controller["leader"], "term": controller.get("term", -1),
            "nodes": sorted(controller["nodes"])}


def partitions_overview(node: Node, snapshots: list[dict[str, Any] | None]) -> dict[str, Any]:
    """GET /v1/partitions: what `krill cluster info` reads for followers' lag."""
    return {
        "node_id": node.node_id,
        "controller": controller_state(snapshots),
        "shards_down": [i for i, s in enumerate(snapshots) if s is None],
        "partitions": replicated_partitions(snapshots),
    }


def _cluster_health(
    node: Node, snapshots: list[dict[str, Any] | None], controller: dict[str, Any],
    down: list[int],
) -> dict[str, Any]:
    """The overview of a node in a cluster, as this node sees it: the controller's leader
    and registered nodes, its own replicas' leadership (a replica that knows no leader
    makes its partition leaderless), and the partitions it leads with fewer replicas in sync
    than replicas (`krill cluster health` reads every partition's from Metadata's ISR)."""
    replicas = replicated_partitions(snapshots)
    leaderless = sorted({(r["topic"], r["partition"]) for r in replicas if r["leader"] < 0})
    under = [(r["topic"], r["partition"]) for r in _led(snapshots)
             if len(r["isr"]) < len(r["replicas"])]
    listed = limits.health_partitions_listed_max
    return {
        "is_healthy": not down and not leaderless and not under and controller["leader"] >= 0,
        "node_id": node.node_id,
        "controller_id": controller["leader"],
        "controller": controller,
        "all_nodes": controller["nodes"],
        "nodes_down": [node.node_id] if down else [],
        "shards_down": down,
        "leaderless_count": len(leaderless),
        "leaderless_partitions": [{"topic": t, "partition": p} for t, p in leaderless[:listed]],
        "under_replicated_count": len(under),
        "under_replicated_partitions": [{"topic": t, "partition": p} for t, p in under[:listed]],
        "leaders_count": sum(r["role"] == "leader" for r in replicas),
        "leadership": [
            {"topic": r["topic"], "partition": r["partition"], "role": r["role"],
             "leader": r["leader"], "term": r["term"]}
            for r in replicas[:listed]
        ],
    }


# The HTTP server ----------------------------------------------------------------------------


class AdminServer:
    """The admin endpoint on a socket the supervisor bound (shards/ports.py)."""

    def __init__(self, sock: socket.socket, node: Node) -> None:
        self.node = node
        handler = type("_BoundHandler", (_Handler,), {"node": node})
        self._server = ThreadingHTTPServer(sock.getsockname()[:2], handler,
                                           bind_and_activate=False)
        self._server.socket.close()
        self._server.socket = sock
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="admin", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0), at most `admin_requests_in_flight_max` at once,
    each socket timing out after `admin_socket_timeout_s`: a client cannot keep threads of
    the supervisor, however many connections it opens or however slowly it sends."""

    node: Node
    protocol_version = "HTTP/1.0"
    server_version = "krill-admin"
    timeout = limits.admin_socket_timeout_s
    in_flight = threading.BoundedSemaphore(limits.admin_requests_in_flight_max)

    def handle(self) -> None:
        # A client that leaves while its request is read or its answer (a 503 or 500 too) is
        # written is no error of ours: no traceback from socketserver.
        try:
            super().handle()
        except ConnectionError as e:
            log.debug("admin: the client went away (%s)", e)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._bounded(self._get)

    def do_PUT(self) -> None:  # noqa: N802
        self._bounded(self._probes)

    def do_DELETE(self) -> None:  # noqa: N802
        self._bounded(self._probes)

    def _bounded(self, serve: Callable[[str], None]) -> None:
        if not self.in_flight.acquire(blocking=False):
            self._send(503, b"too many admin requests at once; retry\n")
            return
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            serve(path)
        except ConnectionError as e:  # the client left before its answer (a probe timed out)
            log.debug("admin: %s %s: the client went away (%s)", self.command, path, e)
        except Exception:  # our bug: answer 500, keep serving
            log.exception("admin: %s %s failed", self.command, path)
            self._send(500, b"internal error\n")
        finally:
            self.in_flight.release()

    def _get(self, path: str) -> None:
        node = self.node
        if path.startswith(_PROBES_PATH):
            self._probes(path)
        elif path in ("/metrics", "/public_metrics"):
            if not node.metrics_enabled:
                self._send(404, b"metrics are disabled (disable_metrics: true)\n")
                return
            body = render_metrics(node, gather(node), public=path == "/public_metrics")
            self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/status/ready":
            snapshots = gather(node)
            ready = all(s is not None and s["ready"] for s in snapshots)
            self._json(200 if ready else 503, {"status": "ready" if ready else "booting"})
        elif path == "/v1/status/live":
            live = all(pid is not None for pid in node.shard_pids())
            self._json(200 if live else 503, {"status": "live" if live else "dead"})
        elif path == "/v1/cluster/health_overview":
            self._json(200, health_overview(node, gather(node)))
        elif path == "/v1/partitions":
            self._json(200, partitions_overview(node, gather(node)))
        elif path == "/v1/node":
            self._json(200, {
                "node_id": node.node_id, "kafka": node.kafka_address,
                "shards": node.shards, "data_dir": node.data_dir,
                "uptime_s": round(time.time() - node.started, 3),
            })
        else:
            self._send(404, f"no such endpoint: {path}\n".encode())

    def _probes(self, path: str) -> None:
        """/v1/failure-probes (the module docstring)."""
        if not path.startswith(_PROBES_PATH):
            self._send(404, f"no such endpoint: {path}\n".encode())
            return
        if not self.node.failure_injection:
            self._send(403, b"failure injection is off: start the node with "
                            b"--enable-failure-injection (enable_failure_injection: true)\n")
            return
        name = path[len(_PROBES_PATH):].strip("/") or None
        if name is not None and name not in PROBE_NAMES:
            self._send(404, f"no such failure probe: {name} (known: "
                            f"{', '.join(PROBE_NAMES)})\n".encode())
            return
        request: dict[str, Any] = {"q": "probes", "op": "list"}
        if self.command == "DELETE":
            request.update(op="clear", probe=name)
        elif self.command == "PUT":
            if name is None:
                self._send(405, b"PUT names a probe: /v1/failure-probes/<probe>\n")
                return
            request.update(op="set", probe=name)
            if PROBE_NAMES[name]:
                query = parse_qs(urlsplit(self.path).query)
                ms = query.get("ms", [""])[0]
                if not ms.isdigit() or not 0 < int(ms) <= limits.failure_probe_delay_ms_max:
                    self._send(400, f"{name} takes ?ms=N, N in 1.."
                                    f"{limits.failure_probe_delay_ms_max}\n".encode())
                    return
                request["ms"] = int(ms)
        answers = ask_shards(self.node, request)
        errors = {a["error"] for a in answers if a is not None and "error" in a}
        if errors:
            self._send(400, f"{'; '.join(sorted(errors))}\n".encode())
            return
        shards = [None if a is None else a["probes"] for a in answers]
        merged: dict[str, Any] = {}
        for probes in shards:
            merged.update(probes or {})
        complete = all(a is not None for a in answers)
        self._json(200 if complete else 503, {"probes": merged, "shards": shards})

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode() + b"\n", "application/json")

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        log.debug("admin: " + format, *args)
