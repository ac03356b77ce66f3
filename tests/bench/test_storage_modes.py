"""bench/storage_modes.py: buffered beside direct mode on two real nodes, one run; each
side's figures come back, and the direct node's chunks are what served it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import storage_modes
from bench.run import ALL_CASES
from tests.bench.case_args import case_args


@pytest.mark.timeout(300)
def test_both_modes_side_by_side(tmp_path: Path) -> None:
    assert "storage_modes" in ALL_CASES
    res = storage_modes.run_storage_modes(case_args(tmp_path, fixed_seconds=1.0))
    assert res["error"] is None, res["error"]
    rate = str(storage_modes.QUICK_RATES[0])
    for mode in storage_modes.MODES:
        side = res[mode]
        assert side["msgs_per_s_median"] > 0 and len(side["rounds"]) == 1
        fixed = side["fixed"][rate]
        assert fixed["p99_ms_median"] > 0 and fixed["achieved_msgs_per_s_median"] > 0
        assert fixed["fdatasync_call_p99_ms"][0] is not None
    assert res["direct_over_buffered_msgs_per_s_median"] > 0
    assert res[f"p99_{rate}_direct_over_buffered"] > 0
