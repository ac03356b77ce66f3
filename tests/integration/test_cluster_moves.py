"""Partition moves on a real 4-node cluster (actors/cluster/moves.py): Kafka's
AlterPartitionReassignments and ListPartitionReassignments from kafka-python's admin client,
a producer running throughout, the partition's Raft group changing its members under it.

What must hold: the move completes (Metadata names the target's replicas, no move is listed),
its leader leaving on the way; every record acknowledged is stored once at its offset, and
the node the move added holds the same log as the others, byte for byte; the node it removed
no longer holds the partition's data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import InvalidReplicationAssignmentError

from actors.replica import read_range
from storage import DiskLog
from tests.support.acked import StreamingProducer
from tests.support.cli import krill
from tests.support.cluster import (
    Cluster,
    assert_acknowledged_once,
    cluster_fixture,
    read_partitions,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MOVE_WAIT_S = 90.0


RECOVERY_RATE = 2 << 20  # bytes/s: the nodes' learner recovery throttle


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 4-node cluster for the module: each test moves a topic of its own, and leaves
    every node running."""
    yield from cluster_fixture(tmp_path_factory.mktemp("moves") / "cluster",
                               "--raft-election-timeout-ms", "1000",
                               "--learner-recovery-rate-bytes", str(RECOVERY_RATE), size=4)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return "moving-" + request.node.name.removeprefix("test_")[:40]


def move_with_fresh_metadata(bootstrap: str, moves: dict[TopicPartition, list[int]]
                             ) -> dict[TopicPartition, object]:
    """AlterPartitionReassignments from a new admin client (fresh Metadata)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        result: dict[TopicPartition, object] = admin.alter_partition_reassignments(moves)
        return result
    finally:
        admin.close()


def replicas(cluster: Cluster, node: int, topic: str) -> list[int]:
    """Partition 0's replicas as `node`'s Metadata names them."""
    (found,) = cluster[node].metadata([topic]).topics
    (partition,) = [p for p in found.partitions if p.partition_index == 0]
    return list(partition.replica_nodes)


def test_a_partition_moves_to_a_new_node_under_load_its_leader_leaving(
        cluster: Cluster, topic: str, tmp_path: Path) -> None:
    cluster.create_topic(topic, 1, replicas=3)
    before = replicas(cluster, 1, topic)
    (added,) = {1, 2, 3, 4} - set(before)
    leader = cluster.wait_leader(topic, 0)
    target = [added, *(n for n in before if n != leader)]
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap(), request_timeout_ms=30_000)
    broker = SimpleNamespace(bootstrap=cluster.bootstrap())
    # 6 MiB for the new node to copy, at most 2 MiB/s (beyond a burst of 1 MiB).
    bulk = 6 << 10
    from tests.support.kafka import produce
    produce(broker, topic, [(None, b"%08d" % i + bytes(1016), None, 0)  # type: ignore[arg-type]
                            for i in range(bulk)], acks="all")
    try:
        with StreamingProducer(broker, topic, **{"enable.idempotence": True}) as producer:
            producer.wait_for(2000)
            tp = TopicPartition(topic, 0)
            # A node that does not exist: refused, nothing moves.
            refused = admin.alter_partition_reassignments({tp: [added, 9, before[0]]})
            assert refused[tp] is InvalidReplicationAssignmentError
            started = time.monotonic()
            assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
            wait_until(lambda: all(sorted(replicas(cluster, n, topic)) == sorted(target)
                                   for n in (1, 2, 3, 4))
                       and admin.list_partition_reassignments() == {}, MOVE_WAIT_S,
                       f"the move to {target} complete")
            # The throttle held the copy back: 5 MiB past the burst at 2 MiB/s.
            assert time.monotonic() - started >= ((bulk << 10) - (1 << 20)) / RECOVERY_RATE
            # The target's first replica is the preferred leader.
            assert replicas(cluster, 1, topic)[0] == added
            moved_at = len(producer.acknowledged)
            producer.wait_for(moved_at + 1000)  # and the producer goes on after it
        acked = list(producer.acknowledged)
    finally:
        admin.close()

    stored = read_partitions(cluster.bootstrap(), topic, 1)
    assert_acknowledged_once(acked, stored)  # type: ignore[arg-type]
    end = max(offset for _, offset in stored) + 1

    # The leader that left has no data of the partition any more; every target node holds
    # the same log (read from a copy of each directory: the nodes still run).
    wait_until(lambda: not (cluster[leader].data_dir / f"{topic}-0").exists(), 30,
               f"node {leader}'s replica removed")
    logs = []
    for node in target:
        copy = tmp_path / f"copy-{node}"
        shutil.copytree(cluster[node].data_dir / f"{topic}-0", copy)
        log_ = DiskLog.open(copy)
        try:
            assert log_.next_offset >= end, (node, log_.next_offset, end)
            logs.append(read_range(log_, 0, end - 1))
        finally:
            log_.close()
    assert logs[0] == logs[1] == logs[2]


def test_a_move_to_a_node_that_is_down_waits_and_is_cancelled_from_the_cli(
        cluster: Cluster, topic: str) -> None:
    """`krill cluster partitions move`, `move-status` and `--cancel`: a move whose new node
    is down cannot complete (its learner never catches up), is listed with that node
    behind, and once cancelled the partition is back on the replicas it began from."""
    cluster.create_topic(topic, 1, replicas=3)
    before = replicas(cluster, 1, topic)
    (added,) = {1, 2, 3, 4} - set(before)
    cluster[added].kill9()
    up = [n for n in (1, 2, 3, 4) if n != added]
    broker = SimpleNamespace(bootstrap=cluster.bootstrap(*up))
    with StreamingProducer(broker, topic, **{"enable.idempotence": True}) as producer:
        producer.wait_for(500)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        admins = ",".join(f"127.0.0.1:{cluster[n].admin_port}" for n in up)
        return krill("cluster", "partitions", *args, "-b", cluster.bootstrap(*up),
                     "--admin", admins)

    nothing = cli("move", f"{topic}/0", "--cancel")
    assert nothing.returncode == 1 and "NoReassignmentInProgress" in nothing.stdout, nothing
    target = [added, *before[1:]]
    started = cli("move", f"{topic}/0", "--replicas", ",".join(map(str, target)))
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"{topic}/0: moving to {','.join(map(str, target))}\n"
    time.sleep(1.5)  # it cannot complete: its new node is down
    status = cli("move-status", "--format", "json")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)["moves"]
    assert row["replicas"] == [*target, before[0]], row
    assert row["adding"] == [added] and row["removing"] == [before[0]], row
    assert list(row["catching_up"]) == [str(added)], row
    assert "no partition is being moved" not in cli("move-status").stdout

    cancelled = cli("move", f"{topic}/0", "--cancel")
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled
    wait_until(lambda: all(replicas(cluster, n, topic) == before for n in up)
               and cli("move-status").stdout == "no partition is being moved\n", MOVE_WAIT_S,
               "the cancelled move back where it began")
    assert_acknowledged_once(producer.acknowledged,  # type: ignore[arg-type]
                             read_partitions(cluster.bootstrap(*up), topic, 1))
    cluster.restart(added)  # (the next test's cluster has every node)


def test_kafka_reassign_partitions_moves_a_partition_and_verifies_it(
        cluster: Cluster, topic: str, tmp_path: Path) -> None:
    """Kafka's own `kafka-reassign-partitions.sh` with a JSON plan: --execute, then --verify
    until it says the move is complete (it also clears replication throttles on the way)."""
    from bench.peers.kafka_tools import run_tool

    cluster.create_topic(topic, 2, replicas=3)
    before = replicas(cluster, 1, topic)
    (added,) = {1, 2, 3, 4} - set(before)
    plan = {"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [added, *before[:2]]}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    bs = ["--bootstrap-server", cluster.bootstrap()]
    done = run_tool("kafka-reassign-partitions", *bs, "--reassignment-json-file", str(path),
                    "--execute", timeout=90)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Successfully started partition reassignment" in done.stdout, done.stdout

    said: list[str] = []

    def verified() -> bool:
        out = run_tool("kafka-reassign-partitions", *bs, "--reassignment-json-file", str(path),
                       "--verify", timeout=90)
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
        said.append(out.stdout + out.stderr[-1000:])
        return f"Reassignment of partition {topic}-0 is completed" in out.stdout

    try:
        wait_until(verified, MOVE_WAIT_S, "kafka-reassign-partitions --verify: completed")
    except AssertionError:
        raise AssertionError(f"--verify said: {said[-1:]}") from None
    assert replicas(cluster, 2, topic) == [added, *before[:2]]


def test_a_move_survives_kill9_of_its_leader_and_its_new_node_down(
        cluster: Cluster, topic: str) -> None:
    """The move's new node is down, so the group holds it as a learner that cannot catch up;
    the leader (which the move removes) is killed -9 and restarted, recovering the
    membership change its log holds from its memberships file; once the new node is back
    the move completes, under a producer throughout, and nothing acknowledged is lost."""
    cluster.create_topic(topic, 1, replicas=3)
    before = replicas(cluster, 1, topic)
    (added,) = {1, 2, 3, 4} - set(before)
    leader = cluster.wait_leader(topic, 0)
    target = [added, *(n for n in before if n != leader)]
    cluster[added].kill9()
    others = [n for n in (1, 2, 3, 4) if n not in (added, leader)]
    broker = SimpleNamespace(bootstrap=cluster.bootstrap(*others, leader))
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap(*others, leader),
                             request_timeout_ms=30_000)
    tp = TopicPartition(topic, 0)
    try:
        with StreamingProducer(broker, topic, **{"enable.idempotence": True}) as producer:
            producer.wait_for(1000)
            # Asked again while Metadata still names the killed node as the controller.
            assert wait_until(lambda: move_with_fresh_metadata(
                cluster.bootstrap(*others, leader), {tp: target}), 30,
                "the move recorded") == {tp: None}
            # The learner's change is in the leader's log (and file) once it committed.
            wait_until(lambda: (cluster[leader].data_dir / f"{topic}-0" /
                                "raft-memberships.json").exists(), 30,
                       "the leader's memberships file")
            cluster[leader].kill9()
            cluster.wait_leader(topic, 0, not_on=leader)
            cluster.restart(leader)
            cluster.restart(added)
            wait_until(lambda: all(sorted(replicas(cluster, n, topic)) == sorted(target)
                                   for n in (1, 2, 3, 4))
                       and admin.list_partition_reassignments() == {}, MOVE_WAIT_S,
                       f"the move to {target} complete")
            moved_at = len(producer.acknowledged)
            producer.wait_for(moved_at + 500)
        acked = list(producer.acknowledged)
    finally:
        admin.close()
    assert_acknowledged_once(acked,  # type: ignore[arg-type]
                             read_partitions(cluster.bootstrap(), topic, 1))
    wait_until(lambda: not (cluster[leader].data_dir / f"{topic}-0").exists(), 30,
               f"node {leader}'s replica removed")
