"""The simulated mode: real actors on a virtual clock, disk and pipes, one seed one run.

Each shipped `sim-*.yaml` runs (shortened) and passes its checks; a seed replays byte for
byte and another seed gives another schedule; a broken run is caught, by the checker or by a
step's expectation, and names its seed; a few hundred seeds of one flow run in a loop.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scenarios import sim
from scenarios.checker import check
from scenarios.sim.clock import SimulationStalled, VirtualLoop
from scenarios.sim.schema import SIM_FAULTS_SCHEMA, SIM_STEP_SCHEMA

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios" / "library"
SIM_FILES = sorted(LIBRARY.glob("sim-*.yaml"))


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)  # faults make the broker log a lot, by design


def load(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(path.read_text())
    return spec


def shortened(spec: dict[str, Any], seconds: float | None = None, rate: int | None = None
              ) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    workload = spec["workload"]
    if seconds is not None:
        workload["testDurationSeconds"] = seconds
        workload.pop("testDurationMinutes", None)
    if rate is not None:
        workload["producerRate"] = rate
    return spec


def assert_valid(result: sim.SimResult) -> None:
    checked = check(result.ops)
    anomalies = {name: found[:3] for name, found in checked.anomalies.items() if found}
    failed_steps = [c for c in result.step_checks if not c["ok"]]
    assert not anomalies and not failed_steps, (
        f"seed {result.seed}: {anomalies} {failed_steps} (replay with --seed {result.seed})")


def test_there_are_at_least_three_flows() -> None:
    assert len(SIM_FILES) >= 3, SIM_FILES


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", SIM_FILES, ids=lambda p: p.stem)
def test_each_shipped_flow_is_valid_and_passes(path: Path) -> None:
    spec = load(path)
    assert spec["cluster"]["mode"] == "simulated"
    for step in spec.get("steps", []):
        jsonschema.validate(step, SIM_STEP_SCHEMA)
    jsonschema.validate(spec.get("faults", {}), SIM_FAULTS_SCHEMA)
    result = sim.run(spec, 1)
    assert_valid(result)
    assert result.step_checks, "a flow checks the actors' state in its steps"
    sends = [op for op in result.ops if op.op == "send"]
    assert sum(op.outcome == "ok" for op in sends) > 100
    assert result.faults


@pytest.mark.timeout(60)
def test_same_seed_same_run_another_seed_another_schedule() -> None:
    spec = shortened(load(LIBRARY / "sim-cross-shard-produce-with-pipe-faults.yaml"), 3, 1000)
    first, again, other = sim.run(spec, 7), sim.run(spec, 7), sim.run(spec, 8)
    assert first.digest == again.digest
    assert [op.to_json() for op in first.ops] == [op.to_json() for op in again.ops]
    assert first.partitions == again.partitions
    assert other.digest != first.digest
    # Not only the digest: the schedule itself (when answers came) differs.
    assert [op.complete_ns for op in first.ops] != [op.complete_ns for op in other.ops]


@pytest.mark.timeout(60)
def test_a_failed_expectation_is_reported_with_its_seed() -> None:
    spec = shortened(load(LIBRARY / "sim-cross-shard-produce-with-pipe-faults.yaml"), 2, 500)
    spec["steps"] = [{"at": "1s", "expect": {"partition": "flow/1", "high_watermark": 10**9}},
                     {"after": {"acked": 10**9}, "hold": {"from": 0, "to": 1}}]
    result = sim.run(spec, 5)
    failed = [c for c in result.step_checks if not c["ok"]]
    assert [c["step"] for c in failed] == [0, 1]
    assert failed[0]["want"] == 10**9 and 0 < failed[0]["got"] < 10**9
    assert failed[1]["got"] == "never happened"
    assert result.seed == 5 and result.figures["replay"] == "--seed 5"


@pytest.mark.timeout(30)
def test_the_virtual_clock_jumps_to_the_next_timer() -> None:
    loop = VirtualLoop()
    fired: list[float] = []
    loop.call_later(3600, lambda: fired.append(loop.time()))
    loop.call_later(3601, loop.stop)
    loop.run_forever()
    assert fired == [3600]
    with pytest.raises(SimulationStalled):
        loop.run_until_complete(loop.create_future())
    loop.close()


def tiny_crash_flow() -> dict[str, Any]:
    """The crash flow, a second long, with every seeded fault on."""
    spec = shortened(load(LIBRARY / "sim-crash-loses-unflushed.yaml"), 1, 400)
    spec["steps"] = [{"at": "0.3s", "crash": "shard 1", "for": "100ms"},
                     {"at": "0.6s", "crash": "node", "for": "50ms"}]
    spec["faults"] = {"pipe_drop": 0.01, "pipe_delay": 0.05, "pipe_delay_ms": [0, 5],
                      "fsync_fail": 0.01, "fsync_ms": [0.1, 3]}
    return spec


@pytest.mark.timeout(60)
def test_a_crash_loses_what_was_not_synced_and_nothing_acknowledged() -> None:
    result = sim.run(load(LIBRARY / "sim-crash-loses-unflushed.yaml"), 3)
    assert result.figures["crashes"] == 3 and result.figures["bytes_lost"] > 0
    assert_valid(result)


@pytest.mark.timeout(120)
def test_a_disk_that_lies_loses_acknowledged_writes_and_the_checker_says_so() -> None:
    spec = tiny_crash_flow()
    spec["faults"] = {"fsync_lies": 1.0}  # every sync reports success and keeps nothing
    result = sim.run(spec, 11)
    checked = check(result.ops)
    assert not checked.valid
    assert checked.anomalies["lost-write"] or checked.anomalies["inconsistent-offsets"]
    assert result.figures["replay"] == "--seed 11"


@pytest.mark.timeout(240)
def test_a_hundred_seeds_of_crashes_and_seeded_faults() -> None:
    spec = tiny_crash_flow()
    digests = set()
    for seed in range(100):
        result = sim.run(spec, seed)
        assert_valid(result)
        assert result.figures["simulated_s"] < 30, f"seed {seed} did not drain"
        digests.add(result.digest)
    assert len(digests) == 100


@pytest.mark.timeout(30)
def test_the_producers_fast_answer_reading_agrees_with_the_generated_decoder() -> None:
    from scenarios.sim.connection import PRODUCE_VERSION, produce_answer
    from wire.messages.produce import ProduceResponse
    from wire.primitives import Writer

    response = ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(
        name="a-topic", partition_responses=[ProduceResponse.PartitionProduceResponse(
            index=3, error_code=56, base_offset=1234567890123, log_start_offset=7)])])
    writer = Writer()
    writer.int32(42)  # the response header: correlation id
    response.encode(writer, PRODUCE_VERSION)
    correlation, answer = produce_answer(writer.getvalue())
    assert (correlation, answer.error_code, answer.base_offset) == (42, 56, 1234567890123)
