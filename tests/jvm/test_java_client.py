"""The JVM's own Kafka client (org.apache.kafka:kafka-clients) against Krill, unchanged.

Each test runs one scenario of the Java programs in tests/jvm/clients (built by
tests/jvm/build.py against a 4.x and a 3.x client) as a subprocess against a real node (the
module's `shared_broker`) or a real 3-node cluster, and asserts on its exit code and on the
JSON it prints; where Python can look for itself (what is stored, committed offsets, low
watermarks, the cluster's id) it does, with confluent-kafka. Java or Maven missing, or Maven
unable to fetch the client, fails the tests: it never skips them.

Pinned behaviour that is Krill's answer rather than Kafka's (see each test):
- `group.protocol=consumer` (KIP-848): Krill has no ConsumerGroupHeartbeat, so the consumer's
  first poll throws UnsupportedVersionException; it does not fall back to the classic protocol.
- DescribeProducers (API 61) is refused: UnsupportedVersionException.

Two tests pin what this client found broken and is now fixed: ListOffsets by a time whose
batch lay below the log start after DeleteRecords (it killed the partition's actor), and
LeaveGroup by instance id alone answering a member id other than the one asked (the Java
admin's removeMembersFromConsumerGroup failed).
"""

from __future__ import annotations

import functools
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.jvm.build import KAFKA_3, KAFKA_4, VERSIONS, JvmBuildError, classpath, java
from tests.support.broker import BrokerProcess
from tests.support.cluster import (
    Cluster,
    assert_acknowledged_once,
    cluster_fixture,
    read_partitions,
)
from tests.support.kafka import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_RUN_LIMIT_S = 120  # one Java program, its watchdog's deadline; the subprocess gets 15 s more
_T0 = 1_700_000_000_000  # the timestamps Admin.java's stamped records carry (T0 + i s)

versions = pytest.mark.parametrize("version", VERSIONS, ids=[f"kafka-{v}" for v in VERSIONS])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path_factory.mktemp("jvm") / "cluster")


@functools.cache
def _classpath(version: str) -> str:
    try:
        return classpath(version)
    except JvmBuildError as e:
        pytest.fail(f"the Java client programs could not be built: {e}", pytrace=False)


def run_java(version: str, scenario: str, bootstrap: str, *args: str) -> dict[str, Any]:
    """Run `krill.Main scenario bootstrap args...` on kafka-clients `version`: the JSON result
    it printed. Fails on a nonzero exit (showing stderr's tail) or a run past its limit."""
    command = [
        java(), "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", f"-Dkrill.deadline.s={_RUN_LIMIT_S}",
        "-cp", _classpath(version), "krill.Main", scenario, bootstrap, *args,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_RUN_LIMIT_S + 15)
    except subprocess.TimeoutExpired as e:  # run() has killed it
        raise AssertionError(f"java {scenario} ({version}) not done in {_RUN_LIMIT_S + 15}s") from e
    assert done.returncode == 0, (
        f"java {scenario} ({version}) exit {done.returncode}:\n{done.stderr[-4000:]}"
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"java {scenario} ({version}) printed nothing:\n{done.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert result.pop("client_version") == version
    return result


def _name(what: str) -> str:
    return f"jvm-{what}-{uuid.uuid4().hex[:8]}"


def _rows(rows: list[list[Any]]) -> list[tuple[int, int, str]]:
    return sorted((int(p), int(o), str(v)) for p, o, v in rows)


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        asked = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=15)}
    finally:
        consumer.close()


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("reader")})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)
        return int(low), int(high)
    finally:
        consumer.close()


def _cluster_id(bootstrap: str) -> str:
    return str(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).cluster_id)


# 1. Idempotent producer ------------------------------------------------------------------------

_RECORDS = 1000


def _check_idempotent_produce(version: str, bootstrap: str, topic: str) -> None:
    result = run_java(version, "produce", bootstrap, topic, "6", str(_RECORDS))
    acked = _rows(result["acked"])
    assert sorted(v for _, _, v in acked) == sorted(f"v-{i}" for i in range(_RECORDS))
    for p in range(6):  # every partition written, its offsets 0..n-1 without a gap
        offsets = [o for q, o, _ in acked if q == p]
        assert offsets == list(range(len(offsets))) and offsets, (p, offsets[:20])
    assert _rows(result["read"]) == acked  # the Java consumer read each record once
    stored = read_partitions(bootstrap, topic, 6)  # and so does librdkafka
    assert len(stored) == _RECORDS
    assert_acknowledged_once([(p, o, v.encode()) for p, o, v in acked], stored)


@versions
def test_idempotent_producer(shared_broker: BrokerProcess, version: str) -> None:
    topic = _name("idem")
    create_topic(shared_broker, topic, partitions=6)
    _check_idempotent_produce(version, shared_broker.bootstrap, topic)


@versions
def test_cluster_idempotent_producer(cluster: Cluster, version: str) -> None:
    topic = _name("idem")
    cluster.create_topic(topic, 6)
    _check_idempotent_produce(version, cluster.bootstrap(), topic)


# 2. Transactions -------------------------------------------------------------------------------


@versions
def test_transactions(shared_broker: BrokerProcess, version: str) -> None:
    topic = _name("txn")
    create_topic(shared_broker, topic, partitions=3)
    result = run_java(version, "transactions", shared_broker.bootstrap, topic, "3", _name("tx"))

    def sent(prefix: str, count: int, p: int) -> list[str]:
        return [f"{prefix}{i}" for i in range(count) if i % 3 == p]

    for p in range(3):
        committed = [v for q, _, v in result["read_committed"] if q == p]
        everything = [v for q, _, v in result["read_uncommitted"] if q == p]
        assert committed == sent("c1-", 30, p) + sent("c2-", 10, p)
        assert everything == sent("c1-", 30, p) + sent("a-", 20, p) + sent("c2-", 10, p)
    # Each record at the same offset in both reads; markers between the transactions.
    by_value = {v: (q, o) for q, o, v in result["read_uncommitted"]}
    assert all(by_value[v] == (q, o) for q, o, v in result["read_committed"])
    assert len({o for q, o, _ in result["read_uncommitted"] if q == 0}) == 21
    assert max(o for q, o, _ in result["read_uncommitted"] if q == 0) == 22  # 3 markers
    # librdkafka reads read_committed by default: the committed records only.
    stored = read_partitions(shared_broker.bootstrap, topic, 3)
    assert sorted(v.decode() for v in stored.values()) == sorted(
        [f"c1-{i}" for i in range(30)] + [f"c2-{i}" for i in range(10)]
    )


# 3. Consumer groups (classic protocol) -------------------------------------------------------

_GROUP_RECORDS = 300
_LATE_RECORDS = 30


def _check_group(version: str, bootstrap: str, topic: str, assignor: str) -> None:
    group = _name("group")
    result = run_java(
        version, "group", bootstrap, topic, "6", group, assignor, str(_GROUP_RECORDS),
        str(_LATE_RECORDS),
    )  # fmt: skip
    split = result["split"]
    a, b = split["a"]["assignment"], split["b"]["assignment"]
    assert sorted(a + b) == sorted(f"{topic}-{p}" for p in range(6))
    assert len(a) == len(b) == 3, (a, b)  # both assignors balance 6 partitions over 2
    assert split["a"]["generation"] == split["b"]["generation"] > 0
    read = [v for m in ("a", "b") for _, _, v in split[m]["rows"]]
    assert sorted(read) == sorted(f"p-{i}" for i in range(_GROUP_RECORDS))  # each once
    for m in ("a", "b"):  # each read only its own partitions
        assert {f"{topic}-{p}" for p, _, _ in split[m]["rows"]} <= set(split[m]["assignment"])

    # A static member that restarts gets its partitions back without a rebalance.
    rejoin = result["rejoin"]
    assert rejoin["a_after"] == rejoin["a_before"] == sorted(a)
    assert rejoin["b_generation_after"] == rejoin["b_generation_before"]
    assert rejoin["b_calls_after"] == rejoin["b_calls_before"]

    # Both closed, then removed by instance id (test_remove_static_members: the call's own
    # outcome): the group is empty, so a new member joins without waiting for them.
    assert result["remove_static"]["state"] == "Empty"

    # A new member resumes from the committed offsets: the late records only, each once.
    assert sorted(v for _, _, v in result["resumed"]) == sorted(
        f"late-{i}" for i in range(_LATE_RECORDS)
    )
    ends = {p: _watermarks(bootstrap, topic, p)[1] for p in range(6)}
    assert sum(ends.values()) == _GROUP_RECORDS + _LATE_RECORDS
    assert _committed(bootstrap, group, topic, 6) == ends


@versions
@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_consumer_group(shared_broker: BrokerProcess, version: str, assignor: str) -> None:
    topic = _name("group")
    create_topic(shared_broker, topic, partitions=6)
    _check_group(version, shared_broker.bootstrap, topic, assignor)


@versions
def test_cluster_consumer_group(cluster: Cluster, version: str) -> None:
    topic = _name("group")
    cluster.create_topic(topic, 6)
    _check_group(version, cluster.bootstrap(), topic, "cooperative-sticky")


# 4. AdminClient --------------------------------------------------------------------------------


@versions
def test_admin_client(shared_broker: BrokerProcess, version: str) -> None:
    prefix = _name("admin")
    a, b, group, txn = f"{prefix}-a", f"{prefix}-b", f"{prefix}-group", f"{prefix}-txn"
    steps = run_java(version, "admin", shared_broker.bootstrap, prefix)

    def partitions(count: int) -> dict[str, Any]:
        listed = [{"partition": p, "leader": 0, "replicas": [0], "isr": [0]} for p in range(count)]
        return {"internal": False, "topic_id_set": True, "partitions": listed}

    def configs(retention: list[str]) -> dict[str, list[str]]:
        return {
            "cleanup.policy": ["delete", "DEFAULT_CONFIG"],
            "retention.ms": retention,
            "segment.bytes": ["134217728", "STATIC_BROKER_CONFIG"],
        }

    expected = {
        "create_topics": "ok",
        "create_existing": {"error": f"TopicExistsException: Topic '{b}' already exists."},
        "list_topics": [a, b],
        "describe_topics": {a: partitions(3), b: partitions(1)},
        "describe_cluster": {
            "cluster_id": _cluster_id(shared_broker.bootstrap),
            "controller": 0,
            "nodes": [[0, "127.0.0.1", shared_broker.port]],
        },
        "describe_configs": configs(["3600000", "DYNAMIC_TOPIC_CONFIG"]),
        "alter_set": configs(["123456", "DYNAMIC_TOPIC_CONFIG"]),
        # Back to the node's default; Krill names its source STATIC_BROKER_CONFIG.
        "alter_delete": configs(["604800000", "STATIC_BROKER_CONFIG"]),
        "create_partitions": {a: partitions(4)},
        "produce": "ok",
        "list_offsets": {
            "earliest": [0, -1],
            "latest": [10, -1],
            "max_timestamp": [7, _T0 + 100_000],
            "for_timestamp": [4, _T0 + 4000],
        },
        "delete_records": 5,
        "list_offsets_after_delete": {"earliest": [5, -1], "latest": [10, -1]},
        "group_member_read": 5,
        "list_groups": [[group, False, "Stable"]],
        "describe_group_live": {
            "state": "Stable",
            "assignor": "range",
            "simple": False,
            "coordinator": 0,
            "members": [[f"{a}-{p}" for p in range(4)]],
        },
        "list_group_offsets": {f"{a}-0": 10, f"{a}-1": 0, f"{a}-2": 0, f"{a}-3": 0},
        "describe_group_empty": {
            "state": "Empty",
            "assignor": "",
            "simple": False,
            "coordinator": 0,
            "members": [],
        },
        "alter_group_offsets": 6,
        "delete_group": [],
        "describe_transaction_ongoing": {
            "state": "Ongoing",
            "producer_id_set": True,
            "partitions": [f"{a}-1"],
            "coordinator": 0,
        },
        "list_transactions": [[txn, "Ongoing"]],
        "describe_transaction_committed": {
            "state": "CompleteCommit",
            "producer_id_set": True,
            "partitions": [],
            "coordinator": 0,
        },
        # Krill has no DescribeProducers (API 61): the client refuses to send it.
        "describe_producers": {
            "error": "UnsupportedVersionException: The node does not support DESCRIBE_PRODUCERS"
        },
        "delete_topics": [a],
    }
    assert steps == expected
    # DeleteRecords as librdkafka sees it.
    assert _watermarks(shared_broker.bootstrap, a, 0) == (5, 10)


@versions
def test_cluster_describe(cluster: Cluster, version: str) -> None:
    topic = _name("describe")
    cluster.create_topic(topic, 3)
    result = run_java(version, "describe", cluster.bootstrap(), topic)
    described = result["describe_cluster"]
    assert described["nodes"] == [
        [i, "127.0.0.1", node.kafka_port] for i, node in sorted(cluster.nodes.items())
    ]
    assert described["controller"] in cluster.nodes
    assert described["cluster_id"] == _cluster_id(cluster.bootstrap())
    (found,) = result["describe_topics"].values()
    assert [p["partition"] for p in found["partitions"]] == [0, 1, 2]
    for p in found["partitions"]:
        assert sorted(p["replicas"]) == [1, 2, 3]
        assert p["leader"] in p["isr"] and set(p["isr"]) <= {1, 2, 3}, p


# 5. What a Kafka 4 client may ask for that Krill refuses ------------------------------------


_KIP848_REFUSAL = {
    KAFKA_4: "org.apache.kafka.common.errors.UnsupportedVersionException: The cluster does not "
    "support the new CONSUMER group protocol. Set group.protocol=classic on the consumer configs "
    "to revert to the CLASSIC protocol until the cluster is upgraded.",
    KAFKA_3: "org.apache.kafka.common.errors.UnsupportedVersionException: The node does not "
    "support CONSUMER_GROUP_HEARTBEAT",
}


@versions
def test_kip848_consumer_protocol_refused(shared_broker: BrokerProcess, version: str) -> None:
    """group.protocol=consumer needs ConsumerGroupHeartbeat (API 68), which Krill does not
    offer: the client does not fall back to the classic protocol; its first poll throws."""
    topic = _name("kip848")
    create_topic(shared_broker, topic, partitions=2)
    group = _name("kip848")
    result = run_java(version, "kip848", shared_broker.bootstrap, topic, group, "5")
    assert result == {
        "phase": "poll",
        "error": _KIP848_REFUSAL[version],
        "records": 0,
        "assignment": [],
    }


# What the Java client found broken in Krill, fixed ------------------------------------------


def test_list_offsets_by_time_after_delete_records(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        topic = _name("timequery")
        create_topic(broker, topic, partitions=1)
        result = run_java(KAFKA_4, "timequery", broker.bootstrap, topic)
        # Kafka: the first record kept at or after T0 + 3.5 s is offset 5 (at T0 + 5 s).
        assert result == {
            "delete_records": 5,
            "for_timestamp": [5, _T0 + 5000],
            "latest": [10, -1],
        }
        assert "Unhandled exception" not in broker.log()
    finally:
        broker.stop()


def test_remove_static_members(shared_broker: BrokerProcess) -> None:
    topic = _name("remove")
    create_topic(shared_broker, topic, partitions=6)
    group = _name("group")
    result = run_java(
        KAFKA_4, "group", shared_broker.bootstrap, topic, "6", group, "range", "6", "1"
    )
    assert result["remove_static"] == {"outcome": "ok", "state": "Empty"}
