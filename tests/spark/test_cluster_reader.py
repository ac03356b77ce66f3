"""The Spark reader on a 3-node cluster: each partition read from a node that has it.

A node answers the reader only for partitions it has a replica of, as their leader, or as any
in-sync replica when asked (`any_replica`). The data source bootstrapped from one node plans
each partition on its leader (`krill.readFrom=leader`) or spreads partitions over their
in-sync replicas (`replica`), and every record comes back exactly once either way. A node
killed -9 is routed around: planning asks the next bootstrap node and the partitions' new
leaders, and a task planned on the dead node asks metadata again and reads from the new
leader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support.cluster import Cluster, cluster_fixture, wait_until
from wire.spark import offsets as plan
from wire.spark import protocol
from wire.spark.client import Metadata, ReaderClient
from wire.spark.datasource import KrillBatchReader, KrillPartition, read_range
from wire.spark.protocol import ProtocolError, ReaderError
from wire.spark.replicas import choose


def cluster_test(test: Callable[..., None]) -> Callable[..., None]:
    """A test on a real 3-node cluster with the shared Spark session."""
    for mark in (pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)):
        test = mark(test)
    return test


TOPIC = "orders"
PARTITIONS = 3
RECORDS = 900  # 300 a partition
CONNECT_TIMEOUT_MS = "1000"  # a killed node is given up on after 1 s, not the default 5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster")


def reader(cluster: Cluster, node: int) -> str:
    return f"127.0.0.1:{cluster[node].reader_port}"


def produce(cluster: Cluster) -> set[tuple[int, int, bytes]]:
    """RECORDS values, acknowledged by every in-sync replica; {(partition, offset, value)}."""
    acked: set[tuple[int, int, bytes]] = set()

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.add((message.partition(), message.offset(), message.value()))

    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"v%d" % i, partition=i % PARTITIONS, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(acked) == RECORDS
    return acked


def in_sync_everywhere(cluster: Cluster, node: int) -> bool:
    """Whether `node`'s reader names every node in sync for every partition."""
    with ReaderClient(reader(cluster, node), timeout_s=5) as client:
        metadata = client.metadata([TOPIC])
    return all(sorted(isr) == [1, 2, 3] for isr in metadata.isr[TOPIC])


def read_tasks(tasks: list[KrillPartition]) -> set[tuple[int, int, bytes]]:
    """What the tasks read, each as an executor would (no Spark)."""
    return {(row["partition"], row["offset"], row["value"])
            for task in tasks for batch in read_range(task) for row in batch.to_pylist()}


def spark_read(spark: Any, bootstrap: str, read_from: str) -> list[tuple[int, int, bytes]]:
    frame = (spark.read.format("krill").option("krill.bootstrap", bootstrap)
             .option("subscribe", TOPIC).option("krill.readFrom", read_from)
             .option("krill.connectTimeoutMs", CONNECT_TIMEOUT_MS).load())
    return [(r.partition, r.offset, bytes(r.value)) for r in frame.collect()]


# Choosing a node, and the request field that lets a follower answer (no cluster) ------------

NODES = {1: "h1:9093", 2: "h2:9093", 3: "h3:9093"}


def test_choose_a_leader_or_an_in_sync_replica() -> None:
    metadata = Metadata(1, NODES, {"t": [2, 3, -1, 1]}, {"t": [[3, 1, 2], [3, 2], [], [1, 4]]})
    assert [choose(metadata, "t", p, "leader") for p in range(4)] == [
        "h2:9093", "h3:9093", None, "h1:9093"]
    # Spread by partition index over the sorted in-sync replicas; node 4 has no reader address.
    assert [choose(metadata, "t", p, "replica") for p in range(4)] == [
        "h1:9093", "h3:9093", None, "h1:9093"]
    assert choose(metadata, "t", 0, "replica", avoid={"h1:9093"}) == "h2:9093"
    assert choose(metadata, "t", 1, "replica", avoid={"h3:9093", "h2:9093"}) == "h3:9093"
    assert choose(metadata, "t", 0, "leader", avoid={"h2:9093"}) == "h2:9093"  # still the one
    assert choose(metadata, "t", 4, "leader") is None and choose(metadata, "u", 0, "leader") is None


def test_any_replica_is_an_optional_boolean() -> None:
    fetch = protocol.fetch_request(1, "t", 0, 5, 100)
    assert "any_replica" not in fetch  # what an older node is sent is unchanged
    assert not protocol.parse_request(fetch)[1].any_replica
    assert protocol.parse_request(protocol.fetch_request(1, "t", 0, 5, 100, True))[1].any_replica
    offsets = protocol.parse_request(protocol.offsets_request(2, [("t", 0, -1)], True))[1]
    assert offsets.any_replica and offsets.queries == [("t", 0, -1)]
    with pytest.raises(ProtocolError):
        protocol.parse_request({**fetch, "any_replica": 1})


# A real cluster and Spark -------------------------------------------------------------------


@cluster_test
def test_every_record_once_from_leaders_and_from_replicas(
    spark: Any, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.create_topic(TOPIC, PARTITIONS, 3)
    acked = produce(cluster)
    wait_until(lambda: in_sync_everywhere(cluster, 1), 30, "every replica in sync")
    with ReaderClient(reader(cluster, 1), timeout_s=10) as client:
        metadata = client.metadata([TOPIC])
    leaders = metadata.topics[TOPIC]
    assert metadata.nodes == {n: reader(cluster, n) for n in (1, 2, 3)}

    # A follower refuses a fetch unless any replica may answer; then it serves it.
    follower = next(n for n in (1, 2, 3) if n != leaders[0])
    with ReaderClient(reader(cluster, follower), timeout_s=10) as client:
        with pytest.raises(ReaderError) as refused:
            client.fetch(TOPIC, 0, 0)
        assert refused.value.code == protocol.ERROR_NOT_LEADER_OR_FOLLOWER
        assert client.fetch(TOPIC, 0, 0, any_replica=True).high_watermark == RECORDS // 3
        assert client.offsets([(TOPIC, 0, -2), (TOPIC, 0, -1)], any_replica=True) == [
            (0, 0), (0, RECORDS // 3)]

    bootstrap = reader(cluster, 1)
    for read_from, expected in (("leader", leaders), ("replica", [1, 2, 3])):
        options = plan.parse_options(
            {"krill.bootstrap": bootstrap, "subscribe": TOPIC, "krill.readFrom": read_from},
            streaming=False)
        planned = KrillBatchReader(options).partitions()
        assert [p.address for p in planned] == [reader(cluster, n) for n in expected], read_from
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="wire.spark.replicas"):
            assert read_tasks(planned) == acked, read_from
        assert not caplog.records, "each task read from the node planned, with no failover"
        rows = spark_read(spark, bootstrap, read_from)
        assert len(rows) == RECORDS and set(rows) == acked, read_from


@cluster_test
def test_a_node_killed_before_the_read(spark: Any, cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, PARTITIONS, 3)
    acked = produce(cluster)
    victim = cluster.leaders(TOPIC, cluster[1])[0]
    survivor = next(n for n in (1, 2, 3) if n != victim)
    bootstrap = f"{reader(cluster, victim)},{reader(cluster, survivor)}"
    options = plan.parse_options(
        {"krill.bootstrap": bootstrap, "subscribe": TOPIC,
         "krill.connectTimeoutMs": CONNECT_TIMEOUT_MS}, streaming=False)
    planned = KrillBatchReader(options).partitions()
    assert planned[0].address == reader(cluster, victim)

    cluster[victim].kill9()

    # Tasks planned before the kill: the victim's partitions move to their new leaders.
    assert read_tasks(planned) == acked
    # A query after it: planned through the next bootstrap node, on the new leaders, or
    # on in-sync replicas that are still there.
    for read_from in ("leader", "replica"):
        rows = spark_read(spark, bootstrap, read_from)
        assert len(rows) == RECORDS and set(rows) == acked, read_from


@cluster_test
def test_a_node_killed_in_the_middle_of_a_read(cluster: Cluster) -> None:
    """A task has read its first fetch from the leader when the leader is killed: it goes on
    from the next offset at the partition's new leader, every record once."""
    cluster.create_topic(TOPIC, 1, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    values = [(b"%06d" % i) * 6_000 for i in range(400)]  # 36 KB each: 14 MB, two fetches
    for value in values:
        producer.produce(TOPIC, value=value, partition=0)
    assert producer.flush(60) == 0
    victim = cluster.leaders(TOPIC, cluster[1])[0]
    survivor = next(n for n in (1, 2, 3) if n != victim)
    wait_until(lambda: in_sync_everywhere(cluster, survivor), 30, "every replica in sync")
    options = plan.parse_options(
        {"krill.bootstrap": f"{reader(cluster, victim)},{reader(cluster, survivor)}",
         "subscribe": TOPIC, "krill.connectTimeoutMs": CONNECT_TIMEOUT_MS}, streaming=False)
    (task,) = KrillBatchReader(options).partitions()
    assert task.address == reader(cluster, victim)

    batches = read_range(task)
    rows = next(batches).to_pylist()
    assert 0 < len(rows) < len(values), "the first fetch held the whole partition"
    cluster[victim].kill9()
    for batch in batches:
        rows += batch.to_pylist()
    assert [row["offset"] for row in rows] == list(range(len(values)))
    assert [row["value"] for row in rows] == values
