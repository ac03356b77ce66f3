"""`krill` flags as a user types them: client flags anywhere on the line, as rpk's do, and
keys for later work refused at `krill start`.

`-b/--brokers` and `--admin` are taken before the command, between the command and its
subcommand, or after it; given twice, the later one wins; with none, KRILL_BROKERS and
KRILL_ADMIN. Every case runs `python -m shards.cli` in a subprocess against a real node.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.broker import BrokerProcess, free_port
from tests.support.cli import krill, krill_start_refused
from tests.support.kafka import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REFUSAL_DEADLINE_S = 10.0


def dead_address() -> str:
    """host:port where nothing listens."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("flags") / "data").start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


@pytest.fixture(scope="module")
def topic(node: BrokerProcess) -> str:
    name = f"flags-{uuid.uuid4().hex[:10]}"
    create_topic(node, name)
    return name


@pytest.fixture(scope="module")
def group(node: BrokerProcess, topic: str) -> str:
    """A consumer group with a committed offset (no members)."""
    name = f"group-{uuid.uuid4().hex[:10]}"
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": name})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    return name


def first_column(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines() if line.strip()]


def placements(command: list[str], flag: str, value: str) -> list[list[str]]:
    """`flag value` before the command, after each of its words."""
    return [command[:i] + [flag, value] + command[i:] for i in range(len(command) + 1)]


# -b anywhere ---------------------------------------------------------------------------------


@pytest.mark.parametrize("at", range(4))
def test_topic_create_takes_brokers_anywhere(node: BrokerProcess, at: int) -> None:
    name = f"made-{at}-{uuid.uuid4().hex[:8]}"
    args = placements(["topic", "create", name], "-b", node.bootstrap)[at]
    created = krill(*args, env={"KRILL_BROKERS": dead_address()})
    assert created.returncode == 0, (args, created.stderr)
    assert first_column(created.stdout) == ["TOPIC", name], created.stdout
    listed = krill("topic", "list", "-b", node.bootstrap)
    assert name in first_column(listed.stdout), listed.stdout


@pytest.mark.parametrize("at", range(3))
def test_topic_list_takes_brokers_anywhere(node: BrokerProcess, topic: str, at: int) -> None:
    args = placements(["topic", "list"], "--brokers", node.bootstrap)[at]
    listed = krill(*args, env={"KRILL_BROKERS": dead_address()})
    assert listed.returncode == 0, (args, listed.stderr)
    assert topic in first_column(listed.stdout), listed.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["-b", "{dead}", "topic", "list", "-b", "{good}"],
        ["-b", "{dead}", "topic", "-b", "{good}", "list"],
        ["topic", "-b", "{dead}", "list", "-b", "{good}"],
        ["-b", "{dead}", "topic", "-b", "{dead}", "list", "-b", "{good}"],
    ],
)
def test_the_later_brokers_flag_wins(node: BrokerProcess, topic: str, args: list[str]) -> None:
    line = [a.format(dead=dead_address(), good=node.bootstrap) for a in args]
    listed = krill(*line)
    assert listed.returncode == 0, (line, listed.stderr)
    assert topic in first_column(listed.stdout), listed.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["-b", "{good}", "topic", "list", "-b", "{dead}"],
        ["topic", "-b", "{good}", "list", "-b", "{dead}"],
        ["-b", "{good}", "topic", "-b", "{dead}", "list"],
    ],
)
def test_the_later_brokers_flag_wins_even_when_dead(node: BrokerProcess, args: list[str]) -> None:
    dead = dead_address()
    line = [a.format(dead=dead, good=node.bootstrap) for a in args]
    listed = krill(*line)
    assert listed.returncode == 1, (line, listed.stdout, listed.stderr)
    assert listed.stderr.splitlines() == [f"krill: error: cannot reach broker at {dead}"]


def test_krill_brokers_is_used_without_a_flag(node: BrokerProcess, topic: str) -> None:
    listed = krill("topic", "list", env={"KRILL_BROKERS": node.bootstrap})
    assert listed.returncode == 0, listed.stderr
    assert topic in first_column(listed.stdout), listed.stdout


def test_a_flag_beats_krill_brokers(node: BrokerProcess, topic: str) -> None:
    listed = krill("-b", node.bootstrap, "topic", "list", env={"KRILL_BROKERS": dead_address()})
    assert listed.returncode == 0, listed.stderr
    assert topic in first_column(listed.stdout), listed.stdout


@pytest.mark.parametrize("at", range(3))
def test_group_list_takes_brokers_anywhere(node: BrokerProcess, group: str, at: int) -> None:
    args = placements(["group", "list"], "-b", node.bootstrap)[at]
    listed = krill(*args, env={"KRILL_BROKERS": dead_address()})
    assert listed.returncode == 0, (args, listed.stderr)
    assert group in first_column(listed.stdout), listed.stdout


def test_group_list_uses_krill_brokers(node: BrokerProcess, group: str) -> None:
    listed = krill("group", "list", env={"KRILL_BROKERS": node.bootstrap})
    assert listed.returncode == 0, listed.stderr
    assert group in first_column(listed.stdout), listed.stdout


# --admin anywhere ----------------------------------------------------------------------------


def assert_healthy(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (result.stdout, result.stderr)
    healthy = [line.split() for line in result.stdout.splitlines() if line.startswith("Healthy:")]
    assert healthy == [["Healthy:", "true"]], result.stdout


@pytest.mark.parametrize("at", range(3))
def test_cluster_health_takes_admin_anywhere(node: BrokerProcess, at: int) -> None:
    args = placements(["cluster", "health"], "--admin", node.admin_address)[at]
    assert_healthy(krill(*args, env={"KRILL_ADMIN": dead_address()}))


def test_cluster_health_uses_krill_admin(node: BrokerProcess) -> None:
    assert_healthy(krill("cluster", "health", env={"KRILL_ADMIN": node.admin_address}))


def test_the_later_admin_flag_wins(node: BrokerProcess) -> None:
    dead = dead_address()
    assert_healthy(krill("--admin", dead, "cluster", "health", "--admin", node.admin_address))
    refused = krill("--admin", node.admin_address, "cluster", "health", "--admin", dead)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"krill: error: cannot reach the admin API at {dead}"
    ), refused.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["-b", "{kafka}", "--admin", "{admin}", "cluster", "info"],
        ["cluster", "-b", "{kafka}", "info", "--admin", "{admin}"],
        ["--admin", "{admin}", "cluster", "info", "-b", "{kafka}"],
    ],
)
def test_cluster_info_takes_both_flags_anywhere(
    node: BrokerProcess, topic: str, args: list[str]
) -> None:
    line = [a.format(kafka=node.bootstrap, admin=node.admin_address) for a in args]
    dead = dead_address()
    info = krill(*line, env={"KRILL_BROKERS": dead, "KRILL_ADMIN": dead})
    assert info.returncode == 0, (line, info.stderr)
    rows = [row.split() for row in info.stdout.splitlines()]
    assert [topic, "1", "1"] in rows, info.stdout
    assert any(row[1:3] == [node.admin_address, "ready"] for row in rows if len(row) > 2), (
        info.stdout
    )


# Keys for later work: refused at start, one line -------------------------------------------


def krill_start(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, before: tuple[str, ...] = ()
) -> tuple[int, str]:
    """`krill start` on free ports and its own data directory, so a key accepted and ignored
    would start a node: that one is killed with its shards, and the test fails."""
    kafka, reader, admin = free_port(), free_port(), free_port()
    code, stderr, elapsed = krill_start_refused(
        "--data-dir", str(tmp_path / "data"), "--smp", "1",
        "--listen", f"127.0.0.1:{kafka}", "--reader-listen", f"127.0.0.1:{reader}",
        "--admin-port", str(admin), *args, env=env, before=before,
    )  # fmt: skip
    assert elapsed < REFUSAL_DEADLINE_S
    return code, stderr


def assert_one_usage_line(code: int, stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("krill: error: "), lines[0]
    assert code == 2, (code, stderr)
    return lines[0]


@pytest.mark.parametrize(
    "args, env, yaml, expected",
    [
        (["--seeds", "127.0.0.1:1,127.0.0.1:2", "--node-id", "3"], {}, None,
         "node_id 3 is not one of the seeds (1, 2): every node of a cluster is a seed; "
         "nodes beyond the seeds are not built yet"),
        ([], {"KRILL_SEEDS": "127.0.0.1:1", "KRILL_NODE_ID": "1"}, None,
         "seeds give node 1 the RPC address 127.0.0.1:1, but its rpc_port is 33145"),
        ([], {"KRILL_STORAGE_MODE": "mmap"}, None,
         "storage_mode must be 'buffered' or 'direct', not 'mmap'"),
        ([], {"KRILL_DEFAULT_REPLICAS": "3"}, None, "default_replicas 3 needs a cluster"),
        (["--default-replicas", "2"], {}, None, "default_replicas 2 needs a cluster: set seeds"),
        ([], {}, "default_replicas: 3\n", "default_replicas 3 needs a cluster: set seeds"),
        ([], {}, "storage_mode: mmap\n", "storage_mode must be 'buffered' or 'direct'"),
        ([], {}, "seeds: [127.0.0.1:33145]\n", "node_id 0 is not one of the seeds (1)"),
        (["--raft-heartbeat-interval-ms", "5"], {}, None,
         "raft_heartbeat_interval_ms must be at least 10, not 5"),
    ],
)  # fmt: skip
def test_keys_for_later_work_are_refused_at_start(
    tmp_path: Path, args: list[str], env: dict[str, str], yaml: str | None, expected: str
) -> None:
    if yaml is not None:
        config = tmp_path / "krill.yaml"
        config.write_text(yaml)
        args = [*args, "--config", str(config)]
    line = assert_one_usage_line(*krill_start(tmp_path, *args, env=env))
    assert expected in line, line
    if yaml is not None and "not supported" in expected:
        assert f"config file '{tmp_path / 'krill.yaml'}'" in line, line


def test_the_admin_port_on_the_kafka_port_is_refused(tmp_path: Path) -> None:
    port = free_port()
    line = assert_one_usage_line(
        *krill_start(tmp_path, "--listen", f"127.0.0.1:{port}", "--admin-port", str(port))
    )
    assert "listen and admin_listen must differ" in line, line
    assert line.count(f"127.0.0.1:{port}") == 2, line  # both addresses named


@pytest.mark.parametrize("flags", [("-b", "127.0.0.1:19092"), ("--admin", "127.0.0.1:19644")])
def test_client_flags_before_start_are_refused(tmp_path: Path, flags: tuple[str, str]) -> None:
    """Client flags are taken anywhere on the line, so `krill -b X start` parses: a node must
    not then start on its defaults as if the flag meant something to it."""
    line = assert_one_usage_line(*krill_start(tmp_path, before=flags))
    assert f"{flags[0]} is for client commands" in line, line
