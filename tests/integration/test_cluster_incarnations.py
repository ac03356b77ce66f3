"""A partition's identity on a 3-node cluster: topics of replication factor 1 are led like any
other, and a topic deleted and created again under its name is another Raft group, with
another directory, on every node, whenever each node hears of it.

Before topic ids, a replica was named by (topic, index) wherever it crossed time or nodes: a
node that missed the delete and the create took its old log, term and vote for the new
topic's, and a shard that got both in one table update had its new replica's clock stopped
by the old replica's cleanup (issue #26, defects 1 to 3).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from storage.partition_dir import read_topic_id
from tests.support.cluster import (
    Cluster,
    cluster_fixture,
    read_partitions,
    stored_batches,
    wait_until,
)
from wire.records import decode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ELECTION_TIMEOUT_MS = 1000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS)
    )


def _produce(bootstrap: str, topic: str, values: list[tuple[int, bytes]],
             timeout_s: float = 60.0) -> dict[tuple[int, int], bytes]:
    """(partition, value) records with acks=all, idempotent; {(partition, offset): value}."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True,
                         "message.timeout.ms": int(timeout_s * 1000)})  # fmt: skip
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, message: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[(message.partition(), message.offset())] = message.value()

    for partition, value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(timeout_s + 5) == 0, "records left undelivered"
    assert not errors, errors[:5]
    return delivered


def _create(cluster: Cluster, topic: NewTopic, *node_ids: int) -> bytes:
    """Create `topic` through the named nodes; its topic id."""
    admin = cluster.admin(*node_ids)  # held: a client destroyed fails its futures
    admin.create_topics([topic], operation_timeout=30)[topic.topic].result(timeout=60)
    (node, *_) = [cluster[i] for i in node_ids] or cluster.running()
    return wait_until(lambda: _topic_id_on(cluster, node.node_id, topic.topic), 30,
                      f"{node} knows topic {topic.topic}")


def _delete(cluster: Cluster, topic: str, *node_ids: int) -> None:
    admin = cluster.admin(*node_ids)
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)


def _topic_id_on(cluster: Cluster, node_id: int, topic: str) -> bytes | None:
    (found,) = cluster[node_id].metadata([topic], version=12).topics
    unknown = found.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION (else: maybe no leader yet)
    return None if unknown else bytes(found.topic_id)


def _stored_values(cluster: Cluster, node_id: int, topic: str, partition: int) -> list[bytes]:
    """The data records' values in a node's segment files of the partition, in order."""
    values = []
    for _base, _epoch, batch in stored_batches(cluster[node_id].data_dir, topic, partition):
        header, records = decode_batch(batch, check_crc=True)
        if not header.is_control:
            values.extend(r.value or b"" for r in records)
    return values


def test_replication_factor_1_partitions_are_led_at_creation_and_after_a_restart(
        cluster: Cluster) -> None:
    partitions = 6  # placement spreads them: every node holds some
    created = time.monotonic()
    _create(cluster, NewTopic("solo", partitions, 1))
    for node in cluster.running():  # CreateTopics answers once leaders are named
        leaders = cluster.leaders("solo", node)
        assert all(leader > 0 for leader in leaders), (node, leaders)
    first = _produce(cluster.bootstrap(), "solo", [(p, b"first-%d" % p) for p in range(partitions)])
    print(f"RF=1 topic: created to every partition written in {time.monotonic() - created:.2f}s")
    assert len(first) == partitions

    holder = cluster.leaders("solo", cluster[1])[0]
    cluster[holder].kill9()
    cluster.restart(holder)
    restarted = time.monotonic()
    for partition in range(partitions):
        cluster.wait_leader("solo", partition, timeout_s=30)
    second = _produce(cluster.bootstrap(), "solo",
                      [(p, b"second-%d" % p) for p in range(partitions)])
    print(f"RF=1 topic: node {holder} restarted to every partition written in "
          f"{time.monotonic() - restarted:.2f}s")
    stored = read_partitions(cluster.bootstrap(), "solo", partitions)
    assert stored == {**first, **second}
    # Each partition is its own one-voter group: one replica, on one node.
    for partition in range(partitions):
        holders = [i for i in cluster.nodes
                   if (cluster[i].data_dir / f"solo-{partition}").is_dir()]
        assert len(holders) == 1, (partition, holders)


def test_a_node_that_missed_a_topics_delete_and_create_never_mixes_the_two(
        cluster: Cluster) -> None:
    """The issue's sequence: node 3 is down while T is deleted and created again; it comes
    back with T's old log, term and vote on disk; then the new T's leader is killed. Every
    node must hold exactly the new T's records."""
    old_id = _create(cluster, NewTopic("T", 1, 3))
    cluster.wait_leader("T", 0)
    _produce(cluster.bootstrap(), "T", [(0, b"old-%04d" % i) for i in range(1000)])
    cluster.wait_replicas_converged("T", 1)
    cluster[3].stop()

    _delete(cluster, "T", 1, 2)
    # Node 3 is registered but down: an explicit assignment keeps it a replica, and node 1
    # the preferred leader.
    new_id = _create(cluster, NewTopic("T", 1, replica_assignment=[[1, 2, 3]]), 1, 2)
    assert new_id != old_id
    leader = cluster.wait_leader("T", 0)
    new = _produce(cluster.bootstrap(1, 2), "T", [(0, b"new-%02d" % i) for i in range(10)])

    cluster.restart(3)
    wait_until(lambda: _topic_id_on(cluster, 3, "T") == new_id, 30, "node 3 has the new T")
    wait_until(lambda: _stored_values(cluster, 3, "T", 0) == list(new.values()), 30,
               "node 3's replica holds the new T's records")

    cluster[leader].kill9()
    cluster.wait_leader("T", 0, not_on=leader, timeout_s=30)
    assert read_partitions(cluster.bootstrap(*[n.node_id for n in cluster.running()]),
                           "T", 1) == new
    cluster.restart(leader)
    cluster.wait_replicas_converged("T", 1)
    for node_id in cluster.nodes:
        assert _stored_values(cluster, node_id, "T", 0) == list(new.values()), node_id
        assert read_topic_id(cluster[node_id].data_dir / "T-0") == new_id, node_id
    # The old incarnation's replica on node 3 called; nobody answered it.
    dropped = _dropped(cluster)
    print(f"Raft messages dropped, by node: {dropped}")


def _dropped(cluster: Cluster) -> dict[int, dict[str, float]]:
    """krill_raft_messages_dropped by node and reason, from each node's /metrics."""
    counts: dict[int, dict[str, float]] = {}
    for node in cluster.running():
        status, body = node.admin_get("/metrics")
        assert status == 200
        for line in body.decode().splitlines():
            if line.startswith("krill_raft_messages_dropped_total{"):
                labels, value = line.rsplit(" ", 1)
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                counts.setdefault(node.node_id, {}).setdefault(reason, 0.0)
                counts[node.node_id][reason] += float(value)
    return counts


def test_a_delete_and_a_create_that_reach_a_shard_together_leave_a_live_group(
        cluster: Cluster) -> None:
    """A follower's node is paused while T is deleted and created again, so when it resumes
    its controller applies both in one go and its shard gets one table with the new T in the
    old one's place: the old replica's cleanup must not stop the new replica's clock. Then
    the leader (node 1) is killed: the other two must elect one at once. (The paused node is
    not the controller's leader: clients send DeleteTopics to it, and a paused node answers
    nothing until their request timeout.)"""
    _create(cluster, NewTopic("T", 1, replica_assignment=[[1, 2, 3]]))
    wait_until(lambda: cluster.wait_leader("T", 0) == 1, 30, "node 1 leads T-0")
    _produce(cluster.bootstrap(), "T", [(0, b"old-%d" % i) for i in range(20)])
    cluster.wait_replicas_converged("T", 1)
    controller = cluster[1].metadata([]).controller_id
    paused, other = (2, 3) if controller == 3 else (3, 2)

    cluster[paused].pause()
    _delete(cluster, "T", 1, other)
    new_id = _create(cluster, NewTopic("T", 1, replica_assignment=[[1, 2, 3]]), 1, other)
    cluster[paused].resume()
    wait_until(lambda: _topic_id_on(cluster, paused, "T") == new_id, 30,
               f"node {paused} has the new T")
    wait_until(lambda: cluster.wait_leader("T", 0) == 1, 30, "node 1 leads the new T-0")
    new = _produce(cluster.bootstrap(), "T", [(0, b"new-%d" % i) for i in range(10)])
    wait_until(lambda: _stored_values(cluster, paused, "T", 0) == list(new.values()), 30,
               f"node {paused}'s replica follows the new T")

    cluster[1].kill9()
    killed = time.monotonic()
    leader = cluster.wait_leader("T", 0, not_on=1, timeout_s=10)
    print(f"new leader {leader} {time.monotonic() - killed:.2f}s after the kill")
    more = _produce(cluster.bootstrap(2, 3), "T", [(0, b"after-%d" % i) for i in range(10)])
    assert read_partitions(cluster.bootstrap(2, 3), "T", 1) == {**new, **more}
