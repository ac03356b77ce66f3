"""`krill bench saturation`: a very short real run against a node, the knee rule, the command."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from scenarios.procs import child_pids
from scenarios.saturation import add_bench_commands, find_knee, low_load_p99_ms
from shards.topic_cli import CommandError
from tests.support.broker import BrokerProcess, free_port

SHORT = ["--steps", "50,10,100", "--step-seconds", "0.5", "--max-seconds", "0.5", "--quiet",
         "-p", "2", "-s", "100"]


def krill(*argv: str) -> int:
    """The `krill` entry point's handling of this command, in this process."""
    parser = argparse.ArgumentParser(prog="krill")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("saturation") / "data").start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


@pytest.mark.timeout(120)
@pytest.mark.integration
def test_a_short_run_writes_the_curve(node: BrokerProcess, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert krill("bench", "saturation", "-b", node.bootstrap, "--out", str(out), *SHORT) == 0
    report = json.loads((out / "report.json").read_text())
    steps = report["steps"]
    assert [s["offered_pct"] for s in steps] == [10, 50, 100]  # sorted, whatever the order
    offered = [s["offered_msgs_per_s"] for s in steps]
    assert offered == sorted(offered) and offered[0] > 0
    assert report["maximum"]["msgs_per_s"] > 0 and report["node"] == "given"
    for step in steps:
        assert step["acked"] == step["messages"] and step["failed"] == 0
        assert 0 < step["p50_ms"] <= step["p99_ms"] <= step["p99_9_ms"] <= step["max_ms"]
        assert step["hdr"].startswith("HISTF")
    assert "knee" in report and "knee_rule" in report
    assert report["at_50pct"]["offered_pct"] == 50
    assert report["at_50pct"]["p99_9_over_p50"] == pytest.approx(
        steps[1]["p99_9_ms"] / steps[1]["p50_ms"], abs=0.01)
    curve = (out / "curve.png").read_bytes()
    assert curve.startswith(b"\x89PNG") and len(curve) > 10_000
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    topics = admin.list_topics(timeout=10).topics  # the run's topic is gone again
    assert not [name for name in topics if name.startswith("krill-saturation-")]


@pytest.mark.timeout(120)
@pytest.mark.integration
def test_without_b_a_node_is_started_and_stopped(tmp_path: Path) -> None:
    before = _children()
    out = tmp_path / "own"
    assert krill("bench", "saturation", "--out", str(out), *SHORT) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["node"].startswith("started") and len(report["steps"]) == 3
    assert _children() == before  # nothing of the node is left running


@pytest.mark.timeout(30)
def test_a_node_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot reach broker at 127.0.0.1:"):
        krill("bench", "saturation", "-b", f"127.0.0.1:{free_port()}", "--out",
              str(tmp_path), *SHORT)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [["--steps", "0,50"], ["--steps", "ten"], ["-p", "0"],
                                 ["--step-seconds", "-1"]])
def test_bad_arguments_are_usage_errors(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        krill("bench", "saturation", *bad)
    assert exited.value.code == 2
    assert "saturation: error: argument" in capsys.readouterr().err


def step(pct: float, p99_ms: float, achieved_share: float = 1.0) -> dict[str, Any]:
    rate = 1000.0 * pct
    return {"offered_pct": pct, "offered_msgs_per_s": rate,
            "achieved_msgs_per_s": rate * achieved_share, "p99_ms": p99_ms}


def knee_pct(steps: Sequence[dict[str, Any]]) -> float | None:
    knee = find_knee(steps)
    return None if knee is None else float(knee["offered_pct"])


@pytest.mark.timeout(10)
def test_the_knee_is_where_the_curve_leaves_the_line_for_good() -> None:
    flat = [step(10, 9), step(25, 10), step(50, 8)]
    assert low_load_p99_ms(flat) == 8  # the lowest of the steps at <= 50%
    assert low_load_p99_ms([step(70, 12), step(100, 50)]) == 12  # else the lowest step's
    assert knee_pct(flat + [step(85, 20), step(100, 40), step(120, 400)]) == 100  # > 3 x 8
    # a lone spike below is not the knee
    assert knee_pct(flat + [step(70, 60), step(85, 20), step(100, 400)]) == 100
    # falling behind the offered rate is off the line whatever the p99
    assert knee_pct(flat + [step(85, 12, 0.9), step(100, 13, 0.8)]) == 85
    assert knee_pct(flat + [step(100, 24)]) is None  # still on the line at the top
    assert find_knee([]) is None
    knee = find_knee([step(120, 30), step(10, 5)])  # order does not matter
    assert knee is not None and knee["offered_pct"] == 120 and "6.0x" in knee["reason"]


def _children() -> set[int]:
    """Live child processes of this test process."""
    return {pid for pid in child_pids(os.getpid()) if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
