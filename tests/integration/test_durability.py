"""Durability: restarts, kill -9 in the middle of acks=all produce, torn segment tails."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.test_confluent import _create, consume, produce
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_restart_keeps_topics_configs_and_records(broker: BrokerProcess) -> None:
    _create(broker, "kept", partitions=4, **{"retention.ms": "999"})
    records = [
        (f"k{i}".encode(), f"v{i}".encode(), [("i", f"{i}".encode())], i % 4) for i in range(400)
    ]
    produce(broker, "kept", records, acks="all")
    broker.restart()
    got = consume(broker, "kept", 4, 400)
    assert sorted(m.value() for m in got) == sorted(r[1] for r in records)
    for p in range(4):
        assert [m.offset() for m in got if m.partition() == p] == list(range(100))
    # Appends continue after the last offset, on every partition.
    delivered = produce(broker, "kept", [(None, b"after", None, p) for p in range(4)], acks="all")
    assert sorted(m.offset() for m in delivered) == [100] * 4
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "kept")
    assert admin.describe_configs([resource])[resource].result(15)["retention.ms"].value == "999"


def test_kill9_during_acks_all_produce_loses_nothing_acknowledged(broker: BrokerProcess) -> None:
    _create(broker, "durable", partitions=3)
    acknowledged: list[tuple[int, int, bytes]] = []
    stop = threading.Event()
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "linger.ms": 2,
            "enable.idempotence": True,
            "message.timeout.ms": 5000,
        }
    )

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            acknowledged.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

    def run() -> None:
        sequence = 0
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                producer.produce(
                    "durable", value=f"{sequence:08d}".encode(), on_delivery=on_delivery
                )
                sequence += 1
            except BufferError:
                pass
            producer.poll(0.001 if sequence % 100 else 0.01)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(acknowledged) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acknowledged) >= 20_000, "producer did not get going"
        broker.kill9()  # supervisor and shard, mid-stream
    finally:
        stop.set()
        thread.join(timeout=30)
        producer.flush(1)
    acked = list(acknowledged)
    broker.start()
    # Read everything the log holds: at least what was acknowledged, maybe a little more
    # (appended and flushed, but the ack never reached the client).
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition("durable", p), timeout=10)[1]
            for p in range(3)
        ]
    finally:
        consumer.close()
    got = consume(broker, "durable", 3, sum(ends))
    stored: dict[int, dict[int, bytes]] = {0: {}, 1: {}, 2: {}}
    for m in got:
        stored[m.partition()][m.offset()] = m.value()
    for partition, offset, value in acked:
        assert stored[partition].get(offset) == value, f"acknowledged {partition}/{offset} lost"
    for partition, offsets in stored.items():
        assert sorted(offsets) == list(range(ends[partition])), f"gap in partition {partition}"
    # Idempotence kept duplicates out: every stored value is distinct.
    values = [v for offsets in stored.values() for v in offsets.values()]
    assert len(values) == len(set(values))


def _tail_segment(data_dir: Path, topic: str, partition: int) -> Path:
    return sorted((data_dir / f"{topic}-{partition}").glob("*.log"))[-1]


@pytest.mark.parametrize("damage", ["garbage", "cut", "flipped"])
def test_torn_tail_is_truncated_on_restart(broker: BrokerProcess, damage: str) -> None:
    _create(broker, "torn")
    for i in range(5):  # five separate batches
        produce(broker, "torn", [(None, f"r{i}".encode() * 50, None, 0)], acks="all")
    broker.stop()
    segment = _tail_segment(broker.data_dir, "torn", 0)
    data = bytearray(segment.read_bytes())
    if damage == "garbage":
        data += b"\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x01\x00garbage" * 3
        kept = 5
    elif damage == "cut":
        data = data[:-7]  # the last batch loses its end
        kept = 4
    else:
        data[-3] ^= 0xFF  # the last batch fails its CRC
        kept = 4
    segment.write_bytes(bytes(data))
    broker.start()
    got = consume(broker, "torn", 1, kept)
    assert [m.value() for m in got] == [f"r{i}".encode() * 50 for i in range(kept)]
    delivered = produce(broker, "torn", [(None, b"next", None, 0)], acks="all")
    assert delivered[0].offset() == kept
    got = consume(broker, "torn", 1, kept + 1)
    assert got[-1].value() == b"next" and got[-1].offset() == kept
