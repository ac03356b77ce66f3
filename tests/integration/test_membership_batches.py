"""A Raft membership change is a control batch of Krill's own type in the partition log
(actors/replica_memberships.py): every Kafka client must read across it as it reads across
transaction markers and LEADER_CHANGE batches, delivering the data around it and never the
change. Here the change is written into a stopped node's log (as a replica's leader writes
it), the node started again, and the partition read by confluent-kafka (read_uncommitted and
read_committed), kafka-python and aiokafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from actors.raft import Membership
from actors.replica_memberships import membership_batch
from storage import DiskLog
from tests.support.broker import BrokerProcess
from tests.support.kafka import create_topic, produce
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "changes"
READ_S = 30


def _write_change_and_data(partition_dir: Path) -> int:
    """A membership change, then five records, at the log's end; the change's offset."""
    log_ = DiskLog.open(partition_dir)
    try:
        epoch = log_.last_epoch or 0
        change = membership_batch(Membership(frozenset({(1, 0), (2, 0), (3, 0)}),
                                             learners=frozenset({(4, 0)})), 1_700_000_000_000)
        at = log_.append(change, iter_batches(change), epoch, 0).base_offset
        data = build_batch([(None, f"after-{i}".encode(), []) for i in range(5)],
                           base_timestamp=1_700_000_000_000)
        log_.append(data, iter_batches(data), epoch, 0)
        log_.flush()
        return at
    finally:
        log_.close()


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[BrokerProcess, list[tuple[int, bytes]]]]:
    """One node for the module: the partition read by each client in turn."""
    broker = BrokerProcess(tmp_path_factory.mktemp("changes") / "data").start()
    try:
        yield _written(broker)
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def _written(broker: BrokerProcess) -> tuple[BrokerProcess, list[tuple[int, bytes]]]:
    create_topic(broker, TOPIC)
    produce(broker, TOPIC, [(None, f"before-{i}".encode(), None, 0) for i in range(10)],
            acks="all")
    broker.stop()
    at = _write_change_and_data(broker.data_dir / f"{TOPIC}-0")
    assert at == 10
    broker.start()
    expected = [(i, f"before-{i}".encode()) for i in range(10)]
    expected += [(11 + i, f"after-{i}".encode()) for i in range(5)]
    return broker, expected


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_confluent_kafka_reads_across_a_membership_change(
        stored: tuple[BrokerProcess, list[tuple[int, bytes]]], isolation: str) -> None:
    broker, expected = stored
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "m",
                         "enable.auto.commit": False, "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + READ_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
        assert consumer.poll(1.0) is None  # nothing after the data
    finally:
        consumer.close()
    assert got == expected


def test_kafka_python_reads_across_a_membership_change(
        stored: tuple[BrokerProcess, list[tuple[int, bytes]]]) -> None:
    broker, expected = stored
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=2000)
    try:
        consumer.assign([KpTopicPartition(TOPIC, 0)])
        consumer.seek(KpTopicPartition(TOPIC, 0), 0)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + READ_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.offset, r.value) for r in records)
    finally:
        consumer.close()
    assert got == expected


def test_aiokafka_reads_across_a_membership_change(
        stored: tuple[BrokerProcess, list[tuple[int, bytes]]]) -> None:
    broker, expected = stored

    async def read() -> list[tuple[int, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTopicPartition(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + READ_S
            while len(got) < len(expected) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    got.extend((r.offset, r.value) for r in records)
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(read()) == expected
