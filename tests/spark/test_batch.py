"""Batch reads through the `krill` data source, with a real broker and a local Spark session.

What confluent-kafka produced (every codec, keys, headers, null keys and values) must come back
row for row; offsets by earliest/latest and by JSON (-2/-1 included), end exclusive.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def load(spark: Any, broker: BrokerProcess, topic: str, **options: Any) -> Any:
    reader = spark.read.format("krill").option("krill.bootstrap", broker.reader_address)
    reader = reader.option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_batch_read_equals_produced(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, codec: str
) -> None:
    kafka.create(topic_name, 2)
    produced: dict[int, list[tuple[Any, Any, list[tuple[str, bytes]]]]] = {0: [], 1: []}
    for i in range(300):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        value = None if i % 11 == 0 else (f"value-{i}-" * (i % 5 + 1)).encode()
        headers = [("n", str(i).encode()), ("kind", b"even" if i % 2 == 0 else b"odd")]
        produced[i % 2].append((key, value, headers if i % 3 else []))
    for partition, records in produced.items():
        kafka.produce(topic_name, records, partition, compression=codec)

    df = load(spark, reader_broker, topic_name, includeHeaders="true")
    rows = df.orderBy("partition", "offset").collect()

    expected = [
        (partition, offset, key, value, [(k, v) for k, v in headers])
        for partition, records in produced.items()
        for offset, (key, value, headers) in enumerate(records)
    ]
    got = [
        (r.partition, r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows
    ]
    assert got == expected
    assert {r.topic for r in rows} == {topic_name}
    assert {r.timestampType for r in rows} == {0}
    assert all(r.timestamp.year >= 2024 for r in rows)


def test_schema_without_headers(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name)
    kafka.values(topic_name, 3)
    df = load(spark, reader_broker, topic_name)
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert [bytes(r.value) for r in df.orderBy("offset").collect()] == [b"v0", b"v1", b"v2"]


def test_offsets_by_json_and_keywords(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name, 2)
    kafka.values(topic_name, 50, partition=0)
    kafka.values(topic_name, 30, partition=1)

    def offsets(**options: Any) -> dict[int, list[int]]:
        rows = (
            load(spark, reader_broker, topic_name, **options)
            .select("partition", "offset")
            .collect()
        )
        result: dict[int, list[int]] = {}
        for r in rows:
            result.setdefault(r.partition, []).append(r.offset)
        return {p: sorted(o) for p, o in result.items()}

    assert offsets(startingOffsets="earliest", endingOffsets="latest") == {
        0: list(range(50)),
        1: list(range(30)),
    }
    start = json.dumps({topic_name: {"0": 10, "1": -2}})
    end = json.dumps({topic_name: {"0": 20, "1": -1}})
    assert offsets(startingOffsets=start, endingOffsets=end) == {
        0: list(range(10, 20)),
        1: list(range(30)),
    }
    # A partition missing from endingOffsets reads to latest; end is exclusive.
    assert offsets(
        startingOffsets=json.dumps({topic_name: {"0": 49, "1": 29}}),
        endingOffsets=json.dumps({topic_name: {"0": 50}}),
    ) == {0: [49], 1: [29]}
    # minPartitions splits the ranges without changing the rows.
    df = load(spark, reader_broker, topic_name, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6
    assert df.count() == 80


def test_subscribe_pattern_and_assign(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name + "-a", 1)
    kafka.create(topic_name + "-b", 2)
    kafka.values(topic_name + "-a", 5)
    kafka.values(topic_name + "-b", 7, partition=1)

    def reader() -> Any:
        return spark.read.format("krill").option(
            "kafka.bootstrap.servers", reader_broker.reader_address
        )

    by_pattern = reader().option("subscribePattern", topic_name + "-.*").load()
    assert by_pattern.count() == 12
    assigned = reader().option("assign", json.dumps({topic_name + "-b": [1]})).load()
    assert {(r.topic, r.partition) for r in assigned.collect()} == {(topic_name + "-b", 1)}


def test_fail_on_data_loss_when_the_log_went_back(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    # A start past the end, as after a topic was re-created.
    kafka.create(topic_name)
    kafka.values(topic_name, 10)
    start = json.dumps({topic_name: {"0": 25}})
    with pytest.raises(Exception, match="some data may have been lost"):
        load(spark, reader_broker, topic_name, startingOffsets=start).collect()
    rows = load(
        spark, reader_broker, topic_name, startingOffsets=start, failOnDataLoss="false"
    ).collect()
    assert sorted(r.offset for r in rows) == list(range(10))


def test_fail_on_data_loss_when_records_were_deleted(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    # DeleteRecords moves the log start past where the query starts: records it would have
    # read are gone.
    kafka.create(topic_name)
    kafka.values(topic_name, 10)
    admin = AdminClient({"bootstrap.servers": reader_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic_name, 0, 4)]).values():
        assert future.result(30).low_watermark == 4
    start = json.dumps({topic_name: {"0": 1}})
    with pytest.raises(Exception, match="some data may have been lost"):
        load(spark, reader_broker, topic_name, startingOffsets=start).collect()
    rows = load(
        spark, reader_broker, topic_name, startingOffsets=start, failOnDataLoss="false"
    ).collect()
    assert sorted(r.offset for r in rows) == list(range(4, 10))
    assert load(spark, reader_broker, topic_name).count() == 6  # earliest: the new start


def test_noop_sink_and_empty_topic(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name)
    assert load(spark, reader_broker, topic_name).count() == 0
    kafka.values(topic_name, 1000)
    load(spark, reader_broker, topic_name).write.format("noop").mode("overwrite").save()
    grouped = (
        load(spark, reader_broker, topic_name)
        .selectExpr("CAST(value AS STRING) AS v")
        .groupBy("v")
        .count()
        .collect()
    )
    assert len(grouped) == 1000 and {r["count"] for r in grouped} == {1}


def test_realistic_records_read_back_exactly(
    spark: Any, reader_broker: BrokerProcess, topic_name: str
) -> None:
    """Issue 18's records: unique keys, 100-byte values, two headers on every third record,
    produced with linger.ms=20 over 4 partitions (many records a batch): read back exactly,
    each in its partition and at its offset, on the vectorised path."""
    from confluent_kafka import Producer

    Kafka(reader_broker).create(topic_name, 4)
    producer = Producer({"bootstrap.servers": reader_broker.bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    placed: dict[tuple[int, int], tuple[bytes, bytes, list[tuple[str, bytes]]]] = {}

    def delivered(headers: list[tuple[str, bytes]], error: Any, message: Any) -> None:
        assert error is None, error
        placed[(message.partition(), message.offset())] = (message.key(), message.value(),
                                                           headers)

    for i in range(20_000):
        headers = [("trace", f"t-{i}".encode()), ("source", b"web")] if i % 3 == 0 else []
        value = (f"{i:08d}" + "x" * 92).encode()
        producer.produce(topic_name, value, f"k{i}".encode(), headers=headers or None,
                         on_delivery=functools.partial(delivered, headers))
        producer.poll(0)
    assert producer.flush(60) == 0

    rows = load(spark, reader_broker, topic_name, includeHeaders="true").collect()
    got = {(r.partition, r.offset): (r.key, r.value, [(h.key, h.value) for h in r.headers])
           for r in rows}
    assert len(rows) == len(got) == 20_000
    assert got == placed


def test_read_committed_skips_aborted_and_stops_at_an_open_transaction(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    """A committed, an aborted and a still-open transaction, with plain records between:
    read_committed returns the committed and plain records before the open transaction
    (the last stable offset), read_uncommitted everything."""
    from confluent_kafka import Producer

    kafka.create(topic_name)

    def transaction(name: str, values: list[bytes], commit: bool | None) -> Any:
        producer = Producer({"bootstrap.servers": reader_broker.bootstrap,
                             "transactional.id": f"{topic_name}-{name}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for value in values:
            producer.produce(topic_name, value, partition=0)
        assert producer.flush(30) == 0
        if commit is True:
            producer.commit_transaction(30)
        elif commit is False:
            producer.abort_transaction(30)
        return producer

    committed = [b"c%d" % i for i in range(5)]
    aborted = [b"a%d" % i for i in range(5)]
    plain = [b"p%d" % i for i in range(3)]
    transaction("one", committed, True)
    transaction("two", aborted, False)
    kafka.produce(topic_name, [(None, v, []) for v in plain])
    still_open = transaction("three", [b"o0", b"o1"], None)
    kafka.produce(topic_name, [(None, b"late", [])])
    def values(isolation: str) -> list[bytes]:
        rows = load(spark, reader_broker, topic_name,
                    **{"kafka.isolation.level": isolation}).orderBy("offset").collect()
        return [bytes(r.value) for r in rows]

    assert values("read_committed") == committed + plain
    assert values("read_uncommitted") == committed + aborted + plain + [b"o0", b"o1", b"late"]
    still_open.commit_transaction(30)
    assert values("read_committed") == committed + plain + [b"o0", b"o1", b"late"]
    with pytest.raises(Exception, match="kafka.isolation.level must be"):
        load(spark, reader_broker, topic_name,
             **{"kafka.isolation.level": "serializable"}).collect()
