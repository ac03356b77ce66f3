"""`krill topic ...` against a real node, as a user types it (issue #2's opening example)."""

from __future__ import annotations

import json

import pytest

from tests.support.broker import BrokerProcess
from tests.support.cli import krill_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_create_produce_consume_describe_delete(broker: BrokerProcess) -> None:
    created = krill_on(broker, "topic", "create", "orders", "-p", "6")
    assert created.returncode == 0, created.stderr
    listed = krill_on(broker, "topic", "list")
    assert "orders" in listed.stdout

    lines = "\n".join(str(i) for i in range(1, 1001)) + "\n"
    produced = krill_on(broker, "topic", "produce", "orders", stdin=lines)
    assert produced.returncode == 0, produced.stderr

    first = krill_on(broker, "topic", "consume", "orders", "-n", "10", "--offset", "start")
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.splitlines()) == 10

    everything = krill_on(
        broker, "topic", "consume", "orders", "--offset", "start", "--format", "json"
    )
    assert everything.returncode == 0, everything.stderr
    records = [json.loads(line) for line in everything.stdout.splitlines()]
    assert sorted(int(r["value"]) for r in records) == list(range(1, 1001))
    assert {r["partition"] for r in records} <= set(range(6))

    described = krill_on(broker, "topic", "describe", "orders", "--format", "json")
    assert described.returncode == 0, described.stderr
    description = json.loads(described.stdout)
    assert sum(p["high_watermark"] for p in description["partitions"]) == 1000

    again = krill_on(broker, "topic", "create", "orders")
    assert again.returncode == 1 and again.stderr.count("\n") == 1
    assert "already exists" in again.stderr

    deleted = krill_on(broker, "topic", "delete", "orders")
    assert deleted.returncode == 0, deleted.stderr
    assert "orders" not in krill_on(broker, "topic", "list").stdout
