"""What a shard counts while it serves: plain numbers, read out when the node is scraped.

Recording sits on the hot path, so it costs what a counter increment costs: an attribute
`+=` on an object the recorder holds. Histograms are observed once per request, flush or
batch, never per record: a bisect into fixed bucket bounds and one list increment. Nothing
here formats or sends anything: the shard snapshots these objects when the supervisor asks
(shards/stats.py), and the supervisor renders Prometheus text (shards/admin.py).

Actors that keep state worth reporting (the group coordinator's committed offsets) register
a collector, a function the shard calls on its loop thread at snapshot time, the way Seastar
metrics are lambdas over their owner's state.

With `disable_metrics: true` the shard hands actors no `ShardMetrics` (None) and they record
nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

__all__ = [
    "FLUSH_BYTES_BUCKETS",
    "Histogram",
    "LifecycleCounts",
    "LATENCY_BUCKETS_S",
    "PartitionStats",
    "PRODUCE_STAGES",
    "ShardMetrics",
    "STAGE_BUCKETS_S",
]

# Request and fdatasync latency, seconds: 100 µs to 10 s, about 2.5 per decade.
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)
# Bytes one fdatasync made durable: 1 KiB to 64 MiB, by fours.
FLUSH_BYTES_BUCKETS = tuple(float(1024 * 4**i) for i in range(9))
# A traced produce's stages (actors/trace.py), and their buckets: finer at the low end than
# the request latencies, a stage often takes tens of microseconds.
PRODUCE_STAGES = ("decode", "route", "append", "flush_wait", "flush", "replicate", "answer")
STAGE_BUCKETS_S = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
)


class Histogram:
    """Counts per bucket (the last one open-ended), their sum and their number."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> list[Any]:
        return [list(self.counts), self.sum]


class PartitionStats:
    """What one partition of this shard took in (appended) and gave out (fetched from here).

    `produced_*` are counted by the partition's owner; `fetched_*` by the shard whose
    connection sent the bytes, whoever owns the partition."""

    __slots__ = ("produced_bytes", "produced_records", "fetched_bytes", "fetched_records")

    def __init__(self) -> None:
        self.produced_bytes = 0
        self.produced_records = 0
        self.fetched_bytes = 0
        self.fetched_records = 0


class LifecycleCounts:
    """What retention and compaction did on this shard, since it started."""

    __slots__ = ("segments_removed", "bytes_removed", "cleans", "clean_bytes_read",
                 "clean_bytes_written", "clean_records_removed")

    def __init__(self) -> None:
        self.segments_removed = 0  # by retention, or below a DeleteRecords start
        self.bytes_removed = 0
        self.cleans = 0  # compactions that replaced segments
        self.clean_bytes_read = 0
        self.clean_bytes_written = 0
        self.clean_records_removed = 0

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class ShardMetrics:
    """Every metric one shard records. Loop thread only."""

    def __init__(self) -> None:
        self.request_latency: dict[int, Histogram] = {}  # API key -> seconds
        self.fdatasync_latency = Histogram(LATENCY_BUCKETS_S)
        self.flush_bytes = Histogram(FLUSH_BYTES_BUCKETS)
        self.partitions: dict[tuple[str, int], PartitionStats] = {}
        self.connections = 0
        self.connections_accepted = 0
        self.cold_reads = 0  # reads that missed the page cache and were warmed first
        self.fdatasync_errors = 0  # flushes that failed (their logs cut back, acks refused)
        self.write_errors = 0  # segment writes that failed (ENOSPC, EIO), undone
        self.lifecycle = LifecycleCounts()  # retention and compaction (actors/log_lifecycle.py)
        # Traced produces (trace_produce_every, actors/trace.py), by stage.
        self.produce_stages = {stage: Histogram(STAGE_BUCKETS_S) for stage in PRODUCE_STAGES}
        self._collectors: dict[str, Callable[[], Any]] = {}

    def request(self, api_key: int, seconds: float) -> None:
        histogram = self.request_latency.get(api_key)
        if histogram is None:
            histogram = self.request_latency[api_key] = Histogram(LATENCY_BUCKETS_S)
        histogram.observe(seconds)

    def partition(self, topic: str, index: int) -> PartitionStats:
        """The counters of one partition (made on first use; `forget` drops them)."""
        key = (topic, index)
        stats = self.partitions.get(key)
        if stats is None:
            stats = self.partitions[key] = PartitionStats()
        return stats

    def forget(self, topic: str) -> None:
        """A topic was deleted: its partitions' counters go with it."""
        for key in [key for key in self.partitions if key[0] == topic]:
            del self.partitions[key]

    def register(self, name: str, collector: Callable[[], Any]) -> None:
        """Call `collector()` at every snapshot; its value goes out under `name`."""
        self._collectors[name] = collector

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": {key: h.snapshot() for key, h in self.request_latency.items()},
            "fdatasync": self.fdatasync_latency.snapshot(),
            "flush_bytes": self.flush_bytes.snapshot(),
            "partitions": [
                [topic, index, s.produced_bytes, s.produced_records, s.fetched_bytes,
                 s.fetched_records]
                for (topic, index), s in self.partitions.items()
            ],
            "connections": self.connections,
            "connections_accepted": self.connections_accepted,
            "cold_reads": self.cold_reads,
            "fdatasync_errors": self.fdatasync_errors,
            "write_errors": self.write_errors,
            "lifecycle": self.lifecycle.snapshot(),
            "produce_stages": {stage: h.snapshot() for stage, h in self.produce_stages.items()},
            **{name: collect() for name, collect in self._collectors.items()},
        }
