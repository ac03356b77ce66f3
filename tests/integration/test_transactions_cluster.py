"""Transactions on a 3-node cluster: the coordinator's node is killed with -9 right after a
commit was answered (its markers possibly still out) and again while a transaction is open
and about to commit; the `__consumer_offsets` partition's new leader loads the transaction,
completes what was prepared, and takes the retried EndTxn. A read_committed consumer sees
every committed record, once. Markers carry the leader epoch of the transaction's
`__consumer_offsets` partition as their coordinator epoch (Kafka's), which grows as its
leadership moves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from actors.group import OFFSETS_TOPIC, offsets_partition
from tests.support.cluster import Cluster, ClusterNode, cluster_fixture, wait_until
from tests.support.raw_client import RawClient, request, txn_markers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "txn-orders"
PARTITIONS = 2
_CLIENT_TIMEOUT_S = 60
_POLL_LIMIT_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster")


def _state(node: ClusterNode, transactional_id: str) -> str | None:
    """The id's state as `node` describes it (None: not its coordinator, or unreachable)."""
    try:
        with RawClient(node.bootstrap) as client:
            answer = client.call(65, 0, request(65, transactional_ids=[transactional_id]))
    except OSError:
        return None
    described = answer.transaction_states[0]
    return str(described.transaction_state) if described.error_code == 0 else None


def _wait_state(cluster: Cluster, transactional_id: str, wanted: str) -> None:
    def reached() -> bool | None:
        states = {_state(n, transactional_id) for n in cluster.running()} - {None}
        return True if states == {wanted} else None

    wait_until(reached, 60, f"{transactional_id} {wanted} on its coordinator")


def _produce(producer: Producer, values: list[bytes]) -> None:
    for index, value in enumerate(values):
        producer.produce(TOPIC, value=value, partition=index % PARTITIONS)
    assert producer.flush(_CLIENT_TIMEOUT_S) == 0


def _read_committed(cluster: Cluster, expected: set[bytes]) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap(*[n.node_id for n in
                                                                   cluster.running()]),
                         "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        got: list[bytes] = []
        deadline = time.monotonic() + _POLL_LIMIT_S
        while not expected <= set(got) and time.monotonic() < deadline:
            msg: Any = consumer.poll(0.2)
            value = None if msg is None or msg.error() else msg.value()
            if value is not None:
                got.append(value)
        return got
    finally:
        consumer.close()


def test_coordinator_node_killed_around_commits(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, PARTITIONS)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": cluster.bootstrap(),
                         "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(_CLIENT_TIMEOUT_S)

    # Killed right after the commit was answered: the markers may still be on their way.
    first = cluster.coordinator(transactional_id)
    producer.begin_transaction()
    committed = [b"one-%d" % i for i in range(6)]
    _produce(producer, committed)
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    cluster[first].kill9()
    _wait_state(cluster, transactional_id, "CompleteCommit")

    # Killed with a transaction open: the client's EndTxn goes to the new coordinator.
    second = cluster.coordinator(transactional_id, not_on=first)
    producer.begin_transaction()
    more = [b"two-%d" % i for i in range(6)]
    _produce(producer, more)
    cluster.restart(first)
    cluster[second].kill9()
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    _wait_state(cluster, transactional_id, "CompleteCommit")

    got = _read_committed(cluster, set(committed + more))
    assert sorted(got) == sorted(committed + more)


def _commit(producer: Producer, values: list[bytes]) -> None:
    producer.begin_transaction()
    _produce(producer, values)
    producer.commit_transaction(_CLIENT_TIMEOUT_S)


def _marker_epochs(cluster: Cluster, via: ClusterNode) -> list[list[int]]:
    """The coordinator epoch of every marker, partition by partition, read from its leader."""
    leaders = cluster.leaders(TOPIC, via)
    return [[m.coordinator_epoch for m in txn_markers(cluster[leaders[p]].bootstrap, TOPIC, p)]
            for p in range(PARTITIONS)]


def test_markers_carry_the_offsets_partitions_leader_epoch(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, PARTITIONS)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": cluster.bootstrap(),
                         "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    first = cluster.coordinator(transactional_id)
    via = cluster[first]
    (offsets,) = via.metadata([OFFSETS_TOPIC]).topics
    index = offsets_partition(transactional_id, len(offsets.partitions))
    before = cluster.leader_epoch(OFFSETS_TOPIC, index, via)
    _commit(producer, [b"one-0", b"one-1"])
    _wait_state(cluster, transactional_id, "CompleteCommit")
    assert _marker_epochs(cluster, via) == [[before]] * PARTITIONS

    # Its leader killed, the partition's next leader serves the id in a later term.
    cluster[first].kill9()
    second = cluster.coordinator(transactional_id, not_on=first)
    via = cluster[second]
    cluster.wait_leader(OFFSETS_TOPIC, index, not_on=first)
    after = cluster.leader_epoch(OFFSETS_TOPIC, index, via)
    assert after > before
    _commit(producer, [b"two-0", b"two-1"])
    _wait_state(cluster, transactional_id, "CompleteCommit")
    for partition in range(PARTITIONS):
        cluster.wait_leader(TOPIC, partition, not_on=first)
    # The second markers carry the term the coordinator wrote them in: `after`, or a later one
    # if the offsets partition changed leader again meanwhile (a busy machine's elections).
    latest = cluster.leader_epoch(OFFSETS_TOPIC, index, via)
    epochs = _marker_epochs(cluster, via)
    assert [len(markers) for markers in epochs] == [2] * PARTITIONS, epochs
    assert [first_marker for first_marker, _ in epochs] == [before] * PARTITIONS, epochs
    (second,) = {second_marker for _, second_marker in epochs}  # one coordinator wrote both
    assert after <= second <= latest, (epochs, after, latest)
