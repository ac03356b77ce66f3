"""LinkedIn's Burrow watching a Krill node: end offsets and consumer lag, partition by partition.

Burrow 1.2.1 (Debian's `burrow`; every release before 1.9.4 does the same) asks ListOffsets
v0 for each partition's end offset and reads the groups' commits from `__consumer_offsets`
itself (Sarama's consumer: Metadata, Fetch v4 with `kafka-version` >= 0.11.0, ListOffsets v1).
It coordinates through ZooKeeper, so one runs beside it. Both are real processes on free
127.0.0.1 ports, stopped in teardown; every wait has a deadline. What Burrow reports is held
against what confluent-kafka reads from the node: the high watermarks and the committed
offsets, and the lag between them.

Burrow and ZooKeeper are system packages: `sh tests/support/install_burrow.sh` (as root)
installs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from tests.support.broker import BrokerProcess, free_port
from tests.support.kafka import admin_client, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

INSTALL_HINT = (
    "run `sh tests/support/install_burrow.sh` as root (apt-get installs burrow, zookeeper)"
)
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # Debian's; its manifest names its deps
CLUSTER = "krill"
TOPIC = "watched"
GROUP = "lagging"
OFFSETS_TOPIC = "__consumer_offsets"
PRODUCED = {0: 12, 1: 7, 2: 5}  # partition -> records before Burrow starts
COMMITTED = {0: 4, 1: 7, 2: 0}  # partition -> the group's commit before Burrow starts
_START_TIMEOUT_S = 30.0
_KILL_TIMEOUT_S = 10.0
# Burrow 1.2.1 reads SIGTERM only once it has started, and it starts one partition consumer
# per `__consumer_offsets` partition (50), each asking ListOffsets on the connection its
# fetch long-polls on (Sarama's 250 ms max wait; Kafka answers a connection's requests in
# order): about 13 s after launch, whatever the broker.
_BURROW_STOP_GRACE_S = 30.0
_ZOOKEEPER_STOP_GRACE_S = 10.0
_CONVERGE_TIMEOUT_S = 30.0  # Burrow refreshes every second (offset-refresh, topic-refresh)
_POLL_INTERVAL_S = 0.2


class Daemon:
    """One child process in its own session, its output in a log file, stopped in teardown."""

    def __init__(self, name: str, argv: list[str], log_path: Path, stop_grace_s: float) -> None:
        self.name = name
        self.log_path = log_path
        self.stop_grace_s = stop_grace_s  # after SIGTERM, before SIGKILL
        # Burrow reads any BURROW_* variable as configuration (viper's AutomaticEnv).
        env = {k: v for k, v in os.environ.items() if not k.startswith("BURROW_")}
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=_KILL_TIMEOUT_S)


def _binaries() -> tuple[str, str]:
    """(Burrow, java) or a failure that says how to install them: not a skip, so CI notices."""
    burrow = shutil.which("Burrow") or shutil.which("burrow")  # Debian installs /usr/bin/Burrow
    java = shutil.which("java")
    found = {"Burrow": burrow, "java": java, str(ZOOKEEPER_JAR): ZOOKEEPER_JAR.is_file()}
    missing = [name for name, there in found.items() if not there]
    if burrow is None or java is None or missing:
        pytest.fail(f"{', '.join(missing)} not found: {INSTALL_HINT}", pytrace=False)
    return burrow, java


def _until(
    what: str, fetch: Callable[[], Any], expected: Any, daemon: Daemon, timeout_s: float
) -> None:
    """Poll `fetch()` until it returns `expected`; fail with the last answer after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        daemon.check_alive()
        got = fetch()
        if got == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: wanted {expected!r} within {timeout_s}s, last got {got!r}\n{daemon.log()}"
            )
        time.sleep(_POLL_INTERVAL_S)


# ZooKeeper and Burrow ------------------------------------------------------------------


@contextmanager
def running_zookeeper(tmp_path: Path, java: str) -> Iterator[str]:
    """A standalone ZooKeeper on a free 127.0.0.1 port; yields its host:port."""
    port = free_port()
    (tmp_path / "zk-data").mkdir()
    config = tmp_path / "zoo.cfg"
    config.write_text(
        f"tickTime=500\ndataDir={tmp_path / 'zk-data'}\nclientPort={port}\n"
        "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"  # no AdminServer on :8080
    )
    argv = [java, "-Xmx128m", "-XX:+UseSerialGC", "-cp", str(ZOOKEEPER_JAR)]
    argv += ["org.apache.zookeeper.server.ZooKeeperServerMain", str(config)]
    daemon = Daemon("ZooKeeper", argv, tmp_path / "zookeeper.log", _ZOOKEEPER_STOP_GRACE_S)
    try:
        _until("ZooKeeper serving", lambda: _serving(port), True, daemon, _START_TIMEOUT_S)
        yield f"127.0.0.1:{port}"
    finally:
        daemon.stop()


def _serving(port: int) -> bool:
    """ZooKeeper binds its port before it can open sessions: ask it (`srvr`, the one
    four-letter command allowed by default) whether it is serving."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"srvr")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    except OSError:
        return False
    return b"Mode: standalone" in answer


def _burrow_config(directory: Path, kafka: str, zookeeper: str, http_port: int) -> None:
    # kafka-version 2.1.0 (the newest 1.2.1 knows): Sarama then fetches with v4, the lowest
    # Fetch Krill serves. One storage worker keeps a group's commits behind the broker
    # offsets they are measured against (Burrow drops a commit for a topic it has no end
    # offsets for yet, and its workers are picked by a hash of the group's name).
    (directory / "burrow.toml").write_text(f"""
[general]
pidfile="{directory / "burrow.pid"}"

[logging]
level="info"

[zookeeper]
servers=["{zookeeper}"]
timeout=6
root-path="/burrow"

[client-profile.krill]
client-id="burrow-test"
kafka-version="2.1.0"

[cluster.{CLUSTER}]
class-name="kafka"
servers=["{kafka}"]
client-profile="krill"
topic-refresh=1
offset-refresh=1

[consumer.{CLUSTER}]
class-name="kafka"
cluster="{CLUSTER}"
servers=["{kafka}"]
client-profile="krill"
start-latest=false

[httpserver.default]
address="127.0.0.1:{http_port}"

[storage.default]
class-name="inmemory"
workers=1
intervals=10
expire-group=604800
min-distance=1

[evaluator.default]
class-name="caching"
expire-cache=1
""")


class BurrowApi:
    def __init__(self, daemon: Daemon, port: int) -> None:
        self.daemon = daemon
        self.base = f"http://127.0.0.1:{port}"

    def ready(self) -> bool:
        return self._read("/burrow/admin") == b"GOOD"

    def get(self, path: str) -> dict[str, Any] | None:
        """The JSON answer, or None while Burrow answers 404 (not known yet) or not at all."""
        body = self._read(path)
        return None if body is None else dict(json.loads(body))

    def _read(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        except (urllib.error.URLError, ConnectionError):
            return None

    def until(self, what: str, fetch: Callable[[], Any], expected: Any) -> None:
        _until(what, fetch, expected, self.daemon, _CONVERGE_TIMEOUT_S)

    def end_offsets(self, topic: str) -> list[int] | None:
        answer = self.get(f"/v3/kafka/{CLUSTER}/topic/{topic}")
        return None if answer is None else list(answer["offsets"])

    def lag(self, group: str) -> dict[int, tuple[int, int]]:
        """partition -> (committed offset, current lag), as Burrow's lag endpoint says."""
        answer = self.get(f"/v3/kafka/{CLUSTER}/consumer/{group}/lag")
        if answer is None:
            return {}
        return {
            p["partition"]: (p["end"]["offset"], p["current_lag"])
            for p in answer["status"]["partitions"]
            if p["topic"] == TOPIC and p["end"] is not None
        }


@contextmanager
def running_burrow(tmp_path: Path, burrow: str, kafka: str, zookeeper: str) -> Iterator[BurrowApi]:
    """Burrow watching `kafka` as cluster CLUSTER, its HTTP API on a free 127.0.0.1 port."""
    directory = tmp_path / "burrow"
    directory.mkdir()
    port = free_port()
    _burrow_config(directory, kafka, zookeeper, port)
    argv = [burrow, "-config-dir", str(directory)]
    daemon = Daemon("Burrow", argv, tmp_path / "burrow.log", _BURROW_STOP_GRACE_S)
    try:
        api = BurrowApi(daemon, port)
        _until("Burrow's HTTP API", api.ready, True, daemon, _START_TIMEOUT_S)
        yield api
    finally:
        daemon.stop()


# What Krill says -----------------------------------------------------------------------


def _produce(broker: BrokerProcess, counts: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(TOPIC, value=f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def _join(broker: BrokerProcess) -> Consumer:
    """A member of GROUP that owns every partition of TOPIC."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "enable.auto.commit": False}
    )
    consumer.subscribe([TOPIC])
    deadline = time.monotonic() + _START_TIMEOUT_S
    while len(consumer.assignment()) < len(PRODUCED):
        assert time.monotonic() < deadline, "the group did not assign every partition"
        consumer.poll(0.1)
    return consumer


def _commit(consumer: Consumer, offsets: dict[int, int]) -> None:
    consumer.commit(
        offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False
    )


def _end_offsets(broker: BrokerProcess, topic: str, partitions: int) -> list[int]:
    """Krill's high watermarks, from one ListOffsets request (v1+, confluent-kafka's)."""
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    admin = admin_client(broker)  # alive until the futures resolve
    answers = admin.list_offsets(specs, request_timeout=10)
    return [answers[TopicPartition(topic, p)].result(timeout=10).offset for p in range(partitions)]


def _committed(consumer: Consumer, partitions: int) -> list[int]:
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    return [tp.offset for tp in consumer.committed(tps, timeout=10)]


# The test --------------------------------------------------------------------------------


def test_burrow_reports_krills_end_offsets_and_lag(tmp_path: Path, broker: BrokerProcess) -> None:
    burrow, java = _binaries()
    create_topic(broker, TOPIC, partitions=len(PRODUCED))
    _produce(broker, PRODUCED)
    consumer = _join(broker)
    try:
        _commit(consumer, COMMITTED)
        with (
            running_zookeeper(tmp_path, java) as zookeeper,
            running_burrow(tmp_path, burrow, broker.bootstrap, zookeeper) as api,
        ):
            _check_burrow_agrees(api, broker, consumer, PRODUCED, COMMITTED)
            # Live: more records on one partition, a new commit on another.
            _produce(broker, {2: 3})
            _commit(consumer, {0: 9})
            produced, committed = {**PRODUCED, 2: PRODUCED[2] + 3}, {**COMMITTED, 0: 9}
            _check_burrow_agrees(api, broker, consumer, produced, committed)
            _check_consumer_offsets_topic(api, broker)
    finally:
        consumer.close()


def _check_burrow_agrees(
    api: BurrowApi,
    broker: BrokerProcess,
    consumer: Consumer,
    produced: dict[int, int],
    committed: dict[int, int],
) -> None:
    partitions = len(produced)
    ends, commits = _end_offsets(broker, TOPIC, partitions), _committed(consumer, partitions)
    assert ends == [produced[p] for p in range(partitions)]  # Krill's own answers first
    assert commits == [committed[p] for p in range(partitions)]
    expected_lag = {p: (commits[p], ends[p] - commits[p]) for p in range(partitions)}
    api.until(f"Burrow's end offsets of {TOPIC}", lambda: api.end_offsets(TOPIC), ends)
    api.until(f"Burrow's lag for {GROUP}", lambda: api.lag(GROUP), expected_lag)


def _check_consumer_offsets_topic(api: BurrowApi, broker: BrokerProcess) -> None:
    """Burrow's end offsets of `__consumer_offsets` (ListOffsets v0 again, on every shard's
    partitions) are Krill's, and the group's commits are among them."""
    metadata = admin_client(broker).list_topics(OFFSETS_TOPIC, timeout=10)
    ends = _end_offsets(broker, OFFSETS_TOPIC, len(metadata.topics[OFFSETS_TOPIC].partitions))
    assert sum(ends) > 0
    api.until(
        "Burrow's end offsets of __consumer_offsets", lambda: api.end_offsets(OFFSETS_TOPIC), ends
    )
