"""kill -9 of a partition's leader under idempotent acks=all produce, with three clients.

A 3-node cluster, a 3-partition topic replicated 3 times, and one producer (confluent-kafka,
kafka-python, aiokafka: each idempotent) writing unique values round-robin over the partitions.
The leader of partition 0 is killed with SIGKILL mid-stream. The producer must carry on (every
record it offered is acknowledged after its flush), every acknowledged value must sit exactly
once at the offset it was acknowledged at, and once the killed node is back and caught up every
replica holds the same batches and consumers bootstrapped from each node read the same records.
The time from the kill to partition 0's next acknowledgement is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from kafka import KafkaProducer

from tests.support.cluster import (
    Cluster,
    ConfluentLoad,
    Load,
    assert_acknowledged_once,
    cluster_fixture,
    first_offset_after_epoch,
    read_partitions,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "orders"
PARTITIONS = 3
_FLUSH_TIMEOUT_S = 60.0
_REQUEST_TIMEOUT_MS = 10_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster")


class KafkaPythonLoad(Load):
    """kafka-python (>= 2.1 has the idempotent producer; 3.x enables it by default)."""

    client = "kafka-python"

    def _run(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap.split(","), acks="all", enable_idempotence=True,
            linger_ms=5, request_timeout_ms=_REQUEST_TIMEOUT_MS, delivery_timeout_ms=60_000,
        )  # fmt: skip
        pending = []
        try:
            started = time.monotonic()
            while not self.running_out(started):
                partition, value = self.record(self.sent)
                future = producer.send(self.topic, value=value, partition=partition)
                future.add_callback(functools.partial(self._acked, value))
                future.add_errback(functools.partial(self._refused, partition, value))
                pending.append(future)
                self.sent += 1
                time.sleep(self.pause_s(started))
            try:
                producer.flush(timeout=_FLUSH_TIMEOUT_S)
            finally:
                self.undelivered = sum(not f.is_done for f in pending)
        finally:
            producer.close(timeout=10)

    def _acked(self, value: bytes, metadata: Any) -> None:
        self.acknowledge(metadata.partition, metadata.offset, value)

    def _refused(self, partition: int, value: bytes, error: BaseException) -> None:
        self.errors.append(f"{partition}: {value!r}: {error!r}")


class AiokafkaLoad(Load):
    """aiokafka, on an event loop of its own in the load thread."""

    client = "aiokafka"

    def _run(self) -> None:
        asyncio.run(self._produce())

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
            request_timeout_ms=_REQUEST_TIMEOUT_MS,
        )  # fmt: skip
        await producer.start()
        pending: list[asyncio.Future[Any]] = []
        try:
            started = time.monotonic()
            while not self.running_out(started):
                partition, value = self.record(self.sent)
                future = await producer.send(self.topic, value=value, partition=partition)
                future.add_done_callback(functools.partial(self._done, partition, value))
                pending.append(future)
                self.sent += 1
                await asyncio.sleep(self.pause_s(started))
            try:
                await asyncio.wait_for(producer.flush(), _FLUSH_TIMEOUT_S)
            finally:
                self.undelivered = sum(not f.done() for f in pending)
        finally:
            await producer.stop()

    def _done(self, partition: int, value: bytes, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            error = "cancelled" if future.cancelled() else repr(future.exception())
            self.errors.append(f"{partition}: {value!r}: {error}")
            return
        metadata = future.result()
        self.acknowledge(metadata.partition, metadata.offset, value)


LOADS: dict[str, type[Load]] = {
    "confluent-kafka": ConfluentLoad,
    "kafka-python": KafkaPythonLoad,
    "aiokafka": AiokafkaLoad,
}


@pytest.mark.parametrize("client", list(LOADS))
def test_kill9_of_a_leader_loses_no_acknowledged_write(cluster: Cluster, client: str) -> None:
    cluster.create_topic(TOPIC, PARTITIONS)
    with LOADS[client](cluster.bootstrap(), TOPIC, PARTITIONS) as load:
        load.wait_acks(300)
        victim = cluster.wait_leader(TOPIC, 0)
        epoch = cluster.leader_epoch(TOPIC, 0, via=cluster[victim])
        acked_before = load.last_offset(0)
        killed_at = time.monotonic()
        cluster[victim].kill9()
        successor = cluster.wait_leader(TOPIC, 0, not_on=victim)
        print(f"{client}: killed node {victim} (leader of {TOPIC}-0 in epoch {epoch}); node "
              f"{successor} leads it now")  # fmt: skip
        load.wait_ack_after(0, killed_at, acked_before)
        load.wait_acks(len(load.acknowledged) + 300)  # and it goes on
    load.print_recovery(0, killed_at, first_offset_after_epoch(
        cluster[successor].data_dir, TOPIC, 0, epoch), "the kill -9")  # fmt: skip
    survivors = [i for i in cluster.nodes if i != victim]
    stored = read_partitions(cluster.bootstrap(*survivors), TOPIC, PARTITIONS)
    assert_acknowledged_once(load.acknowledged, stored)

    cluster.restart(victim)
    cluster.wait_formed()
    cluster.wait_replicas_converged(TOPIC, PARTITIONS)
    for node in cluster.nodes.values():
        from_node = read_partitions(node.bootstrap, TOPIC, PARTITIONS)
        assert from_node == stored, f"bootstrapped from {node}: records differ"
