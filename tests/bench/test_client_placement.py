"""Where the shard cases of `make bench` run their client (bench/shards.py): the core chosen
for each placement, the pinning itself (real thread affinity), the shards' cores read from a
node just started, the figures per placement (how busy the client's core was, and the
throughput a client-bound round predicts), and the forwarding figures beside the floors.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from bench.broker import Broker
from bench.report import CaseError
from bench.shards import (
    CLIENT_PLACEMENTS,
    _client_bound_prediction,
    _client_core_figures,
    _client_cores,
    _forward_figures,
    _rounds_key,
    _shard_cores,
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
        # Pinned, but these rounds carry no figures of the client's core.
        "local_client_core_busy_median": None,
        "local_shards_on_client_core_busy_median": None,
        "cross_client_core_busy_median": None,
        "cross_shards_on_client_core_busy_median": None,
        "cross_over_local_msgs_per_s_client_bound_prediction_median": None,
    }
    assert placements[free]["cross_over_local_cpu_per_gb_median"] == 1.1


def test_a_pinned_clients_core_is_shared_out_between_it_and_the_shards_pinned_there() -> None:
    out: dict[str, Any] = {
        "elapsed_s": 2.0,
        "client_cpu_s": 1.7,
        "broker_cpu_s_by_process": {"shard0": 0.9, "shard1": 0.3, "supervisor": 0.01},
    }

    _client_core_figures(out, client_core=1, shard_cores={0: 0, 1: 1})

    assert out["client_core_busy"] == 0.85
    assert out["shards_on_client_core_busy"] == 0.15


def test_an_unpinned_client_has_no_core_to_share_out() -> None:
    out: dict[str, Any] = {"elapsed_s": 2.0, "client_cpu_s": 1.7, "broker_cpu_s_by_process": {}}

    _client_core_figures(out, client_core=None, shard_cores={0: 0})

    assert "client_core_busy" not in out and "shards_on_client_core_busy" not in out


@pytest.mark.parametrize(
    ("a", "b", "predicted"),
    [
        # The client fills its core alone on A, and has what shard 1 leaves it on B.
        ((0.98, 0.0), (0.83, 0.15), 0.85),
        ((0.8, 0.2), (0.6, 0.4), 0.75),
        # A core that is not full: the client is not what bounds the phase.
        ((0.5, 0.0), (0.83, 0.15), None),
        ((0.98, 0.0), (0.5, 0.15), None),
    ],
)
def test_a_client_bound_round_pair_predicts_the_share_the_shards_leave_the_client(
    a: tuple[float, float], b: tuple[float, float], predicted: float | None
) -> None:
    names = ("client_core_busy", "shards_on_client_core_busy")

    prediction = _client_bound_prediction(
        dict(zip(names, a, strict=True)), dict(zip(names, b, strict=True))
    )

    assert prediction == (None if predicted is None else pytest.approx(predicted, abs=1e-3))


def test_an_unpinned_round_pair_predicts_nothing() -> None:
    assert _client_bound_prediction({"msgs_per_s": 1.0}, {"msgs_per_s": 1.0}) is None


def test_pinned_placements_are_summarised_with_how_busy_the_clients_core_was() -> None:
    off, on, free = CLIENT_PLACEMENTS
    a = _Side("smp=1", {off: [1.0, 1.0], on: [1.0], free: [1.0]})
    b = _Side("smp=2", {off: [1.1, 1.1], on: [1.1], free: [1.1]})
    for busy, shards, rounds in ((0.98, 0.0, a.res["rounds"]), (0.8, 0.18, b.res["rounds"])):
        for r in rounds:
            r.update(client_core_busy=busy, shards_on_client_core_busy=shards)
    res: dict[str, Any] = {"client_cores": {off: 1, on: 0, free: None}}

    _summarise(a, b, res, "smp_2_over_1")  # type: ignore[arg-type]

    placed = res["client_placements"][off]
    assert placed["smp=1_client_core_busy_median"] == 0.98
    assert placed["smp=2_shards_on_client_core_busy_median"] == 0.18
    assert placed["smp_2_over_1_msgs_per_s_client_bound_prediction_median"] == 0.82
    assert res["smp_2_over_1_msgs_per_s_client_bound_prediction_median"] == 0.82
    # The rounds on core 0 carry no such figures; unpinned has no core to describe.
    prediction = "smp_2_over_1_msgs_per_s_client_bound_prediction_median"
    assert res["client_placements"][on][prediction] is None
    assert "smp=1_client_core_busy_median" not in res["client_placements"][free]


def test_every_shard_of_a_node_just_started_is_found_on_its_own_core() -> None:
    # Read at once after the node is ready, before its last shard may have logged its pid.
    smp = min(2, len(os.sched_getaffinity(0)))
    with Broker(smp=smp) as broker:
        cores = _shard_cores(broker)

    assert sorted(cores) == list(range(smp))
    assert len(set(cores.values())) == smp
    assert set(cores.values()) <= os.sched_getaffinity(0)


def test_what_a_target_leaves_per_forwarded_request_is_set_beside_the_floors() -> None:
    a = _Side("smp=1", {})
    b = _Side("smp=2", {})
    a.res["rounds"] = [{"broker_cpu_s_per_gb": 2.0, "msgs_per_request": 200.0}]
    b.res["rounds"] = [{"broker_cpu_s_per_gb": 2.4, "msgs_per_request": 250.0}]
    res: dict[str, Any] = {
        "pipe_round_trip_floor": {"cpu_us_per_round_trip": 51.2},
        "handoff_floor": {"handoff_floor_cpu_us": 204.8},
    }

    _forward_figures(a, b, res, "smp_2_over_1", target=1.1, share=0.5)  # type: ignore[arg-type]

    # B's request: 250 x 1 KiB = 256 000 bytes; half of B's requests are forwarded.
    assert res["smp_2_over_1_extra_cpu_us_per_forwarded_request_median"] == 204.8
    assert res["smp_2_over_1_target_leaves_cpu_us_per_forwarded_request_median"] == 102.4
    assert res["smp_2_over_1_pipe_floor_over_target_leaves"] == 0.5
    assert res["smp_2_over_1_handoff_floor_over_target_leaves"] == 2.0
    assert res["smp_2_over_1_request_size_ratio_median"] == 1.25
