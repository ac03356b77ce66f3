"""The admin port of a real 2-shard node: /metrics after a known workload, /public_metrics,
the text format itself, the status endpoints (healthy, a shard stopped, a shard killed),
`--disable-metrics`, consumer-group lag against `krill group describe`, the connection gauges,
and what a deleted topic leaves behind.

Most checks share one node on which a module fixture runs one workload and scrapes at once,
before any other test touches the node: there, every count the workload determines (records,
offsets, committed offsets, lag, the producer's own count of Produce requests) is compared
exactly. Latencies, RSS and fds only have sane ranges.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from actors.metrics import (
    FLUSH_BYTES_BUCKETS,
    LATENCY_BUCKETS_S,
    PRODUCE_STAGES,
    STAGE_BUCKETS_S,
)
from shards import limits as shard_limits
from shards.loop_watch import STALL_STATES
from shards.shard_table import shard_of
from tests.support.broker import BrokerProcess
from tests.support.cli import krill
from tests.support.kafka import admin_client, consume, create_topic, produce
from tests.support.raw_client import RawClient, request
from wire.messages.api_versions import ApiVersionsResponse

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores for two shards"),
]

SHARDS = 2
GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "100", "--offsets-topic-partitions", "10")
WAIT_S = 30.0  # any bounded wait for the node or a client to get somewhere
STATS_TIMEOUT_S = 5.0  # shards/limits.py stats_timeout_s: how long a scrape waits for a shard

TOPIC = "metered"
PARTITIONS = 4
RECORDS = 2000
VALUE_BYTES = 100
GROUP = "metered-readers"
COMMITTED = {0: 500, 1: 250, 2: 17}  # partition 3: never committed
API_VERSIONS = 18

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


# Helpers --------------------------------------------------------------------------------------


def select(samples: Samples, name: str, **labels: str) -> dict[Labels, float]:
    """Every sample called `name` whose labels include `labels`, by its full label set."""
    wanted = set(labels.items())
    return {
        sample_labels: value
        for (sample_name, sample_labels), value in samples.items()
        if sample_name == name and wanted <= set(sample_labels)
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample called `name` with exactly these labels."""
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {key}; {name} has {select(samples, name)}"
    return samples[key]


def by_label(samples: dict[Labels, float], label: str) -> dict[str, float]:
    """The samples by one label's value, summed over the others (shards, say)."""
    summed: dict[str, float] = {}
    for labels, v in samples.items():
        key = dict(labels)[label]
        summed[key] = summed.get(key, 0) + v
    return summed


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll `probe()` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s}s (last: {last!r})")


def get_json(node: BrokerProcess, path: str) -> tuple[int, Any]:
    status, body = node.admin_get(path)
    return status, json.loads(body)


def assert_histogram(samples: Samples, name: str, bounds: tuple[float, ...], **labels: str) -> int:
    """Buckets are cumulative over exactly `bounds` and +Inf, and +Inf equals _count; returns
    the count."""
    buckets = {
        float(dict(lbls)["le"]): v
        for lbls, v in select(samples, f"{name}_bucket", **labels).items()
        if set(dict(lbls)) == {*labels, "le"}
    }
    assert sorted(buckets) == [*bounds, math.inf], (name, labels, sorted(buckets))
    counts = [buckets[b] for b in sorted(buckets)]
    assert counts == sorted(counts), f"{name}{labels}: buckets not cumulative: {counts}"
    count = value(samples, f"{name}_count", **labels)
    assert buckets[math.inf] == count, (name, labels, buckets[math.inf], count)
    assert value(samples, f"{name}_sum", **labels) >= 0
    return int(count)


def start_node(tmp: Path, *extra: str) -> BrokerProcess:
    return BrokerProcess(tmp / "data", *GROUP_ARGS, *extra, smp=SHARDS).start()


def stop_node(node: BrokerProcess) -> None:
    node.kill9() if node.alive() else node.stop()


def consume_in_group(node: BrokerProcess, topic: str, group: str, count: int) -> Consumer:
    """A subscribed consumer that has read `count` records (returned open: the caller closes)."""
    consumer = Consumer({
        "bootstrap.servers": node.bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + WAIT_S * 2
        while got < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got += 1
        assert got == count, f"read {got} of {count} records in {WAIT_S * 2}s"
    except BaseException:
        consumer.close()
        raise
    return consumer


# The workload node ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    node: BrokerProcess
    scrape: Samples  # /metrics right after the workload, before any other test ran
    watermarks: dict[int, int]  # partition -> high watermark, as confluent-kafka read it
    produce_requests: int  # Produce requests the producer sent (librdkafka's statistics)


def produce_counted(node: BrokerProcess) -> int:
    """RECORDS records of VALUE_BYTES, round robin over the partitions, acks=all; returns how
    many Produce requests librdkafka sent, from its statistics once everything is delivered."""
    reports: list[dict[str, Any]] = []
    producer = Producer({
        "bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 5,
        "statistics.interval.ms": 100, "stats_cb": lambda text: reports.append(json.loads(text)),
    })
    failed: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    try:
        for i in range(RECORDS):
            producer.produce(TOPIC, value=bytes([65 + i % 26]) * VALUE_BYTES,
                             partition=i % PARTITIONS, on_delivery=on_delivery)
            producer.poll(0)
        assert producer.flush(WAIT_S) == 0, "records left undelivered"
        assert not failed, failed
        delivered_at = len(reports)
        # Two reports after the flush: the second one began after every request was answered.
        wait_for("two statistics reports after the flush",
                 lambda: producer.poll(0.1) is not None and len(reports) >= delivered_at + 2)
    finally:
        producer.close()
    last = reports[-1]
    return sum(b.get("req", {}).get("Produce", 0) for b in last["brokers"].values())


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workload]:
    # Every produce request traced stage by stage (actors/trace.py).
    node = start_node(tmp_path_factory.mktemp("metrics"), "--trace-produce-every", "1")
    try:
        create_topic(node, TOPIC, partitions=PARTITIONS)
        produce_requests = produce_counted(node)
        consumer = consume_in_group(node, TOPIC, GROUP, RECORDS)
        try:
            consumer.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in COMMITTED.items()],
                            asynchronous=False)
            watermarks = {
                p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                for p in range(PARTITIONS)
            }
        finally:
            consumer.close()
        yield Workload(node, node.metrics(), watermarks, produce_requests)
    finally:
        stop_node(node)


def test_workload_topic_spans_both_shards() -> None:
    """The exact per-shard checks below mean something only if both shards own a partition."""
    assert {shard_of(TOPIC, p, SHARDS) for p in range(PARTITIONS)} == set(range(SHARDS))


def test_records_bytes_and_offsets_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    topic = {"redpanda_namespace": "kafka", "redpanda_topic": TOPIC}
    assert value(m, "redpanda_kafka_records_produced_total", **topic) == RECORDS
    produced_bytes = value(m, "redpanda_kafka_request_bytes_total", **topic,
                           redpanda_request="produce")
    # Stored batches: the values plus per-record and per-batch headers, far less than double.
    assert RECORDS * VALUE_BYTES <= produced_bytes < RECORDS * VALUE_BYTES * 1.5
    fetched_bytes = value(m, "redpanda_kafka_request_bytes_total", **topic,
                          redpanda_request="consume")
    # Every batch went out at least once (the group read every record), whole batches only.
    assert produced_bytes <= fetched_bytes < 3 * produced_bytes
    fetched_records = value(m, "redpanda_kafka_records_fetched_total", **topic)
    assert RECORDS <= fetched_records < 3 * RECORDS

    assert workload.watermarks == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    max_offset = by_label(select(m, "redpanda_kafka_max_offset", **topic), "redpanda_partition")
    assert max_offset == {str(p): hwm for p, hwm in workload.watermarks.items()}
    assert value(m, "redpanda_kafka_partitions", **topic) == PARTITIONS
    # The cluster totals agree with the per-partition series.
    all_offsets = select(m, "redpanda_kafka_max_offset")
    assert value(m, "redpanda_cluster_partitions") == len(all_offsets)
    assert value(m, "redpanda_cluster_topics") == len(
        {dict(labels)["redpanda_topic"] for labels in all_offsets})
    assert value(m, "redpanda_cluster_brokers") == 1


def test_per_shard_partition_counters_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    records = select(m, "krill_partition_produced_records_total", topic=TOPIC)
    assert sum(records.values()) == RECORDS
    for p in range(PARTITIONS):
        per_shard = by_label(select(m, "krill_partition_produced_records_total", topic=TOPIC,
                                    partition=str(p)), "shard")
        owner = str(shard_of(TOPIC, p, SHARDS))
        # Appends are counted by the owner only (another shard may hold a zero series).
        assert per_shard[owner] == RECORDS // PARTITIONS, (p, per_shard)
        assert sum(per_shard.values()) == RECORDS // PARTITIONS, (p, per_shard)
    produced_bytes = select(m, "krill_partition_produced_bytes_total", topic=TOPIC)
    assert sum(produced_bytes.values()) == value(
        m, "redpanda_kafka_request_bytes_total", redpanda_namespace="kafka",
        redpanda_topic=TOPIC, redpanda_request="produce")
    fetched = select(m, "krill_partition_fetched_records_total", topic=TOPIC)
    assert sum(fetched.values()) == value(
        m, "redpanda_kafka_records_fetched_total", redpanda_namespace="kafka",
        redpanda_topic=TOPIC)
    fetched_bytes = select(m, "krill_partition_fetched_bytes_total", topic=TOPIC)
    assert sum(fetched_bytes.values()) == value(
        m, "redpanda_kafka_request_bytes_total", redpanda_namespace="kafka",
        redpanda_topic=TOPIC, redpanda_request="consume")


def test_group_offsets_and_lag_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    committed = by_label(select(m, "redpanda_kafka_consumer_group_committed_offset",
                                redpanda_group=GROUP, redpanda_topic=TOPIC),
                         "redpanda_partition")
    assert committed == {str(p): o for p, o in COMMITTED.items()}
    lags = [workload.watermarks[p] - o for p, o in COMMITTED.items()]
    assert value(m, "redpanda_kafka_consumer_group_lag_sum", redpanda_group=GROUP) == sum(lags)
    assert value(m, "redpanda_kafka_consumer_group_lag_max", redpanda_group=GROUP) == max(lags)
    assert sum(lags) == 0 + 250 + 483
    assert value(m, "redpanda_kafka_consumer_group_topics", redpanda_group=GROUP) == 1
    # The consumer closed (LeaveGroup) before the scrape.
    assert value(m, "redpanda_kafka_consumer_group_consumers", redpanda_group=GROUP) == 0


def test_request_latency_histograms_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    produce = assert_histogram(m, "redpanda_kafka_request_latency_seconds", LATENCY_BUCKETS_S,
                               redpanda_request="produce")
    consume = assert_histogram(m, "redpanda_kafka_request_latency_seconds", LATENCY_BUCKETS_S,
                               redpanda_request="consume")
    assert produce > 0 and consume > 0
    per_api: dict[str, int] = {}
    for shard in range(SHARDS):
        for labels in select(m, "krill_kafka_request_latency_seconds_count", shard=str(shard)):
            api = dict(labels)["api"]
            per_api[api] = per_api.get(api, 0) + assert_histogram(
                m, "krill_kafka_request_latency_seconds", LATENCY_BUCKETS_S, api=api,
                shard=str(shard))
    # The one producer of the workload sent every Produce request this node answered.
    assert workload.produce_requests >= 1
    assert per_api["Produce"] == workload.produce_requests
    assert produce == per_api["Produce"]
    assert consume == per_api["Fetch"] >= 1
    for api in ("Metadata", "ApiVersions", "CreateTopics", "JoinGroup", "SyncGroup",
                "OffsetCommit", "FindCoordinator", "ListOffsets"):
        assert per_api.get(api, 0) >= 1, (api, per_api)
    # Produce with acks=all waits for an fdatasync; nothing here should take a minute.
    produce_sum = value(m, "redpanda_kafka_request_latency_seconds_sum",
                        redpanda_request="produce")
    assert 0 < produce_sum < 60 * produce


def test_every_produce_request_traced_stage_by_stage(workload: Workload) -> None:
    """Each Produce request was observed once in every stage, on the shard of its connection;
    those whose first partition the other shard owns got its stamps back with the answer
    (shards/calls/produce.py): no acks=all request skipped its flush."""
    m = workload.scrape
    shards = [str(s) for s in range(SHARDS)]
    for stage in PRODUCE_STAGES:
        traced = sum(assert_histogram(m, "krill_produce_stage_seconds", STAGE_BUCKETS_S,
                                      stage=stage, shard=shard) for shard in shards)
        assert traced == workload.produce_requests, (stage, traced)
    for shard in shards:  # a flush is a hand-off to the I/O pool and back: never ~0
        fastest = value(m, "krill_produce_stage_seconds_bucket", stage="flush", shard=shard,
                        le=repr(STAGE_BUCKETS_S[0]))
        assert fastest == 0, (shard, fastest)
    latency = value(m, "redpanda_kafka_request_latency_seconds_sum", redpanda_request="produce")
    inside = sum(value(m, "krill_produce_stage_seconds_sum", stage=stage, shard=shard)
                 for stage in PRODUCE_STAGES[1:-1] for shard in shards)
    assert 0 < inside <= latency * 1.01 + 0.001, (inside, latency)  # from dispatch to answer


def test_fdatasync_histograms_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    for shard in map(str, range(SHARDS)):
        syncs = assert_histogram(m, "krill_storage_fdatasync_latency_seconds",
                                 LATENCY_BUCKETS_S, shard=shard)
        flushes = assert_histogram(m, "krill_storage_flush_bytes", FLUSH_BYTES_BUCKETS,
                                   shard=shard)
        assert syncs == flushes and syncs > 0, (shard, syncs, flushes)
        assert 0 < value(m, "krill_storage_fdatasync_latency_seconds_sum", shard=shard) < 60 * syncs
        # acks=all: every byte of the topic this shard appended was made durable, and no
        # flush made more durable than the shard appended over all its topics.
        flushed = value(m, "krill_storage_flush_bytes_sum", shard=shard)
        topic_bytes = sum(select(m, "krill_partition_produced_bytes_total", topic=TOPIC,
                                 shard=shard).values())
        all_bytes = sum(select(m, "krill_partition_produced_bytes_total", shard=shard).values())
        assert 0 < topic_bytes <= flushed <= all_bytes, (shard, topic_bytes, flushed, all_bytes)


def test_loop_and_io_pool_histograms_after_known_workload(workload: Workload) -> None:
    """Every shard's loop turned, and its fdatasyncs went through its I/O pool: one call
    timed per fdatasync, each with its wait before it (shards/loop_watch.py, io_pool.py)."""
    m = workload.scrape
    for shard in map(str, range(SHARDS)):
        turns = assert_histogram(m, "krill_reactor_turn_seconds", LATENCY_BUCKETS_S,
                                 shard=shard)
        assert turns > 0, shard
        assert value(m, "krill_reactor_stalls_total", shard=shard) <= turns
        for state in STALL_STATES:
            assert value(m, "krill_reactor_stall_seconds_total", state=state, shard=shard) >= 0
        syncs = value(m, "krill_storage_fdatasync_latency_seconds_count", shard=shard)
        calls = assert_histogram(m, "krill_io_call_seconds", LATENCY_BUCKETS_S, pool="io",
                                 shard=shard)
        waits = assert_histogram(m, "krill_io_queue_wait_seconds", LATENCY_BUCKETS_S,
                                 pool="io", shard=shard)
        assert calls == waits and calls >= syncs > 0, (shard, calls, waits, syncs)
        for generation in "012":
            assert_histogram(m, "krill_gc_pause_seconds", LATENCY_BUCKETS_S,
                             generation=generation, shard=shard)


def test_shard_gauges_after_known_workload(workload: Workload) -> None:
    m = workload.scrape
    shards = [str(s) for s in range(SHARDS)]
    assert by_label(select(m, "krill_shard_ready"), "shard") == dict.fromkeys(shards, 1.0)
    rss = by_label(select(m, "krill_shard_resident_memory_bytes"), "shard")
    assert set(rss) == set(shards)
    assert all(16 << 20 < v < 2 << 30 for v in rss.values()), rss
    fds = by_label(select(m, "krill_shard_open_fds"), "shard")
    assert set(fds) == set(shards)
    assert all(10 < v < 10_000 for v in fds.values()), fds  # segments, sockets, pipes
    cpu = by_label(select(m, "krill_shard_cpu_seconds_total"), "shard")
    assert set(cpu) == set(shards) and all(0 < v < 600 for v in cpu.values()), cpu
    budget = by_label(select(m, "krill_memory_budget_bytes"), "shard")
    assert set(budget) == set(shards) and all(v > 0 for v in budget.values()), budget
    for shard in shards:
        assert 0 <= value(m, "krill_memory_in_flight_bytes", shard=shard) <= budget[shard]
    assert 0 < value(m, "redpanda_application_uptime_seconds_total") < 600
    free = value(m, "redpanda_storage_disk_free_bytes")
    assert 0 < free <= value(m, "redpanda_storage_disk_total_bytes")


# /public_metrics and the text format ------------------------------------------------------------


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return samples


def test_public_metrics_are_the_redpanda_ones_of_metrics(workload: Workload) -> None:
    node = workload.node
    # Every client of the tests before has closed; wait until the node has seen them go, so
    # nothing changes between the two scrapes.
    wait_for("no Kafka connection open", lambda: sum(
        select(node.metrics(), "krill_kafka_connections").values()) == 0)
    status, full_body = node.admin_get("/metrics")
    assert status == 200
    status, public_body = node.admin_get("/public_metrics")
    assert status == 200
    full, public = parse(full_body.decode()), parse(public_body.decode())
    families = {f.name for f in text_string_to_metric_families(public_body.decode())}
    assert families and all(name.startswith("redpanda_") for name in families), families
    assert {key for key in full if key[0].startswith("redpanda_")} == set(public)
    assert any(key[0].startswith("krill_") for key in full)
    moving = {"redpanda_application_uptime_seconds_total", "redpanda_storage_disk_free_bytes"}
    for key, public_value in public.items():
        if key[0] not in moving:  # nothing ran on the node between the two scrapes
            assert public_value == full[key], (key, public_value, full[key])
    uptime = "redpanda_application_uptime_seconds_total"
    assert public[(uptime, ())] >= full[(uptime, ())]


def test_every_line_parses_and_every_family_has_help_and_type(workload: Workload) -> None:
    status, body = workload.node.admin_get("/metrics")
    assert status == 200
    text = body.decode()
    assert text.endswith("\n")
    helps: dict[str, int] = {}
    types: dict[str, str] = {}
    current: str | None = None
    samples = 0
    for number, line in enumerate(text.splitlines(), 1):
        assert line.strip(), f"line {number} is blank"
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            helps[name] = number
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert helps.get(name) == number - 1, f"line {number}: TYPE without HELP: {line}"
            types[name] = kind
            current = name
        else:
            assert not line.startswith("#"), f"line {number}: {line}"
            # Each sample line parses on its own and belongs to the family declared above it.
            (family,) = list(text_string_to_metric_families(line + "\n"))
            (sample,) = family.samples
            assert current is not None, f"line {number}: sample before any TYPE"
            suffixes = ("_bucket", "_count", "_sum") if types[current] == "histogram" else ("",)
            assert sample.name in {current + s for s in suffixes}, (number, line, current)
            if types[current] == "counter":
                assert current.endswith("_total"), (number, line)
            samples += 1
    assert set(helps) == set(types)
    assert samples > 100
    # The documented families are all there, with the right types.
    expected = {
        "redpanda_kafka_request_bytes_total": "counter",
        "redpanda_kafka_records_produced_total": "counter",
        "redpanda_kafka_records_fetched_total": "counter",
        "redpanda_kafka_max_offset": "gauge",
        "redpanda_kafka_partitions": "gauge",
        "redpanda_cluster_topics": "gauge",
        "redpanda_cluster_partitions": "gauge",
        "redpanda_cluster_brokers": "gauge",
        "redpanda_kafka_request_latency_seconds": "histogram",
        "redpanda_rpc_active_connections": "gauge",
        "redpanda_kafka_consumer_group_committed_offset": "gauge",
        "redpanda_kafka_consumer_group_consumers": "gauge",
        "redpanda_kafka_consumer_group_topics": "gauge",
        "redpanda_kafka_consumer_group_lag_max": "gauge",
        "redpanda_kafka_consumer_group_lag_sum": "gauge",
        "redpanda_storage_disk_free_bytes": "gauge",
        "redpanda_storage_disk_total_bytes": "gauge",
        "redpanda_application_uptime_seconds_total": "counter",
        "krill_kafka_request_latency_seconds": "histogram",
        "krill_storage_fdatasync_latency_seconds": "histogram",
        "krill_storage_flush_bytes": "histogram",
        "krill_partition_produced_bytes_total": "counter",
        "krill_partition_produced_records_total": "counter",
        "krill_partition_fetched_bytes_total": "counter",
        "krill_partition_fetched_records_total": "counter",
        "krill_memory_in_flight_bytes": "gauge",
        "krill_memory_budget_bytes": "gauge",
        "krill_kafka_connections": "gauge",
        "krill_kafka_connections_accepted_total": "counter",
        "krill_long_poll_watches": "gauge",
        "krill_cross_shard_calls_pending": "gauge",
        "krill_shard_ready": "gauge",
        "krill_shard_resident_memory_bytes": "gauge",
        "krill_shard_open_fds": "gauge",
        "krill_shard_cpu_seconds_total": "counter",
        "krill_storage_cold_reads_total": "counter",
        "krill_reactor_turn_seconds": "histogram",
        "krill_reactor_stalls_total": "counter",
        "krill_reactor_stall_seconds_total": "counter",
        "krill_gc_pause_seconds": "histogram",
        "krill_io_queue_wait_seconds": "histogram",
        "krill_io_call_seconds": "histogram",
        "krill_produce_stage_seconds": "histogram",
    }
    assert {name: types.get(name) for name in expected} == expected


def test_concurrent_scrapes_all_see_every_shard(workload: Workload) -> None:
    """Scrapes share the stats sockets' queues (16 messages each): 32 at once each get both
    shards, not a timeout that would read as a shard down, or, past the admin server's
    requests in flight (shard_limits.admin_requests_in_flight_max), a 503 at once."""
    node = workload.node

    def scrape(_: int) -> tuple[int, tuple[dict[str, float], float] | None]:
        status, body = node.admin_get("/metrics")
        if status != 200:
            return status, None
        m = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(body.decode()) for s in f.samples}
        return status, (by_label(select(m, "krill_shard_ready"), "shard"),
                        value(m, "redpanda_kafka_records_produced_total",
                              redpanda_namespace="kafka", redpanda_topic=TOPIC))

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(scrape, range(32)))
    served = [scraped for status, scraped in results if status == 200]
    assert {status for status, _ in results} <= {200, 503}, results
    assert served and served == [({"0": 1.0, "1": 1.0}, RECORDS)] * len(served)
    assert len(served) >= shard_limits.admin_requests_in_flight_max or len(served) == 32
    assert time.monotonic() - started < STATS_TIMEOUT_S  # no scrape waited out a shard


# Status endpoints ----------------------------------------------------------------------------


def test_status_endpoints_on_a_running_node(workload: Workload) -> None:
    node = workload.node
    assert get_json(node, "/v1/status/ready") == (200, {"status": "ready"})
    assert get_json(node, "/v1/status/live") == (200, {"status": "live"})
    status, overview = get_json(node, "/v1/cluster/health_overview")
    assert status == 200
    assert overview == {
        "is_healthy": True, "controller_id": 0, "all_nodes": [0], "nodes_down": [],
        "shards_down": [], "leaderless_count": 0, "leaderless_partitions": [],
        "under_replicated_count": 0, "under_replicated_partitions": [],
    }
    status, about = get_json(node, "/v1/node")
    assert status == 200
    assert about["node_id"] == 0 and about["shards"] == SHARDS
    assert about["kafka"] == node.bootstrap
    assert about["data_dir"] == str(node.data_dir.resolve())
    assert 0 < about["uptime_s"] < 600
    assert node.admin_get("/v1/no/such/thing")[0] == 404


def test_a_client_that_leaves_before_its_answer_is_no_error(workload: Workload) -> None:
    # A readiness probe that timed out, a scraper killed mid-scrape: the connection is reset
    # before the answer is written. The node logs no traceback and serves on.
    node = workload.node
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", node.admin_port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: krill\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def ready() -> Any:  # (the aborted scrapes may still hold the admission slots: 503)
        status, body = node.admin_get("/v1/status/ready")
        return (status, json.loads(body)) if status == 200 else None

    assert wait_for("ready once the aborted scrapes are done", ready) == (
        200, {"status": "ready"})
    log = node.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 500:log.find("Traceback") + 1500]


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[BrokerProcess]:
    node = start_node(tmp_path)
    try:
        yield node
    finally:
        stop_node(node)


def test_a_stopped_shard_makes_the_node_unready_and_unhealthy(own_node: BrokerProcess) -> None:
    """SIGSTOP: the process runs (live) but answers no snapshot (not ready); SIGCONT: back."""
    node = own_node
    create_topic(node, "halted", partitions=PARTITIONS)
    stopped = node.shard_pids()[1]
    owned_by_stopped = {("halted", p) for p in range(PARTITIONS) if shard_of("halted", p, 2) == 1}
    assert owned_by_stopped
    os.kill(stopped, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert get_json(node, "/v1/status/ready") == (503, {"status": "booting"})
        assert time.monotonic() - started < STATS_TIMEOUT_S + 3  # one stats timeout, no more
        assert get_json(node, "/v1/status/live") == (200, {"status": "live"})
        status, overview = get_json(node, "/v1/cluster/health_overview")
        assert status == 200
        assert overview["is_healthy"] is False
        assert overview["shards_down"] == [1] and overview["nodes_down"] == [0]
        leaderless = {(p["topic"], p["partition"]) for p in overview["leaderless_partitions"]}
        assert overview["leaderless_count"] == len(leaderless)
        assert owned_by_stopped <= leaderless
        assert all(shard_of(t, p, SHARDS) == 1 for t, p in leaderless), leaderless
        scrape = node.metrics()
        assert by_label(select(scrape, "krill_shard_ready"), "shard") == {"0": 1.0, "1": 0.0}
        offsets = select(scrape, "redpanda_kafka_max_offset", redpanda_topic="halted")
        assert {int(dict(lbl)["redpanda_partition"]) for lbl in offsets} == {
            p for p in range(PARTITIONS) if shard_of("halted", p, SHARDS) == 0}
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_for("ready again after SIGCONT",
             lambda: node.admin_get("/v1/status/ready")[0] == 200)
    status, overview = get_json(node, "/v1/cluster/health_overview")
    assert (status, overview["is_healthy"], overview["leaderless_count"]) == (200, True, 0)


def _gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it went while being read
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_killed_shard_stops_the_node_and_its_admin_port(own_node: BrokerProcess) -> None:
    node = own_node
    assert get_json(node, "/v1/status/live") == (200, {"status": "live"})
    survivor, victim = node.shard_pids()
    supervisor = node.process
    assert supervisor is not None
    os.kill(victim, signal.SIGKILL)
    wait_for("the killed shard to die", lambda: _gone_or_zombie(victim), 10)
    # From now on the admin port may answer only that the node is not live, or not at all.
    answers: list[tuple[float, int | str]] = []
    dead_at = time.monotonic()
    deadline = dead_at + 45  # the supervisor waits up to 30 s for the other shard
    while supervisor.poll() is None and time.monotonic() < deadline:
        try:
            answer: int | str = node.admin_get("/v1/status/live", timeout_s=2)[0]
        except OSError as e:
            answer = type(e).__name__
        answers.append((round(time.monotonic() - dead_at, 3), answer))
        time.sleep(0.02)
    assert supervisor.poll() == 1, "the node must stop, exit code 1, when a shard dies"
    # Known race (reported with these tests): /v1/status/live asks Popen.poll() from the admin
    # thread, which answers None ("running") while the supervisor's own thread is in waitpid
    # for the same child, i.e. at the very moment the shard dies. So a 200 may come first;
    # once the node said it is not live, it must never say live again.
    statuses = [a for _, a in answers]
    first_down = next((i for i, a in enumerate(statuses) if a != 200), len(statuses))
    assert 200 not in statuses[first_down:], f"live after shard 1 died: {answers}"
    assert first_down <= 1, f"live after shard 1 died: {answers}"
    assert f"shard 1 (pid {victim}) was killed by signal 9; stopping the node" in node.log()
    wait_for("the other shard to exit", lambda: _gone_or_zombie(survivor), 10)
    with pytest.raises(OSError):
        node.admin_get("/v1/status/live", timeout_s=2)


# --disable-metrics --------------------------------------------------------------------------


def test_disable_metrics_serves_status_but_no_metrics(tmp_path: Path) -> None:
    node = start_node(tmp_path, "--disable-metrics")
    try:
        for path in ("/metrics", "/public_metrics"):
            status, body = node.admin_get(path)
            assert status == 404, (path, status)
            assert b"disabled" in body
        assert get_json(node, "/v1/status/ready") == (200, {"status": "ready"})
        assert get_json(node, "/v1/status/live") == (200, {"status": "live"})
        status, overview = get_json(node, "/v1/cluster/health_overview")
        assert (status, overview["is_healthy"]) == (200, True)
        create_topic(node, "unmetered", partitions=PARTITIONS)
        produce(node, "unmetered", [(None, b"%d" % i, None, i % PARTITIONS) for i in range(200)],
                acks="all")
        got = consume(node, "unmetered", PARTITIONS, 200)
        assert sorted(int(m.value()) for m in got) == list(range(200))
        assert node.admin_get("/metrics")[0] == 404  # still nothing after traffic
    finally:
        stop_node(node)


# Consumer-group lag against `krill group describe` -------------------------------------------


def test_group_lag_matches_krill_group_describe(workload: Workload) -> None:
    node = workload.node
    topic, group = "lagging", "lag-check"
    per_partition = {0: 30, 1: 20, 2: 10}
    create_topic(node, topic, partitions=len(per_partition))
    produce(node, topic, [(None, b"r", None, p) for p, n in per_partition.items()
                          for _ in range(n)], acks="all")
    consumer = consume_in_group(node, topic, group, sum(per_partition.values()))
    try:
        partway = {0: 12, 1: 20, 2: 0}
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in partway.items()],
                        asynchronous=False)
        members = value(node.metrics(), "redpanda_kafka_consumer_group_consumers",
                        redpanda_group=group)
        assert members == 1
    finally:
        consumer.close()
    wait_for("the group to be empty", lambda: value(
        node.metrics(), "redpanda_kafka_consumer_group_consumers", redpanda_group=group) == 0)

    described = krill("-b", node.bootstrap, "group", "describe", group, "--format", "json")
    assert described.returncode == 0, described.stderr
    cli = {o["partition"]: o for o in json.loads(described.stdout)["offsets"]
           if o["topic"] == topic}
    m = node.metrics()
    committed = by_label(select(m, "redpanda_kafka_consumer_group_committed_offset",
                                redpanda_group=group, redpanda_topic=topic),
                         "redpanda_partition")
    ends = by_label(select(m, "redpanda_kafka_max_offset", redpanda_topic=topic),
                    "redpanda_partition")
    assert set(cli) == set(partway)
    for p, o in cli.items():
        assert o["committed"] == committed[str(p)] == partway[p], (p, o)
        assert o["end"] == ends[str(p)] == per_partition[p], (p, o)
        assert o["lag"] == ends[str(p)] - committed[str(p)], (p, o)
    lags = [o["lag"] for o in cli.values()]
    assert lags == [18, 0, 10]
    assert value(m, "redpanda_kafka_consumer_group_lag_sum", redpanda_group=group) == sum(lags)
    assert value(m, "redpanda_kafka_consumer_group_lag_max", redpanda_group=group) == max(lags)


def test_a_deleted_group_leaves_no_series(workload: Workload) -> None:
    node, group = workload.node, "short-lived"
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(TOPIC, 1, 7)], asynchronous=False)
    finally:
        consumer.close()
    m = node.metrics()
    assert value(m, "redpanda_kafka_consumer_group_committed_offset", redpanda_group=group,
                 redpanda_topic=TOPIC, redpanda_partition="1") == 7
    assert value(m, "redpanda_kafka_consumer_group_lag_sum", redpanda_group=group) == (
        workload.watermarks[1] - 7)
    deleted = krill("-b", node.bootstrap, "group", "delete", group)
    assert deleted.returncode == 0, deleted.stderr
    left = [key for key in node.metrics() if ("redpanda_group", group) in key[1]]
    assert not left, left


# Connections --------------------------------------------------------------------------------


def _connections(node: BrokerProcess) -> tuple[float, float, float]:
    """(open summed over shards, redpanda_rpc_active_connections, accepted summed)."""
    m = node.metrics()
    shards = select(m, "krill_kafka_connections")
    assert set(by_label(shards, "shard")) == {str(s) for s in range(SHARDS)}
    return (sum(shards.values()),
            value(m, "redpanda_rpc_active_connections", redpanda_server="kafka"),
            sum(select(m, "krill_kafka_connections_accepted_total").values()))


def test_connection_gauges_follow_clients(own_node: BrokerProcess) -> None:
    node = own_node
    assert _connections(node) == (0, 0, 0)  # the admin port's HTTP is not a Kafka connection
    raw = [RawClient(node.bootstrap, client_id=f"gauge-{i}") for i in range(8)]
    producers: list[Producer] = []
    try:
        for client in raw:  # a served request: the connection is accepted and counted
            answer = client.call(API_VERSIONS, 3, request(API_VERSIONS,
                                                          client_software_name="t",
                                                          client_software_version="1"))
            assert isinstance(answer, ApiVersionsResponse) and answer.error_code == 0
        wait_for("8 raw connections counted", lambda: _connections(node) == (8, 8, 8))
        for _ in range(3):
            producer = Producer({"bootstrap.servers": node.bootstrap})
            producers.append(producer)
            assert producer.list_topics(timeout=10).brokers
        opened, active, accepted = wait_for(
            "the producers' connections counted",
            lambda: (c := _connections(node))[0] >= 8 + 3 and c)
        assert opened == active and accepted >= opened
    finally:
        for client in raw:
            client.close()
        for producer in producers:
            producer.close()
    closed = wait_for("every connection closed", lambda: (c := _connections(node))[0] == 0 and c)
    assert closed[1] == 0 and closed[2] >= 8 + 3
    assert _connections(node)[2] == closed[2]  # accepted is a counter: it stays


# A deleted topic -----------------------------------------------------------------------------


def _topic_series(samples: Samples, topic: str) -> dict[tuple[str, Labels], float]:
    return {key: v for key, v in samples.items()
            if ("redpanda_topic", topic) in key[1] or ("topic", topic) in key[1]}


def _delete_topic(node: BrokerProcess, topic: str) -> None:
    admin = admin_client(node)  # kept alive until the future resolves
    admin.delete_topics([topic])[topic].result(timeout=15)
    wait_for(f"{topic} gone from the high watermarks", lambda: not select(
        node.metrics(), "redpanda_kafka_max_offset", redpanda_topic=topic))


def test_a_deleted_topic_leaves_no_series(workload: Workload) -> None:
    """actors/metrics.py: "A topic was deleted: its partitions' counters go with it" (and
    every other per-topic series: a node that churns topics must not grow its scrape)."""
    node, topic = workload.node, "churned"
    create_topic(node, topic, partitions=2)
    produce(node, topic, [(None, b"x", None, i % 2) for i in range(10)], acks="all")
    assert len(consume(node, topic, 2, 10)) == 10
    assert value(node.metrics(), "redpanda_kafka_records_produced_total",
                 redpanda_namespace="kafka", redpanda_topic=topic) == 10
    _delete_topic(node, topic)
    left = _topic_series(node.metrics(), topic)
    assert not left, f"series of deleted topic {topic!r} still served: {sorted(left)}"


def test_a_topic_made_again_counts_from_zero(workload: Workload) -> None:
    node, topic = workload.node, "reborn"
    create_topic(node, topic, partitions=2)
    produce(node, topic, [(None, b"x", None, i % 2) for i in range(10)], acks="all")
    _delete_topic(node, topic)
    create_topic(node, topic, partitions=2)
    produce(node, topic, [(None, b"y", None, i % 2) for i in range(3)], acks="all")
    m = node.metrics()
    assert by_label(select(m, "redpanda_kafka_max_offset", redpanda_topic=topic),
                    "redpanda_partition") == {"0": 2, "1": 1}
    produced = value(m, "redpanda_kafka_records_produced_total", redpanda_namespace="kafka",
                     redpanda_topic=topic)
    per_partition = by_label(select(m, "krill_partition_produced_records_total", topic=topic),
                             "partition")
    assert (produced, per_partition) == (3, {"0": 2, "1": 1}), (
        "the new topic's counters carry the deleted one's records")
