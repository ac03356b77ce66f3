"""kafka-python 3 and aiokafka against a real Krill node, with their default settings."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic

from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _topic() -> str:
    return f"kp-{uuid.uuid4().hex[:10]}"


def _key(i: int) -> bytes | None:
    return None if i % 4 == 1 and i % 9 else f"k{i % 3}".encode()


def _value(i: int) -> bytes | None:
    return None if i % 9 == 0 else f"value {i}".encode()  # a null value always has a key


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_round_trip(shared_broker: BrokerProcess, codec: str | None) -> None:
    topic = _topic()
    # Defaults: acks=all and enable_idempotence=True (InitProducerId at construction).
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, compression_type=codec)
    try:
        futures = [
            producer.send(
                topic,
                key=_key(i),
                value=_value(i),
                headers=[("n", f"{i}".encode())],
                partition=0,
            )
            for i in range(300)
        ]
        producer.flush(timeout=30)
        offsets = [f.get(timeout=10).offset for f in futures]
    finally:
        producer.close(timeout=10)
    assert offsets == list(range(300))
    consumer = KafkaConsumer(
        bootstrap_servers=shared_broker.bootstrap, consumer_timeout_ms=5000, fetch_min_bytes=1
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got = []
        for message in consumer:
            got.append(message)
            if len(got) == 300:
                break
    finally:
        consumer.close()
    assert [m.offset for m in got] == list(range(300))
    assert [m.value for m in got] == [_value(i) for i in range(300)]
    assert [m.key for m in got] == [_key(i) for i in range(300)]
    assert got[7].headers == [("n", b"7")]


def test_kafka_python_admin(shared_broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    topic = _topic()
    try:
        admin.create_topics([NewTopic(topic, 3, 1, topic_configs={"cleanup.policy": "delete"})])
        assert topic in admin.list_topics()
        admin.create_partitions({topic: NewPartitions(4)})
        described = admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == 4
        admin.delete_topics([topic])
        assert topic not in admin.list_topics()
    finally:
        admin.close()


def test_kafka_python_end_offsets_and_offsets_for_times(shared_broker: BrokerProcess) -> None:
    topic = _topic()
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap, linger_ms=0)
    try:
        for i in range(5):
            producer.send(topic, value=b"x", partition=0, timestamp_ms=1_000_000 + i * 10).get(10)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.end_offsets([tp])[tp] == 5
        assert consumer.beginning_offsets([tp])[tp] == 0
        found = consumer.offsets_for_times({tp: 1_000_000 + 25})[tp]
        assert found is not None and found.offset == 3 and found.timestamp == 1_000_030
    finally:
        consumer.close()


def test_aiokafka_round_trip(shared_broker: BrokerProcess) -> None:
    topic = _topic()

    async def scenario() -> list:
        producer = AIOKafkaProducer(
            bootstrap_servers=shared_broker.bootstrap, acks="all", compression_type="lz4"
        )
        await producer.start()
        try:
            sent = [
                await producer.send_and_wait(
                    topic, value=f"a{i}".encode(), key=b"k", headers=[("h", b"v")], partition=0
                )
                for i in range(50)
            ]
            batch = producer.create_batch()
            for i in range(50, 100):
                batch.append(key=None, value=f"a{i}".encode(), timestamp=None)
            await (await producer.send_batch(batch, topic, partition=0))
        finally:
            await producer.stop()
        assert [r.offset for r in sent] == list(range(50))
        consumer = AIOKafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list = []
            while len(got) < 100:
                records = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 20)
                for messages in records.values():
                    got.extend(messages)
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert [m.value for m in got] == [f"a{i}".encode() for i in range(100)]
    assert [m.offset for m in got] == list(range(100))
    assert got[0].headers == (("h", b"v"),)
