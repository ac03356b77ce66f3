"""Bench cases for the log's lifecycle: retention holding the disk, and what it costs.

- `retention_steady`: a producer at a fixed 5,000 msg/s x 1 KiB (acks=all) into 6 partitions
  with `segment.bytes` 1 MiB and `retention.bytes` 8 MiB, on a node looking every second
  (`--log-cleanup-interval-ms 1000`), beside the same load on a node keeping everything
  (`retention.bytes` -1): rounds interleaved keep, retain, retain, keep (2 with `--quick`).
  The data directory's bytes on disk are sampled every 2 s. Targets: the retained node's
  disk never past the bound (6 x (retention.bytes + 2 segments), plus what arrives in one
  cleanup interval and one file.delete.delay.ms: 2 s at 5 MB/s) and flat over the second half
  of the round (slope < 1 MiB per minute), and the producer's p99 beside retention within
  1.25x of its p99 without.

- `compaction`: 150k records of 1 KiB over 5,000 keys produced as fast as the client can
  into a compacted topic (8 MiB segments, 1 shard, the node looking every second), then a
  producer at a fixed 5,000 msg/s into another topic on the same shard while the cleaner works
  through the first, and again once it is done. Figures: the topic's bytes on disk before and
  after, the cleaner's rate (MB read per second of cleaning, from the node's log), and the
  fixed-rate p99 beside the cleaner over the p99 without it. Checked: every key reads back with
  its last value. Targets: at most 1/10 of the bytes left, p99 ratio <= 1.5.

Every figure is also in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.broker import Broker, log
from bench.clients import produce_fixed_rate
from bench.measure import liveness
from bench.report import CaseError, case_failed, finish, header

__all__ = ["LIFECYCLE_CASES"]

MiB = 1024 * 1024
SEGMENT_BYTES = 1 * MiB
RETENTION_BYTES = 8 * MiB
PARTITIONS = 6
RATE = 5_000
DISK_SAMPLE_S = 2.0
TARGET_DISK_SLOPE_MIB_PER_MIN = 1.0
TARGET_P99_RATIO = 1.25


def disk_bytes(root: Path) -> int:
    """Bytes the files under `root` take on disk (allocated blocks, as `du`)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:  # removed meanwhile (retention)
                pass
    return total


class DiskSampler(threading.Thread):
    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._done.wait(DISK_SAMPLE_S):
            self.samples.append((round(time.monotonic() - t0, 1), disk_bytes(self.root)))

    def stop(self) -> list[tuple[float, int]]:
        self._done.set()
        self.join(10)
        return self.samples


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of the last half of the samples."""
    tail = samples[len(samples) // 2:]
    if len(tail) < 3:
        return None
    xs = [t for t, _ in tail]
    ys = [b / MiB for _, b in tail]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx * 60, 3)


def create(bootstrap: str, name: str, configs: dict[str, str],
           partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    try:
        futures[name].result(30)
    except Exception as e:
        raise CaseError(f"CreateTopics {name}: {e}") from e


def run_retention_steady(args: argparse.Namespace) -> dict[str, Any]:
    res, t0 = header("retention_steady", args), time.monotonic()
    seconds = 10.0 if args.quick else 40.0
    rounds = ["keep", "retain"] if args.quick else ["keep", "retain", "retain", "keep"]
    bound = PARTITIONS * (RETENTION_BYTES + 2 * SEGMENT_BYTES) + RATE * 1024 * 2
    res.update({"rate": RATE, "seconds_per_round": seconds, "partitions": PARTITIONS,
                "segment_bytes": SEGMENT_BYTES, "retention_bytes": RETENTION_BYTES,
                "disk_bound_bytes": bound, "order": rounds})
    sides: dict[str, list[dict[str, Any]]] = {"keep": [], "retain": []}
    try:
        with (
            Broker(smp=args.smp, krill=args.krill, data_root=args.data_root,
                   extra_args=("--log-cleanup-interval-ms", "1000")) as retain,
            Broker(smp=args.smp, krill=args.krill, data_root=args.data_root) as keep,
        ):
            for i, side in enumerate(rounds):
                broker = retain if side == "retain" else keep
                topic = f"r{i}"
                create(broker.bootstrap, topic, {
                    "segment.bytes": str(SEGMENT_BYTES), "file.delete.delay.ms": "1000",
                    "retention.bytes": str(RETENTION_BYTES if side == "retain" else -1)})
                sampler = DiskSampler(Path(broker.data_dir) / "")
                sampler.start()
                phase = produce_fixed_rate(
                    broker.bootstrap, topic, b"v" * 1024, PARTITIONS, rate=RATE,
                    seconds=seconds, stall_timeout=args.stall_timeout, check=liveness(broker),
                    broker_pid=broker.pid)
                during = len(sampler.samples)
                time.sleep(3 * DISK_SAMPLE_S)  # a last housekeeping pass and delete delay
                samples = sampler.stop()
                summary = {"latency_ms": phase["latency_ms"],
                           "achieved_msgs_per_s": phase.get("achieved_msgs_per_s"),
                           "disk_mib_end": round(samples[-1][1] / MiB, 1) if samples else None,
                           "disk_mib_max": round(max(b for _, b in samples) / MiB, 1)
                           if samples else None,
                           "disk_slope_mib_per_min": slope_mib_per_min(samples[:during]),
                           "disk_samples_mib": [round(b / MiB, 1) for _, b in samples]}
                log(f"retention_steady {side}: p99 {phase['latency_ms']['p99']} ms, disk "
                    f"{summary['disk_mib_end']} MiB")
                sides[side].append(summary)
                _drop(broker.bootstrap, topic)
        for side, phases in sides.items():
            res[side] = phases
        p99 = {s: statistics.median(p["latency_ms"]["p99"] for p in sides[s]) for s in sides}
        res["p99_retain_over_keep"] = round(p99["retain"] / p99["keep"], 3)
        retained = sides["retain"]
        res["disk_mib_end_retain"] = [p["disk_mib_end"] for p in retained]
        res["disk_mib_end_keep"] = [p["disk_mib_end"] for p in sides["keep"]]
        met_disk = all(p["disk_mib_max"] is not None and p["disk_mib_max"] * MiB <= bound
                       for p in retained)
        slopes = [p["disk_slope_mib_per_min"] for p in retained]
        met_flat = all(s is not None and s < TARGET_DISK_SLOPE_MIB_PER_MIN for s in slopes)
        res["met"] = {
            "disk_within_bound": met_disk,
            # A 10 s round never fills retention: the slope and the ratio are judged in a
            # full run only.
            "disk_flat": None if args.quick else met_flat,
            "p99_ratio_le_1_25": None if args.quick
            else res["p99_retain_over_keep"] <= TARGET_P99_RATIO,
        }
    except Exception as e:
        case_failed(res, "retention_steady", e)
    return finish(res, t0)


def _drop(bootstrap: str, topic: str) -> None:
    """Delete the round's topic so the next round starts from the same page cache (see
    bench/README.md, metrics_overhead)."""
    from bench.clients import delete_topic

    delete_topic(bootstrap, topic)


# compaction ---------------------------------------------------------------------------------

COMPACT_RECORDS = 150_000
COMPACT_KEYS = 5_000
TARGET_COMPACTED_FRACTION = 0.1
TARGET_CLEANING_P99_RATIO = 1.5
_COMPACTED_LINE = re.compile(
    r"compacted (\d+) segment\(s\) into \d+: (\d+) of (\d+) records removed, ([\d.]+) MB read, "
    r"([\d.]+) MB written in ([\d.]+) s")


def produce_keyed(bootstrap: str, topic: str, count: int, keys: int) -> dict[bytes, bytes]:
    """Produce `count` 1 KiB records round-robin over `keys` keys; the last value per key."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.size": 256 * 1024})
    errors: list[Any] = []
    latest: dict[bytes, bytes] = {}
    for i in range(count):
        key, value = b"key-%d" % (i % keys), b"%d:" % i + b"v" * 1016
        latest[key] = value
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=0,
                                 on_delivery=lambda err, _m: err and errors.append(err))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) or errors:
        raise CaseError(f"keyed produce failed: {errors[:1]}")
    return latest


def read_latest(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-compaction",
                         "enable.auto.commit": False})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: dict[bytes, bytes] = {}
        last, deadline = -1, time.monotonic() + 120
        while last < high - 1 and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    got[msg.key()] = msg.value()
                    last = msg.offset()
        return got
    finally:
        consumer.close()


def cleaner_lines(broker: Broker) -> list[tuple[float, float]]:
    """(MB read, seconds) of every clean the node logged that replaced segments."""
    with open(broker.log_path, errors="replace") as f:
        return [(float(m.group(4)), float(m.group(6))) for m in _COMPACTED_LINE.finditer(f.read())
                if int(m.group(1)) > 0]


def run_compaction(args: argparse.Namespace) -> dict[str, Any]:
    res, t0 = header("compaction", args), time.monotonic()
    count = 30_000 if args.quick else COMPACT_RECORDS
    seconds = 5.0 if args.quick else 15.0
    res.update({"records": count, "keys": COMPACT_KEYS, "value_bytes": 1024,
                "fixed_rate": RATE, "seconds_per_phase": seconds})
    try:
        with Broker(smp=1, krill=args.krill, data_root=args.data_root,
                    extra_args=("--log-cleanup-interval-ms", "1000")) as broker:
            create(broker.bootstrap, "keyed", {"cleanup.policy": "compact",
                                               "segment.bytes": str(8 * MiB)}, partitions=1)
            create(broker.bootstrap, "steady", {}, partitions=PARTITIONS)
            directory = Path(broker.data_dir) / "keyed-0"
            latest = produce_keyed(broker.bootstrap, "keyed", count, COMPACT_KEYS)
            res["disk_mib_before"] = round(disk_bytes(directory) / MiB, 1)
            cleaning = produce_fixed_rate(
                broker.bootstrap, "steady", b"v" * 1024, PARTITIONS, rate=RATE, seconds=seconds,
                stall_timeout=args.stall_timeout, check=liveness(broker), broker_pid=broker.pid)
            cleans_during = len(cleaner_lines(broker))
            deadline = time.monotonic() + 300
            previous = -1
            while time.monotonic() < deadline:  # until a pass finds nothing more to do
                time.sleep(3)
                size = disk_bytes(directory)
                if size == previous:
                    break
                previous = size
            idle = produce_fixed_rate(
                broker.bootstrap, "steady", b"v" * 1024, PARTITIONS, rate=RATE, seconds=seconds,
                stall_timeout=args.stall_timeout, check=liveness(broker), broker_pid=broker.pid)
            res["disk_mib_after"] = round(disk_bytes(directory) / MiB, 1)
            lines = cleaner_lines(broker)
            read_mb, clean_s = sum(mb for mb, _ in lines), sum(s for _, s in lines)
            res["cleans"] = len(lines)
            res["cleans_finished_by_end_of_cleaning_phase"] = cleans_during
            res["cleaner_mb_read"] = round(read_mb, 1)
            res["cleaner_seconds"] = round(clean_s, 2)
            res["cleaner_mb_per_s"] = round(read_mb / clean_s, 1) if clean_s else None
            res["p99_ms_cleaning"] = cleaning["latency_ms"]["p99"]
            res["p99_ms_idle"] = idle["latency_ms"]["p99"]
            res["latency_ms_cleaning"] = cleaning["latency_ms"]
            res["latency_ms_idle"] = idle["latency_ms"]
            res["p99_cleaning_over_idle"] = round(
                cleaning["latency_ms"]["p99"] / idle["latency_ms"]["p99"], 3)
            got = read_latest(broker.bootstrap, "keyed")
            res["keys_read"] = len(got)
            res["latest_values_intact"] = got == latest
            if got != latest:
                raise CaseError(f"compaction lost values: {len(got)} keys read of {len(latest)}")
            fraction = res["disk_mib_after"] / res["disk_mib_before"]
            res["disk_fraction_left"] = round(fraction, 4)
            res["met"] = {
                # 30 MB with --quick: the active 8 MiB segment, never cleaned, is most of
                # what is left, so only a full run judges the fraction.
                "disk_fraction_le_0_1": None if args.quick
                else fraction <= TARGET_COMPACTED_FRACTION,
                "p99_ratio_le_1_5": None if args.quick
                else res["p99_cleaning_over_idle"] <= TARGET_CLEANING_P99_RATIO,
            }
    except Exception as e:
        case_failed(res, "compaction", e)
    return finish(res, t0)


LIFECYCLE_CASES = {"retention_steady": run_retention_steady, "compaction": run_compaction}
