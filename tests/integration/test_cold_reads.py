"""A consumer catching up on data that is not in memory, beside a producer on the same shard.

The log's files are evicted from the page cache one by one (fdatasync, then
posix_fadvise(DONTNEED): no privilege needed, unlike drop_caches), and the test checks the
eviction took. The consumer must get every record back exactly, the producer every ack, and
the node's own counter must show the reads went to the I/O pool to be brought in first
(storage/page_cache.py) rather than waiting on the disk on the shard's loop. How much that
spares the producer's latency is a benchmark figure (`make bench`, case cold_reads), not a
test.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from storage.page_cache import cached
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RECORDS = 40_000
VALUE_BYTES = 1024
SEGMENT_BYTES = 8 * 1024 * 1024


@pytest.fixture
def node(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data", smp=1).start()  # one shard: both on its loop
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def evict(directory: Path) -> int:
    """Drop every segment file of a partition from the page cache; the bytes evicted."""
    evicted = 0
    for path in sorted(directory.glob("*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            if cached(fd, 0, size):
                pytest.fail(f"{path.name} stayed in the page cache: cannot test cold reads")
            evicted += size
        finally:
            os.close(fd)
    return evicted


def cold_reads(node: BrokerProcess) -> float:
    return sum(v for (n, _), v in node.metrics().items() if n == "krill_storage_cold_reads_total")


def test_a_cold_read_beside_a_steady_producer_loses_nothing(node: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    topics = [NewTopic("history", 1, config={"segment.bytes": str(SEGMENT_BYTES)}),
              NewTopic("live", 1)]
    for future in admin.create_topics(topics).values():
        future.result(15)
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all",
                         "linger.ms": 5, "queue.buffering.max.messages": RECORDS + 1000})
    for i in range(RECORDS):
        producer.produce("history", value=i.to_bytes(8, "big") * (VALUE_BYTES // 8))
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    evicted = evict(node.data_dir / "history-0")
    assert evicted >= RECORDS * VALUE_BYTES
    assert len(list((node.data_dir / "history-0").glob("*.log"))) >= 4  # several segments
    before = cold_reads(node)

    stop = threading.Event()
    acked: list[object] = []
    steady = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 0})

    def produce_steadily() -> None:  # ~1,000 records/s on the same shard
        sequence = 0
        while not stop.is_set():
            steady.produce("live", value=b"%d" % sequence,
                           on_delivery=lambda error, _m: acked.append(error))
            steady.poll(0)
            sequence += 1
            time.sleep(0.001)

    thread = threading.Thread(target=produce_steadily, daemon=True)
    thread.start()
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "catch-up",
                         "enable.auto.commit": False, "fetch.max.bytes": 4 * 1024 * 1024})
    try:
        consumer.assign([TopicPartition("history", 0, 0)])
        expected = 0
        deadline = time.monotonic() + 90
        while expected < RECORDS and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                assert message.offset() == expected
                assert message.value() == expected.to_bytes(8, "big") * (VALUE_BYTES // 8)
                expected += 1
        assert expected == RECORDS
    finally:
        consumer.close()
        stop.set()
        thread.join(10)
    assert steady.flush(30) == 0
    assert acked and all(error is None for error in acked), acked[:3]
    assert cold_reads(node) > before  # the reads were brought in on the I/O pool first
