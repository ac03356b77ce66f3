"""Produce continuously while something breaks, then check nothing acknowledged was lost.

The kill -9 tests share this: a background confluent-kafka producer with acks=all records
every (partition, offset, value) the broker acknowledged; after the restart the whole log is
read back and every acknowledged record must sit at its offset, with no gaps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker import BrokerProcess

__all__ = ["StreamingProducer", "read_whole_log", "assert_acknowledged_kept"]

_RUN_LIMIT_S = 60.0
# Reading the whole log back after a restart (~20k records; generous for a loaded machine).
_READ_LIMIT_S = 120.0


class StreamingProducer:
    """`with StreamingProducer(broker, topic) as p: p.wait_for(n); <break something>`."""

    def __init__(self, broker: BrokerProcess, topic: str, **conf: Any) -> None:
        self.topic = topic
        self.acknowledged: list[tuple[int, int, bytes]] = []
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 5000,
                **conf,
            }
        )
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> StreamingProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        # Drop what is queued or in flight: a live client would resend it to the restarted
        # broker, and records appended after the restart are not what this check is about.
        self._producer.purge()
        self._producer.flush(1)
        del self._producer

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + _RUN_LIMIT_S
        while len(self.acknowledged) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.acknowledged) >= count, "the producer did not get going"

    def _on_delivery(self, err: object, msg: Any) -> None:
        if err is None:
            self.acknowledged.append((msg.partition(), msg.offset(), msg.value()))

    def _run(self) -> None:
        sequence = 0
        deadline = time.monotonic() + _RUN_LIMIT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                value = f"{sequence:08d}".encode()
                self._producer.produce(self.topic, value=value, on_delivery=self._on_delivery)
                sequence += 1
            except BufferError:
                pass  # the client's queue is full: poll below drains it
            self._producer.poll(0.001 if sequence % 100 else 0.01)


def read_whole_log(
    broker: BrokerProcess, topic: str, partitions: int
) -> tuple[dict[tuple[int, int], bytes], list[int]]:
    """Every stored record by (partition, offset), and each partition's high watermark: at
    least what was acknowledged, maybe a little more (flushed, but the ack never arrived).
    Reads until every partition reaches its high watermark (bounded in time)."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    stored: dict[tuple[int, int], bytes] = {}
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        next_offsets = [0] * partitions
        deadline = time.monotonic() + _READ_LIMIT_S
        while time.monotonic() < deadline and any(
            n < end for n, end in zip(next_offsets, ends, strict=True)
        ):
            for message in consumer.consume(1000, 0.2):
                assert message.error() is None, message.error()
                if message.offset() < ends[message.partition()]:
                    stored[(message.partition(), message.offset())] = message.value()
                next_offsets[message.partition()] = message.offset() + 1
    finally:
        consumer.close()
    return stored, ends


def assert_acknowledged_kept(
    acknowledged: list[tuple[int, int, bytes]],
    stored: dict[tuple[int, int], bytes],
    ends: list[int],
) -> None:
    assert len(stored) == sum(ends), f"read {len(stored)} of the {sum(ends)} stored records"
    for partition, offset, value in acknowledged:
        found = stored.get((partition, offset))
        assert found == value, f"acknowledged {partition}/{offset} = {value!r}, stored {found!r}"
    for partition, end in enumerate(ends):
        offsets = sorted(o for (p, o) in stored if p == partition)
        assert offsets == list(range(end)), f"gap in partition {partition}"
