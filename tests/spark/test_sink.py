"""Writes through the `krill` sink, with a real broker and a local Spark session.

What Spark writes must come back row for row, read by confluent-kafka and by the krill
reader: string and binary keys, null keys and values, headers, rows routed by a `topic`
column and a `partition` column; a streaming query copies one topic into another. A task's
report names the partitions and offsets it wrote, and a failed produce says what it had
delivered. Wrong input and options are refused when the write starts.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess
from wire.spark.sink import (
    PartitionWrite,
    SinkWriteError,
    parse_sink_options,
    write_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(180)]

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def consume(broker: BrokerProcess, topic: str, partition: int, count: int) -> list[Record]:
    """`count` records of one partition from offset 0, read by confluent-kafka."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "sink-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    records: list[Record] = []
    try:
        for _ in range(200):
            if len(records) >= count:
                break
            for message in consumer.consume(count - len(records), timeout=0.5):
                assert message.error() is None, message.error()
                headers = [(k, bytes(v)) for k, v in message.headers() or []]
                records.append((message.key(), message.value(), headers))
    finally:
        consumer.close()
    return records


def read_back(spark: Any, broker: BrokerProcess, topic: str) -> list[Record]:
    rows = (
        spark.read.format("krill").option("krill.bootstrap", broker.reader_address)
        .option("subscribe", topic).option("includeHeaders", "true").load()
        .orderBy("partition", "offset").collect()
    )
    return [(r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows]


def writer(df: Any, broker: BrokerProcess, **options: Any) -> Any:
    # Spark's Python data sources take no write in its default mode, ErrorIfExists.
    write = df.write.format("krill").mode("append").option("krill.bootstrap", broker.bootstrap)
    for key, value in options.items():
        write = write.option(key, value)
    return write


def test_batch_write_equals_input(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name)
    expected: list[Record] = []
    for i in range(500):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        value = None if i % 11 == 0 else f"value-{i}".encode()
        headers = [("n", str(i).encode()), ("kind", b"odd")] if i % 3 else []
        expected.append((key, value, headers))
    rows = [(k, v, [{"key": hk, "value": hv} for hk, hv in h] or None, i)
            for i, (k, v, h) in enumerate(expected)]
    df = spark.createDataFrame(
        rows, "key binary, value binary, headers array<struct<key string, value binary>>, i int"
    ).coalesce(1).sortWithinPartitions("i")  # one task, in input order
    writer(df, reader_broker, topic=topic_name).save()

    assert consume(reader_broker, topic_name, 0, len(expected)) == expected
    assert read_back(spark, reader_broker, topic_name) == expected


def test_string_columns_and_default_partitioner(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name, 3)
    df = spark.range(300).selectExpr("CAST(id % 10 AS STRING) AS key",
                                     "to_json(named_struct('id', id)) AS value")
    writer(df, reader_broker, topic=topic_name).save()

    got = read_back(spark, reader_broker, topic_name)
    assert sorted(v for _, v, _ in got if v) == sorted(
        f'{{"id":{i}}}'.encode() for i in range(300))
    by_key: dict[bytes | None, set[int]] = {}
    rows = (spark.read.format("krill").option("krill.bootstrap", reader_broker.reader_address)
            .option("subscribe", topic_name).load().collect())
    for row in rows:
        by_key.setdefault(row.key, set()).add(row.partition)
    assert len(by_key) == 10
    assert all(len(partitions) == 1 for partitions in by_key.values())  # keyed: one partition
    assert {r.partition for r in rows} == {0, 1, 2}


def test_topic_and_partition_columns_route_rows(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    kafka.create(first, 2)
    kafka.create(second, 2)
    rows = [(f"k{i}", f"v{i}", first if i % 2 else second, i % 2 if i % 3 else 1, i)
            for i in range(200)]
    df = spark.createDataFrame(rows, "key string, value string, topic string, partition int, "
                                     "i int").coalesce(1).sortWithinPartitions("i")
    writer(df, reader_broker).save()

    for topic in (first, second):
        for partition in (0, 1):
            wanted = [(k.encode(), v.encode(), []) for k, v, t, p, _ in rows
                      if t == topic and p == partition]
            assert consume(reader_broker, topic, partition, len(wanted)) == wanted
    # The topic option overrides the column, as in Spark's Kafka sink.
    third = f"{topic_name}-c"
    kafka.create(third)
    writer(df.drop("partition"), reader_broker, topic=third).save()
    assert len(read_back(spark, reader_broker, third)) == 200


def test_streaming_write_copies_a_topic(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-out"
    kafka.create(source)
    kafka.create(target)
    produced: list[Record] = [(f"k{i}".encode() if i % 5 else None, f"v{i}".encode(), [])
                              for i in range(400)]
    kafka.produce(source, produced)
    query = (
        spark.readStream.format("krill").option("krill.bootstrap", reader_broker.reader_address)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 150).load()
        .select("key", "value")
        .writeStream.format("krill").option("krill.bootstrap", reader_broker.bootstrap)
        .option("topic", target).option("checkpointLocation", checkpoint).start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert consume(reader_broker, target, 0, 400) == produced


def test_task_report_names_offsets(reader_broker: BrokerProcess, kafka: Kafka,
                                   topic_name: str) -> None:
    kafka.create(topic_name, 2)
    kafka.values(topic_name, 5, partition=1)
    options = parse_sink_options({"krill.bootstrap": reader_broker.bootstrap,
                                  "topic": topic_name})
    batch = pa.record_batch({"value": pa.array([b"a", b"b", b"c"]),
                             "partition": pa.array([1, 0, 1], pa.int32())})
    report = write_batches(options, iter([batch, batch]))
    assert report.partitions == (PartitionWrite(topic_name, 0, 2, 0, 1),
                                 PartitionWrite(topic_name, 1, 4, 5, 8))
    assert report.rows == 6


def test_failed_produce_says_what_was_delivered(reader_broker: BrokerProcess, kafka: Kafka,
                                                topic_name: str) -> None:
    kafka.create(topic_name)
    options = parse_sink_options({"krill.bootstrap": reader_broker.bootstrap,
                                  "topic": topic_name})
    good = pa.record_batch({"value": pa.array([b"a", b"b"])})
    bad = pa.record_batch({"value": pa.array([b"c"]), "partition": pa.array([7], pa.int32())})
    with pytest.raises(SinkWriteError, match=rf"delivered.*{topic_name}-0: 2 \[0\.\.1\]"):
        write_batches(options, iter([good, bad]))


def test_missing_value_column_is_refused(spark: Any, reader_broker: BrokerProcess,
                                         topic_name: str) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS key", "id AS count")
    with pytest.raises(Exception, match="required column 'value'") as failure:
        writer(df, reader_broker, topic=topic_name).save()
    assert "SinkSchemaError: krill sink: required column 'value'" in str(failure.value)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("kafka.acks", "1", "kafka.acks=1 is refused"),
    ("kafka.enable.idempotence", "false", "kafka.enable.idempotence=false is refused"),
    ("krill.bootstrapServers", "x:1", "(?i)unknown option 'krill.bootstrapServers'"),
    ("krill.deliveryGuarantee", "none", "(?i)krill.deliveryGuarantee=none is refused"),
    ("kafka.transactional.id", "mine", "kafka.transactional.id is refused"),
])
def test_unsafe_or_unknown_options_are_refused(
    spark: Any, reader_broker: BrokerProcess, topic_name: str, option: str, value: str,
    message: str,
) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=message):
        writer(df, reader_broker, topic=topic_name, **{option: value}).save()
    assert parse_sink_options({"kafka.bootstrap.servers": "h:1", "kafka.acks": "-1",
                               "kafka.linger.ms": "7"}).producer == {
        "bootstrap.servers": "h:1", "acks": "all", "linger.ms": "7",
        "enable.idempotence": "true", "transaction.timeout.ms": "300000"}
    at_least_once = parse_sink_options({"krill.bootstrap": "h:1",
                                        "krill.deliveryGuarantee": "at-least-once"})
    assert not at_least_once.exactly_once
    assert "transaction.timeout.ms" not in at_least_once.producer
    with pytest.raises(ValueError, match="at-least-once write has no transactions"):
        parse_sink_options({"krill.bootstrap": "h:1", "krill.deliveryGuarantee": "at-least-once",
                            "kafka.transaction.timeout.ms": "1000"})


def test_full_producer_queue_waits_for_room(reader_broker: BrokerProcess, kafka: Kafka,
                                            topic_name: str) -> None:
    kafka.create(topic_name)
    options = parse_sink_options({"krill.bootstrap": reader_broker.bootstrap, "topic": topic_name,
                                  "kafka.queue.buffering.max.messages": "5"})
    batch = pa.record_batch({"value": pa.array([str(i).encode() for i in range(300)])})
    report = write_batches(options, iter([batch]))
    assert report.partitions == (PartitionWrite(topic_name, 0, 300, 0, 299),)
    got = [v for _, v, _ in consume(reader_broker, topic_name, 0, 300)]
    assert got == batch.column(0).to_pylist()
