"""`krill cluster up` as a user runs it: N local nodes on ports at the bases plus (i - 1) x 100,
one line per node and the bootstrap string, every node ready, a node that dies reported in
one line while the others run on, and SIGINT stopping every node process. Mistakes are one
line: usage (exit 2) before anything starts, a node refused at start (exit 1) with every
other node stopped.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import REPO, wait_for
from tests.support.cli import krill, krill_environment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODES = 3
STEP = 100  # shards/cluster_cli.py UP_PORT_STEP
LINE_WAIT_S = 90.0  # the ready line: three interpreters, recoveries, an election
STOP_WAIT_S = 60.0  # SIGINT to every process gone (UP_STOP_TIMEOUT_S is 40)
CLI_S = 120.0  # one `krill` command against the cluster (three interpreters may be busy)
TOPIC, PARTITIONS = "orders", 3
HEALTHY_WAIT_S = 30.0  # a new topic's partitions elect their leaders
NODE_LINE = re.compile(r"^node (\d+): kafka (\S+), admin (\S+), pid (\d+), log (\S+)$")


def free_bases(count: int) -> dict[str, int]:
    """Base ports for `cluster up -n count` whose every node's port is free. Below the
    ephemeral range (32768-60999 here), so no client's outgoing connection holds one."""
    for _ in range(200):
        # Bases count * STEP apart: node i's ports of one kind never meet another kind's.
        bases = dict(zip(("kafka", "rpc", "admin", "reader"),
                         random.sample(range(10_000, 32_000 - count * STEP, count * STEP), 4),
                         strict=True))
        offsets = [random.randrange(STEP)] * 4
        bases = {name: port + off for (name, port), off in zip(bases.items(), offsets,
                                                                strict=True)}
        ports = [port + i * STEP for port in bases.values() for i in range(count)]
        if all(_free(port) for port in ports):
            return bases
    raise AssertionError("no free base ports")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@dataclass
class LocalNode:
    node_id: int
    kafka: str
    admin: str
    pid: int
    log: Path


class Up:
    """A running `krill cluster up` and the lines it printed, read on a thread."""

    def __init__(
        self, data_dir: Path, nodes: int, *extra: str, bases: dict[str, int] | None = None
    ) -> None:
        self.bases = bases or free_bases(nodes)
        self.groups: set[int] = set()  # each node leads a process group of its own
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shards.cli", "cluster", "up", "-n", str(nodes),
             "--data-dir", str(data_dir), *(f"--{name}-port={port}" for name, port in
                                            self.bases.items()), *extra],
            cwd=REPO, env=krill_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            match = NODE_LINE.match(line.rstrip("\n"))
            if match:
                self.groups.add(int(match.group(4)))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout_s: float = LINE_WAIT_S) -> str:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout_s}s after {self.seen}") from None
        if line is None:
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AssertionError(f"cluster up ended after {self.seen}: {stderr}")
        self.seen.append(line)
        return line

    def node_pids(self) -> set[int]:
        """Every process of every node: its supervisor and shards, in its process group."""
        pids = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) in self.groups:
                        pids.add(int(entry.name))
                except ProcessLookupError:
                    pass
        return pids

    def kill(self) -> None:
        """Teardown: nothing `up` started outlives the test, whatever happened."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, list[LocalNode]]]:
    running = Up(tmp_path_factory.mktemp("up") / "cluster", NODES, "--", "--log-level", "info")
    try:
        nodes = []
        for _ in range(NODES):
            match = NODE_LINE.match(line := running.next_line())
            assert match, line
            node_id, kafka, admin, pid, log = match.groups()
            nodes.append(LocalNode(int(node_id), kafka, admin, int(pid), Path(log)))
        yield running, nodes
    finally:
        running.kill()


def admin_status(admin: str, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


# A running cluster, in the order a user meets it -------------------------------------------


def test_one_line_per_node_then_the_bootstrap_then_ready(up: tuple[Up, list[LocalNode]]) -> None:
    running, nodes = up
    bases = running.bases
    assert [n.node_id for n in nodes] == [1, 2, 3]
    for i, node in enumerate(nodes):
        assert node.kafka == f"127.0.0.1:{bases['kafka'] + i * STEP}"
        assert node.admin == f"127.0.0.1:{bases['admin'] + i * STEP}"
        assert node.log.name == "krill.log" and node.log.parent.name == f"node-{i + 1}"
        assert Path(f"/proc/{node.pid}").exists()
        # Every node is a seed of the same cluster, with its own id and ports.
        args = Path(f"/proc/{node.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert args[args.index("--node-id") + 1] == str(i + 1)
        assert args[args.index("--seeds") + 1] == ",".join(
            f"{j + 1}@127.0.0.1:{bases['rpc'] + j * STEP}" for j in range(NODES))
        assert args[args.index("--default-replicas") + 1] == "3"
        assert args[-2:] == ["--log-level", "info"]  # what came after `--`, last
    assert running.next_line() == f"bootstrap: {','.join(n.kafka for n in nodes)}"
    ready = running.next_line()
    assert ready.startswith(f"ready: krill -b {nodes[0].kafka} --admin "), ready


def test_every_node_is_ready_and_takes_kafka_connections(up: tuple[Up, list[LocalNode]]) -> None:
    _, nodes = up
    for node in nodes:
        assert admin_status(node.admin, "/v1/status/ready") == 200, node
        host, port = node.kafka.split(":")
        socket.create_connection((host, int(port)), timeout=5).close()


def test_every_node_lists_every_broker(up: tuple[Up, list[LocalNode]]) -> None:
    from confluent_kafka.admin import AdminClient

    _, nodes = up
    for node in nodes:
        admin = AdminClient({"bootstrap.servers": node.kafka})
        # Nodes register with the controller once it has a leader: a moment after ready.
        wait_for(lambda: len(admin.list_topics(timeout=30).brokers) == NODES,  # noqa: B023
                 HEALTHY_WAIT_S, f"{node.kafka} lists every broker")
        metadata = admin.list_topics(timeout=30)
        assert sorted(metadata.brokers) == [1, 2, 3], (node, metadata.brokers)
        assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {
            n.kafka for n in nodes}
        assert metadata.controller_id in (1, 2, 3)


# `cluster info` and `cluster health` on a real cluster (topics with 3 replicas, Metadata's
# replicas and ISR, each leader's /v1/partitions, the controller in each node's health
# overview).


def cluster_cli(nodes: list[LocalNode], *args: str) -> subprocess.CompletedProcess[str]:
    admins = ",".join(n.admin for n in nodes)
    return krill("-b", nodes[0].kafka, "--admin", admins, "cluster", *args, timeout_s=CLI_S)


def test_cluster_health_and_info_of_a_replicated_topic(up: tuple[Up, list[LocalNode]]) -> None:
    _, nodes = up
    created = krill("-b", nodes[0].kafka, "topic", "create", TOPIC, "-p", str(PARTITIONS),
                    "-r", "3", timeout_s=CLI_S)
    assert created.returncode == 0, created.stderr
    wait_for(lambda: cluster_cli(nodes, "health").returncode == 0, HEALTHY_WAIT_S,
             "the cluster healthy")
    health = json.loads(cluster_cli(nodes, "health", "--format", "json").stdout)
    assert health["is_healthy"] is True, health
    assert health["all_nodes"] == [1, 2, 3] and health["nodes_down"] == [], health
    assert health["controller_id"] in (1, 2, 3), health
    assert health["admin_unreachable"] == [], health
    result = cluster_cli(nodes, "info", "--format", "json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert [b["id"] for b in info["brokers"]] == [1, 2, 3]
    assert info["controller_id"] == health["controller_id"]
    assert [n["node_id"] for n in info["nodes"]] == [1, 2, 3]
    rows = [p for p in info["partitions"] if p["topic"] == TOPIC]
    assert [p["partition"] for p in rows] == list(range(PARTITIONS))
    for row in rows:
        assert sorted(row["replicas"]) == [1, 2, 3] and sorted(row["isr"]) == [1, 2, 3], row
        assert row["leader"] in row["replicas"], row
        followers = sorted(int(n) for n in row["lag"])
        assert followers == sorted(set(row["replicas"]) - {row["leader"]}), row
        assert all(lag >= 0 for lag in row["lag"].values()), row
    text = cluster_cli(nodes, "info").stdout
    assert "PARTITIONS" in text and TOPIC in text


def test_a_node_that_dies_is_told_and_the_others_run_on(up: tuple[Up, list[LocalNode]]) -> None:
    running, nodes = up
    victim = nodes[1]
    os.killpg(victim.pid, signal.SIGKILL)
    line = running.next_line(timeout_s=30)
    assert line == (f"node 2 (pid {victim.pid}) was killed by signal 9; 2 node(s) keep "
                    f"running; see {victim.log}"), line
    assert running.process.poll() is None
    for node in (nodes[0], nodes[2]):
        assert admin_status(node.admin, "/v1/status/ready") == 200, node


def test_cluster_health_names_the_dead_node(up: tuple[Up, list[LocalNode]]) -> None:
    """Node 2 was killed above: the survivors elect leaders where it led, and health says
    node 2 is down (its admin API does not answer), exit 1."""
    _, nodes = up
    result = cluster_cli(nodes, "health", "--format", "json")
    assert result.returncode == 1, (result.stdout, result.stderr)
    health = json.loads(result.stdout)
    assert health["is_healthy"] is False
    assert health["nodes_down"] == [2], health
    assert health["admin_unreachable"] == [nodes[1].admin], health
    assert health["all_nodes"] == [1, 2, 3], health
    text = cluster_cli(nodes, "health")
    assert text.returncode == 1 and "Nodes down:" in text.stdout, text


def test_sigint_stops_every_node(up: tuple[Up, list[LocalNode]]) -> None:
    running, nodes = up
    assert running.node_pids(), "the nodes' processes are not found"
    running.process.send_signal(signal.SIGINT)
    assert running.next_line(timeout_s=30) == f"stopping {NODES} node(s)"
    assert running.process.wait(timeout=STOP_WAIT_S) == 0
    assert running.process.stderr is not None and running.process.stderr.read() == ""
    wait_for(lambda: not running.node_pids(), 10, "every node process gone")
    for node in nodes:
        assert "Traceback" not in node.log.read_text(), node.log


# Mistakes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0"], "argument -n/--nodes: -n must be 1..9, not 0"),
        (["-n", "x"], "-n must be an integer, not 'x'"),
        (["--", "--node-id", "5"], "--node-id is set by `cluster up` for each node"),
        (["--", "--seeds=127.0.0.1:1"], "--seeds is set by `cluster up` for each node"),
        (["-n", "3", "--kafka-port", "65400"], "--kafka-port 65400 leaves no room for 3 nodes"),
        (["-b", "127.0.0.1:9092"], "-b is for client commands; `cluster up` starts nodes"),
    ],
)
def test_usage_mistakes_are_one_line_and_start_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    before = args[:2] if args[0] == "-b" else []  # client flags go before the command
    after = args[2:] if before else args
    result = krill(*before, "cluster", "up", "--data-dir", str(tmp_path / "c"), *after,
                   timeout_s=CLI_S)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("krill: error: ") and message in result.stderr, result.stderr
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert not (tmp_path / "c").exists()


def test_a_node_refused_at_start_stops_them_all(tmp_path: Path) -> None:
    """Node 1's Kafka port is taken: `up` says so in one line, exit 1, no node left."""
    bases = free_bases(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", bases["kafka"]))
        taken.listen(1)
        running = Up(tmp_path / "cluster", 2, bases=bases)
        try:
            code = running.process.wait(timeout=LINE_WAIT_S)
            stderr = running.process.stderr.read() if running.process.stderr else ""
            assert stderr.splitlines() == [
                f"krill: error: node 1 exited with code 1 at start: Kafka address "
                f"127.0.0.1:{bases['kafka']} is already in use"], stderr
            assert code == 1
            wait_for(lambda: not running.node_pids(), 10, "every node process gone")
        finally:
            running.kill()
