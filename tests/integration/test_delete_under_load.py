"""Deleting and re-creating a topic while a producer writes to it with acks=all.

With a steady acks=all producer a partition almost always has an fdatasync in flight, so a
delete lands during one: that tripped `close() with a flush ticket outstanding` and left the
directory and its file descriptors behind. Re-creating the topic at once also reuses every
path (`<topic>-<partition>/00000000000000000000.log`): a shard that kept the old file open
for sendfile must not serve its bytes as the new topic's.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shards import limits as shard_limits
from tests.support.broker import BrokerProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "churn"
PARTITIONS = 4
ROUNDS = 10


@pytest.fixture
def node(broker: BrokerProcess) -> BrokerProcess:
    """A fresh node of two shards (tests/conftest.py), stopped in teardown."""
    assert broker.smp == 2, "these tests need a partition's owner and a connection apart"
    return broker


def open_fds(node: BrokerProcess) -> float:
    return sum(v for (n, _), v in node.metrics().items() if n == "krill_shard_open_fds")


def read_all(node: BrokerProcess, generation: int) -> list[list[bytes]]:
    """Every record of every partition, checking offsets run 0, 1, 2, ... with no gap."""
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"check-{generation}",
                         "enable.auto.commit": False})
    try:
        values: list[list[bytes]] = []
        for p in range(PARTITIONS):
            end = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), 10)[1]
            consumer.assign([TopicPartition(TOPIC, p, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < end and time.monotonic() < deadline:
                for message in consumer.consume(500, 1.0):
                    assert message.error() is None, message.error()
                    assert message.offset() == len(got), (p, message.offset(), len(got))
                    got.append(message.value())
            assert len(got) == end
            values.append(got)
        return values
    finally:
        consumer.close()


def test_delete_and_recreate_under_an_acks_all_producer(node: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result(15)
    stop = threading.Event()
    generation = [0]  # what the producer stamps on its records
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all",
                         "linger.ms": 1, "message.timeout.ms": 20_000,
                         "allow.auto.create.topics": False})  # the test makes the topic

    def produce() -> None:
        sequence = 0
        while not stop.is_set():
            value = b"%d:%d" % (generation[0], sequence)
            try:
                producer.produce(TOPIC, value=value, partition=sequence % PARTITIONS)
            except BufferError:
                producer.poll(0.05)
                continue
            producer.poll(0)
            sequence += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        time.sleep(1)
        fds_before = open_fds(node)
        for round_ in range(ROUNDS):
            admin.delete_topics([TOPIC])[TOPIC].result(15)
            generation[0] = round_ + 1
            wait_for(lambda: TOPIC not in admin.list_topics(timeout=10).topics, 10, "deleted")
            admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result(15)
            time.sleep(0.3)  # writes into the new topic, flushes in flight at the next delete
    finally:
        stop.set()
        thread.join(10)
    producer.flush(30)
    assert node.alive()
    log = node.log()
    for sign in ("Traceback", "AssertionError", "Unhandled exception"):
        assert sign not in log, log[log.find(sign) - 2000 : log.find(sign) + 2000]
    # The deleted generations' directories are gone, removed off the loop.
    data = node.data_dir
    wait_for(lambda: not list(data.glob(f"{TOPIC}-*-delete")), 15, "trash removed")
    assert sorted(p.name for p in data.glob(f"{TOPIC}-*")) == [
        f"{TOPIC}-{p}" for p in range(PARTITIONS)
    ]
    # Their files are closed: at most the I/O pool's lazily started workers were added.
    workers = shard_limits.io_threads + shard_limits.read_io_threads
    assert open_fds(node) <= fds_before + 2 * workers
    # The topic reads whole from every shard: offsets 0, 1, 2, ... and records as written
    # (librdkafka retries what it had queued during a deletion into the new topic, with its
    # old stamp, so older generations may appear; bytes of a deleted file may not).
    records = read_all(node, ROUNDS)
    assert sum(map(len, records)) > 0
    for values in records:
        for value in values:
            stamp, sequence = value.split(b":")
            assert 0 <= int(stamp) <= ROUNDS and int(sequence) >= 0, value
