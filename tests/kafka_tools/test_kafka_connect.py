"""Kafka Connect against Krill, unchanged: a distributed worker (Kafka 4.3.1's, from the jars
`make peers` fetches) keeps its configs, offsets and status in Krill topics it creates
compacted, and moves a file through a Krill topic and back with Kafka's file source and sink
connectors, line for line, as it does against Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from bench.broker import free_port
from bench.peers.fetch import connect_libs
from bench.peers.kafka import kafka_java
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LINES = 500
_WORKER_START_S = 90.0
_MOVED_S = 90.0


class Worker:
    """One Connect worker process: its REST port, its log, stopped with SIGTERM in teardown."""

    def __init__(self, root: Path, bootstrap: str) -> None:
        self.port = free_port()
        self.log_path = root / "connect.log"
        props = {
            "bootstrap.servers": bootstrap,
            "group.id": "krill-connect",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": "connect-configs",
            "offset.storage.topic": "connect-offsets",
            "status.storage.topic": "connect-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.flush.interval.ms": "500",
            "listeners": f"http://127.0.0.1:{self.port}",
        }
        config = root / "worker.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        command = kafka_java("org.apache.kafka.connect.cli.ConnectDistributed", str(config),
                             heap_mib=512, log_level="INFO", config_dir=root,
                             libs=connect_libs())
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                text = answer.read()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None
        return json.loads(text) if text else None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _WORKER_START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the worker exited: {self.log_tail()}"
            try:
                if "version" in self.rest("GET", "/"):
                    return
            except (OSError, AssertionError):  # not listening yet, or its resources not yet up
                pass
            time.sleep(0.5)
        raise AssertionError(f"the worker's REST API did not answer: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_bytes()[-3000:].decode("utf-8", "replace")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


@pytest.fixture
def node(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def worker(tmp_path: Path, node: BrokerProcess) -> Iterator[Worker]:
    w = Worker(tmp_path, node.bootstrap)
    try:
        w.wait_ready()
        yield w
    finally:
        code = w.stop()
        print(f"connect worker exited {code}; log tail:\n{w.log_tail()}")


def test_a_file_moves_through_a_krill_topic_and_back(tmp_path: Path, node: BrokerProcess,
                                                     worker: Worker) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic("lines", 1, 1)])["lines"].result(30)
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    lines = [f"line {i} of the file" for i in range(LINES)]
    source.write_text("".join(f"{line}\n" for line in lines))
    worker.rest("POST", "/connectors", {"name": "file-in", "config": {
        "connector.class": "FileStreamSource", "tasks.max": "1", "file": str(source),
        "topic": "lines"}})
    worker.rest("POST", "/connectors", {"name": "file-out", "config": {
        "connector.class": "FileStreamSink", "tasks.max": "1", "file": str(sink),
        "topics": "lines"}})

    deadline = time.monotonic() + _MOVED_S
    moved: list[str] = []
    while time.monotonic() < deadline:
        moved = sink.read_text().splitlines() if sink.exists() else []
        if len(moved) >= LINES:
            break
        time.sleep(0.5)
    assert moved == lines, f"{len(moved)} of {LINES} lines came back: {worker.log_tail()}"
    for name in ("file-in", "file-out"):
        status = worker.rest("GET", f"/connectors/{name}/status")
        assert status["connector"]["state"] == "RUNNING", status
        assert [t["state"] for t in status["tasks"]] == ["RUNNING"], status

    # Connect's own topics, made by the worker: compacted, as it requires of them.
    wanted = ["connect-configs", "connect-offsets", "connect-status"]
    configs = admin.describe_configs([ConfigResource("topic", t) for t in wanted])
    for resource, future in configs.items():
        assert future.result(30)["cleanup.policy"].value == "compact", resource
    # The sink's consumer group committed the whole topic.
    group = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("connect-file-out")])["connect-file-out"].result(30)
    deadline = time.monotonic() + 30
    while [p.offset for p in group.topic_partitions] != [LINES] and time.monotonic() < deadline:
        time.sleep(0.5)
        group = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("connect-file-out")])["connect-file-out"].result(30)
    assert [p.offset for p in group.topic_partitions] == [LINES]
