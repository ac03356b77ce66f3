"""bench/budget.py: the latency budget's case runs on a real node and a real 3-node cluster
and reads every stage back from their /metrics; its percentiles come right off buckets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import budget
from bench.run import ALL_CASES
from tests.bench.case_args import case_args


def test_a_quantile_is_linear_inside_its_bucket() -> None:
    buckets = [(0.001, 10.0), (0.002, 30.0), (0.005, 40.0), (math.inf, 40.0)]
    assert budget._quantile(buckets, 0.25) == pytest.approx(0.001)  # the 10th of 40
    assert budget._quantile(buckets, 0.5) == pytest.approx(0.0015)  # halfway into (1, 2] ms
    assert budget._quantile(buckets, 1.0) == pytest.approx(0.005)
    assert budget._quantile([(0.001, 0.0), (math.inf, 0.0)], 0.5) is None
    over = [(0.001, 0.0), (math.inf, 5.0)]
    assert budget._quantile(over, 0.99) == 0.001  # past the last bound: the bound, no more


def test_buckets_of_a_window_are_the_differences_summed_over_nodes() -> None:
    before = {("h_bucket", (("le", "0.001"), ("stage", "flush"))): 2.0}
    after = {("h_bucket", (("le", "0.001"), ("stage", "flush"))): 7.0,
             ("h_bucket", (("le", "+Inf"), ("stage", "flush"))): 9.0,
             ("h_bucket", (("le", "+Inf"), ("stage", "route"))): 4.0}
    assert budget._buckets(before, after, "h", stage="flush") == [(0.001, 5.0), (math.inf, 9.0)]


@pytest.mark.timeout(300)
def test_the_budget_of_one_node_and_three(tmp_path: Path) -> None:
    assert "latency_budget" in ALL_CASES
    res = budget.run_budget(case_args(tmp_path, fixed_seconds=1.0))
    assert res["error"] is None, res["error"]
    for topology in ("one_node", "three_nodes"):
        window = res[topology][str(budget.QUICK_RATES[0])]
        stages = window["stages_ms"]
        assert set(stages) == set(budget.STAGES)
        traced = {s["traced"] for s in stages.values()}
        assert len(traced) == 1 and traced.pop() > 0, stages  # every stage of every trace
        assert stages["flush"]["p50"] > 0 and window["stages_p50_sum"] > 0
        assert window["client_ms"]["count"] > 0 and window["loop"]["turns"] > 0
        assert window["io"]["call"]["p50_ms"] is not None
