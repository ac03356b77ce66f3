"""What the admin API and `krill cluster health/info` make of a cluster, from made-up inputs:
shard snapshots carrying "raft" and "controller" (shards/admin.py), and Kafka Metadata as
confluent-kafka gives it (shards/cluster_cli.py). No process runs: these are the pure parts.
"""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shards import cluster_cli
from shards.admin import (
    Node,
    controller_state,
    health_overview,
    partitions_overview,
    render_metrics,
    replicated_partitions,
)
from shards.cluster_cli import cluster_overview, partition_rows

pytestmark = pytest.mark.timeout(30)

NODE = Node(node_id=2, data_dir="/d", kafka_address="127.0.0.1:9192", shards=2, run_dir="/r",
            started=0.0, metrics_enabled=True, shard_pids=lambda: [1, 2])


def snapshot(raft: list[list[Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A shard's stats snapshot with what health reads (and `raft` when given)."""
    value: dict[str, Any] = {"ready": True, "partitions": [], "topics": [], **extra}
    if raft is not None:
        value["raft"] = raft
    return value


CONTROLLER = {"leader": 1, "term": 4, "nodes": [3, 1, 2]}
# A replica: [topic, partition, role, leader, term, hwm, log end, followers (node: last offset
# matched), quiesced, in-sync nodes (a leader's), replica nodes, min.insync.replicas].
SHARD_0 = snapshot(
    [["orders", 2, "follower", 1, 7, 90, 95, {}, True, [], [1, 2, 3], 1],
     ["orders", 0, "leader", 2, 5, 100, 120, {1: 119, 3: 80}, False, [2, 1], [2, 3, 1], 2]],
    controller=CONTROLLER, topics=[["orders", 3]],
)  # fmt: skip
SHARD_1 = snapshot([["orders", 1, "candidate", -1, 6, 40, 41, {}, False, [], [3, 2, 1], 1]])


# shards/admin.py ------------------------------------------------------------------------------


def test_replicated_partitions_by_topic_and_partition_followers_by_name() -> None:
    assert replicated_partitions([SHARD_0, SHARD_1]) == [
        {"topic": "orders", "partition": 0, "shard": 0, "role": "leader", "leader": 2,
         "term": 5, "high_watermark": 100, "log_end": 120, "followers": {"1": 119, "3": 80},
         "quiesced": False, "replicas": [2, 3, 1], "isr": [2, 1], "min_insync": 2},
        {"topic": "orders", "partition": 1, "shard": 1, "role": "candidate", "leader": -1,
         "term": 6, "high_watermark": 40, "log_end": 41, "followers": {}, "quiesced": False,
         "replicas": [3, 2, 1], "isr": [], "min_insync": 1},
        {"topic": "orders", "partition": 2, "shard": 0, "role": "follower", "leader": 1,
         "term": 7, "high_watermark": 90, "log_end": 95, "followers": {}, "quiesced": True,
         "replicas": [1, 2, 3], "isr": [], "min_insync": 1},
    ]  # fmt: skip


def test_a_node_of_its_own_has_no_replicated_partitions_nor_controller() -> None:
    assert replicated_partitions([snapshot(), None]) == []
    assert controller_state([snapshot(), snapshot()]) is None
    assert controller_state([None, SHARD_1]) is None  # shard 0 did not answer
    assert partitions_overview(NODE, [snapshot(), None]) == {
        "node_id": 2, "controller": None, "shards_down": [1], "partitions": []}


def test_controller_state_from_shard_0() -> None:
    assert controller_state([SHARD_0, SHARD_1]) == {"leader": 1, "term": 4, "nodes": [1, 2, 3]}
    overview = partitions_overview(NODE, [SHARD_0, SHARD_1])
    assert overview["controller"] == {"leader": 1, "term": 4, "nodes": [1, 2, 3]}
    assert [p["partition"] for p in overview["partitions"]] == [0, 1, 2]


# What else a shard's snapshot says, for a scrape of every metric (shards/admin.py).
SHARD_GAUGES = ("memory_in_flight", "memory_backlog", "memory_limit", "long_poll_watches",
                "watch_subscriptions", "watch_subscriptions_served", "cross_shard_pending",
                "arena_used", "arena_regions", "io_outstanding", "read_io_outstanding",
                "snapshot_seconds", "disk_free_bytes", "connections_refused")


def samples(text: bytes, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric family's samples from a scrape, by their labels."""
    (family,) = [f for f in text_string_to_metric_families(text.decode()) if f.name == name]
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_replication_metrics_come_from_the_partitions_this_node_leads() -> None:
    led = snapshot(
        [["orders", 0, "leader", 2, 5, 100, 120, {1: 119, 3: 80}, False, [2, 1], [2, 3, 1], 3],
         ["orders", 2, "leader", 2, 5, 9, 9, {1: 8, 3: 8}, False, [2, 3, 1], [2, 3, 1], 2],
         ["orders", 1, "follower", 1, 7, 90, 95, {}, True, [], [1, 2, 3], 1]],
        partitions=[["orders", 0, 100, 0], ["orders", 2, 9, 0], ["lone", 0, 4, 0]])
    public = render_metrics(NODE, [led, SHARD_1], public=True)
    assert samples(public, "redpanda_kafka_under_replicated_replicas") == {
        (("redpanda_namespace", "kafka"), ("redpanda_partition", "0"),
         ("redpanda_topic", "orders")): 1.0,  # node 3 out
        (("redpanda_namespace", "kafka"), ("redpanda_partition", "2"),
         ("redpanda_topic", "orders")): 0.0,
        (("redpanda_namespace", "kafka"), ("redpanda_partition", "0"),
         ("redpanda_topic", "lone")): 0.0,  # one replica (no Raft entry): none to miss
    }  # fmt: skip
    counted = dict.fromkeys(SHARD_GAUGES, 0)
    gauges = render_metrics(NODE, [{**led, **counted}, {**snapshot([]), **counted}],
                            public=False)
    assert samples(gauges, "krill_under_replicated_partitions") == {
        (("shard", "0"),): 1.0, (("shard", "1"),): 0.0}
    assert samples(gauges, "krill_under_min_isr_partitions") == {
        (("shard", "0"),): 1.0, (("shard", "1"),): 0.0}  # orders-0: 2 in sync of 3 asked
    assert samples(gauges, "krill_out_of_sync_replicas") == {(("node", "3"),): 1.0}


def test_health_of_a_node_of_its_own_is_unchanged() -> None:
    served = snapshot(partitions=[["orders", 0, 5, 0]], topics=[["orders", 2]])
    assert health_overview(NODE, [served, snapshot(partitions=[["orders", 1, 5, 0]])]) == {
        "is_healthy": True, "controller_id": 2, "all_nodes": [2], "nodes_down": [],
        "shards_down": [], "leaderless_count": 0, "leaderless_partitions": [],
        "under_replicated_count": 0, "under_replicated_partitions": [],
    }  # fmt: skip


def test_health_of_a_node_in_a_cluster_names_the_controller_and_leadership() -> None:
    overview = health_overview(NODE, [SHARD_0, SHARD_1])
    assert overview["controller_id"] == 1
    assert overview["controller"] == {"leader": 1, "term": 4, "nodes": [1, 2, 3]}
    assert overview["all_nodes"] == [1, 2, 3]
    assert overview["node_id"] == 2
    # orders-1's replica here knows no leader; orders partitions hosted elsewhere are not
    # this node's to call leaderless.
    assert overview["leaderless_partitions"] == [{"topic": "orders", "partition": 1}]
    assert overview["leaderless_count"] == 1
    # orders-0, led here, has node 3 out of its in-sync replicas.
    assert overview["under_replicated_partitions"] == [{"topic": "orders", "partition": 0}]
    assert overview["under_replicated_count"] == 1
    assert overview["is_healthy"] is False
    assert overview["leaders_count"] == 1
    assert overview["leadership"][0] == {"topic": "orders", "partition": 0, "role": "leader",
                                         "leader": 2, "term": 5}


def test_health_in_a_cluster_without_a_controller_leader_is_unhealthy() -> None:
    led = snapshot([["orders", 0, "leader", 2, 5, 1, 1, {1: 0, 3: 0}, False, [2, 3, 1],
                     [2, 3, 1], 1]], controller={"leader": -1, "term": 9, "nodes": [1, 2, 3]})
    overview = health_overview(NODE, [led, snapshot([])])
    assert overview["controller_id"] == -1 and overview["leaderless_count"] == 0
    assert overview["under_replicated_count"] == 0
    assert overview["is_healthy"] is False
    led["controller"] = {"leader": 3, "term": 9, "nodes": [1, 2, 3]}
    assert health_overview(NODE, [led, snapshot([])])["is_healthy"] is True
    assert health_overview(NODE, [led, None])["shards_down"] == [1]


# shards/cluster_cli.py ------------------------------------------------------------------------


def metadata(partitions: dict[int, tuple[int, list[int], list[int]]], controller: int = 1,
             brokers: tuple[int, ...] = (1, 2, 3)) -> SimpleNamespace:
    """Kafka Metadata as confluent-kafka's list_topics gives it: partition -> (leader,
    replicas, isrs) of one topic, "orders"."""
    return SimpleNamespace(
        controller_id=controller,
        brokers={b: SimpleNamespace(id=b, host="127.0.0.1", port=9092 + 100 * (b - 1))
                 for b in brokers},
        topics={"orders": SimpleNamespace(partitions={
            i: SimpleNamespace(leader=leader, replicas=replicas, isrs=isrs)
            for i, (leader, replicas, isrs) in partitions.items()})},
    )  # fmt: skip


def node_overview(node: int, **changes: Any) -> dict[str, Any]:
    """One node's cluster health overview (shards/admin.py), healthy unless changed."""
    return {"node_id": node, "all_nodes": [1, 2, 3], "nodes_down": [], "shards_down": [],
            "leaderless_partitions": [], "controller": CONTROLLER, **changes}


ALL_IN_SYNC = {0: (1, [1, 2, 3], [1, 2, 3]), 1: (2, [2, 3, 1], [2, 3, 1])}
EVERY_NODE = [node_overview(1), node_overview(2), node_overview(3)]


def test_a_healthy_cluster() -> None:
    assert cluster_overview(EVERY_NODE, [], metadata(ALL_IN_SYNC)) == {
        "is_healthy": True, "controller_id": 1, "all_nodes": [1, 2, 3], "nodes_down": [],
        "shards_down": [], "admin_unreachable": [], "leaderless_count": 0,
        "leaderless_partitions": [], "under_replicated_count": 0,
        "under_replicated_partitions": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    "overviews, unreachable, partitions, controller, expected",
    [
        # Node 3's admin API does not answer: it is down, its address named.
        (EVERY_NODE[:2], ["127.0.0.1:9844"], ALL_IN_SYNC, 1,
         {"nodes_down": [3], "admin_unreachable": ["127.0.0.1:9844"]}),
        # A node answers that a shard of its is down.
        ([*EVERY_NODE[:2], node_overview(3, nodes_down=[3], shards_down=[1])], [], ALL_IN_SYNC,
         1, {"nodes_down": [3], "shards_down": [{"node": 3, "shard": 1}]}),
        # No leader in Metadata.
        (EVERY_NODE, [], {**ALL_IN_SYNC, 1: (-1, [2, 3, 1], [2, 3])}, 1,
         {"leaderless_count": 1, "leaderless_partitions": [{"topic": "orders", "partition": 1}]}),
        # A replica that knows no leader (a node's own overview), though Metadata has one.
        ([node_overview(1, leaderless_partitions=[{"topic": "orders", "partition": 0}]),
          *EVERY_NODE[1:]], [], ALL_IN_SYNC, 1,
         {"leaderless_count": 1, "leaderless_partitions": [{"topic": "orders", "partition": 0}]}),
        # Fewer in-sync replicas than replicas.
        (EVERY_NODE, [], {**ALL_IN_SYNC, 0: (1, [1, 2, 3], [1, 2])}, 1,
         {"under_replicated_count": 1,
          "under_replicated_partitions": [{"topic": "orders", "partition": 0}]}),
        # A leader's own overview says so, before Metadata here has heard.
        ([node_overview(2, under_replicated_partitions=[{"topic": "orders", "partition": 1}]),
          *EVERY_NODE[:1], *EVERY_NODE[2:]], [], ALL_IN_SYNC, 1,
         {"under_replicated_count": 1,
          "under_replicated_partitions": [{"topic": "orders", "partition": 1}]}),
        # No controller.
        (EVERY_NODE, [], ALL_IN_SYNC, -1, {"controller_id": -1}),
    ],
)  # fmt: skip
def test_what_makes_a_cluster_unhealthy(
    overviews: list[dict[str, Any]], unreachable: list[str],
    partitions: dict[int, tuple[int, list[int], list[int]]], controller: int,
    expected: dict[str, Any],
) -> None:
    overview = cluster_overview(overviews, unreachable, metadata(partitions, controller))
    assert overview["is_healthy"] is False
    assert {key: overview[key] for key in expected} == expected


def test_a_registered_node_missing_from_metadata_is_still_counted() -> None:
    overview = cluster_overview(EVERY_NODE[:2], [], metadata(ALL_IN_SYNC, brokers=(1, 2)))
    assert overview["all_nodes"] == [1, 2, 3] and overview["nodes_down"] == [3]


def test_health_text_of_a_cluster() -> None:
    overview = cluster_overview(
        [*EVERY_NODE[:2], node_overview(3, nodes_down=[3], shards_down=[1])], ["10.0.0.9:9644"],
        metadata({**ALL_IN_SYNC, 0: (1, [1, 2, 3], [1, 2])}))
    out = io.StringIO()
    cluster_cli._print_health(overview, out)
    rows = {key.strip(): rest.strip() for key, rest in
            (line.split(":", 1) for line in out.getvalue().splitlines()[2:])}
    assert rows == {
        "Healthy": "false", "Controller ID": "1", "All nodes": "[1, 2, 3]",
        "Nodes down": "[3]", "Shards down": "3/1", "Admin unreachable": "10.0.0.9:9644",
        "Leaderless partitions (0)": "[]", "Under-replicated partitions (1)": "orders/0",
    }  # fmt: skip


def test_partition_rows_with_lag_from_the_leader() -> None:
    # A follower's match is its last offset, the leader's log end the next one: caught up,
    # they differ by one and the lag is 0.
    answers = [
        {"partitions": [{"topic": "orders", "partition": 0, "role": "leader", "term": 5,
                         "log_end": 120, "followers": {"2": 119, "3": 80}}]},
        {"partitions": [{"topic": "orders", "partition": 0, "role": "follower", "term": 5,
                         "log_end": 120, "followers": {}},
                        {"topic": "orders", "partition": 1, "role": "leader", "term": 4,
                         "log_end": 60, "followers": {"1": 59, "3": 54}}]},
        # A deposed leader of an older term that has not heard of the new one yet.
        {"partitions": [{"topic": "orders", "partition": 1, "role": "leader", "term": 3,
                         "log_end": 50, "followers": {"1": 0, "2": 0}}]},
    ]  # fmt: skip
    rows = partition_rows(metadata(ALL_IN_SYNC), answers)
    assert rows == [
        {"topic": "orders", "partition": 0, "leader": 1, "replicas": [1, 2, 3],
         "isr": [1, 2, 3], "lag": {"2": 0, "3": 39}},
        {"topic": "orders", "partition": 1, "leader": 2, "replicas": [2, 3, 1],
         "isr": [2, 3, 1], "lag": {"1": 0, "3": 5}},
    ]  # fmt: skip
    assert partition_rows(metadata(ALL_IN_SYNC), answers[::-1]) == rows  # in any order
    # A node of its own: no /v1/partitions answers, no lag.
    assert [r["lag"] for r in partition_rows(metadata(ALL_IN_SYNC), [])] == [{}, {}]
