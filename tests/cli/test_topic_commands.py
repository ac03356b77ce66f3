"""`krill topic ...` against a real node, as a user types it (issue #2's opening example)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.broker import REPO, BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def krill(
    broker: BrokerProcess, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shards.cli", *args, "-b", broker.bootstrap],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_create_produce_consume_describe_delete(broker: BrokerProcess) -> None:
    created = krill(broker, "topic", "create", "orders", "-p", "6")
    assert created.returncode == 0, created.stderr
    listed = krill(broker, "topic", "list")
    assert "orders" in listed.stdout

    lines = "\n".join(str(i) for i in range(1, 1001)) + "\n"
    produced = krill(broker, "topic", "produce", "orders", stdin=lines)
    assert produced.returncode == 0, produced.stderr

    first = krill(broker, "topic", "consume", "orders", "-n", "10", "--offset", "start")
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.splitlines()) == 10

    everything = krill(
        broker, "topic", "consume", "orders", "--offset", "start", "--format", "json"
    )
    assert everything.returncode == 0, everything.stderr
    records = [json.loads(line) for line in everything.stdout.splitlines()]
    assert sorted(int(r["value"]) for r in records) == list(range(1, 1001))
    assert {r["partition"] for r in records} <= set(range(6))

    described = krill(broker, "topic", "describe", "orders", "--format", "json")
    assert described.returncode == 0, described.stderr
    description = json.loads(described.stdout)
    assert sum(p["high_watermark"] for p in description["partitions"]) == 1000

    again = krill(broker, "topic", "create", "orders")
    assert again.returncode == 1 and again.stderr.count("\n") == 1
    assert "already exists" in again.stderr

    deleted = krill(broker, "topic", "delete", "orders")
    assert deleted.returncode == 0, deleted.stderr
    assert "orders" not in krill(broker, "topic", "list").stdout
