"""Benchmark of the Spark reader: the endpoint alone, and Spark batch reads into `noop`.

    .venv/bin/python -m bench.spark_reader [--case plain] [--case realistic]
        [--records 1000000] [--value-bytes 100] [--rounds 5] [--no-compare]

Starts a node (2 shards where there are 2 cores), runs the cases and prints one JSON line per
case on stdout (progress on stderr):

  plain      issue 5's records: values only, produced over 2 partitions. The reader endpoint
             alone (raw batches fetched by one Python client, MB/s) and a Spark batch read of
             every record into `noop` (rows/s).
  realistic  issue 18's records: keys `k<i>`, 100-byte values, two headers on every third
             record, produced by confluent-kafka with linger.ms=20 over 4 partitions (by key).
             Spark reads them into `noop` without and with includeHeaders with the
             vectorised decoder (Spark's memory is measured then), then, unless
             --no-compare, with it and the per-record one (KRILL_SPARK_DECODER=records) in
             turns, in the same warm session (the speedups). The targets are met or not by
             the median of every vectorised read of both phases. Also the decode alone: the
             same fetched bytes through `RowBuilder` in this process, both ways.

Spark is `local[2]` and warm: each way of reading is done once uncounted (Python workers
started, modules imported), then --rounds times, the ways in turns; figures are medians.
Besides rows/s each way has its CPU per row (`cpu_us_per_row`: the JVM and its Python
workers for Spark reads, this process for the decode alone), which shared cores disturb less
than wall time. Memory is the peak RSS of Spark's process tree (the JVM and its Python
workers; not the node, not this process), sampled every 0.1 s while only the vectorised
decoder reads.
Targets: plain (issue 5): >= 500 MB/s, >= 500k rows/s, < 2 GiB. realistic (issue 18):
>= 600k rows/s without headers, >= 400k rows/s with includeHeaders, < 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench.broker import RssSampler, log, tree_cpu_seconds
from bench.report import finish, header
from tests.support.broker import BrokerProcess
from wire.spark.arrow import DECODER_ENV
from wire.spark.client import ReaderClient
from wire.spark.protocol import fetch_bytes_max

PLAIN_TOPIC = "spark-bench"
PLAIN_PARTITIONS = 2
REALISTIC_TOPIC = "spark-bench-realistic"
REALISTIC_PARTITIONS = 4
# KRILL_SPARK_DECODER's values: the vectorised decoder, the per-record one.
DECODERS = ("vector", "records")

PLAIN_ROWS_PER_S_MIN = 500_000
ENDPOINT_MB_PER_S_MIN = 500
REALISTIC_ROWS_PER_S_MIN = 600_000
REALISTIC_HEADERS_ROWS_PER_S_MIN = 400_000
SPARK_RSS_MIB_MAX = 2048


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def produce_plain(broker: BrokerProcess, records: int, value_bytes: int) -> None:
    from confluent_kafka import Producer

    create_topic(broker, PLAIN_TOPIC, PLAIN_PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
                         "acks": 1})
    value = b"x" * value_bytes
    for i in range(records):
        _produce(producer, PLAIN_TOPIC, value=value, partition=i % PLAIN_PARTITIONS)
    assert producer.flush(120) == 0


def produce_realistic(broker: BrokerProcess, records: int, value_bytes: int) -> None:
    """Issue 18's records: as a user's producer sends them, librdkafka's defaults but
    linger.ms, partitions chosen by key."""
    from confluent_kafka import Producer

    create_topic(broker, REALISTIC_TOPIC, REALISTIC_PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    value = b"v" * value_bytes
    headers = [("trace-id", b"4bf92f3577b34da6a3ce929d0e0e4736"), ("source", b"bench")]
    for i in range(records):
        _produce(producer, REALISTIC_TOPIC, key=b"k%d" % i, value=value,
                 headers=headers if i % 3 == 0 else None)
    assert producer.flush(120) == 0


def _produce(producer: Any, topic: str, **fields: Any) -> None:
    while True:
        try:
            producer.produce(topic, **fields)
            return
        except BufferError:
            producer.poll(0.05)


def fetch_all(address: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every fetch reply of every partition, end to end, as raw batches."""
    fetched: dict[int, list[bytes]] = {}
    with ReaderClient(address) as client:
        for partition in range(partitions):
            offset, replies = 0, []
            while True:
                got = client.fetch(topic, partition, offset, fetch_bytes_max)
                if not len(got.records):
                    break
                replies.append(bytes(got.records))
                offset = _next_offset(got.records)
            fetched[partition] = replies
    return fetched


def endpoint_mb_per_s(address: str, rounds: int = 3) -> tuple[float, int]:
    """Fetch every partition end to end `rounds` times with one client; the best MB/s."""
    best, total = 0.0, 0
    for _ in range(rounds):
        started = time.perf_counter()
        fetched = fetch_all(address, PLAIN_TOPIC, PLAIN_PARTITIONS)
        total = sum(len(reply) for replies in fetched.values() for reply in replies)
        best = max(best, total / (time.perf_counter() - started) / 1e6)
    return best, total


def _next_offset(view: bytes | memoryview) -> int:
    from wire.record_batch import batch_length_at, read_header

    position, last = 0, 0
    while True:
        size = batch_length_at(view, position)
        if size is None or position + size > len(view):
            return last
        last = read_header(view, position).next_offset
        position += size


class Run(NamedTuple):
    rows_per_s: float
    cpu_us_per_row: float  # CPU of whatever did the reading, per row


def decode_alone(fetched: dict[int, list[bytes]], include_headers: bool, decoder: str) -> Run:
    """`RowBuilder` alone over fetched replies, as an executor's task runs it."""
    from wire.spark.arrow import RowBuilder

    rows = 0
    started, cpu = time.perf_counter(), time.process_time()
    for partition, replies in fetched.items():
        builder = RowBuilder(REALISTIC_TOPIC, partition, 0, _next_offset(replies[-1]),
                             include_headers, vectorised=decoder == "vector")
        for reply in replies:
            builder.add(memoryview(reply))
            rows += builder.build().num_rows
    cpu = time.process_time() - cpu
    return Run(rows / (time.perf_counter() - started), cpu / rows * 1e6)


class SparkReads:
    """One `local[2]` session; reads of a topic into `noop`, timed, with either decoder."""

    def __init__(self, address: str, kafka_connector: bool = False) -> None:
        """`kafka_connector`: Spark's own Kafka source on the classpath too (bench/peers)."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        self.address = address
        builder = (SparkSession.builder.master("local[2]")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.memory", "1g"))
        if kafka_connector:
            from bench.peers.fetch import spark_kafka_jars

            builder = builder.config("spark.jars", ",".join(map(str, spark_kafka_jars())))
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("ERROR")
        self._decoder: str | None = None

    @property
    def jvm_pid(self) -> int:
        gateway = self.spark.sparkContext._gateway
        assert gateway is not None
        return int(gateway.proc.pid)

    def read(self, topic: str, records: int, include_headers: bool = False,
             decoder: str = "vector") -> Run:
        """Every record of `topic` into `noop`; CPU is the JVM's and its Python workers'."""
        if decoder != self._decoder:
            # Workers take the environment the data source is registered with; another
            # environment is another pool of Python workers, so each decoder keeps its own.
            from wire.spark import register

            self.spark.sparkContext.environment[DECODER_ENV] = decoder
            register(self.spark)
            self._decoder = decoder
        df = (self.spark.read.format("krill").option("krill.bootstrap", self.address)
              .option("subscribe", topic)
              .option("includeHeaders", str(include_headers).lower()).load())
        started, cpu = time.perf_counter(), tree_cpu_seconds(self.jvm_pid)
        df.write.format("noop").mode("overwrite").save()
        cpu = tree_cpu_seconds(self.jvm_pid) - cpu
        return Run(records / (time.perf_counter() - started), cpu / records * 1e6)

    def read_kafka(self, bootstrap: str, topic: str, records: int) -> Run:
        """Every record of `topic` into `noop` through Spark's own Kafka source."""
        df = (self.spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("endingOffsets", "latest").load())
        started, cpu = time.perf_counter(), tree_cpu_seconds(self.jvm_pid)
        df.write.format("noop").mode("overwrite").save()
        cpu = tree_cpu_seconds(self.jvm_pid) - cpu
        return Run(records / (time.perf_counter() - started), cpu / records * 1e6)

    def stop(self) -> None:
        self.spark.stop()


def in_turns(ways: dict[str, Callable[[], Run]], rounds: int) -> dict[str, list[Run]]:
    """Each way once uncounted, then `rounds` turns of all ways (so load hits them alike)."""
    for way in ways.values():
        way()
    runs: dict[str, list[Run]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            runs[name].append(way())
    return runs


def medians(runs: dict[str, list[Run]]) -> dict[str, dict[str, Any]]:
    return {name: {"rows_per_s": round(statistics.median(r.rows_per_s for r in some)),
                   "cpu_us_per_row": round(statistics.median(r.cpu_us_per_row for r in some), 2),
                   "rows_per_s_runs": [round(r.rows_per_s) for r in some]}
            for name, some in runs.items()}


def _way(headers: bool, decoder: str) -> str:
    return decoder + ("_headers" if headers else "")


def case_plain(broker: BrokerProcess, reads: SparkReads, args: argparse.Namespace
               ) -> dict[str, Any]:
    res = header("spark_reader_plain", args)
    started = time.monotonic()
    log(f"plain: producing {args.records} records of {args.value_bytes} bytes")
    produce_plain(broker, args.records, args.value_bytes)
    mb_s, total = endpoint_mb_per_s(broker.reader_address)
    log(f"reader endpoint, one client, raw batches: {mb_s:.0f} MB/s "
        f"({total / 1e6:.0f} MB per pass)")
    with RssSampler(reads.jvm_pid) as rss:
        spark = medians(in_turns({"vector": lambda: reads.read(PLAIN_TOPIC, args.records)},
                                 args.rounds))["vector"]
    log(f"plain: Spark batch read into noop (local[2]): {spark['rows_per_s'] / 1000:.0f}k "
        f"rows/s ({spark['cpu_us_per_row']} us of CPU a row), peak RSS of Spark (JVM + "
        f"Python workers) {rss.peak_mib:.0f} MiB")
    res.update({
        "records": args.records, "value_bytes": args.value_bytes,
        "partitions": PLAIN_PARTITIONS, "endpoint_mb_per_s": round(mb_s), **spark,
        "spark_rss_peak_mib": round(rss.peak_mib),
        "target_met": {
            "endpoint_mb_per_s": mb_s >= ENDPOINT_MB_PER_S_MIN,
            "rows_per_s": spark["rows_per_s"] >= PLAIN_ROWS_PER_S_MIN,
            "spark_rss_peak_mib": rss.peak_mib < SPARK_RSS_MIB_MAX,
        },
    })
    return finish(res, started)


def case_realistic(broker: BrokerProcess, reads: SparkReads, args: argparse.Namespace
                   ) -> dict[str, Any]:
    res = header("spark_reader_realistic", args)
    started = time.monotonic()
    log(f"realistic: producing {args.records} records (keys, {args.value_bytes}-byte values, "
        "two headers on every third)")
    produce_realistic(broker, args.records, args.value_bytes)
    decoders = DECODERS if args.compare else DECODERS[:1]
    decode = _decode_alone(broker, decoders, args.rounds)

    def spark(headers: bool, decoder: str) -> Callable[[], Run]:
        return lambda: reads.read(REALISTIC_TOPIC, args.records, headers, decoder)

    # Memory: the vectorised decoder alone, so that Spark's memory is its own.
    with RssSampler(reads.jvm_pid) as rss:
        alone = in_turns({_way(h, "vector"): spark(h, "vector") for h in (False, True)},
                         args.rounds)
    _log_figures("Spark into noop", medians(alone))
    log(f"realistic: peak RSS of Spark (JVM + Python workers) {rss.peak_mib:.0f} MiB")
    both: dict[str, list[Run]] = {}
    compared: dict[str, Any] = {}
    if args.compare:
        # Before and after in turns, in the same session and under the same load.
        both = in_turns({_way(h, d): spark(h, d) for h in (False, True) for d in DECODERS},
                        args.rounds)
        _log_figures("in turns, Spark into noop", medians(both))
        compared["spark_in_turns"] = medians(both)
        compared["speedup"] = {
            f"{what}{suffix}": round(figures[f"vector{suffix}"]["rows_per_s"]
                                     / figures[f"records{suffix}"]["rows_per_s"], 2)
            for what, figures in (("spark", medians(both)), ("decode", decode))
            for suffix in ("", "_headers")
        }
    # The targets: every vectorised read, of both phases (the machine is shared; more runs).
    spark_figures = medians({way: runs + both.get(way, []) for way, runs in alone.items()})
    _log_figures("Spark into noop, every vectorised read", spark_figures)
    rows_s = spark_figures["vector"]["rows_per_s"]
    rows_s_headers = spark_figures["vector_headers"]["rows_per_s"]
    res.update({
        "records": args.records, "value_bytes": args.value_bytes,
        "partitions": REALISTIC_PARTITIONS, "rows_per_s": rows_s,
        "rows_per_s_headers": rows_s_headers, "spark": spark_figures,
        "spark_rss_peak_mib": round(rss.peak_mib), "decode_alone": decode,
        "target_met": {
            "rows_per_s": rows_s >= REALISTIC_ROWS_PER_S_MIN,
            "rows_per_s_headers": rows_s_headers >= REALISTIC_HEADERS_ROWS_PER_S_MIN,
            "spark_rss_peak_mib": rss.peak_mib < SPARK_RSS_MIB_MAX,
        },
        **compared,
    })
    return finish(res, started)


def _decode_alone(broker: BrokerProcess, decoders: tuple[str, ...], rounds: int
                  ) -> dict[str, dict[str, Any]]:
    fetched = fetch_all(broker.reader_address, REALISTIC_TOPIC, REALISTIC_PARTITIONS)

    def decode(headers: bool, decoder: str) -> Callable[[], Run]:
        return lambda: decode_alone(fetched, headers, decoder)

    figures = medians(in_turns({_way(h, d): decode(h, d) for h in (False, True)
                                for d in decoders}, rounds))
    _log_figures("decode alone", figures)
    return figures


def _log_figures(what: str, figures: dict[str, dict[str, Any]]) -> None:
    for name, figure in figures.items():
        log(f"realistic: {what}, {name}: {figure['rows_per_s'] / 1000:.0f}k rows/s, "
            f"{figure['cpu_us_per_row']} us of CPU a row")


CASES = {"plain": case_plain, "realistic": case_realistic}


def run_cases(names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The cases `names` against one fresh node and one Spark session, their figures."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        args.smp = broker.smp
        reads = SparkReads(broker.reader_address)
        try:
            for name in names:
                results.append(CASES[name](broker, reads, args))
        finally:
            reads.stop()
            broker.stop()
    return results


def from_bench_run(case: str, quick: bool) -> dict[str, Any]:
    """`python -m bench.run --case spark_reader_plain|spark_reader_realistic`: the defaults
    below, a fifth of the records and two rounds with `--quick`."""
    args = argparse.Namespace(records=200_000 if quick else 1_000_000, value_bytes=100,
                              rounds=2 if quick else 5, compare=True, smp=None, quick=quick)
    return run_cases([case.removeprefix("spark_reader_")], args)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="repeatable; default: all")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="leave out the per-record decoder")
    args = parser.parse_args()
    args.smp, args.quick = None, False  # bench.run's line header
    for figures in run_cases(args.case or list(CASES), args):
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
