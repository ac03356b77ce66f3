"""Kafka's own command-line tools against Krill, unchanged: the scripts of Kafka's bin/, run
from the jars `make peers` fetches (bench/peers/kafka_tools.py), against one node and a
3-node cluster. Each tool must end with exit code 0 and say what Kafka's would; what Krill
does not offer is pinned: the tool's exit code and Kafka's message for it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bench.peers.kafka_tools import run_tool
from tests.support.broker import BrokerProcess
from tests.support.cluster import Cluster, cluster_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The console producer reads "key:value" lines.
KEYED = ("--reader-property", "parse.key=true", "--reader-property", "key.separator=:")


def tool(name: str, *args: str, stdin: str | None = None, ok: bool = True,
         timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    done = run_tool(name, *args, stdin=stdin, timeout=timeout)
    if ok:
        assert done.returncode == 0, (name, args, done.stdout[-2000:], done.stderr[-2000:])
        assert "Exception" not in done.stderr, (name, args, done.stderr[-2000:])
    return done


def read_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, k, 0) for k in range(partitions)])
    got: list[bytes] = []
    try:
        for _ in range(200):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
            if len(got) >= count:
                break
    finally:
        c.close()
    return got


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("tools") / "data").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(tmp_path / "cluster")


def test_topics_create_list_describe_alter_delete(node: BrokerProcess) -> None:
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "orders", "--partitions", "3",
         "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert "orders" in tool("kafka-topics", *bs, "--list").stdout.split()
    described = tool("kafka-topics", *bs, "--describe", "--topic", "orders").stdout
    assert "PartitionCount: 3" in described and "retention.ms=3600000" in described
    assert len(re.findall(r"Partition: \d+\s+Leader: 0", described)) == 3
    tool("kafka-topics", *bs, "--alter", "--topic", "orders", "--partitions", "4")
    assert "PartitionCount: 4" in tool("kafka-topics", *bs, "--describe", "--topic",
                                       "orders").stdout
    again = tool("kafka-topics", *bs, "--create", "--topic", "orders", "--partitions", "1",
                 ok=False)
    assert again.returncode == 1 and "already exists" in again.stderr + again.stdout
    tool("kafka-topics", *bs, "--delete", "--topic", "orders")
    assert "orders" not in tool("kafka-topics", *bs, "--list").stdout.split()


def test_console_producer_consumer_and_groups(node: BrokerProcess) -> None:
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "lines", "--partitions", "2")
    lines = [f"line-{i}" for i in range(20)]
    keyed = "".join(f"k{i}:{v}\n" for i, v in enumerate(lines))
    tool("kafka-console-producer", *bs, "--topic", "lines", *KEYED, stdin=keyed)
    assert sorted(read_all(node.bootstrap, "lines", 2, 20)) == sorted(v.encode() for v in lines)
    out = tool("kafka-console-consumer", *bs, "--topic", "lines", "--from-beginning",
               "--group", "tools", "--max-messages", "20", "--timeout-ms", "30000",
               "--formatter-property", "print.key=true")
    assert sorted(out.stdout.splitlines()) == sorted(f"k{i}\t{v}" for i, v in enumerate(lines))
    described = tool("kafka-consumer-groups", *bs, "--describe", "--group", "tools").stdout
    committed = {int(m[0]): (int(m[1]), int(m[2]), int(m[3])) for m in
                 re.findall(r"tools\s+lines\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", described)}
    assert set(committed) == {0, 1}
    assert sum(c for c, _, _ in committed.values()) == 20
    assert all(lag == 0 and c == end for c, end, lag in committed.values())
    assert "tools" in tool("kafka-consumer-groups", *bs, "--list").stdout.split()
    reset = tool("kafka-consumer-groups", *bs, "--group", "tools", "--topic", "lines",
                 "--reset-offsets", "--to-earliest", "--execute").stdout
    assert re.search(r"tools\s+lines\s+0\s+0", reset), reset
    after = tool("kafka-consumer-groups", *bs, "--describe", "--group", "tools").stdout
    assert sorted(int(m) for m in re.findall(r"tools\s+lines\s+\d+\s+(\d+)", after)) == [0, 0]
    tool("kafka-consumer-groups", *bs, "--delete", "--group", "tools")
    assert "tools" not in tool("kafka-consumer-groups", *bs, "--list").stdout.split()


def test_configs_offsets_and_delete_records(node: BrokerProcess, tmp_path: Path) -> None:
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "kept", "--partitions", "2")
    tool("kafka-console-producer", *bs, "--topic", "kept",
         stdin="".join(f"v{i}\n" for i in range(10)))
    tool("kafka-configs", *bs, "--entity-type", "topics", "--entity-name", "kept", "--alter",
         "--add-config", "retention.ms=86400000,cleanup.policy=delete")
    described = tool("kafka-configs", *bs, "--entity-type", "topics", "--entity-name", "kept",
                     "--describe").stdout
    assert "retention.ms=86400000" in described
    offsets = tool("kafka-get-offsets", *bs, "--topic", "kept").stdout.split()
    ends = {int(line.split(":")[1]): int(line.split(":")[2]) for line in offsets}
    assert sorted(ends) == [0, 1] and sum(ends.values()) == 10
    busy = max(ends, key=lambda k: ends[k])
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "kept", "partition": busy, "offset": 2}]}))
    deleted = tool("kafka-delete-records", *bs, "--offset-json-file", str(spec)).stdout
    assert f"partition: kept-{busy}\tlow_watermark: 2" in deleted, deleted
    earliest = tool("kafka-get-offsets", *bs, "--topic", "kept", "--time", "-2").stdout.split()
    assert f"kept:{busy}:2" in earliest


def test_perf_tools_and_transactions_list(node: BrokerProcess) -> None:
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "perf", "--partitions", "3")
    produced = tool("kafka-producer-perf-test", "--topic", "perf", "--num-records", "20000",
                    "--record-size", "100", "--throughput", "-1", "--command-property",
                    f"bootstrap.servers={node.bootstrap}", "acks=all").stdout
    assert re.search(r"^20000 records sent", produced, re.M), produced
    consumed = tool("kafka-consumer-perf-test", *bs, "--topic", "perf", "--num-records",
                    "20000", "--timeout", "30000").stdout
    row = consumed.strip().splitlines()[-1].split(", ")
    assert int(row[4]) == 20000, consumed
    listed = tool("kafka-transactions", *bs, "list").stdout
    assert listed.splitlines()[0].split() == ["TransactionalId", "Coordinator", "ProducerId",
                                              "TransactionState"]


def test_log_dirs_describe_every_replica_and_its_size(node: BrokerProcess) -> None:
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "sized", "--partitions", "2")
    tool("kafka-console-producer", *bs, "--topic", "sized", *KEYED,
         stdin="".join(f"k:{'x' * 500}\n" for _ in range(40)))
    out = tool("kafka-log-dirs", *bs, "--describe", "--topic-list", "sized").stdout
    report = json.loads(out.strip().splitlines()[-1])
    ((broker,),) = [report["brokers"]]
    ((log_dir,),) = [broker["logDirs"]]
    assert log_dir["error"] is None and log_dir["logDir"] == str(node.data_dir.resolve())
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert set(sizes) == {"sized-0", "sized-1"}
    assert sum(sizes.values()) >= 40 * 500  # every record (one key: all in one partition)
    assert all(p["offsetLag"] == 0 and p["isFuture"] is False for p in log_dir["partitions"])


def test_leader_election_finds_every_preferred_replica_leading(node: BrokerProcess) -> None:
    """A node of its own is every partition's preferred replica: Kafka's answer for a
    partition that needs no election (ELECTION_NOT_NEEDED), preferred or unclean."""
    bs = ["--bootstrap-server", node.bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "led", "--partitions", "2")
    preferred = tool("kafka-leader-election", *bs, "--election-type", "preferred",
                     "--topic", "led", "--partition", "1").stdout
    assert preferred.strip() == "Valid replica already elected for partitions led-1"
    every = tool("kafka-leader-election", *bs, "--election-type", "unclean",
                 "--all-topic-partitions").stdout
    assert {"led-0", "led-1"} <= set(every.strip().split("partitions ")[1].split(", "))
    unknown = tool("kafka-leader-election", *bs, "--election-type", "preferred", "--topic",
                   "nope", "--partition", "0", ok=False)
    assert unknown.returncode == 1
    assert "nope-0: org.apache.kafka.common.errors.UnknownTopicOrPartitionException" in (
        unknown.stdout)


def test_topics_and_groups_on_a_cluster(cluster: Cluster) -> None:
    bootstrap = cluster.bootstrap()
    bs = ["--bootstrap-server", bootstrap]
    tool("kafka-topics", *bs, "--create", "--topic", "replicated", "--partitions", "3",
         "--replication-factor", "3")
    described = tool("kafka-topics", *bs, "--describe", "--topic", "replicated").stdout
    rows = re.findall(r"Partition: (\d+)\s+Leader: (\d+)\s+Replicas: ([\d,]+)\s+Isr: ([\d,]+)",
                      described)
    assert len(rows) == 3, described
    for _, leader, replicas, isr in rows:
        assert sorted(replicas.split(",")) == ["1", "2", "3"]
        assert leader in replicas.split(",") and leader in isr.split(",")
    tool("kafka-console-producer", *bs, "--topic", "replicated", *KEYED, "--producer-property",
         "acks=all", stdin="".join(f"key{i}:r{i}\n" for i in range(30)))  # keys: every partition
    out = tool("kafka-console-consumer", *bs, "--topic", "replicated", "--from-beginning",
               "--group", "cg", "--max-messages", "30", "--timeout-ms", "30000")
    assert sorted(out.stdout.splitlines()) == sorted(f"r{i}" for i in range(30))
    lags = re.findall(r"cg\s+replicated\s+\d+\s+\d+\s+\d+\s+(\d+)",
                      tool("kafka-consumer-groups", *bs, "--describe", "--group", "cg").stdout)
    assert lags == ["0", "0", "0"]
    # Each partition's leader is its preferred replica, or the election is refused by name.
    election = tool("kafka-leader-election", *bs, "--election-type", "preferred", "--topic",
                    "replicated", "--partition", "0", ok=False)
    if election.returncode == 0:
        assert "Valid replica already elected for partitions replicated-0" in election.stdout
    else:
        assert "PreferredLeaderNotAvailableException" in election.stdout, election
