"""A node of a 3-node cluster paused (SIGSTOP of its whole process group, as a stalled VM or a
long GC pause) for 4-6 s, eight times, under acks=all produce (issue #26, defect 12).

Each pause outlasts what a peer's ZeroMQ connection used to wait for a sign of life (ZMTP
heartbeats, 3 s), so the peers closed their connections to the stopped node while its kernel
still held their last messages; at SIGCONT libzmq 4.3.5 aborted the shard
(`Assertion failed: !_io_error (src/stream_engine_base.cpp:310)`: a PING read from that
backlog after the connection had failed, shards/node_mesh.py says why) and the supervisor
stopped the node. Before the fix this test failed in four runs of four, at its first, first,
third and fifth pause; the same load lost a node in 11 and in 16 of 25 pauses of 4-9 s.

After every pause each node must still run and serve, with no libzmq assertion in its log;
after the last one every acknowledged value sits exactly once at its offset and the replicas
hold the same batches. Pause lengths and victims come from a fixed seed.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    Cluster,
    ClusterNode,
    ConfluentLoad,
    assert_acknowledged_once,
    cluster_fixture,
    read_partitions,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "paused"
PARTITIONS = 12
# Records offered per second: few and small, so each node sends its peers many small Raft
# messages, the traffic under which the old heartbeats' PINGs were likeliest to be read late.
LOAD_RATE_PER_S = 100.0
# The load outlasts the pauses even on a busy machine (80 s here alone, 150 s with other
# clusters running beside it).
LOAD_RUN_LIMIT_S = 240.0
PAUSES = 8  # the defect showed by the fifth in each of four runs
PAUSE_S = (4.0, 6.0)  # past the 3 s the ZMTP heartbeats gave a silent peer
SEED = 26
_SERVING_TIMEOUT_S = 10.0  # a resumed node's admin endpoint answering ready
_ACKS_AFTER_RESUME = 50  # the load acknowledged again before the next pause
ASSERTION = "Assertion failed"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster", "--raft-election-timeout-ms", "1000")


def _assert_every_node_serves(cluster: Cluster, when: str) -> None:
    """No node exited by itself or logged a libzmq assertion, and each answers ready."""
    for node in cluster.nodes.values():
        log = node.log_path.read_text(errors="replace")
        assert node.alive() and ASSERTION not in log, (
            f"{when}: {node} {'exited' if not node.alive() else 'aborted a shard'}:\n"
            f"{node.log_tail()}"
        )
        wait_until(functools.partial(_ready, node), _SERVING_TIMEOUT_S, f"{node} serving {when}")


def _ready(node: ClusterNode) -> bool:
    return node.admin_get("/v1/status/ready")[0] == 200


def test_nodes_survive_being_paused_again_and_again(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, PARTITIONS)
    rng = random.Random(SEED)
    load = ConfluentLoad(cluster.bootstrap(), TOPIC, PARTITIONS, LOAD_RATE_PER_S, LOAD_RUN_LIMIT_S)
    with load:
        load.wait_acks(200)
        for pause in range(PAUSES):
            victim = rng.choice(sorted(cluster.nodes))
            length_s = rng.uniform(*PAUSE_S)
            cluster[victim].pause()
            time.sleep(length_s)
            cluster[victim].resume()
            load.wait_acks(len(load.acknowledged) + _ACKS_AFTER_RESUME)
            _assert_every_node_serves(cluster, f"after pause {pause} (node {victim})")
            print(f"pause {pause}: node {victim} for {length_s:.1f}s; "
                  f"{len(load.acknowledged)} acknowledged")  # fmt: skip
    cluster.wait_replicas_converged(TOPIC, PARTITIONS)
    stored = read_partitions(cluster.bootstrap(), TOPIC, PARTITIONS)
    assert_acknowledged_once(load.acknowledged, stored)
    _assert_every_node_serves(cluster, "at the end")
