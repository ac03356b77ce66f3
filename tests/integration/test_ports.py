"""A node's ports and bounds, against real `krill start` processes (shards/ports.py).

A node whose Kafka, reader, admin or (in a cluster) node RPC address is taken, by another node
or by any other program, refuses to start: exit code 1, one line naming the address, nothing
left bound. The shards of one node share the Kafka port. `kafka_connections_max` closes a
connection past it at once and counts it; `topic_partitions_per_shard` refuses topics and
partitions past `topic_partitions_per_shard x smp`, `__consumer_offsets` included.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.cli import krill_on, krill_start_refused
from tests.support.kafka import admin_client, consume, create_topic, produce
from tests.support.raw_client import RawClient, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REFUSAL_DEADLINE_S = 10.0  # a refused start: interpreter start-up plus a few binds
API_VERSIONS = 18
METRIC_WAIT_S = 10.0


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# Helpers -------------------------------------------------------------------------------------


def krill_start(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    return krill_start_refused(*args, env=env)


def second_node_args(data_dir: Path, kafka: int, reader: int, admin: int) -> list[str]:
    return [
        "--listen", f"127.0.0.1:{kafka}",
        "--reader-listen", f"127.0.0.1:{reader}",
        "--admin-port", str(admin),
        "--data-dir", str(data_dir),
        "--smp", "2",
    ]  # fmt: skip


def assert_refused(code: int, stderr: str, elapsed_s: float, line: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines() == [line], stderr
    assert code == 1, (code, stderr)
    assert elapsed_s < REFUSAL_DEADLINE_S, elapsed_s


def assert_port_free(port: int) -> None:
    """Nothing holds 127.0.0.1:port: a plain socket (no SO_REUSEADDR/PORT) binds and listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError as e:
            pytest.fail(f"127.0.0.1:{port} is still taken after a refused start: {e}")


@contextmanager
def foreign_listener(port: int, options: str) -> Iterator[socket.socket]:
    """Another program's listening socket on 127.0.0.1:port (or the wildcard)."""
    host = "0.0.0.0" if "wildcard" in options else "127.0.0.1"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if "reuseaddr" in options:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if "reuseport" in options:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(8)
        yield sock
    finally:
        sock.close()


def api_versions_answered(client: RawClient) -> bool:
    """Send ApiVersions; True if it was answered, False if the broker closed the connection."""
    body = request(API_VERSIONS, client_software_name="krill-tests", client_software_version="1")
    try:
        client.send(API_VERSIONS, 3, body)
        return client.receive_frame() is not None
    except (ConnectionResetError, BrokenPipeError):
        return False


def per_shard(broker: BrokerProcess, name: str) -> dict[str, float]:
    """{shard: value} of one per-shard metric."""
    return {
        dict(labels)["shard"]: value
        for (metric, labels), value in broker.metrics().items()
        if metric == name
    }


def wait_for_metric(broker: BrokerProcess, name: str, shard: str, value: float) -> None:
    deadline = time.monotonic() + METRIC_WAIT_S
    while True:
        seen = per_shard(broker, name).get(shard)
        if seen == value:
            return
        assert time.monotonic() < deadline, f"{name}{{shard={shard}}} is {seen}, not {value}"
        time.sleep(0.05)


def assert_serves(broker: BrokerProcess) -> None:
    """One record produced and read back through `broker`."""
    topic = _topic()
    create_topic(broker, topic)
    value = uuid.uuid4().bytes
    delivered = produce(broker, topic, [(None, value, None, 0)], acks="all")
    assert [m.offset() for m in delivered] == [0]
    assert [m.value() for m in consume(broker, topic, 1, 1)] == [value]


def kafka_error(error: BaseException | None) -> KafkaError:
    """The KafkaError a failed admin future carries."""
    assert isinstance(error, KafkaException), repr(error)
    cause = error.args[0]
    assert isinstance(cause, KafkaError), repr(error)
    return cause


def node_with_config(tmp_path: Path, yaml: str, smp: int) -> BrokerProcess:
    config = tmp_path / "krill.yaml"
    config.write_text(yaml)
    return BrokerProcess(tmp_path / "data", "--config", str(config), smp=smp)


@contextmanager
def running(node: BrokerProcess) -> Iterator[BrokerProcess]:
    node.start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A running two-shard node whose ports a second start tries to take."""
    with running(BrokerProcess(tmp_path_factory.mktemp("ports") / "data", smp=2)) as broker:
        yield broker


PORT_NAMES = {"kafka": "Kafka", "reader": "Spark reader", "admin": "admin"}


# A port taken: refused, one line, nothing left bound ------------------------------------------


@pytest.mark.parametrize("which", ["kafka", "reader", "admin"])
def test_a_port_of_a_running_node_is_refused(
    node: BrokerProcess, tmp_path: Path, which: str
) -> None:
    ports = {"kafka": free_port(), "reader": free_port(), "admin": free_port()}
    ports[which] = {"kafka": node.port, "reader": node.reader_port, "admin": node.admin_port}[which]
    pids = node.shard_pids()
    code, stderr, elapsed = krill_start(*second_node_args(tmp_path / "second", **ports))
    line = f"krill: error: {PORT_NAMES[which]} address 127.0.0.1:{ports[which]} is already in use"
    assert_refused(code, stderr, elapsed, line)
    for name, port in ports.items():
        if name != which:
            assert_port_free(port)
    assert node.alive() and node.shard_pids() == pids
    assert_serves(node)


def test_the_kafka_port_on_the_wildcard_is_refused(node: BrokerProcess, tmp_path: Path) -> None:
    """0.0.0.0:PORT overlaps 127.0.0.1:PORT where the running node listens."""
    reader, admin = free_port(), free_port()
    code, stderr, elapsed = krill_start(
        *second_node_args(tmp_path / "second", node.port, reader, admin),
        "--listen", f"0.0.0.0:{node.port}",
        "--advertise", f"127.0.0.1:{node.port}",
    )  # fmt: skip
    assert_refused(
        code, stderr, elapsed, f"krill: error: Kafka address 0.0.0.0:{node.port} is already in use"
    )
    assert_port_free(reader)
    assert_port_free(admin)
    assert_serves(node)


@pytest.mark.parametrize("which", ["kafka", "reader", "admin"])
@pytest.mark.parametrize(
    "options", ["plain", "reuseport", "reuseaddr+reuseport", "wildcard+reuseaddr+reuseport"]
)
def test_a_port_taken_by_another_program_is_refused(
    tmp_path: Path, which: str, options: str
) -> None:
    ports = {"kafka": free_port(), "reader": free_port(), "admin": free_port()}
    with foreign_listener(ports[which], options) as foreign:
        code, stderr, elapsed = krill_start(*second_node_args(tmp_path / "node", **ports))
        line = (
            f"krill: error: {PORT_NAMES[which]} address 127.0.0.1:{ports[which]} is already in use"
        )
        assert_refused(code, stderr, elapsed, line)
        # The foreign program still owns its port: a client reaches it, not a shard.
        with socket.create_connection(("127.0.0.1", ports[which]), timeout=5):
            accepted, _ = foreign.accept()
            accepted.close()
    for name, port in ports.items():
        if name != which:
            assert_port_free(port)


# Node RPC, in a cluster: one port per shard ----------------------------------------------


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free ports on 127.0.0.1 (shard k's RPC is port + k)."""
    for _ in range(100):
        first = free_port()
        if first + count - 1 > 65535:
            continue
        probes = []
        try:
            for port in range(first, first + count):
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError(f"no {count} consecutive free ports")


@pytest.mark.parametrize("shard", [0, 1])
def test_a_taken_node_rpc_port_is_refused(tmp_path: Path, shard: int) -> None:
    """A one-seed cluster binds rpc_port + k for each shard k: any taken is refused, one line,
    and nothing else stays bound."""
    smp = min(2, len(os.sched_getaffinity(0)))
    if shard >= smp:
        pytest.skip("needs two usable cores")
    ports = {"kafka": free_port(), "reader": free_port(), "admin": free_port()}
    rpc = free_port_run(smp)
    with foreign_listener(rpc + shard, "plain"):
        code, stderr, elapsed = krill_start(
            "--listen", f"127.0.0.1:{ports['kafka']}",
            "--reader-listen", f"127.0.0.1:{ports['reader']}",
            "--admin-port", str(ports["admin"]),
            "--data-dir", str(tmp_path / "node"), "--smp", str(smp),
            "--node-id", "1", "--seeds", f"1@127.0.0.1:{rpc}", "--rpc-port", str(rpc),
        )  # fmt: skip
        line = f"krill: error: node RPC address 127.0.0.1:{rpc + shard} is already in use"
        assert_refused(code, stderr, elapsed, line)
    for port in [*ports.values(), *range(rpc, rpc + smp)]:
        assert_port_free(port)


# The shards of one node share the Kafka port ------------------------------------------------


def test_the_shards_share_the_kafka_port(node: BrokerProcess) -> None:
    connections = 20  # SO_REUSEPORT hashing: all on one shard is a 2e-6 chance
    before = per_shard(node, "krill_kafka_connections_accepted_total")
    assert sorted(before) == ["0", "1"], before
    clients = [RawClient(node.bootstrap) for _ in range(connections)]
    try:
        assert all(api_versions_answered(c) for c in clients)
        after = per_shard(node, "krill_kafka_connections_accepted_total")
    finally:
        for client in clients:
            client.close()
    accepted = {shard: after[shard] - before[shard] for shard in before}
    assert sum(accepted.values()) == connections, accepted
    assert accepted["0"] > 0 and accepted["1"] > 0, accepted


# kafka_connections_max ----------------------------------------------------------------------


@pytest.mark.parametrize("source", ["yaml", "env"])
def test_a_connection_past_kafka_connections_max_is_closed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    if source == "env":
        monkeypatch.setenv("KRILL_KAFKA_CONNECTIONS_MAX", "4")  # the node inherits it
        broker = BrokerProcess(tmp_path / "data", smp=1)
    else:
        broker = node_with_config(tmp_path, "kafka_connections_max: 4\n", smp=1)
    with running(broker):
        clients = [RawClient(broker.bootstrap) for _ in range(4)]
        try:
            assert [api_versions_answered(c) for c in clients] == [True] * 4
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as fifth:
                assert fifth.recv(1) == b""  # closed by the broker, nothing sent
            assert time.monotonic() - started < 3.0
            assert per_shard(broker, "krill_kafka_connections_refused_total") == {"0": 1.0}
            assert per_shard(broker, "krill_kafka_connections") == {"0": 4.0}
            assert [api_versions_answered(c) for c in clients] == [True] * 4

            clients.pop().close()
            wait_for_metric(broker, "krill_kafka_connections", "0", 3.0)
            clients.append(RawClient(broker.bootstrap))
            assert [api_versions_answered(c) for c in clients] == [True] * 4
            assert per_shard(broker, "krill_kafka_connections_accepted_total") == {"0": 5.0}
            assert per_shard(broker, "krill_kafka_connections_refused_total") == {"0": 1.0}
        finally:
            for client in clients:
                client.close()


def test_kafka_connections_max_below_the_shard_count_is_refused(tmp_path: Path) -> None:
    """kafka_connections_max is what the node keeps open at once, however many shards share
    it: fewer than the accepting shards cannot be split, and is refused in one line."""
    config = tmp_path / "krill.yaml"
    config.write_text("kafka_connections_max: 1\n")
    args = second_node_args(tmp_path / "data", free_port(), free_port(), free_port())
    code, stderr, _ = krill_start(*args, "--config", str(config))
    assert code == 2, (code, stderr)
    assert stderr.splitlines() == [
        "krill: error: kafka_connections_max must be at least the 2 shards that accept "
        "connections, not 1"
    ], stderr


def test_kafka_connections_max_is_split_over_the_shards_to_the_last_one(
    tmp_path: Path,
) -> None:
    """3 over 2 shards: one shard takes 2, the other 1, and the node exactly 3."""
    tries = 20  # landing by hash: all on one shard is a 2e-6 chance
    with running(node_with_config(tmp_path, "kafka_connections_max: 3\n", smp=2)) as broker:
        served: list[RawClient] = []
        try:
            for _ in range(tries):
                client = RawClient(broker.bootstrap)
                if api_versions_answered(client):
                    served.append(client)
                else:
                    client.close()
            open_now = per_shard(broker, "krill_kafka_connections")
            assert len(served) == 3, f"{len(served)} connections served, open: {open_now}"
            assert sorted(open_now.values()) == [1.0, 2.0], open_now
        finally:
            for client in served:
                client.close()


# topic_partitions_per_shard ----------------------------------------------------------------


def test_topics_past_topic_partitions_per_shard_are_refused(tmp_path: Path) -> None:
    yaml = "topic_partitions_per_shard: 60\n"
    with running(node_with_config(tmp_path, yaml, smp=1)) as broker:
        admin = admin_client(broker)
        admin.create_topics([NewTopic("a", 40, 1)])["a"].result(timeout=15)

        for validate_only in (True, False):
            future = admin.create_topics([NewTopic("b", 30, 1)], validate_only=validate_only)
            error = kafka_error(future["b"].exception(timeout=15))
            assert error.code() == KafkaError.INVALID_PARTITIONS, error
            assert "the node has 40 partitions and takes at most 60" in error.str(), error
            assert "topic_partitions_per_shard" in error.str(), error

        admin.create_topics([NewTopic("c", 20, 1)])["c"].result(timeout=15)  # exactly 60

        cli = krill_on(broker, "topic", "create", "d")
        assert cli.returncode == 1, (cli.returncode, cli.stderr)
        assert cli.stderr.splitlines() == [
            "krill: error: topic 'd': the node has 60 partitions and takes at most 60 "
            "(topic_partitions_per_shard x shards); 1 more do not fit (INVALID_PARTITIONS)"
        ], cli.stderr

        future = admin.create_partitions([NewPartitions("a", 41)])
        error = kafka_error(future["a"].exception(timeout=15))
        assert error.code() == KafkaError.INVALID_PARTITIONS, error
        assert "takes at most 60" in error.str(), error

        for topic in ("a", "c"):  # topics within the limit work
            delivered = produce(broker, topic, [(None, b"v", None, 0)], acks="all")
            assert [m.offset() for m in delivered] == [0]

        admin.delete_topics(["c"])["c"].result(timeout=15)  # 20 free again
        admin.create_topics([NewTopic("d", 20, 1)])["d"].result(timeout=15)
        topics = admin.list_topics(timeout=15).topics
        assert {name: len(t.partitions) for name, t in topics.items()} == {"a": 40, "d": 20}


def test_consumer_offsets_counts_and_the_limit_is_per_shard(tmp_path: Path) -> None:
    """30 per shard over 2 shards is 60; `__consumer_offsets` (50) counts once made."""
    yaml = "topic_partitions_per_shard: 30\n"
    with running(node_with_config(tmp_path, yaml, smp=2)) as broker:
        admin = admin_client(broker)
        admin.create_topics([NewTopic("a", 5, 1)])["a"].result(timeout=15)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g"})
        try:
            consumer.commit(offsets=[TopicPartition("a", 0, 0)], asynchronous=False)
        finally:
            consumer.close()
        topics = admin.list_topics(timeout=15).topics
        assert {name: len(t.partitions) for name, t in topics.items()} == {
            "a": 5,
            "__consumer_offsets": 50,
        }

        error = kafka_error(admin.create_topics([NewTopic("b", 6, 1)])["b"].exception(15))
        assert error.code() == KafkaError.INVALID_PARTITIONS, error
        assert "the node has 55 partitions and takes at most 60" in error.str(), error
        admin.create_topics([NewTopic("b", 5, 1)])["b"].result(timeout=15)
