"""Krill beside Apache Kafka and tansu (bench/vs_kafka.py, bench/peers/): the peers fetched
into the cache, and each case run whole at tiny sizes, starting and stopping every peer. A
case must end without an error, with every side's figures, Krill's ratios and the targets'
verdicts in the line, and leave no process or directory behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import vs_kafka
from bench.peers.fetch import KAFKA_VERSION, kafka_libs, tansu_binary
from bench.run import ALL_CASES
from bench.vs_kafka import (
    VS_KAFKA_CASES,
    run_cluster_latency,
    run_consume,
    run_end_to_end,
    run_latency,
    run_throughput,
)
from tests.bench.case_args import case_args

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_cases_are_registered_with_the_bench() -> None:
    assert set(VS_KAFKA_CASES) <= set(ALL_CASES)


def test_the_peers_are_fetched_into_the_cache() -> None:
    libs = kafka_libs()
    assert any(jar.name == f"kafka_2.13-{KAFKA_VERSION}.jar" for jar in libs.iterdir())
    assert any(jar.name.startswith("kafka-tools-") for jar in libs.iterdir())
    assert tansu_binary().stat().st_mode & 0o111


def test_a_kafka_cluster_id_never_starts_like_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.peers import kafka

    drawn = iter([b"\xf8" + bytes(15), b"\x00" * 16])  # base64 "-A..." first, then "AAA..."
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: type("U", (), {"bytes": next(drawn)}))
    cluster_id = kafka._cluster_id()
    assert cluster_id == "A" * 22  # the draw that began with '-' was drawn again


def test_throughput_beside_kafka_and_tansu(tmp_path: Path) -> None:
    res = run_throughput(case_args(tmp_path, rounds=2, messages=2_000))

    assert res["error"] is None, res["error"]
    assert set(res["sides"]) == {"krill", "kafka_fsync", "kafka_page_cache", "tansu"}
    for side in res["sides"].values():
        assert len(side["rounds"]) == 2 and side["msgs_per_s_median"] > 0
        assert side["broker_cpu_s_per_gb_median"] > 0
    assert res["sides"]["kafka_fsync"]["settings"]["log.flush.interval.messages"] == "1"
    assert "log.flush.interval.messages" not in res["sides"]["kafka_page_cache"]["settings"]
    for peer in ("kafka_fsync", "kafka_page_cache", "tansu"):
        assert len(res[f"krill_over_{peer}_msgs_per_s_by_round"]) == 2
        assert res[f"krill_over_{peer}_msgs_per_s_median"] > 0
    assert set(res["target_met"]) == {"msgs_per_s_ge_1_0x_kafka_fsync",
                                      "cpu_per_gb_le_1_5x_kafka_fsync"}
    assert not any(tmp_path.iterdir()), "a side's directory is left behind"


def test_latency_at_fixed_rates_beside_kafka(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vs_kafka, "QUICK_RATES", (5_000,))
    res = run_latency(case_args(tmp_path, fixed_seconds=0.5))

    assert res["error"] is None, res["error"]
    for name, side in res["sides"].items():
        fixed = side["fixed_rate"]["5000"]
        assert fixed["held"] is True, (name, fixed)
        assert fixed["p50_ms_median"] <= fixed["p99_ms_median"] <= fixed["p99_9_ms_median"]
    assert "5000" in res["krill_over_kafka_fsync_p99_by_rate"]
    assert res["target_met"]["p99_le_1_0x_kafka_fsync_at_every_rate_it_holds"] is not None


def test_latency_of_three_nodes_beside_a_kafka_cluster(tmp_path: Path) -> None:
    res = run_cluster_latency(case_args(tmp_path, fixed_seconds=0.5))

    assert res["error"] is None, res["error"]
    assert set(res["sides"]) == {"krill", "kafka_fsync"}
    assert res["sides"]["kafka_fsync"]["nodes"] == res["sides"]["krill"]["nodes"] == 3
    assert res["sides"]["krill"]["fixed_rate"]["5000"]["rounds"][0]["messages"] > 0
    # Compared where Kafka's cluster held the rate (on two loaded cores it may not, in 0.5 s).
    held = res["sides"]["kafka_fsync"]["fixed_rate"]["5000"]["held"]
    assert ("5000" in res["krill_over_kafka_fsync_p99_by_rate"]) == bool(held), res["sides"]


def test_end_to_end_latency_beside_kafka_and_tansu(tmp_path: Path) -> None:
    res = run_end_to_end(case_args(tmp_path, fixed_seconds=0.5))

    assert res["error"] is None, res["error"]
    for side in res["sides"].values():
        (only,) = side["rounds"]
        assert only["latency_ms"]["count"] == only["messages"] == 5_000
        assert 0 < side["p50_ms_median"] <= side["p99_ms_median"] <= side["p99_9_ms_median"]
    assert res["krill_over_kafka_fsync_p99"] > 0


def test_consume_cold_and_warm_beside_kafka_and_tansu(tmp_path: Path) -> None:
    res = run_consume(case_args(tmp_path, messages=6_000))

    assert res["error"] is None, res["error"]
    for name, side in res["sides"].items():
        for how in ("cold", "warm"):
            assert side[how]["verified"] is True and side[how]["messages"] == 6_000, name
    for name in ("krill", "kafka_fsync"):  # on disk: dropped from the page cache first
        assert res["sides"][name]["cold"]["cached_bytes_left_before"] == 0
    assert res["sides"]["tansu"]["cold"]["cached_bytes_left_before"] is None
    assert res["krill_over_kafka_fsync_cold_msgs_per_s"] > 0


@pytest.mark.spark
def test_spark_kafka_source_reading_krill_beside_reading_kafka(tmp_path: Path) -> None:
    # In a process of its own: its Spark session is its own, not the one the Spark tests
    # share when they run in this process (stopping it would stop theirs).
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--case", "vs_kafka_spark_source",
         "--messages", "20000", "--rounds", "1", "--data-root", str(tmp_path), "--out", "-"],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])

    assert res["case"] == "vs_kafka_spark_source" and res["error"] is None, res["error"]
    assert set(res["ways"]) == {"kafka_source_from_krill", "kafka_source_from_kafka",
                                "krill_source_from_krill"}
    assert all(way["rows_per_s"] > 0 for way in res["ways"].values())
    assert res["kafka_source_krill_over_kafka_rows_per_s"] > 0
    assert res["spark_rss_peak_mib"] > 0
    assert res["target_met"]["kafka_source_krill_ge_0_8x_kafka"] is not None
