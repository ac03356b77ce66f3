"""Partition moves on a real 4-node cluster (actors/cluster/moves.py): Kafka's
AlterPartitionReassignments and ListPartitionReassignments from kafka-python's admin client,
a producer running throughout, the partition's Raft group changing its members under it.

What must hold: the move completes (Metadata names the target's replicas, no move is listed),
its leader leaving on the way; every record acknowledged is stored once at its offset, and
the node the move added holds the same log as the others, byte for byte; the node it removed
no longer holds the partition's data.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

from actors.replica import read_range
from storage import DiskLog
from tests.support.acked import StreamingProducer, read_whole_log
from tests.support.cluster import Cluster, cluster_fixture, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "moving"
MOVE_WAIT_S = 90.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster", "--raft-election-timeout-ms", "1000",
                               size=4)


def replicas(cluster: Cluster, node: int) -> list[int]:
    (found,) = cluster[node].metadata([TOPIC]).topics
    (partition,) = found.partitions
    return list(partition.replica_nodes)


def test_a_partition_moves_to_a_new_node_under_load_its_leader_leaving(
        cluster: Cluster, tmp_path: Path) -> None:
    cluster.create_topic(TOPIC, 1, replicas=3)
    before = replicas(cluster, 1)
    (added,) = {1, 2, 3, 4} - set(before)
    leader = cluster.wait_leader(TOPIC, 0)
    target = [added, *(n for n in before if n != leader)]
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap(), request_timeout_ms=30_000)
    broker = SimpleNamespace(bootstrap=cluster.bootstrap())
    try:
        with StreamingProducer(broker, TOPIC, **{"enable.idempotence": True}) as producer:
            producer.wait_for(2000)
            tp = TopicPartition(TOPIC, 0)
            # A node that does not exist: refused, nothing moves.
            refused = admin.alter_partition_reassignments({tp: [added, 9, before[0]]})
            assert refused[tp] is InvalidReplicationAssignmentError
            assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
            wait_until(lambda: all(sorted(replicas(cluster, n)) == sorted(target)
                                   for n in (1, 2, 3, 4))
                       and admin.list_partition_reassignments() == {}, MOVE_WAIT_S,
                       f"the move to {target} complete")
            assert replicas(cluster, 1)[0] == added  # the target's first: the preferred leader
            moved_at = len(producer.acknowledged)
            producer.wait_for(moved_at + 1000)  # and the producer goes on after it
        acked = list(producer.acknowledged)
    finally:
        admin.close()

    stored, ends = read_whole_log(broker, TOPIC, 1)  # type: ignore[arg-type]
    for partition, offset, value in acked:
        assert stored.get((partition, offset)) == value, (partition, offset)
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record stored twice"

    # The leader that left has no data of the partition any more; every target node holds
    # the same log (read from a copy of each directory: the nodes still run).
    wait_until(lambda: not (cluster[leader].data_dir / f"{TOPIC}-0").exists(), 30,
               f"node {leader}'s replica removed")
    logs = []
    for node in target:
        copy = tmp_path / f"copy-{node}"
        shutil.copytree(cluster[node].data_dir / f"{TOPIC}-0", copy)
        log_ = DiskLog.open(copy)
        try:
            assert log_.next_offset >= ends[0], (node, log_.next_offset, ends)
            logs.append(read_range(log_, 0, ends[0] - 1))
        finally:
            log_.close()
    assert logs[0] == logs[1] == logs[2]


def test_a_move_cancelled_goes_back_and_an_unknown_move_is_refused(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, 1, replicas=3)
    before = replicas(cluster, 1)
    (added,) = {1, 2, 3, 4} - set(before)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap(), request_timeout_ms=30_000)
    try:
        tp = TopicPartition(TOPIC, 0)
        nothing = admin.alter_partition_reassignments({tp: None})
        assert nothing[tp] is NoReassignmentInProgressError
        # Node 4 for a replica of the first, then cancelled: back to where it began, whatever
        # step the group had reached.
        assert admin.alter_partition_reassignments(
            {tp: [added, *before[1:]]}) == {tp: None}
        time.sleep(0.5)
        admin.alter_partition_reassignments({tp: None})
        wait_until(lambda: all(replicas(cluster, n) == before for n in (1, 2, 3, 4))
                   and admin.list_partition_reassignments() == {}, MOVE_WAIT_S,
                   "the cancelled move back where it began")
    finally:
        admin.close()
    wait_until(lambda: not (cluster[added].data_dir / f"{TOPIC}-0").exists(), 30,
               f"node {added}'s replica removed")
