"""`krill cluster health` and `krill cluster info` against a real 2-shard node, as a user types
them: text and JSON, exit codes (0 healthy, 1 not), and one error line when the admin API
cannot be reached. A shard stopped with SIGSTOP makes the node unhealthy without stopping it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from shards.shard_table import shard_of
from tests.support.broker import BrokerProcess
from tests.support.cli import krill
from tests.support.kafka import create_topic

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores for two shards"),
]

SHARDS = 2
TOPICS = {"orders": 6, "events": 2}
WAIT_S = 30.0
HEALTHY = {
    "is_healthy": True, "controller_id": 0, "all_nodes": [0], "nodes_down": [],
    "shards_down": [], "leaderless_count": 0, "leaderless_partitions": [],
    "under_replicated_count": 0, "under_replicated_partitions": [],
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("cluster") / "data", smp=SHARDS).start()
    try:
        for name, partitions in TOPICS.items():
            create_topic(broker, name, partitions=partitions)
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def cluster(node: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return krill("-b", node.bootstrap, "--admin", node.admin_address, "cluster", *args)


def table(text: str, title: str) -> list[list[str]]:
    """The rows (header first) of one titled section of `cluster info`'s text."""
    lines = text.splitlines()
    start = lines.index(title)
    assert lines[start + 1] == "=" * len(title)
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def closed_address() -> str:
    """host:port where nothing listens: bind a free port, then close it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def assert_one_error_line(result: subprocess.CompletedProcess[str], starts: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert result.stderr.startswith(starts), result.stderr
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""


# health ---------------------------------------------------------------------------------------


def test_health_text_on_a_healthy_node(node: BrokerProcess) -> None:
    result = cluster(node, "health")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[:2] == ["CLUSTER HEALTH OVERVIEW", "=" * len("CLUSTER HEALTH OVERVIEW")]
    rows = {key.strip(): rest.strip() for key, rest in
            (line.split(":", 1) for line in lines[2:])}
    assert rows == {
        "Healthy": "true", "Controller ID": "0", "All nodes": "[0]", "Nodes down": "[]",
        "Shards down": "[]", "Leaderless partitions (0)": "[]",
        "Under-replicated partitions (0)": "[]",
    }


def test_health_json_on_a_healthy_node(node: BrokerProcess) -> None:
    result = cluster(node, "health", "--format", "json")
    assert result.returncode == 0, result.stderr
    overview = json.loads(result.stdout)
    assert overview == HEALTHY
    status, body = node.admin_get("/v1/cluster/health_overview")
    assert (status, json.loads(body)) == (200, overview)


def test_health_flags_go_anywhere_and_admin_comes_from_the_environment(
    node: BrokerProcess,
) -> None:
    after = krill("cluster", "health", "--format", "json", "-b", node.bootstrap,
                  "--admin", node.admin_address)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == HEALTHY
    from_env = krill("cluster", "health", "--format", "json",
                     env={"KRILL_ADMIN": node.admin_address, "KRILL_BROKERS": node.bootstrap})
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout) == HEALTHY


def test_health_of_a_node_with_a_stopped_shard_exits_1(node: BrokerProcess) -> None:
    """SIGSTOP shard 1: it runs but answers no snapshot, so its partitions have no leader."""
    stopped = node.shard_pids()[1]
    leaderless = sorted((t, p) for t, n in TOPICS.items() for p in range(n)
                        if shard_of(t, p, SHARDS) == 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        text = cluster(node, "health")
        as_json = cluster(node, "health", "--format", "json")
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert text.returncode == 1, (text.stdout, text.stderr)
    assert text.stderr == ""  # unhealthy is an answer, not an error
    rows = {key.strip(): rest.strip() for key, rest in
            (line.split(":", 1) for line in text.stdout.splitlines()[2:])}
    assert rows["Healthy"] == "false"
    assert rows["Shards down"] == "[1]" and rows["Nodes down"] == "[0]"
    listed = [item for key, rest in rows.items() if key.startswith("Leaderless partitions (")
              for item in rest.split(", ")]
    assert {tuple(item.split("/")) for item in listed} >= {(t, str(p)) for t, p in leaderless}
    assert as_json.returncode == 1, as_json.stderr
    overview = json.loads(as_json.stdout)
    assert overview["is_healthy"] is False and overview["shards_down"] == [1]
    assert {(p["topic"], p["partition"]) for p in overview["leaderless_partitions"]} == set(
        leaderless)  # no groups here: no __consumer_offsets either
    assert overview["leaderless_count"] == len(leaderless)
    # Resumed, the node is healthy again (bounded wait: the shard catches up on its queue).
    deadline = time.monotonic() + WAIT_S
    while (again := cluster(node, "health")).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert again.returncode == 0, again.stdout


def test_health_with_no_admin_api_is_one_error_line(node: BrokerProcess) -> None:
    address = closed_address()
    for extra in ((), ("--format", "json")):
        result = krill("-b", node.bootstrap, "--admin", address, "cluster", "health", *extra)
        assert_one_error_line(result, f"krill: error: cannot reach the admin API at {address}")


# info -----------------------------------------------------------------------------------------


def test_info_text_lists_broker_node_and_topics(node: BrokerProcess) -> None:
    result = cluster(node, "info")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    text = result.stdout
    cluster_id = table(text, "CLUSTER")
    assert len(cluster_id) == 1 and len(cluster_id[0]) == 1 and cluster_id[0][0]
    host, port = node.bootstrap.split(":")
    assert table(text, "BROKERS") == [["ID", "HOST", "PORT"], ["0*", host, port]]
    nodes = table(text, "NODES")
    assert nodes[0] == ["ID", "ADMIN", "STATUS", "SHARDS", "UPTIME"]
    assert len(nodes) == 2
    node_id, admin, status, shards, uptime = nodes[1]
    assert (node_id, admin, status, shards) == ("0", node.admin_address, "ready", str(SHARDS))
    assert uptime.endswith("s") and 0 <= int(uptime[:-1]) < 600
    assert table(text, "TOPICS") == [["NAME", "PARTITIONS", "REPLICAS"]] + [
        [name, str(count), "1"] for name, count in sorted(TOPICS.items())]


def test_info_json_matches_the_text_and_the_node(node: BrokerProcess) -> None:
    result = cluster(node, "info", "--format", "json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    host, port = node.bootstrap.split(":")
    assert info["controller_id"] == 0
    assert info["brokers"] == [{"id": 0, "host": host, "port": int(port)}]
    assert info["topics"] == [{"name": name, "partitions": count, "replicas": 1}
                              for name, count in sorted(TOPICS.items())]
    (about,) = info["nodes"]
    uptime = about.pop("uptime_s")
    assert 0 < uptime < 600
    assert about == {
        "node_id": 0, "kafka": node.bootstrap, "shards": SHARDS,
        "data_dir": str(node.data_dir.resolve()), "admin": node.admin_address,
        "ready": True, "status": "ready",
    }
    text = cluster(node, "info").stdout
    assert table(text, "CLUSTER") == [[info["cluster_id"]]]


def test_info_lists_every_partition_of_a_node_of_its_own(node: BrokerProcess) -> None:
    """One replica each, led by node 0, and no followers to lag."""
    info = json.loads(cluster(node, "info", "--format", "json").stdout)
    assert info["partitions"] == [
        {"topic": name, "partition": index, "leader": 0, "replicas": [0], "isr": [0], "lag": {}}
        for name, count in sorted(TOPICS.items()) for index in range(count)]
    assert table(cluster(node, "info").stdout, "PARTITIONS") == [
        ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "LAG"]] + [
        [name, str(index), "0", "0", "0", "-"]
        for name, count in sorted(TOPICS.items()) for index in range(count)]


def test_a_node_of_its_own_has_no_replicated_partitions(node: BrokerProcess) -> None:
    status, body = node.admin_get("/v1/partitions")
    assert status == 200
    assert json.loads(body) == {
        "node_id": 0, "controller": None, "shards_down": [], "partitions": []}


def test_info_with_no_admin_api_is_one_error_line(node: BrokerProcess) -> None:
    address = closed_address()
    for extra in ((), ("--format", "json")):
        result = krill("-b", node.bootstrap, "--admin", address, "cluster", "info", *extra)
        assert_one_error_line(result, f"krill: error: cannot reach the admin API at {address}")


def test_a_malformed_admin_address_is_a_usage_error(node: BrokerProcess) -> None:
    result = krill("-b", node.bootstrap, "--admin", "nohost", "cluster", "health")
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "krill: error: argument --admin: admin address must be host:port, not 'nohost' "
        "(see 'krill --help')"]
    assert result.returncode == 2


@pytest.fixture
def not_http() -> Iterator[str]:
    """host:port of a server of another protocol (an SSH banner), as a mistyped --admin finds."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with client:
                client.settimeout(5)
                try:
                    client.recv(4096)
                    client.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


@pytest.mark.parametrize("command", ["health", "info"])
def test_an_admin_address_that_is_not_http_is_one_error_line(
    node: BrokerProcess, not_http: str, command: str
) -> None:
    result = krill("-b", node.bootstrap, "--admin", not_http, "cluster", command)
    assert_one_error_line(result, "krill: error: ")  # the wording is the fixer's to choose
    assert not_http in result.stderr
