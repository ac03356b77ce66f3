"""`krill topic alter-config` against a real node, as a user types it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.broker import BrokerProcess
from tests.support.cli import krill_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WEEK_MS = str(7 * 24 * 3600 * 1000)  # the node's log_retention_ms default


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("alter-cli") / "data").start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("krill: error: "), result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    return lines[0]


def configs(broker: BrokerProcess, topic: str) -> dict[str, tuple[str, str]]:
    described = krill_on(broker, "topic", "describe", topic, "--format", "json")
    assert described.returncode == 0, described.stderr
    return {c["name"]: (c["value"], c["source"]) for c in json.loads(described.stdout)["configs"]}


def test_set_and_delete(node: BrokerProcess) -> None:
    created = krill_on(node, "topic", "create", "orders", "-c", "segment.ms=60000")
    assert created.returncode == 0, created.stderr

    altered = krill_on(node, "topic", "alter-config", "orders", "--set", "retention.ms=3600000",
                    "--set", "cleanup.policy=compact,delete", "--delete", "segment.ms")
    assert altered.returncode == 0, altered.stderr
    rows = [line.split() for line in altered.stdout.splitlines()]
    assert rows == [
        ["KEY", "VALUE", "SOURCE"],
        ["cleanup.policy", "compact,delete", "DYNAMIC_TOPIC_CONFIG"],
        ["retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"],
        ["segment.ms", WEEK_MS, "STATIC_BROKER_CONFIG"],
    ]
    now = configs(node, "orders")
    assert now["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert now["cleanup.policy"] == ("compact,delete", "DYNAMIC_TOPIC_CONFIG")
    assert now["segment.ms"] == (WEEK_MS, "STATIC_BROKER_CONFIG")
    assert now["write.caching"] == ("false", "DEFAULT_CONFIG")

    text = krill_on(node, "topic", "describe", "orders")
    assert text.returncode == 0, text.stderr
    assert ["retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"] in [
        line.split() for line in text.stdout.splitlines()
    ]


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--set", "no.such=1"), "unknown topic config 'no.such' (INVALID_CONFIG)"),
        (("--set", "retention.ms=soon"), "retention.ms: 'soon' is not an integer"),
        (("--set", "compression.type=gzip"), "compression.type: 'gzip' is refused"),
        (("--set", "preallocate=true"), "preallocate: 'true' is refused"),
        (("--delete", "no.such"), "unknown topic config 'no.such'"),
    ],
)
def test_mistakes_are_one_line(node: BrokerProcess, args: tuple[str, ...], expected: str) -> None:
    created = krill_on(node, "topic", "create", "mistakes")
    assert created.returncode == 0 or "already exists" in created.stderr, created.stderr
    before = configs(node, "mistakes")
    line = one_error_line(krill_on(node, "topic", "alter-config", "mistakes", *args), 1)
    assert "topic 'mistakes'" in line and expected in line, line
    assert configs(node, "mistakes") == before


def test_unknown_topic(node: BrokerProcess) -> None:
    result = krill_on(node, "topic", "alter-config", "nowhere", "--set", "retention.ms=5")
    assert one_error_line(result, 1) == "krill: error: topic 'nowhere' does not exist"


@pytest.mark.parametrize(
    "args, expected",
    [
        ((), "give at least one --set KEY=VALUE or --delete KEY"),
        (("--set", "retention.ms"), "expected key=value"),
        (("--set", "retention.ms=5", "--delete", "retention.ms"), "named more than once"),
    ],
)
def test_usage_mistakes_exit_2(node: BrokerProcess, args: tuple[str, ...], expected: str) -> None:
    line = one_error_line(krill_on(node, "topic", "alter-config", "orders", *args), 2)
    assert expected in line, line
