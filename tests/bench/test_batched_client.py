"""The cheapest client of the shard cases (`bench.clients.produce_max_batched`) against a real
node: every message it reports sent is in the log, in each partition's share, also when the
client's local queue fills and refuses part of a batch."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from bench.clients import PRODUCE_BATCH_MESSAGES, produce_max_batched
from tests.support.broker import BrokerProcess
from tests.support.kafka import create_topic

pytestmark = pytest.mark.timeout(90)


def _high_watermarks(broker: BrokerProcess, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


# 700: fewer than one call's messages, so a call is always refused in part and the rest sent again.
@pytest.mark.parametrize("queue_messages", [100_000, 700], ids=["roomy", "full-queue"])
def test_every_message_sent_in_batches_is_in_the_log(
    shared_broker: BrokerProcess, queue_messages: int
) -> None:
    topic, partitions, n = f"batched-{queue_messages}", 3, 6_000
    create_topic(shared_broker, topic, partitions)
    checks: list[int] = []
    assert PRODUCE_BATCH_MESSAGES > 700

    out = produce_max_batched(
        shared_broker.bootstrap, topic, n, b"v" * 100, partitions,
        timeout=60, stall_timeout=20, check=lambda: checks.append(1),
        broker_pid=shared_broker.process.pid,  # type: ignore[union-attr]
        config={"queue.buffering.max.messages": queue_messages},
    )  # fmt: skip

    assert out["messages"] == n and out["msgs_per_s"] > 0
    assert out["client_cpu_s"] > 0
    assert _high_watermarks(shared_broker, topic, partitions) == [n // partitions] * partitions
    assert checks, "the broker's liveness was never checked"
