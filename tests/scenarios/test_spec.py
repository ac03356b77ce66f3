"""Scenario files: what a mistake says, what a shipped file and an OMB workload read as."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scenarios.cli import LIBRARY
from scenarios.spec import SpecError, load, parse

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse(text, Path("flow.yaml"))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_wrong_type_names_the_key_and_its_line() -> None:
    message = error_of("cluster:\n  shards: 2\nworkload:\n  producerRate: fast\n")
    assert message.startswith("flow.yaml:4:3: workload.producerRate: 'fast' is not of type")


def test_an_unknown_key_is_pointed_at_with_the_known_ones() -> None:
    message = error_of("workload:\n  partitionsPerTopic: 3\n  producerRatee: 100\n")
    assert message.startswith("flow.yaml:3:3: workload.producerRatee: unknown key")
    assert "producerRate" in message.split("known:")[1]


def test_a_bad_target_says_the_form() -> None:
    message = error_of("workload: {producerRate: 10}\nsteps:\n  - at: 5s\n    kill: nod 0\n")
    assert message.startswith("flow.yaml:4:5: steps[0].kill: 'nod 0' is not in the form")
    assert "'node 0'" in message


def test_link_faults_need_two_nodes_and_the_simulated_mode_runs_one() -> None:
    message = error_of("workload: {producerRate: 10}\nsteps:\n  - at: 5s\n    link: cut\n"
                       "    from: node 0\n    to: others\n")
    assert message.startswith("flow.yaml:4:5: steps[0].link: a link joins two nodes")
    message = error_of("cluster: {nodes: 3, mode: simulated}\nworkload: {producerRate: 10}\n")
    assert message.startswith("flow.yaml:1:11: cluster.nodes: the simulated mode runs one node")


def test_steps_past_the_end_and_bad_undos_are_refused() -> None:
    text = ("workload: {producerRate: 10, testDurationSeconds: 10}\n"
            "steps:\n  - at: 20s\n    stop: shard 0\n")
    assert "past the workload's end" in error_of(text)
    text = ("workload: {producerRate: 10}\n"
            "steps:\n  - at: 1s\n    restart: node 0\n  - at: 2s\n    undo: 0\n")
    assert "steps[1].undo" in error_of(text)


def test_not_yaml_is_one_line_with_the_position() -> None:
    assert error_of("workload: [1, 2\n").startswith("flow.yaml:2:1: not YAML")


def test_a_range_is_drawn_from_the_seed_and_the_duration_scales_the_timeline() -> None:
    text = ("workload: {producerRate: 10, testDurationSeconds: 60}\n"
            "steps:\n  - at: 10s..50s\n    stop: node 0\n    for: 10s\n")
    drawn = {parse(text, seed=seed).steps[0].at_s for seed in range(20)}
    assert len(drawn) > 10 and all(10 <= t <= 50 for t in drawn)
    assert parse(text, seed=7).steps[0].at_s == parse(text, seed=7).steps[0].at_s
    short = parse(text, seed=7, duration_s=6)
    assert short.workload.duration_s == 6
    assert short.steps[0].at_s == pytest.approx(parse(text, seed=7).steps[0].at_s / 10, abs=0.01)
    assert short.steps[0].for_s == pytest.approx(1.0)


def test_a_for_range_is_drawn_per_step_from_the_seed() -> None:
    text = ("workload: {producerRate: 10, testDurationSeconds: 60}\nsteps:\n"
            + "  - after: {previous: 10s}\n    stop: node 0\n    for: 4s..9s\n" * 12)
    lengths = [step.for_s for step in parse(text, seed=3).steps]
    assert len(set(lengths)) > 6 and all(4 <= t <= 9 for t in lengths)  # type: ignore[operator]
    assert lengths == [step.for_s for step in parse(text, seed=3).steps]
    assert lengths != [step.for_s for step in parse(text, seed=4).steps]
    backwards = ("workload: {producerRate: 10}\n"
                 "steps:\n  - at: 1s\n    stop: node 0\n    for: 9s..4s\n")
    assert "steps[0].for: a range runs from low to high" in error_of(backwards)

def test_an_omb_workload_file_runs_unchanged() -> None:
    scenario = load(LIBRARY / "omb-1-topic-100-partitions-1kb.yaml")
    assert scenario.nodes == 1 and scenario.workload.partitions_per_topic == 100
    assert scenario.workload.producer_rate == 50000 and scenario.workload.duration_s == 900
    assert scenario.workload.payload is not None and len(scenario.workload.payload) == 1024
    assert scenario.topics == [{"name": "workload-0", "partitions": 100, "config": {}}]


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_reads(path: Path) -> None:
    scenario = load(path)
    assert scenario.workload.duration_s > 0


def test_the_cli_says_a_file_mistake_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload:\n  messageSize: 8\n")
    done = subprocess.run([sys.executable, "-m", "scenarios.cli", "scenario", "run", str(bad)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"krill: error: {bad}:2:3: workload.messageSize: 8 is less")


def test_scenario_list_names_every_shipped_file() -> None:
    done = subprocess.run([sys.executable, "-m", "scenarios.cli", "scenario", "list"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0
    for path in LIBRARY.glob("*.yaml"):
        assert path.name in done.stdout


def test_every_yaml_example_in_the_scenarios_readme_reads() -> None:
    text = (REPO / "scenarios" / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    assert blocks
    for block in blocks:
        assert parse(block).workload.duration_s > 0
