"""Durability: restarts, kill -9 in the middle of acks=all produce, torn segment tails; the
kill -9 in direct storage mode too (storage/appender.py; its torn tails are
tests/storage/test_disk_log.py's, in both modes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.acked import StreamingProducer, assert_acknowledged_kept, read_whole_log
from tests.support.broker import BrokerProcess
from tests.support.kafka import consume, create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(params=["buffered", "direct"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh node of the parametrized storage mode, stopped (or killed) in teardown."""
    node = BrokerProcess(tmp_path / "data", "--storage-mode", request.param).start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


def test_restart_keeps_topics_configs_and_records(broker: BrokerProcess) -> None:
    create_topic(broker, "kept", partitions=4, **{"retention.ms": "999"})
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


def test_kill9_during_acks_all_produce_loses_nothing_acknowledged(node: BrokerProcess) -> None:
    broker = node
    create_topic(broker, "durable", partitions=3)
    with StreamingProducer(broker, "durable", **{"enable.idempotence": True}) as producer:
        producer.wait_for(20_000)
        broker.kill9()  # supervisor and shard, mid-stream
    acked = list(producer.acknowledged)
    broker.start()
    stored, ends = read_whole_log(broker, "durable", 3)
    assert_acknowledged_kept(acked, stored, ends)
    # Idempotence kept duplicates out: every stored value is distinct.
    assert len(set(stored.values())) == len(stored)


def _tail_segment(data_dir: Path, topic: str, partition: int) -> Path:
    return sorted((data_dir / f"{topic}-{partition}").glob("*.log"))[-1]


@pytest.mark.parametrize("damage", ["garbage", "cut", "flipped"])
def test_torn_tail_is_truncated_on_restart(broker: BrokerProcess, damage: str) -> None:
    _torn_tail(broker, damage)


def _torn_tail(broker: BrokerProcess, damage: str) -> None:
    create_topic(broker, "torn")
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
