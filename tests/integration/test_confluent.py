"""confluent-kafka (librdkafka) against a real Krill node: produce, consume, administer."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from tests.support.broker import BrokerProcess
from tests.support.kafka import admin_client, consume, create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_every_codec(shared_broker: BrokerProcess, codec: str) -> None:
    topic = _topic()
    create_topic(shared_broker, topic, partitions=3)
    records = [
        (
            f"key-{i % 7}".encode() if i % 5 else None,
            None if i % 11 == 0 else f"value-{i}".encode() * (1 + i % 3),
            [("h1", f"{i}".encode()), ("empty", None)] if i % 2 else None,
            None,
        )
        for i in range(600)
    ]
    delivered = produce(shared_broker, topic, records, **{"compression.type": codec, "acks": "all"})
    assert len(delivered) == len(records)
    got = consume(shared_broker, topic, 3, len(records))
    assert len(got) == len(records)
    sent = sorted(repr((r[0], r[1])) for r in records)
    assert sorted(repr((m.key(), m.value())) for m in got) == sent
    with_headers = [m for m in got if m.headers()]
    assert len(with_headers) == 300
    assert all(dict(m.headers())["empty"] is None for m in with_headers)
    # Offsets per partition are exactly 0..n-1, in order.
    by_partition: dict[int, list[int]] = {}
    for m in got:
        by_partition.setdefault(m.partition(), []).append(m.offset())
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_levels(shared_broker: BrokerProcess, acks: str) -> None:
    topic = _topic()
    create_topic(shared_broker, topic)
    records = [(None, f"m{i}".encode(), None, 0) for i in range(200)]
    delivered = produce(shared_broker, topic, records, acks=acks)
    assert len(delivered) == 200
    if acks != "0":
        assert [m.offset() for m in delivered] == list(range(200))
    got = consume(shared_broker, topic, 1, 200)
    assert [m.value() for m in got] == [r[1] for r in records]


def test_idempotent_producer(shared_broker: BrokerProcess) -> None:
    topic = _topic()
    create_topic(shared_broker, topic, partitions=2)
    records = [(b"k", f"{i}".encode(), None, i % 2) for i in range(2000)]
    delivered = produce(
        shared_broker, topic, records, **{"enable.idempotence": True, "batch.num.messages": 50}
    )
    assert len(delivered) == 2000
    got = consume(shared_broker, topic, 2, 2000)
    assert sorted(int(m.value()) for m in got) == list(range(2000))
    for p in (0, 1):
        assert [m.offset() for m in got if m.partition() == p] == list(range(1000))


def test_admin_create_describe_grow_delete(shared_broker: BrokerProcess) -> None:
    admin = admin_client(shared_broker)
    topic = _topic()
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "1234"})])[topic].result(15)
    with pytest.raises(KafkaException) as existing:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    assert existing.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaException) as too_many_replicas:
        name = _topic()  # (the futures dict must stay intact: the client resolves through it)
        admin.create_topics([NewTopic(name, 1, 3)])[name].result(15)
    assert too_many_replicas.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    with pytest.raises(KafkaException) as bad_config:
        name = _topic()
        admin.create_topics([NewTopic(name, 1, 1, config={"no.such": "1"})])[name].result(15)
    assert bad_config.value.args[0].code() == KafkaError.INVALID_CONFIG

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["retention.ms"].value == "1234"
    assert not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].is_default

    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(15)
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 5
    with pytest.raises(KafkaException):
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(15)

    produce(shared_broker, topic, [(None, b"x", None, 4)])
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    assert topic not in admin.list_topics(timeout=10).topics
    # The name is free again, and the new topic starts empty.
    create_topic(shared_broker, topic, partitions=5)
    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "w"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 4), timeout=10) == (0, 0)
    finally:
        consumer.close()


def test_auto_create_on_produce(shared_broker: BrokerProcess) -> None:
    topic = _topic()
    delivered = produce(shared_broker, topic, [(None, b"auto", None, None)])
    assert delivered[0].offset() == 0
    admin = admin_client(shared_broker)
    assert topic in admin.list_topics(timeout=10).topics


def test_offsets_for_times_and_watermarks(shared_broker: BrokerProcess) -> None:
    topic = _topic()
    create_topic(shared_broker, topic)
    base = int(time.time() * 1000) - 100_000
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic, value=f"{i}".encode(), partition=0, timestamp=base + i * 1000)
        producer.flush(10)  # one batch per record: lookups are exact
    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "t"})
    try:
        for i in (0, 3, 9):
            found = consumer.offsets_for_times([TopicPartition(topic, 0, base + i * 1000)], 10)
            assert found[0].offset == i
        between = consumer.offsets_for_times([TopicPartition(topic, 0, base + 3500)], 10)
        assert between[0].offset == 4
        after = consumer.offsets_for_times([TopicPartition(topic, 0, base + 10**7)], 10)
        assert after[0].offset == -1
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
    finally:
        consumer.close()


def test_message_size_limit(shared_broker: BrokerProcess) -> None:
    topic = _topic()
    create_topic(shared_broker, topic, **{"max.message.bytes": "20000"})
    producer = Producer(
        {
            "bootstrap.servers": shared_broker.bootstrap,
            "message.max.bytes": 1_000_000,
            "linger.ms": 0,
            "compression.type": "none",
        }
    )
    results: list = []
    fits = b"a" * 19_000  # a batch of one record: ~19.1 KB with the batch overhead
    producer.produce(topic, value=fits, partition=0, on_delivery=lambda e, m: results.append(e))
    producer.flush(15)
    producer.produce(
        topic, value=b"b" * 21_000, partition=0, on_delivery=lambda e, m: results.append(e)
    )
    producer.flush(15)
    assert results[0] is None
    assert results[1] is not None and results[1].code() == KafkaError.MSG_SIZE_TOO_LARGE
    got = consume(shared_broker, topic, 1, 1)
    assert got[0].value() == fits
