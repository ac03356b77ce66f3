"""Spark's own Kafka connector (`format("kafka")`, spark-sql-kafka-0-10, what existing Spark
jobs use) against Krill, unchanged: batch and streaming reads with Spark's options, batch and
streaming writes, read_committed, offsets in a checkpoint, and a 3-node cluster read through
a leader killed with -9."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess
from tests.support.cluster import Cluster, cluster_fixture

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def kafka_read(spark: Any, bootstrap: str, topic: str, **options: str) -> list[Any]:
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("endingOffsets", "latest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def test_batch_read_with_keys_headers_partitions_and_offsets(
        spark: Any, kafka: Kafka, reader_broker: BrokerProcess, topic_name: str) -> None:
    kafka.create(topic_name, 3)
    sent = {}
    for partition in range(3):
        records = [(f"k{partition}-{i}".encode(), f"v{partition}-{i}".encode(),
                    [("h", f"{partition}.{i}".encode())]) for i in range(10)]
        kafka.produce(topic_name, records, partition)
        for offset, (key, value, headers) in enumerate(records):
            sent[(partition, offset)] = (key, value, headers)
    rows = kafka_read(spark, reader_broker.bootstrap, topic_name, includeHeaders="true")

    got = {(r.partition, r.offset): (bytes(r.key), bytes(r.value),
                                     [(h.key, bytes(h.value)) for h in r.headers])
           for r in rows}
    assert got == sent
    assert {r.topic for r in rows} == {topic_name}


def test_batch_write_then_read_back(spark: Any, kafka: Kafka, reader_broker: BrokerProcess,
                                    topic_name: str) -> None:
    kafka.create(topic_name, 2)
    rows = [(f"key{i}", f"value{i}", i % 2) for i in range(40)]
    frame = spark.createDataFrame(rows, "key string, value string, partition int")
    (frame.write.format("kafka").option("kafka.bootstrap.servers", reader_broker.bootstrap)
     .option("topic", topic_name).save())

    consumer = Consumer({"bootstrap.servers": reader_broker.bootstrap, "group.id": "check"})
    consumer.assign([TopicPartition(topic_name, p, 0) for p in range(2)])
    got = []
    for _ in range(100):
        got += [m for m in consumer.consume(100, timeout=0.2) if m.error() is None]
        if len(got) >= 40:
            break
    consumer.close()
    assert sorted((m.key().decode(), m.value().decode(), m.partition()) for m in got) == sorted(
        rows)


def test_streaming_read_resumes_from_its_checkpoint(
        spark: Any, kafka: Kafka, reader_broker: BrokerProcess, topic_name: str,
        tmp_path: Path) -> None:
    kafka.create(topic_name, 2)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_once() -> None:
        stream = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", reader_broker.bootstrap)
                  .option("subscribe", topic_name).option("startingOffsets", "earliest")
                  .load().selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        query = (stream.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    kafka.values(topic_name, 10, partition=0, prefix="a")
    kafka.values(topic_name, 5, partition=1, prefix="b")
    run_once()
    assert spark.read.parquet(out).count() == 15
    kafka.values(topic_name, 7, partition=1, prefix="c")
    run_once()  # only what came after the checkpoint's offsets
    values = sorted(r.value for r in spark.read.parquet(out).collect())
    assert values == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)]
                            + [f"c{i}" for i in range(7)])


def test_streaming_write_into_krill(spark: Any, kafka: Kafka, reader_broker: BrokerProcess,
                                    topic_name: str, tmp_path: Path) -> None:
    kafka.create(topic_name, 2)
    source = tmp_path / "source"
    rows = [(f"key{i}", f"value{i}") for i in range(30)]
    spark.createDataFrame(rows, "key string, value string").repartition(3).write.parquet(
        str(source))
    stream = spark.readStream.schema("key string, value string").parquet(str(source))
    query = (stream.writeStream.format("kafka")
             .option("kafka.bootstrap.servers", reader_broker.bootstrap)
             .option("topic", topic_name)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()

    got = kafka_read(spark, reader_broker.bootstrap, topic_name)
    assert sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in got) == sorted(rows)


def test_read_committed_leaves_out_aborted_transactions(
        spark: Any, kafka: Kafka, reader_broker: BrokerProcess, topic_name: str) -> None:
    kafka.create(topic_name, 1)
    producer = Producer({"bootstrap.servers": reader_broker.bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic_name, f"{outcome}-{i}".encode(), partition=0)
        assert producer.flush(30) == 0  # in the log before the marker, aborted or not
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = kafka_read(spark, reader_broker.bootstrap, topic_name,
                           **{"kafka.isolation.level": "read_committed"})
    everything = kafka_read(spark, reader_broker.bootstrap, topic_name)

    assert sorted(bytes(r.value).decode() for r in committed) == sorted(
        [f"commit-{i}" for i in range(5)] * 2)
    assert len(everything) == 15  # read_uncommitted: the aborted ones too


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster")


def test_a_cluster_read_through_a_leader_killed(spark: Any, cluster: Cluster) -> None:
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "enable.idempotence": True})
    for i in range(300):
        producer.produce(topic, f"r{i}".encode(), partition=i % 3)
    assert producer.flush(60) == 0
    node = cluster.running()[0]
    victim = cluster.leaders(topic, node)[0]
    cluster.nodes[victim].kill9()
    cluster.wait_leader(topic, 0, not_on=victim)
    survivors = cluster.bootstrap(*[n.node_id for n in cluster.running()])

    rows = kafka_read(spark, survivors, topic)
    assert sorted(bytes(r.value).decode() for r in rows) == sorted(f"r{i}" for i in range(300))
