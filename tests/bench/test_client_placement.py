"""Where the shard cases of `make bench` run their client (bench/shards.py): the core chosen
for each placement, the pinning itself (real thread affinity), and the figures per placement.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from bench.run import CaseError
from bench.shards import (
    CLIENT_PLACEMENTS,
    _client_cores,
    _rounds_key,
    _summarise,
    client_on_core,
)

pytestmark = pytest.mark.timeout(30)


def test_off_the_connection_core_is_the_other_core_of_a_two_core_machine() -> None:
    one_shard, two_shards = {0: 0}, {0: 0, 1: 1}

    cores = _client_cores([one_shard, two_shards], machine=[0, 1])

    assert cores == {"off_connection_core": 1, "on_connection_core": 0, "unpinned": None}
    assert list(cores) == list(CLIENT_PLACEMENTS)


def test_off_the_connection_core_prefers_a_core_no_shard_uses() -> None:
    cores = _client_cores([{0: 4}, {0: 4, 1: 5}], machine=[4, 5, 6, 7])

    assert cores["off_connection_core"] == 6
    assert cores["on_connection_core"] == 4


@pytest.mark.parametrize(
    ("shard_cores", "machine", "says"),
    [
        ([{0: 0}, {0: 1, 1: 0}], [0, 1], "different cores"),
        ([{0: 0}], [0], "needs a core besides"),
        ([{1: 1}], [0, 1], "without shard 0"),
    ],
)
def test_a_placement_that_cannot_be_made_fails_the_case_with_a_reason(
    shard_cores: list[dict[int, int]], machine: list[int], says: str
) -> None:
    with pytest.raises(CaseError, match=says):
        _client_cores(shard_cores, machine)


def test_pinning_moves_this_thread_and_the_threads_it_starts_then_puts_it_back() -> None:
    before = os.sched_getaffinity(0)
    core = max(before)
    seen: dict[str, set[int]] = {}

    def child() -> None:
        seen["child"] = os.sched_getaffinity(0)

    with client_on_core(core):
        seen["inside"] = os.sched_getaffinity(0)
        t = threading.Thread(target=child)
        t.start()
        t.join()

    assert seen == {"inside": {core}, "child": {core}}
    assert os.sched_getaffinity(0) == before


def test_unpinned_leaves_the_thread_where_it_may_run() -> None:
    before = os.sched_getaffinity(0)

    with client_on_core(None):
        inside = os.sched_getaffinity(0)

    assert inside == before == os.sched_getaffinity(0)


class _Side:
    """What `_summarise` reads of a side: its name and its rounds per placement."""

    def __init__(self, name: str, cpu_by_placement: dict[str, list[float]]) -> None:
        self.name = name
        self.res: dict[str, Any] = {}
        for placement, cpus in cpu_by_placement.items():
            self.res[_rounds_key(placement)] = [
                {"broker_cpu_s_per_gb": cpu, "msgs_per_s": 1000.0 * cpu, "mb_per_s": 1.0}
                for cpu in cpus
            ]


def test_each_placement_is_summarised_and_the_targets_use_the_first() -> None:
    off, on, free = CLIENT_PLACEMENTS
    a = _Side("local", {off: [1.0, 2.0, 1.0], on: [1.0], free: [2.0]})
    b = _Side("cross", {off: [1.2, 2.6, 1.1], on: [1.5], free: [2.2]})
    res: dict[str, Any] = {"client_cores": {off: 1, on: 0, free: None}}

    _summarise(a, b, res, "cross_over_local")  # type: ignore[arg-type]

    assert res["cross_over_local_cpu_per_gb_by_round"] == [1.2, 1.3, 1.1]
    assert res["cross_over_local_cpu_per_gb_median"] == 1.2
    assert res["cross_over_local_msgs_per_s_median"] == 1.2
    assert a.res["produce_median"]["broker_cpu_s_per_gb"] == 1.0
    placements = res["client_placements"]
    assert list(placements) == list(CLIENT_PLACEMENTS)
    assert placements[off]["client_core"] == 1
    assert placements[off]["rounds"] == 3
    assert placements[off]["cross_over_local_cpu_per_gb_median"] == 1.2
    assert placements[on] == {
        "client_core": 0,
        "rounds": 1,
        "local_cpu_per_gb_median": 1.0,
        "cross_cpu_per_gb_median": 1.5,
        "cross_over_local_cpu_per_gb_median": 1.5,
        "cross_over_local_msgs_per_s_median": 1.5,
    }
    assert placements[free]["cross_over_local_cpu_per_gb_median"] == 1.1
