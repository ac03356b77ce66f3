"""Committed offsets expire as Kafka's offsets.retention.minutes says (KIP-211), on a real node.

A node configured with `group_offset_retention_sec: 1`, looking every 200 ms: a standalone
consumer's commit expires a second after it was made; a consumer group's offsets expire a
second after its last member left, and the group goes with them; a group with a member keeps
everything. Expiry is written to `__consumer_offsets` (tombstones): a restart does not bring
an expired offset back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import admin_client, create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed


@pytest.fixture
def node(tmp_path: Path) -> BrokerProcess:
    config = tmp_path / "krill.yaml"
    config.write_text("group_offset_retention_sec: 1\ngroup_offset_retention_check_ms: 200\n"
                      "group_initial_rebalance_delay_ms: 0\n")
    broker = BrokerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def consumer(broker: BrokerProcess, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 200})


def committed(broker: BrokerProcess, group: str, topic: str) -> int:
    reader = consumer(broker, group)
    try:
        (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset
    finally:
        reader.close()


def groups(broker: BrokerProcess) -> set[str]:
    admin = admin_client(broker)  # alive until the future resolves
    listed = admin.list_consumer_groups().result(10)
    return {g.group_id for g in listed.valid}


def test_standalone_commit_expires_after_the_retention(node: BrokerProcess) -> None:
    create_topic(node, "t", 1)
    standalone = consumer(node, "standalone")
    try:
        standalone.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
        assert committed(node, "standalone", "t") == 5
        wait_for(lambda: committed(node, "standalone", "t") == NO_OFFSET, 15,
                 "the standalone commit expired")
    finally:
        standalone.close()
    wait_for(lambda: "standalone" not in groups(node), 15, "the group without offsets removed")
    node.restart()
    assert committed(node, "standalone", "t") == NO_OFFSET  # the tombstone is durable


def test_group_offsets_live_while_it_has_members(node: BrokerProcess) -> None:
    create_topic(node, "t", 1)
    produce(node, "t", [(None, b"x", None, 0)] * 3)
    member = consumer(node, "busy")
    try:
        member.subscribe(["t"])
        got = 0
        deadline = time.monotonic() + 20
        while got < 3 and time.monotonic() < deadline:
            msg = member.poll(0.2)
            got += msg is not None and msg.error() is None
        assert got == 3
        member.commit(asynchronous=False)
        time.sleep(2.5)  # past the retention, with a member: kept
        (tp,) = member.committed([TopicPartition("t", 0)], timeout=10)
        assert tp.offset == 3
    finally:
        member.close()  # leaves: Empty from here
    wait_for(lambda: committed(node, "busy", "t") == NO_OFFSET, 15,
             "the empty group's offsets expired")
    wait_for(lambda: "busy" not in groups(node), 15, "the empty group removed")
