"""The pictures, the verdict table and the live line of scenarios/report.py, on hand-made data."""

from __future__ import annotations

import io
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from scenarios.history import Op
from scenarios.report import (
    Progress,
    bucket_percentiles_ms,
    curve_png,
    saturation_table,
    timeline_png,
    timeline_series,
    verdict_table,
)

MS = 1_000_000
S = 1_000_000_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def send(complete_ns: int, latency_ms: float, outcome: str = "ok") -> Op:
    return Op("send", "p0", complete_ns - int(latency_ms * MS), complete_ns, outcome, topic="t",
              partition=0, value=f"p0-{complete_ns}", offset=0 if outcome == "ok" else None)


def poll(complete_ns: int, records: int) -> Op:
    return Op("poll", "c0", complete_ns - MS, complete_ns, "ok",
              records=tuple(("t", 0, i, f"v{i}") for i in range(records)))


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", header[16:24])
    return width, height


@pytest.mark.timeout(60)
def test_timeline_png_with_a_fault_band(tmp_path: Path) -> None:
    start = 5 * S  # the run's clock need not start at zero
    ops = [send(start + i * 10 * MS, 2 + (i % 7)) for i in range(1000)]  # 10 s, 100/s
    ops += [poll(start + i * 100 * MS, 10) for i in range(100)]
    ops.append(send(start + 4 * S, 1, outcome="unknown"))  # not counted
    path = tmp_path / "timeline.png"
    timeline_png(path, ops, [("kill -9 node 0", start + 3 * S, start + 6 * S)], start)
    width, height = png_size(path)
    assert (width, height) == (1100, 660)  # 10 x 6 inches at 110 dpi
    assert 20_000 < path.stat().st_size < 1_000_000


@pytest.mark.timeout(60)
def test_timeline_png_of_an_empty_history(tmp_path: Path) -> None:
    path = tmp_path / "timeline.png"
    timeline_png(path, [], [], 0)
    assert png_size(path) == (1100, 660)


@pytest.mark.timeout(30)
def test_percentiles_per_bucket_on_known_data() -> None:
    # bucket 0: latencies 1..100 ms; bucket 1: empty; bucket 2: 1000 ms and 3000 ms.
    complete = [i * 5 * MS for i in range(100)] + [2 * S + 1, 2 * S + 2]
    latency = [(100 - i) * MS for i in range(100)] + [3000 * MS, 1000 * MS]
    got = bucket_percentiles_ms(np.array(complete), np.array(latency), 0, 1.0, 3,
                                (0.5, 0.99, 1.0))
    # nearest rank: the value at index min(n - 1, floor(q * n)) of the sorted values
    assert got[:, 0].tolist() == [51.0, 100.0, 100.0]
    assert all(math.isnan(v) for v in got[:, 1])
    assert got[:, 2].tolist() == [3000.0, 3000.0, 3000.0]


@pytest.mark.timeout(30)
def test_series_counts_acknowledged_sends_and_polled_records_per_second() -> None:
    ops = [send(i * 100 * MS, 3) for i in range(20)]  # 10 per second over 2 s
    ops += [poll(S + 1, 40), poll(S + 2, 0)]
    ops += [send(500 * MS, 3, outcome="failed")]
    series = timeline_series(ops, 0, bucket_s=0.5)
    assert series.acked_per_s.tolist() == [10.0, 10.0, 10.0, 10.0]
    assert series.polled_per_s.tolist() == [0.0, 0.0, 80.0, 0.0]
    assert series.p50_ms.tolist() == [3.0] * 4
    assert series.starts_s.tolist() == [0.0, 0.5, 1.0, 1.5]


@pytest.mark.timeout(60)
def test_curve_png_marks_the_knee(tmp_path: Path) -> None:
    points = [{"offered_pct": pct, "achieved_msgs_per_s": 1000.0 * pct, "p50_ms": 5.0,
               "p99_ms": 9.0 if pct < 100 else 90.0, "p99_9_ms": 12.0 if pct < 100 else 200.0}
              for pct in (10, 50, 100)]
    path = tmp_path / "curve.png"
    curve_png(path, points, {**points[-1], "reason": "p99 90 ms is 10.0x the low-load 9 ms"})
    assert png_size(path) == (990, 605)
    curve_png(tmp_path / "flat.png", points[:2], None)
    assert (tmp_path / "flat.png").stat().st_size > 10_000


def rendered(report: dict[str, object]) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    verdict_table(report, console=console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(text, str)
    return text


@pytest.mark.timeout(30)
def test_verdict_table_shows_pass_and_fail() -> None:
    report = {
        "valid": False,
        "verdict": "FAIL",
        "anomalies": {"lost-write": [{"value": "p0-1", "topic": "t", "partition": 0,
                                      "offset": 0, "read_up_to": 1}], "duplicate": []},
        "figures": {},
        "checks": {"p99_ms_outside_faults": {"value": 12.5, "bound": 20.0, "ok": True},
                   "recovery_ms": {"value": 9000.0, "bound": 5000.0, "ok": False}},
    }
    text = rendered(report)
    lines = {line.split()[1]: line for line in text.splitlines()
             if line.startswith("│") and len(line.split()) > 1}
    assert "PASS" in lines["p99_ms_outside_faults"] and "12.5" in lines["p99_ms_outside_faults"]
    assert "FAIL" in lines["recovery_ms"] and "5000" in lines["recovery_ms"]
    assert "p0-1" in lines["lost-write"] and " 1 " in lines["lost-write"]
    assert " 0 " in lines["duplicate"]
    assert text.rstrip().endswith("verdict: FAIL")
    assert rendered({"valid": True, "anomalies": {}, "checks": {}}).rstrip().endswith(
        "verdict: PASS")


@pytest.mark.timeout(30)
def test_progress_is_one_rewritten_line_off_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(stream=stream)
    progress.update(1.0, 10.0, 20_000, 8.25, 0, "step 1/3")
    progress.close()
    text = stream.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
    assert "20,000 msg/s" in text and "p99    8.2 ms" in text and "step 1/3" in text

    quiet = io.StringIO()
    with Progress(quiet=True, stream=quiet) as silent:
        silent.update(1.0, 10.0, 5.0, None, 2)
    assert quiet.getvalue() == "" and "faults 2" in silent.line


@pytest.mark.timeout(30)
def test_saturation_table_names_the_knee_and_the_goal() -> None:
    steps = [{"offered_pct": pct, "offered_msgs_per_s": 1000.0 * pct,
              "achieved_msgs_per_s": 1000.0 * min(pct, 90), "p50_ms": 5.0, "p99_ms": p99,
              "p99_9_ms": 2 * p99, "behind_max_ms": 1.5} for pct, p99 in ((10, 9.0), (50, 8.0),
                                                                           (100, 90.0))]
    report = {"partitions": 6, "message_bytes": 1024, "acks": "all",
              "maximum": {"msgs_per_s": 100_000.0, "mb_per_s": 102.4}, "steps": steps,
              "knee": {**steps[2], "reason": "achieved 90% of offered"}, "spikes": [],
              "at_50pct": {"offered_pct": 50, "p99_ms": 8.0, "p99_9_over_p50": 3.2,
                           "p99_9_over_p50_max": 5.0, "flat_tail": True}}
    console = Console(file=io.StringIO(), width=120, color_system=None)
    saturation_table(report, console=console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    knee_row = next(line for line in text.splitlines() if "100%" in line)
    assert "knee" in knee_row and "90,000" in knee_row
    assert "knee: 100% offered (achieved 90% of offered)" in text
    assert "p99.9/p50 3.2 (goal <= 5: met)" in text
