"""Benchmark of the Spark sink: batch writes of a cached DataFrame into Krill.

    .venv/bin/python -m bench.spark_writer [--records 1000000] [--rounds 3]

Starts a node (2 shards where there are 2 cores), caches `--records` rows of issue 18's shape
(16-byte binary keys, 100-byte binary values) in a `local[2]` Spark session over 2 tasks, and
writes them with `df.write.format("krill")` into a topic of 4 partitions (by key), once
uncounted (Python workers started, modules imported), then `--rounds` times exactly once (the
sink's default: a transaction per task, committed by the driver) and as many times at least
once (`krill.deliveryGuarantee=at-least-once`), interleaved ABBA. Prints one JSON line on
stdout (progress on stderr): `rows_per_s` (the median exactly-once round),
`at_least_once_rows_per_s` and their ratio, `cpu_us_per_row` (the JVM and its Python workers),
`spark_rss_peak_mib` (peak RSS of Spark's process tree, the JVM and its Python workers,
sampled every 0.1 s over the counted rounds) and `target_met`.
Target (issue 18): >= 300k rows/s, < 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker import RssSampler, log, tree_cpu_seconds
from bench.report import finish, header
from tests.support.broker import BrokerProcess

TOPIC = "spark-sink-bench"
PARTITIONS = 4
TASKS = 2
ROWS_PER_S_MIN = 300_000
RSS_MIB_MAX = 2048


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from wire.spark import register

    spark = (SparkSession.builder.master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def source_rows(spark: Any, records: int) -> Any:
    """`records` rows, 16-byte keys and 100-byte values, cached over TASKS partitions."""
    df = spark.range(records, numPartitions=TASKS).selectExpr(
        "unhex(lpad(hex(id), 32, '0')) AS key",
        "CAST(concat(lpad(CAST(id AS STRING), 20, '0'), repeat('v', 80)) AS BINARY) AS value",
    ).cache()
    assert df.count() == records
    return df


EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"


def write_once(spark: Any, df: Any, broker: BrokerProcess, records: int,
               guarantee: str = EXACTLY_ONCE) -> tuple[float, float]:
    """One write of `df`: (rows/s, CPU µs per row of the JVM and its Python workers)."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    jvm = int(gateway.proc.pid)
    started, cpu = time.perf_counter(), tree_cpu_seconds(jvm)
    (df.write.format("krill").mode("append").option("krill.bootstrap", broker.bootstrap)
     .option("topic", TOPIC).option("krill.deliveryGuarantee", guarantee).save())
    cpu = tree_cpu_seconds(jvm) - cpu
    return records / (time.perf_counter() - started), cpu / records * 1e6


def case_spark_writer(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    res = header("spark_writer", args)
    res.update(records=args.records, rounds=args.rounds, key_bytes=16, value_bytes=100,
               partitions=PARTITIONS, tasks=TASKS)
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        res["smp"] = broker.smp
        spark = spark_session()
        try:
            create_topic(broker, TOPIC, PARTITIONS)
            df = source_rows(spark, args.records)
            log(f"spark_writer: warm-up write of {args.records} rows")
            write_once(spark, df, broker, args.records)
            gateway = spark.sparkContext._gateway
            assert gateway is not None
            runs: dict[str, list[tuple[float, float]]] = {EXACTLY_ONCE: [], AT_LEAST_ONCE: []}
            with RssSampler(int(gateway.proc.pid)) as rss:
                for round_number in range(args.rounds):
                    order = [EXACTLY_ONCE, AT_LEAST_ONCE]
                    for guarantee in order if round_number % 2 == 0 else order[::-1]:
                        run = write_once(spark, df, broker, args.records, guarantee)
                        runs[guarantee].append(run)
                        log(f"spark_writer: round {round_number + 1} {guarantee}: "
                            f"{run[0]:,.0f} rows/s, {run[1]:.2f} CPU µs/row")
        finally:
            spark.stop()
            broker.stop()
    exactly, least = runs[EXACTLY_ONCE], runs[AT_LEAST_ONCE]
    res["rows_per_s"] = round(statistics.median(r[0] for r in exactly))
    res["rows_per_s_rounds"] = [round(r[0]) for r in exactly]
    res["cpu_us_per_row"] = round(statistics.median(r[1] for r in exactly), 2)
    res["at_least_once_rows_per_s"] = round(statistics.median(r[0] for r in least))
    res["at_least_once_rows_per_s_rounds"] = [round(r[0]) for r in least]
    res["at_least_once_cpu_us_per_row"] = round(statistics.median(r[1] for r in least), 2)
    res["exactly_over_at_least_once"] = round(res["rows_per_s"]
                                              / res["at_least_once_rows_per_s"], 3)
    res["spark_rss_peak_mib"] = round(rss.peak_mib, 1)
    res["target_met"] = (res["rows_per_s"] >= ROWS_PER_S_MIN
                         and res["spark_rss_peak_mib"] < RSS_MIB_MAX)
    return finish(res, started)


def from_bench_run(case: str, quick: bool) -> dict[str, Any]:
    """`python -m bench.run --case spark_writer`: 1M rows, 3 rounds; --quick: 200k, 2."""
    assert case == "spark_writer", case
    args = argparse.Namespace(records=200_000 if quick else 1_000_000,
                              rounds=2 if quick else 3, smp=None, quick=quick)
    return case_spark_writer(args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.smp, args.quick = None, False  # bench.run's line header
    print(json.dumps(case_spark_writer(args)), flush=True)


if __name__ == "__main__":
    main()
