"""What the shard runtime hands its actors: settings, the topic table, partition lookup, I/O.

Actors know no shard (DESIGN.md §1): they reach partitions, the controller, the clock and the
blocking-I/O pool through this interface, which the shard runtime implements. A test can
implement it with plain objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from actors.metrics import ShardMetrics
    from actors.watermarks import Published, Waiter
    from storage.appender import ChunkPool
    from storage.free_space import FreeSpaceGuard

__all__ = [
    "BrokerSettings", "LongPolls", "Memory", "TopicInfo", "TopicTable", "Services", "now_ms",
    "set_wall_clock",
]


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The node's settings that actors need, copied from the node configuration."""

    node_id: int
    advertised_host: str
    advertised_port: int
    data_dir: str
    cluster_id: str
    auto_create_topics: bool = True
    default_partitions: int = 1
    message_max_bytes: int = 1048588
    segment_bytes: int = 128 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    log_retention_ms: int = 7 * 24 * 3600 * 1000  # retention.ms unless a topic sets it
    retention_bytes: int = -1  # retention.bytes unless a topic sets it
    log_cleanup_interval_ms: int = 10_000  # how often retention and compaction look
    shards: int = 1  # shard processes of this node (partition owners: shards.shard_table)
    offsets_topic_partitions: int = 50  # partitions of __consumer_offsets (Kafka's default)
    group_initial_rebalance_delay_ms: int = 3000  # Kafka's group.initial.rebalance.delay.ms
    group_offset_retention_sec: int = 7 * 24 * 3600  # offsets of a group Empty this long go
    group_offset_retention_check_ms: int = 600_000  # how often the coordinator looks
    partitions_max: int = 100_000  # partitions the node may own (topic_partitions_per_shard)
    transaction_max_timeout_ms: int = 900_000  # Kafka's transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000  # idle ids are forgotten
    replica_lag_time_max_ms: int = 30_000  # a follower this long behind leaves the ISR
    trace_produce_every: int = 0  # one produce request in this many traced (actors/trace.py)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: bytes  # 16 bytes, a random UUID fixed at creation
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # only the keys set explicitly
    internal: bool = False


@dataclass(frozen=True, slots=True)
class TopicTable:
    """An immutable snapshot of every topic; replaced whole when a topic changes."""

    topics: dict[str, TopicInfo] = field(default_factory=dict)
    version: int = 0

    def by_id(self, topic_id: bytes) -> TopicInfo | None:
        for info in self.topics.values():
            if info.topic_id == topic_id:
                return info
        return None


class Memory(Protocol):
    """The shard's budget of bytes in flight (see shards/memory.py)."""

    def acquire(self, nbytes: int) -> None: ...
    def release(self, nbytes: int) -> None: ...
    def over(self) -> bool: ...
    def when_under(self, callback: Callable[[], None]) -> None: ...


class LongPolls(Protocol):
    """The shard's watermark table (actors/watermarks.py), across shards: partitions publish
    into it, long-poll fetches wait on it. A partition is its key, (topic, index). Loop
    thread only."""

    def publish(self, key: tuple[str, int], state: Published) -> None:
        """A partition of this shard changed its high watermark (or log start, or epoch)."""
        ...

    def gone(self, key: tuple[str, int]) -> None:
        """A partition of this shard stopped (deleted, or the shard stops)."""
        ...

    def withdraw(self, key: tuple[str, int], state: Published | None) -> None:
        """A partition that last published `state` stops publishing (it no longer leads, or
        stops): `gone`, unless another incarnation's partition published since."""
        ...

    def idle_read(self, key: tuple[str, int], offset: int, epoch: int) -> Published | None:
        """A local partition's published state if a read at `offset` finds nothing; else
        None (ask the partition)."""
        ...

    def watch(self, key: tuple[str, int], seen: int, waiter: Waiter) -> bool:
        """Wake `waiter` once the partition's high watermark passes `seen` (unless it is
        cancelled first); False if it already has (nothing registered)."""
        ...


class Services(Protocol):
    settings: BrokerSettings
    memory: Memory
    long_polls: LongPolls
    metrics: ShardMetrics | None  # None: `disable_metrics`, record nothing
    # The shard's free-space guard (storage_min_free_bytes); None: no guard (unit tests).
    disk_space: FreeSpaceGuard | None
    # Direct mode's write memory (storage/appender.py); None: buffered mode.
    chunks: ChunkPool | None

    def topics(self) -> TopicTable:
        """The current topic table snapshot."""
        ...

    def partition(self, topic: str, index: int) -> Any:
        """The actor owning that partition (an ActorRef, or a stand-in with `tell()` when
        another shard owns it), or None if it does not exist."""
        ...

    def partition_writer(self, topic: str, index: int) -> Any:
        """Something whose `tell()` reaches the partition's leader replica wherever it is:
        this shard's actor, another shard's, or (in a cluster) another node's; None when no
        leader is known. For the transaction coordinator's `WriteTxnMarker`s."""
        ...

    def controller(self) -> Any:
        """The actor owning cluster metadata (topics, producer ids)."""
        ...

    def group_coordinator(self, group_id: str) -> Any:
        """The GroupCoordinator owning `group_id` (the owner of its `__consumer_offsets`
        partition), or None if it cannot be reached from here."""
        ...

    def group_coordinators(self) -> list[Any]:
        """Every shard's GroupCoordinator (ListGroups asks them all)."""
        ...

    def local_group_coordinator(self) -> Any:
        """This shard's GroupCoordinator (None before it starts): a `__consumer_offsets`
        partition led here tells it of the transaction markers it commits."""
        ...

    def run_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Run `fn` on the I/O pool; call `done(result, error)` back on the loop thread.
        For what acks wait on: fdatasync, metadata writes."""
        ...

    def read_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """The same on the read pool, for bulk reads from the disk (a cold read brought into
        the page cache): they never hold up an fdatasync behind them."""
        ...

    def segments_removed(self, paths: list[str]) -> None:
        """Segment files a partition of this shard took out of its log (retention,
        compaction): other shards drop the fds they keep open for them."""
        ...

    def clean_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """The same on the shard's cleaner thread: compaction, one clean at a time."""
        ...

    def connection_closed(self) -> None:
        """A Connection actor closed its socket (the shard counts what it accepted)."""
        ...

    frame_scratch: bytearray  # what every connection of the shard receives into (wire/frame.py)

    def frame_buffer(self, nbytes: int) -> Any:
        """A reusable buffer to receive a large produce frame into (`view`, `retain()`,
        `release()`; see shards/arena.py), or None: the frame gets a fresh bytearray."""
        ...


# The wall clock every actor reads (record timestamps, group session deadlines, retention).
# A simulation (scenarios/sim/) puts its virtual clock here, so that time agrees with its
# event loop's; everything else leaves it alone.
_wall_clock_ns: Callable[[], int] = time.time_ns


def set_wall_clock(clock_ns: Callable[[], int] | None) -> None:
    """Make `now_ms()` read `clock_ns` (nanoseconds since the epoch); None: the real clock."""
    global _wall_clock_ns
    _wall_clock_ns = time.time_ns if clock_ns is None else clock_ns


def now_ms() -> int:
    return _wall_clock_ns() // 1_000_000
