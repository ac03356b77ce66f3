"""The in-sync replicas of a 3-node cluster, as a user and a Kafka client see them.

kill -9 of a node: within replica.lag.time.max.ms (3 s here, Kafka's is 30 s) Metadata from
the other nodes leaves it out of every ISR, `krill cluster info` and `krill cluster health`
say so ("Under-replicated partitions (3)"), and so do the metrics (Kafka's and Redpanda's
gauges); once it is restarted and has caught up with what was written meanwhile, it is back
in every ISR, the cluster is healthy and an idle caught-up follower lags 0. And
min.insync.replicas has Kafka's meaning: a topic with 3 of 3 takes acks=all produces while
every replica is in sync, and confluent-kafka sees NOT_ENOUGH_REPLICAS once one is down.

Each test starts its own cluster (tests/support/cluster.py): every node a seed, one shard
each, every partition replicated 3 times.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import krill
from tests.support.cluster import Cluster, cluster_fixture, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ELECTION_TIMEOUT_MS = 1000
LAG_MS = 3000  # replica.lag.time.max.ms of every node
# A kill seen (an election timeout unheard, ticks) and reported to every node, with room for
# a loaded machine; far below what the defect showed (40 s and never).
ISR_CHANGE_WAIT_S = 20.0
CAUGHT_UP_WAIT_S = 60.0  # a restarted node: start, recovery, catch-up, reports
TOPIC, PARTITIONS = "watched", 3
RECORDS = 200


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS),
        "--replica-lag-time-max-ms", str(LAG_MS))


def produce(bootstrap: str, topic: str, count: int, partitions: int, acks: str = "all",
            retries: int = 5) -> list[KafkaError | None]:
    """`count` records spread over the partitions; each one's delivery error (None: ok)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "retries": retries,
                         "message.timeout.ms": 30_000, "linger.ms": 5})
    results: list[KafkaError | None] = []
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, partition=i % partitions,
                         on_delivery=lambda err, _msg: results.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0, "records left undelivered"
    return results


def isrs(cluster: Cluster, node: int, topic: str) -> dict[int, tuple[int, ...]]:
    """Each partition's ISR as `node`'s Metadata gives it."""
    (found,) = cluster[node].metadata([topic]).topics
    assert found.error_code == 0, found
    return {p.partition_index: tuple(sorted(p.isr_nodes)) for p in found.partitions}


def every_isr(cluster: Cluster, nodes: tuple[int, ...], topic: str,
              expected: tuple[int, ...]) -> bool:
    return all(set(isrs(cluster, n, topic).values()) == {expected} for n in nodes)


def krill_cluster(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`krill cluster ARGS` against every node's admin API, as a user runs it."""
    admins = ",".join(f"127.0.0.1:{n.admin_port}" for n in cluster.nodes.values())
    return krill("-b", cluster.bootstrap(*running(cluster)), "--admin", admins, "cluster", *args)


def running(cluster: Cluster) -> tuple[int, ...]:
    return tuple(n.node_id for n in cluster.running())


def health(cluster: Cluster) -> tuple[int, dict[str, Any]]:
    result = krill_cluster(cluster, "health", "--format", "json")
    return result.returncode, json.loads(result.stdout)


def info_rows(cluster: Cluster, topic: str) -> list[dict[str, Any]]:
    result = krill_cluster(cluster, "info", "--format", "json")
    assert result.returncode == 0, result.stderr
    return [p for p in json.loads(result.stdout)["partitions"] if p["topic"] == topic]


def gauges(cluster: Cluster, node: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    status, body = cluster[node].admin_get("/metrics")
    assert status == 200
    (family,) = [f for f in text_string_to_metric_families(body.decode()) if f.name == name]
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def under_replicated(cluster: Cluster, nodes: tuple[int, ...], topic: str) -> dict[int, float]:
    """redpanda_kafka_under_replicated_replicas of the topic's partitions, from their
    leaders among `nodes`."""
    found: dict[int, float] = {}
    for node in nodes:
        for labels, value in gauges(cluster, node,
                                    "redpanda_kafka_under_replicated_replicas").items():
            named = dict(labels)
            if named["redpanda_topic"] == topic:
                found[int(named["redpanda_partition"])] = value
    return found


def test_a_killed_node_leaves_every_isr_and_is_back_once_caught_up(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, PARTITIONS)
    assert produce(cluster.bootstrap(), TOPIC, RECORDS, PARTITIONS) == [None] * RECORDS
    wait_until(lambda: every_isr(cluster, (1, 2, 3), TOPIC, (1, 2, 3)), ISR_CHANGE_WAIT_S,
               "every ISR full")
    assert gauges(cluster, 1, "krill_under_replicated_partitions") == {(("shard", "0"),): 0}

    cluster[1].kill9()
    wait_until(lambda: every_isr(cluster, (2, 3), TOPIC, (2, 3)), ISR_CHANGE_WAIT_S,
               "node 1 out of every ISR in Metadata from nodes 2 and 3")
    code, overview = wait_until(lambda: (lambda h: h if h[1]["under_replicated_count"] >= 3
                                         else None)(health(cluster)),
                                ISR_CHANGE_WAIT_S, "cluster health naming the partitions")
    assert code == 1 and overview["nodes_down"] == [1], overview
    assert {(p["topic"], p["partition"]) for p in overview["under_replicated_partitions"]} >= {
        (TOPIC, i) for i in range(PARTITIONS)}, overview
    text = krill_cluster(cluster, "health").stdout
    assert "Nodes down:" in text and "[1]" in text, text
    assert "Under-replicated partitions (0)" not in text, text
    for row in info_rows(cluster, TOPIC):
        assert sorted(row["isr"]) == [2, 3] and sorted(row["replicas"]) == [1, 2, 3], row
    assert under_replicated(cluster, (2, 3), TOPIC) == dict.fromkeys(range(PARTITIONS), 1.0)
    out_of_sync = [gauges(cluster, n, "krill_out_of_sync_replicas") for n in (2, 3)]
    assert sum(g.get((("node", "1"),), 0) for g in out_of_sync) >= PARTITIONS, out_of_sync
    led = [gauges(cluster, n, "krill_under_replicated_partitions")[(("shard", "0"),)]
           for n in (2, 3)]
    assert sum(led) >= PARTITIONS, led  # __consumer_offsets' partitions may count too

    # Written while node 1 is down: it has to catch up before it is back in.
    assert produce(cluster.bootstrap(2, 3), TOPIC, RECORDS, PARTITIONS) == [None] * RECORDS
    cluster.restart(1)
    wait_until(lambda: every_isr(cluster, (1, 2, 3), TOPIC, (1, 2, 3)), CAUGHT_UP_WAIT_S,
               "node 1 back in every ISR in Metadata from every node")
    wait_until(lambda: health(cluster)[0] == 0, CAUGHT_UP_WAIT_S, "the cluster healthy")
    rows = wait_until(lambda: (lambda r: r if all(r_["lag"] for r_ in r) else None)(
        info_rows(cluster, TOPIC)), CAUGHT_UP_WAIT_S, "every partition's lag known")
    for row in rows:
        assert sorted(row["isr"]) == [1, 2, 3], row
        assert set(row["lag"].values()) == {0}, row  # idle and caught up: nothing lacking
    assert under_replicated(cluster, (1, 2, 3), TOPIC) == dict.fromkeys(range(PARTITIONS), 0.0)


def test_min_insync_replicas_of_all_three_takes_acks_all_until_one_is_out(
        cluster: Cluster) -> None:
    topic = "strict"
    cluster.create_topic(topic, 1, config={"min.insync.replicas": "3"})
    wait_until(lambda: every_isr(cluster, (1, 2, 3), topic, (1, 2, 3)), ISR_CHANGE_WAIT_S,
               "the ISR full")
    # Refused before the fix (Krill compared 3 with Raft's majority of 2): never writable.
    assert produce(cluster.bootstrap(), topic, 10, 1, retries=0) == [None] * 10

    leader = cluster.wait_leader(topic, 0)
    follower = next(n for n in (1, 2, 3) if n != leader)
    cluster[follower].kill9()
    up = tuple(n for n in (1, 2, 3) if n != follower)
    wait_until(lambda: every_isr(cluster, up, topic, up), ISR_CHANGE_WAIT_S,
               f"node {follower} out of the ISR")
    errors = produce(cluster.bootstrap(*up), topic, 5, 1, retries=0)
    assert [e.code() if e is not None else None for e in errors] == [
        KafkaError.NOT_ENOUGH_REPLICAS] * 5, errors
    assert produce(cluster.bootstrap(*up), topic, 5, 1, acks="1") == [None] * 5

    cluster.restart(follower)
    wait_until(lambda: every_isr(cluster, (1, 2, 3), topic, (1, 2, 3)), CAUGHT_UP_WAIT_S,
               f"node {follower} back in the ISR")
    assert produce(cluster.bootstrap(), topic, 10, 1, retries=0) == [None] * 10
