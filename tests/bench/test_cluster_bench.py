"""The cluster cases of `make bench` (bench/cluster.py), each run whole at tiny sizes against
real nodes: 3 nodes x RF=3 beside 1 node, a leader killed and one stopped, a follower
catching up, an idle cluster's heartbeats. Each case must end without an error, with its
figures and its targets' verdicts in the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cluster import (
    CLUSTER_CASES,
    FAILOVER_KINDS,
    run_cluster_catch_up,
    run_cluster_failover,
    run_cluster_idle_heartbeats,
    run_cluster_vs_single,
)
from bench.run import ALL_CASES
from tests.bench.case_args import case_args

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_cases_are_registered_with_the_bench() -> None:
    assert set(CLUSTER_CASES) <= set(ALL_CASES)


def test_cluster_beside_single_node_in_abba_rounds(tmp_path: Path) -> None:
    res = run_cluster_vs_single(case_args(tmp_path, rounds=2, messages=2_000, fixed_seconds=0.3))

    assert res["error"] is None, res["error"]
    single, cluster = res["single"], res["cluster"]
    assert single["replicas"] == 1 and cluster["replicas"] == 3
    assert len(single["rounds"]) == len(cluster["rounds"]) == 2
    assert all(r["messages"] == 2_000 and r["msgs_per_s"] > 0 for r in cluster["rounds"])
    assert len(res["cluster_over_single_msgs_per_s_by_round"]) == 2
    assert res["cluster_over_single_msgs_per_s_median"] > 0
    for side in (single, cluster):
        for rate in ("5000", "20000"):
            fixed = side["fixed_rate"][rate]
            assert fixed["p50_ms_median"] <= fixed["p99_ms_median"] <= fixed["p99_9_ms_median"]
    assert res["target_met"]["cluster_ge_0_25x_single_msgs_per_s"] is not None
    assert not any(tmp_path.iterdir()), "the nodes' data directories are left behind"


def test_failover_after_kill_and_after_sigterm(tmp_path: Path) -> None:
    res = run_cluster_failover(case_args(tmp_path))

    assert res["error"] is None, res["error"]
    assert [t["kind"] for t in res["trials"]] == list(FAILOVER_KINDS)
    for trial in res["trials"]:
        assert trial["victim_led"], trial
        assert 0 < trial["leaders_s"] <= trial["writable_s"] < 20, trial
        assert 0 < trial["metadata_s"] < 20, trial
        assert trial["undelivered"] == 0 and not trial["delivery_errors"], trial
        assert trial["restart_caught_up_s"] >= trial["restart_ready_s"] > 0, trial
    assert set(res["target_met"]) == {
        "kill9_writable_median_le_3s", "kill9_writable_max_le_3s",
        "sigterm_writable_median_le_0_5s", "sigterm_writable_max_le_0_5s",
    }  # fmt: skip
    assert all(nd["exits"] for nd in res["cluster"]["nodes"] if nd["node_id"] in
               {t["victim"] for t in res["trials"]})  # fmt: skip


def test_a_restarted_follower_catches_up(tmp_path: Path) -> None:
    res = run_cluster_catch_up(case_args(tmp_path, messages=3_000))

    assert res["error"] is None, res["error"]
    (only,) = res["round_results"]
    assert only["payload_mb"] == pytest.approx(3_000 * 1024 / 1e6, abs=0.01)
    # The follower's log grew by what it missed (plus batch headers and indexes).
    assert only["log_mb_copied"] >= only["payload_mb"]
    assert only["restart_to_caught_up_s"] >= only["restart_to_ready_s"] > 0
    assert res["mb_per_s_median"] > 0


def test_an_idle_cluster_s_cpu_per_node(tmp_path: Path) -> None:
    res = run_cluster_idle_heartbeats(case_args(tmp_path), partitions=30, seconds=1.0)

    assert res["error"] is None, res["error"]
    assert sum(res["leaders_by_node"].values()) == 30
    for window in (res["bare"], res["idle"]):
        assert set(window["nodes"]) == {"1", "2", "3"}
        assert all(0 <= n["core_share"] < 2 for n in window["nodes"].values())
        assert all("shard0" in n["cpu_s_by_process"] for n in window["nodes"].values())
    assert res["target_met"]["idle_lt_0_1_core_per_node"] is not None


def test_a_cluster_whose_port_was_taken_starts_again_on_new_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process binds a node RPC port between the bench picking it free and the node
    binding it (a test beside the bench, as in a CI run): the cluster starts again on new
    ports instead of failing its case."""
    import socket

    import bench.cluster_nodes as cluster_nodes

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    real = cluster_nodes.free_port
    monkeypatch.setattr(cluster_nodes, "free_port", lambda: next(picks, None) or real())
    try:
        with cluster_nodes.Cluster(case_args(tmp_path)) as cluster:
            rpc = [n.rpc_port for n in cluster.nodes]
            assert taken.getsockname()[1] not in rpc
            assert all(n.alive() for n in cluster.nodes)
    finally:
        taken.close()
