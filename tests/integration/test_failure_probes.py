"""The admin API's failure probes: a failing fdatasync and a slow one, on a real node.

A failed fdatasync must never be acknowledged: the partition cuts its log back to the last
durable offset and answers KAFKA_STORAGE_ERROR, and an idempotent producer's retries then
land once each, in order (actors/partition.py has the rule). The probes answer 403 unless
the node runs with --enable-failure-injection.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from tests.support.acked import read_whole_log
from tests.support.broker import BrokerProcess, wait_for
from tests.support.cli import krill_start_refused
from tests.support.kafka import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXCEPTION = "/v1/failure-probes/storage/fdatasync/exception"
DELAY = "/v1/failure-probes/storage/fdatasync/delay"


def admin(broker: BrokerProcess, method: str, path: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{broker.admin_address}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def probes_set(broker: BrokerProcess, method: str, path: str) -> dict[str, Any]:
    status, body = admin(broker, method, path)
    assert status == 200, (status, body)
    answer: dict[str, Any] = json.loads(body)
    assert None not in answer["shards"], answer
    return answer


@pytest.fixture
def injectable(tmp_path: Path) -> Iterator[BrokerProcess]:
    node = BrokerProcess(tmp_path / "data", "--enable-failure-injection").start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


def test_probes_are_refused_without_failure_injection(broker: BrokerProcess) -> None:
    for method, path in (("GET", "/v1/failure-probes"), ("PUT", EXCEPTION),
                         ("PUT", f"{DELAY}?ms=100"), ("DELETE", "/v1/failure-probes")):
        status, body = admin(broker, method, path)
        assert status == 403, (method, path, status, body)
        assert body.count(b"\n") == 1 and b"--enable-failure-injection" in body, body


def test_a_mistaken_setting_is_one_line(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    code, stderr, _ = krill_start_refused(
        "--data-dir", data, env={"KRILL_ENABLE_FAILURE_INJECTION": "maybe"})
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "KRILL_ENABLE_FAILURE_INJECTION must be true or false" in stderr, stderr
    code, stderr, _ = krill_start_refused("--data-dir", data, "--storage-min-free-bytes", "-1")
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "storage_min_free_bytes must be 0 (no guard) or more" in stderr, stderr


def test_probe_requests_are_checked(injectable: BrokerProcess) -> None:
    assert probes_set(injectable, "GET", "/v1/failure-probes")["probes"] == {}
    assert admin(injectable, "PUT", "/v1/failure-probes/storage/nothing")[0] == 404
    assert admin(injectable, "PUT", DELAY)[0] == 400  # no ?ms=
    assert admin(injectable, "PUT", f"{DELAY}?ms=0")[0] == 400
    assert admin(injectable, "PUT", "/v1/failure-probes")[0] == 405
    answer = probes_set(injectable, "PUT", f"{DELAY}?ms=5")
    assert answer["probes"] == {"storage/fdatasync/delay": {"ms": 5}}
    assert all(s == answer["probes"] for s in answer["shards"])
    probes_set(injectable, "PUT", EXCEPTION)
    assert set(probes_set(injectable, "GET", "/v1/failure-probes")["probes"]) == {
        "storage/fdatasync/delay", "storage/fdatasync/exception"}
    assert probes_set(injectable, "DELETE", DELAY)["probes"] == {
        "storage/fdatasync/exception": {}}
    assert probes_set(injectable, "DELETE", "/v1/failure-probes")["probes"] == {}


class Outcomes:
    """Delivery reports of one producer: acknowledged (partition, offset, value), failures."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))
        else:
            self.failed.append(err)


def test_failed_fdatasync_is_never_acknowledged_and_retries_land_once(
    injectable: BrokerProcess,
) -> None:
    broker = injectable
    create_topic(broker, "synced", partitions=2)
    outcomes = Outcomes()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 60_000})
    for i in range(200):
        producer.produce("synced", value=f"before-{i:04d}".encode(), on_delivery=outcomes)
    assert producer.flush(30) == 0 and len(outcomes.acked) == 200, outcomes.failed

    probes_set(broker, "PUT", EXCEPTION)
    for i in range(200):
        producer.produce("synced", value=f"during-{i:04d}".encode(), on_delivery=outcomes)
    deadline = time.monotonic() + 3.0  # the client retries KAFKA_STORAGE_ERROR meanwhile
    while time.monotonic() < deadline:
        producer.poll(0.1)
    assert len(outcomes.acked) == 200, "a produce was acknowledged while fdatasync failed"
    assert not outcomes.failed, outcomes.failed[:3]  # retriable: still in the client's hands
    errors = [v for (name, labels), v in broker.metrics().items()
              if name == "krill_storage_fdatasync_errors_total"]
    assert sum(errors) > 0, "no fdatasync failed"

    probes_set(broker, "DELETE", "/v1/failure-probes")
    assert producer.flush(60) == 0, "the retries did not land"
    assert len(outcomes.acked) == 400 and not outcomes.failed, outcomes.failed[:3]
    assert "fdatasync failed" in broker.log()

    def check() -> None:
        stored, ends = read_whole_log(broker, "synced", 2)
        assert sum(ends) == 400, ends  # each value once: no retry stored twice
        for partition, end in enumerate(ends):
            assert sorted(o for p, o in stored if p == partition) == list(range(end))
        assert sorted(stored.values()) == sorted(v for _, _, v in outcomes.acked)
        for partition, offset, value in outcomes.acked:
            assert stored[(partition, offset)] == value, (partition, offset, value)

    check()
    broker.kill9()
    broker.start()
    check()


def _acks_all_latency_s(producer: Producer, count: int) -> float:
    """The median time one acks=all record takes, produced one at a time."""
    latencies = []
    for i in range(count):
        started = time.monotonic()
        producer.produce("slow", value=f"{i}".encode())
        assert producer.flush(30) == 0
        latencies.append(time.monotonic() - started)
    return statistics.median(latencies)


def test_fdatasync_delay_slows_acks_until_cleared(injectable: BrokerProcess) -> None:
    broker = injectable
    create_topic(broker, "slow")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    before = _acks_all_latency_s(producer, 10)
    probes_set(broker, "PUT", f"{DELAY}?ms=200")
    slowed = _acks_all_latency_s(producer, 7)
    probes_set(broker, "DELETE", DELAY)
    wait_for(lambda: _acks_all_latency_s(producer, 3) < 0.1, 10, "latency back after the clear")
    after = _acks_all_latency_s(producer, 10)
    assert before < 0.1 and after < 0.1, (before, after)
    # Each flush syncs the segment file (and now and then an index): 200 ms at least.
    assert 0.2 <= slowed < 2.0, slowed
