"""A node left running: memory and open files stay flat whatever clients do.

The node's own /metrics say what it holds (shard RSS and open fds from /proc, long-poll
watches, cross-shard calls waiting, connections). Before the long-poll rework, 4 consumers
long-polling 48 idle partitions every 10 ms grew a 2-shard node by ~14 MB/s (2.2 GB in
150 s), and closing them freed nothing: every round left a watcher on every partition.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shards import limits as shard_limits
from tests.support.broker import BrokerProcess, wait_for
from tests.support.raw_client import RawClient, produce_request
from wire.messages.fetch import FetchRequest
from wire.records import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 48
CONSUMERS = 4
MiB = 1024 * 1024


@pytest.fixture
def node(broker: BrokerProcess) -> BrokerProcess:
    """A fresh node of two shards (tests/conftest.py), stopped in teardown."""
    assert broker.smp == 2, "these tests need a partition's owner and a connection apart"
    return broker


def total(broker: BrokerProcess, name: str) -> float:
    """A per-shard metric summed over the shards."""
    return sum(v for (n, _), v in broker.metrics().items() if n == name)


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions)])[name].result(15)


def test_idle_long_polls_hold_nothing(node: BrokerProcess) -> None:
    """4 consumers × 48 idle partitions, fetch.wait.max.ms=10, for half a minute: RSS flat,
    the watches no more than one per partition per consumer, and nothing left once they
    close. (`make bench`'s idle_consumers holds this for longer.)"""
    create_topic(node, "idle", PARTITIONS)
    stop = threading.Event()
    consumers = []
    for i in range(CONSUMERS):
        consumer = Consumer({
            "bootstrap.servers": node.bootstrap, "group.id": f"idle-{i}",
            "fetch.wait.max.ms": 10, "enable.auto.commit": False,
        })
        consumer.assign([TopicPartition("idle", p, 0) for p in range(PARTITIONS)])
        consumers.append(consumer)
    errors: list[str] = []

    def poll(consumer: Consumer) -> None:
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                errors.append(f"a record from an idle topic: {message.offset()}")

    threads = [threading.Thread(target=poll, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    try:
        time.sleep(10)  # warm-up: connections, metadata, first rounds
        rss: list[float] = []
        watches: list[float] = []
        for _ in range(6):  # a sample every 4 s for 20 s: half a minute in all
            rss.append(total(node, "krill_shard_resident_memory_bytes"))
            watches.append(total(node, "krill_long_poll_watches"))
            time.sleep(4)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for consumer in consumers:
            consumer.close()
    assert errors == []
    grown = max(rss) - rss[0]
    assert grown < 24 * MiB, f"RSS grew {grown / MiB:.1f} MiB in 20 s: {rss}"
    assert max(watches) <= CONSUMERS * PARTITIONS, watches
    # Closed: every watch and connection is gone; what crosses shards is at most one
    # subscription per partition (one shard's half of 48, each way).
    wait_for(lambda: total(node, "krill_kafka_connections") == 0, 15, "connections closed")
    assert total(node, "krill_long_poll_watches") == 0
    assert total(node, "krill_cross_shard_calls_pending") <= PARTITIONS
    after = total(node, "krill_shard_resident_memory_bytes")
    assert after < rss[0] + 24 * MiB, (after, rss)


def _fetch_many(topic: str, partitions: int, max_wait_ms: int) -> FetchRequest:
    """A long poll of every partition of `topic` at offset 0 (idle: it waits)."""
    return FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0,
                                        partition_max_bytes=1 << 20)
            for p in range(partitions)
        ])],
    )


def test_clients_that_vanish_mid_request_leave_nothing(node: BrokerProcess) -> None:
    """Connect, send half a frame, a 30 s long poll or a produce, vanish; 300 times each.
    The node ends with no connection, watch or cross-shard call left, its open files and
    RSS where they were, and serves a well-behaved client all along."""
    create_topic(node, "vanish", 8)
    create_topic(node, "quiet", 8)  # never written: every long poll of it waits
    batch = build_batch([(b"k", b"v" * 100, [])])
    # Warm-up: every partition written and read once, so the files a partition opens on first
    # use (its indexes, another shard's segment for sendfile) are open before measuring.
    with RawClient(node.bootstrap) as warm:
        for p in range(8):
            warm.call(0, 7, produce_request("vanish", batch, partition=p))
        warm.call(1, 12, _fetch_many("vanish", 8, 0))
        warm.call(1, 12, _fetch_many("quiet", 8, 0))
    wait_for(lambda: total(node, "krill_kafka_connections") == 0, 15, "warm-up closed")
    fds_before = total(node, "krill_shard_open_fds")
    rss_before = total(node, "krill_shard_resident_memory_bytes")
    long_poll = _fetch_many("quiet", 8, 30_000)
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all"})
    delivered: list[object] = []
    for round_ in range(300):
        with RawClient(node.bootstrap) as client:
            frame = client.encode(1, 12, long_poll, 1)
            client.send_raw(frame[: len(frame) // 2])  # half a frame
        with RawClient(node.bootstrap) as client:
            client.send(1, 12, long_poll)  # a long poll that will never be read
        with RawClient(node.bootstrap) as client:
            client.send(0, 7, produce_request("vanish", batch, partition=round_ % 8))
        if round_ % 50 == 0:  # a client that stays: served throughout
            producer.produce("vanish", b"steady", on_delivery=lambda e, m: delivered.append(e))
            producer.flush(15)
    assert delivered == [None] * 6
    del producer  # librdkafka closes its connections as the handle goes
    wait_for(lambda: total(node, "krill_kafka_connections") == 0, 20, "every client closed")
    assert total(node, "krill_long_poll_watches") == 0
    assert total(node, "krill_cross_shard_calls_pending") <= 8  # at most a subscription each
    fds_after = total(node, "krill_shard_open_fds")
    # Pool workers start when first needed, each with an eventfd: at most this many a shard.
    workers = shard_limits.io_threads + shard_limits.read_io_threads
    assert fds_after <= fds_before + 2 * workers, (fds_before, fds_after)
    rss_after = total(node, "krill_shard_resident_memory_bytes")
    assert rss_after < rss_before + 24 * MiB, (rss_before, rss_after)
    # Every produce that arrived whole was kept: 8 + 300 raw ones and 6 steady ones.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "count",
                         "enable.auto.commit": False})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition("vanish", p), 10)[1]
                for p in range(8)]
    finally:
        consumer.close()
    assert sum(ends) == 314


def test_a_long_poll_released_on_close_frees_its_watches_at_once(node: BrokerProcess) -> None:
    """A client that closes during a 30 s long poll: its watches go when it closes, not when
    the 30 s are up."""
    create_topic(node, "waiting", 8)
    clients = [RawClient(node.bootstrap) for _ in range(10)]
    try:
        for client in clients:
            client.send(1, 12, _fetch_many("waiting", 8, 30_000))
        wait_for(lambda: total(node, "krill_long_poll_watches") == 80, 10, "80 watches")
    finally:
        for client in clients:
            client.sock.shutdown(socket.SHUT_RDWR)
            client.close()
    wait_for(lambda: total(node, "krill_long_poll_watches") == 0, 5, "watches released")
