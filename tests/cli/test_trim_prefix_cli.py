"""`krill topic trim-prefix` (DeleteRecords) against a real node, as a user types it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support.broker import BrokerProcess
from tests.support.cli import krill_on
from tests.support.kafka import create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("trim-cli") / "data").start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def table(result: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert result.returncode == 0, result.stderr
    return [line.split() for line in result.stdout.splitlines()]


def test_trim_one_partition_then_all(node: BrokerProcess) -> None:
    create_topic(node, "clicks", 3)
    produce(node, "clicks", [(None, b"x", None, p) for p in (0, 1, 2) for _ in range(10)])
    assert table(krill_on(node, "topic", "trim-prefix", "clicks", "-p", "0", "--offset", "4")) == [
        ["PARTITION", "LOG-START"], ["0", "4"]]
    assert table(krill_on(node, "topic", "trim-prefix", "clicks", "--offset", "-1")) == [
        ["PARTITION", "LOG-START"], ["0", "10"], ["1", "10"], ["2", "10"]]


def test_mistakes_are_one_line(node: BrokerProcess) -> None:
    create_topic(node, "small", 1)
    produce(node, "small", [(None, b"x", None, 0)] * 3)
    cases = [
        (("topic", "trim-prefix", "small", "--offset", "7"), "out of range"),
        (("topic", "trim-prefix", "small", "-p", "5", "--offset", "1"), "no partition 5"),
        (("topic", "trim-prefix", "missing", "--offset", "1"), "missing"),
        (("topic", "trim-prefix", "small", "--offset", "x"), "expected an offset"),
    ]
    for args, words in cases:
        result = krill_on(node, *args)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.splitlines()
        assert result.returncode != 0 and len(lines) == 1, result.stderr
        assert words in lines[0].lower(), lines[0]
