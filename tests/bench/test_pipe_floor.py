"""The pipe round-trip floor of `make bench` (bench/pipe_floor.py): two real processes, the
real ZeroMQ pipe mesh between them, every round trip answered."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.pipe_floor import measure_pipe_round_trip

pytestmark = pytest.mark.timeout(60)


def test_the_floor_is_measured_over_real_pipes_between_two_processes() -> None:
    figures = measure_pipe_round_trip(round_trips=300, timeout=40)

    assert figures["round_trips"] == 300
    cpu, loop, wall = (
        figures["cpu_us_per_round_trip"],
        figures["loop_threads_us_per_round_trip"],
        figures["wall_us_per_round_trip"],
    )
    assert all(us > 0 for us in figures["by_shard_cpu_us"]), figures
    assert cpu == pytest.approx(sum(figures["by_shard_cpu_us"]), abs=0.2)
    # The loop threads are part of their processes; a round trip waits for both loops.
    assert 0 < loop <= cpu + 1, figures
    assert wall > loop / 2, figures


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["side", "--shard", "0"], "side needs --run-dir"),
        (["copies", "--run-dir", "/tmp"], "copies needs --handoff-bytes"),
    ],
)
def test_a_cli_mistake_is_a_one_line_usage_error(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.pipe_floor", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(says)


def test_the_handoff_floor_hands_each_request_across_and_times_the_copies_on_one_core() -> None:
    figures = measure_pipe_round_trip(round_trips=200, timeout=40, handoff_bytes=64 * 1024)

    assert figures["handoff_bytes"] == 64 * 1024
    assert figures["round_trips"] == 200
    one_core = figures["copies_on_one_core_cpu_us"]
    assert one_core > 0, figures
    assert figures["handoff_floor_cpu_us"] == pytest.approx(
        figures["cpu_us_per_round_trip"] - one_core, abs=0.2
    )
