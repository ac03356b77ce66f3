"""confluent-kafka helpers for tests: make topics, produce records, read them back."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

__all__ = ["admin_client", "consume", "create_topic", "produce"]

# How long `consume` polls for the records it expects before returning what it has.
_POLL_LIMIT_S = 30.0


def admin_client(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(broker: BrokerProcess, name: str, partitions: int = 1, **configs: str) -> None:
    admin = admin_client(broker)  # keep it alive until the future resolves
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    futures[name].result(timeout=15)


def produce(broker: BrokerProcess, topic: str, records: list[tuple], **conf: object) -> list:
    """Produce (key, value, headers, partition) tuples; return the delivered messages."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, **conf})
    delivered: list = []
    errors: list = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        (errors if err else delivered).append(err or msg)

    for key, value, headers, partition in records:
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(
            topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **kwargs
        )
    assert producer.flush(30) == 0, "messages left undelivered"
    assert not errors, errors
    return delivered


def consume(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "test-reader",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list = []
        deadline = time.monotonic() + _POLL_LIMIT_S
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
        return got
    finally:
        consumer.close()
