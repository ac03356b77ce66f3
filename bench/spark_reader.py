"""Benchmark of the Spark reader: the endpoint alone, and a Spark batch read into `noop`.

    .venv/bin/python -m bench.spark_reader [--records 1000000] [--value-bytes 100]

Starts a node (2 shards where there are 2 cores), produces the records with confluent-kafka
over 2 partitions, then measures
  1. the reader endpoint alone: raw batches fetched by one Python client, no decoding (MB/s);
  2. a Spark batch read (`local[2]`) of every record into the `noop` sink (rows/s), with the
     peak RSS of this process tree (the Spark JVM and its Python workers; the node is not in
     it).
Targets (issue 5): >= 500 MB/s, >= 500k rows/s, < 2 GiB.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.broker import RssSampler, log
from tests.support.broker import BrokerProcess
from wire.spark.client import ReaderClient
from wire.spark.protocol import fetch_bytes_max

TOPIC = "spark-bench"
PARTITIONS = 2


def produce(broker: BrokerProcess, records: int, value_bytes: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
                         "acks": 1})
    value = b"x" * value_bytes
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def endpoint_mb_per_s(address: str, rounds: int = 3) -> tuple[float, int]:
    """Fetch every partition end to end `rounds` times with one client; the best MB/s."""
    best, total = 0.0, 0
    with ReaderClient(address) as client:
        for _ in range(rounds):
            total = 0
            started = time.perf_counter()
            for partition in range(PARTITIONS):
                offset = 0
                while True:
                    got = client.fetch(TOPIC, partition, offset, fetch_bytes_max)
                    if not len(got.records):
                        break
                    total += len(got.records)
                    offset = _next_offset(got.records)
            best = max(best, total / (time.perf_counter() - started) / 1e6)
    return best, total


def _next_offset(view: memoryview) -> int:
    from wire.record_batch import batch_length_at, read_header

    position, last = 0, 0
    while True:
        size = batch_length_at(view, position)
        if size is None or position + size > len(view):
            return last
        last = read_header(view, position).next_offset
        position += size


def spark_rows_per_s(address: str, records: int) -> tuple[float, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from wire.spark import register

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        def once() -> float:
            df = (spark.read.format("krill").option("krill.bootstrap", address)
                  .option("subscribe", TOPIC).load())
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            return records / (time.perf_counter() - started)

        with RssSampler(os.getpid()) as rss:
            once()  # warm: Python workers started, modules imported
            best = max(once(), once())
        return best, rss.peak_mib
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            log(f"producing {args.records} records of {args.value_bytes} bytes")
            produce(broker, args.records, args.value_bytes)
            mb_s, total = endpoint_mb_per_s(broker.reader_address)
            log(f"reader endpoint, one client, raw batches: {mb_s:.0f} MB/s "
                f"({total / 1e6:.0f} MB per pass)")
            rows_s, peak = spark_rows_per_s(broker.reader_address, args.records)
            log(f"Spark batch read into noop (local[2]): {rows_s / 1000:.0f}k rows/s, "
                f"peak RSS of Spark (JVM + Python workers) {peak:.0f} MiB")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
