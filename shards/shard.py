"""One shard: the process that runs one core's actors on one event loop.

Started by the supervisor as `python -m shards.shard_process --shard N --shards M ...`,
which pins the process to its core and runs a `Shard`. It binds the actor runtime to its
loop, joins the pipe mesh of the node's shards, and starts its actors: a Partition per
partition it owns (shards/shard_topics.py), a GroupCoordinator, and on shard 0 the
Controller (which owns the topic table and sends every change to all shards) and the Spark
reader endpoint. It accepts Kafka connections on the listening socket the supervisor bound
for it (shards/acceptor.py). Its stats endpoint (shards/stats.py) answers the supervisor's
/metrics and health scrapes. A cluster's node RPC, Raft and controller group are
shards/shard_cluster.py's.

This class also implements `actors.services.Services`: it is how actors reach each other, on
this shard or, through the stand-ins' calls, on another (shards/remote.py), and the I/O
pool, without knowing which shard they are on.

SIGTERM/SIGINT: stop accepting, stop every actor (connections close; partitions flush and
close their logs), then exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import zmq
from pykka import ActorRef, ActorRegistry

from actors.cluster.commands import NodeInfo
from actors.cluster.state import PlacedTopic
from actors.cluster_controller import ClusterController
from actors.connection import Connection
from actors.controller import Controller, load_topic_table
from actors.group import OFFSETS_TOPIC, offsets_partition
from actors.group.coordinator import GroupCoordinator
from actors.metrics import ShardMetrics
from actors.runtime import bind_loop, stop_all_actors
from actors.services import BrokerSettings, TopicTable
from actors.topic_config import TopicSettings
from shards import limits
from shards.acceptor import Acceptor
from shards.arena import ArenaLease, ArenaSet
from shards.calls import segments, topics
from shards.cluster_host import NOT_HOSTED, cluster_id
from shards.config import NodeConfig, reader_advertised
from shards.disk_space import DiskSpaceWatch
from shards.io_pool import IoPool, IoPoolStats
from shards.loop_watch import LoopStats, LoopWatch
from shards.memory import MemoryBudget
from shards.node_mesh import NodeMesh
from shards.pipes import PipeBroken, ZmqPipeMesh
from shards.raft_host import RaftHost
from shards.reader import ReaderEndpoint
from shards.remote import RemoteController, RemoteCoordinator, RemotePartition
from shards.router import Router
from shards.shard_cluster import ClusterShard
from shards.shard_table import shard_of
from shards.shard_topics import TopicsShard
from shards.stats import StatsEndpoint, failure_probes
from shards.threads import demote_helper_threads
from shards.watch import WatchService
from storage import limits as storage_limits
from storage.appender import ChunkPool
from storage.free_space import FreeSpaceGuard
from wire.frame import SCRATCH_BYTES

__all__ = ["EXIT_PIPE_BROKEN", "Shard"]

log = logging.getLogger(__name__)

EXIT_PIPE_BROKEN = 70  # EX_SOFTWARE: a shard stopped itself on a broken invariant


class Shard(ClusterShard, TopicsShard):
    def __init__(
        self,
        config: NodeConfig,
        shard_id: int,
        shards: int,
        run_dir: str,
        arena_fds: list[int] | None = None,
        listen_fd: int | None = None,
        reader_fd: int | None = None,
        rpc_fd: int | None = None,
    ) -> None:
        """`listen_fd`: the Kafka listening socket the supervisor bound for this shard (None:
        it accepts no connections); `reader_fd`: shard 0's Spark reader socket; `rpc_fd`: its
        node RPC socket, in a cluster."""
        self.config = config
        self.shard_id = shard_id
        self.shards = shards
        self.run_dir = run_dir
        host, port = config.advertise
        self.settings = BrokerSettings(
            node_id=config.node_id,
            advertised_host=host,
            advertised_port=port,
            data_dir=str(Path(config.data_dir).resolve()),
            cluster_id=cluster_id(config),
            auto_create_topics=config.auto_create_topics,
            default_partitions=config.default_partitions,
            message_max_bytes=config.message_max_bytes,
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            log_retention_ms=config.log_retention_ms,
            retention_bytes=config.retention_bytes,
            log_cleanup_interval_ms=config.log_cleanup_interval_ms,
            shards=shards,
            offsets_topic_partitions=config.offsets_topic_partitions,
            group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            group_offset_retention_sec=config.group_offset_retention_sec,
            group_offset_retention_check_ms=config.group_offset_retention_check_ms,
            partitions_max=config.topic_partitions_per_shard * shards,
            transaction_max_timeout_ms=config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            trace_produce_every=config.trace_produce_every,
        )
        self.metrics = None if config.disable_metrics else ShardMetrics()
        self.disk_space = FreeSpaceGuard(config.storage_min_free_bytes)
        # Direct mode's write memory and cache of recent batches (storage/appender.py).
        self.chunks = (ChunkPool(storage_limits.direct_chunk_bytes, config.direct_memory_bytes)
                       if config.storage_mode == "direct" else None)
        # One receive buffer for all this shard's connections: they read one at a time.
        self.frame_scratch = bytearray(SCRATCH_BYTES)
        self._listen_fd = listen_fd
        self._reader_fd = reader_fd
        self._acceptor: Acceptor | None = None
        self._stats: StatsEndpoint | None = None
        self._disk_watch: DiskSpaceWatch | None = None
        self._stats_context: zmq.Context[Any] | None = None
        self._ready = False
        self._started = time.time()
        self.exit_code = 0  # what the process exits with once the loop stops
        self.loop = asyncio.new_event_loop()
        # Turn lengths, stalls (logged as they happen) and GC pauses (shards/loop_watch.py).
        loop_stats = None if self.metrics is None else LoopStats()
        self._loop_watch = LoopWatch(self.loop, config.loop_stall_threshold_ms, loop_stats,
                                     f"shard{shard_id}")
        pools = {name: None if self.metrics is None else IoPoolStats()
                 for name in ("io", "read", "cleaner")}
        self._io = IoPool(
            self.loop, limits.io_threads, f"shard{shard_id}-io", limits.io_calls_per_job,
            pools["io"],
        )
        # Bulk reads (cold data brought into the page cache, large Spark reads, removing a
        # deleted partition) on threads of their own, so an fdatasync never waits behind one.
        self._read_io = IoPool(self.loop, limits.read_io_threads, f"shard{shard_id}-read",
                               stats=pools["read"])
        # The shard's log cleaner (compaction): one thread, one clean at a time; it throttles
        # itself, so it never holds up a flush or a cold read.
        self._clean_io = IoPool(self.loop, limits.cleaner_threads, f"shard{shard_id}-cleaner",
                                stats=pools["cleaner"])
        if self.metrics is not None and loop_stats is not None:
            self.metrics.register("loop", loop_stats.snapshot)
            self.metrics.register("io_pools", lambda: {
                name: stats.snapshot() for name, stats in pools.items() if stats is not None})
            if self.chunks is not None:
                self.metrics.register("chunks", self.chunks.stats)
        self._table = TopicTable()
        self.long_polls = WatchService(shard_id, self.owner_of)
        self._partitions: dict[tuple[str, int], ActorRef[Any]] = {}  # owned here
        self._remote_partitions: dict[tuple[str, int], RemotePartition] = {}
        self._topic_settings: dict[str, TopicSettings] = {}
        self._controller: Any = None
        self._group_coordinator: ActorRef[Any] | None = None
        self._mesh: Any = None
        self._router: Router | None = None
        # Every arena of the node with more than one shard; with one, a private arena for
        # large frames only. Either way large produce frames are received into our own.
        self._arenas: ArenaSet | None = None
        if arena_fds:
            self._arenas = ArenaSet.from_fds(shard_id, arena_fds)
        elif shards == 1 and config.pipe_arena_bytes:
            self._arenas = ArenaSet.private(config.pipe_arena_bytes)
        self.memory = MemoryBudget(config.memory_budget_bytes, self._pipe_backlog_bytes)
        self._reader: ReaderEndpoint | None = None  # shard 0 only
        self._stopping = False
        # A cluster (DESIGN.md §7): node RPC, Raft groups, the controller group on shard 0.
        self.cluster = bool(config.seed_nodes)
        self._rpc_fd = rpc_fd
        self._node_mesh: NodeMesh | None = None
        self.raft: RaftHost | None = None
        self._cluster_nodes: dict[int, NodeInfo] = {}  # registered nodes (Metadata's brokers)
        self._controller_leader: int | None = None
        self._controller_actor: ClusterController | None = None
        self._offsets_led: frozenset[int] | None = None  # last told to the coordinator
        if self.cluster:
            self.raft = RaftHost(
                config.node_id, shard_id, self.loop, self.settings.data_dir, self.run_blocking,
                config.raft_election_ticks, 1, config.raft_heartbeat_interval_ms / 1000,
                config.learner_recovery_rate_bytes / self.shards)

    # Services -----------------------------------------------------------------------------

    def topics(self) -> TopicTable:
        return self._table

    def partition(self, topic: str, index: int) -> Any:
        key = (topic, index)
        local = self._partitions.get(key)
        if local is not None:
            return local
        remote = self._remote_partitions.get(key)
        if remote is None and self.cluster:
            info = self._table.topics.get(topic)
            if info is not None and 0 <= index < info.partitions:
                return NOT_HOSTED  # another node's: the client asks its leader
        return remote

    def local_partition(self, topic: str, index: int) -> ActorRef[Any] | None:
        return self._partitions.get((topic, index))

    def frame_buffer(self, nbytes: int) -> ArenaLease | None:
        return None if self._arenas is None else self._arenas.own.lease(nbytes)

    def write_caching(self, topic: str) -> bool:
        """Whether the topic answers produces at append time (`write.caching=true`)."""
        settings = self._topic_settings.get(topic)
        return settings is not None and settings.write_caching

    def owner_of(self, topic: str, index: int) -> int:
        """The shard of this node that holds the partition's replica (in a cluster: the
        replica placed on this node; -1 when none is)."""
        if self.cluster:
            info = self._table.topics.get(topic)
            if isinstance(info, PlacedTopic) and 0 <= index < info.partitions:
                for node, shard in info.replicas[index]:
                    if node == self.config.node_id:
                        return shard
            return -1
        return shard_of(topic, index, self.shards)

    def controller(self) -> Any:
        assert self._controller is not None
        return self._controller

    def group_coordinator(self, group_id: str) -> Any:
        """The coordinator of `group_id`: the one on the shard that owns the group's
        `__consumer_offsets` partition (a stand-in when that is another shard)."""
        info = self._table.topics.get(OFFSETS_TOPIC)
        count = info.partitions if info is not None else self.settings.offsets_topic_partitions
        owner = self.owner_of(OFFSETS_TOPIC, offsets_partition(group_id, count))
        if owner < 0:
            if info is None:  # not made yet: any shard's coordinator makes it
                return self._group_coordinator
            return None  # no replica here: the client finds its coordinator again
        return self._coordinator_on(owner)

    def group_coordinators(self) -> list[Any]:
        """Every shard's coordinator (ListGroups asks them all)."""
        return [self._coordinator_on(shard) for shard in range(self.shards)]

    def local_group_coordinator(self) -> Any:
        return self._group_coordinator

    def _coordinator_on(self, shard: int) -> Any:
        if shard == self.shard_id:
            return self._group_coordinator
        assert self._router is not None
        return RemoteCoordinator(self._router, shard)

    def _owns_offsets_partition(self, index: int) -> bool:
        if self.cluster:  # led here: OffsetsOwnership tells the coordinator as leaders move
            return False
        return self.owner_of(OFFSETS_TOPIC, index) == self.shard_id

    def run_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._io.run(fn, done)

    def read_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._read_io.run(fn, done)

    def segments_removed(self, paths: list[str]) -> None:
        if self._router is not None:
            segments.broadcast_removed(self._router, paths)

    def clean_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._clean_io.run(fn, done)

    # Topic table --------------------------------------------------------------------------

    def publish_topics(self, table: TopicTable, done: Callable[[], None]) -> None:
        """The Controller (shard 0 only) changed the table: apply it here, then on every
        other shard; `done()` once every shard has it."""
        self.on_topics_changed(table)
        if self._router is None:
            done()
        else:
            topics.broadcast(self._router, table, done)

    # Serving ------------------------------------------------------------------------------

    def start(self) -> None:
        bind_loop(self.loop)
        asyncio.set_event_loop(self.loop)
        if self.shards > 1:
            self._mesh = ZmqPipeMesh(
                self.shard_id,
                self.shards,
                self.run_dir,
                self.loop,
                self._on_pipe_message,
                on_backlog=lambda _target, _bytes: self.memory.wake(),
                on_broken=self.pipe_broken,
            )
        if self.cluster:
            self._start_node_rpc()
        elif self._mesh is not None:
            self._router = Router(self, self._mesh, self._arenas)
        if self._router is not None:
            self.long_polls.bind(self._router, lambda t, i: (t, i) in self._partitions)
        if self.shard_id == 0 and self.cluster:
            self._controller = self._start_cluster_controller()
        elif self.shard_id == 0:
            self._controller = Controller.start(
                self.settings, self.publish_topics, self.run_blocking
            )
        else:
            assert self._router is not None
            self._controller = RemoteController(self._router)
            # The table as shard 0 last wrote it (a read-only file); newer versions follow
            # on the pipe from shard 0, in order. (A cluster's comes from its controller
            # group, once shard 0 has replayed its log.)
            if not self.cluster:
                self.on_topics_changed(load_topic_table(self.settings.data_dir))
        self._group_coordinator = GroupCoordinator.start(self, self._owns_offsets_partition)
        if self._listen_fd is not None:
            self._acceptor = Acceptor(self.config, self.shard_id, self.shards, self.loop,
                                      self._listen_fd, lambda sock: Connection.start(sock, self))
        if self._reader_fd is not None:
            self._reader = ReaderEndpoint(
                self, self.loop, self.config.reader_listen, reader_advertised(self.config),
                listening_fd=self._reader_fd,
            )
        self._disk_watch = DiskSpaceWatch(
            self.loop, self.disk_space, self.settings.data_dir, self.read_blocking)
        self._disk_watch.start()
        self._stats_context = zmq.Context(io_threads=1)
        self._stats = StatsEndpoint(
            self.loop, self._stats_context, self.run_dir, self.shard_id, self.snapshot,
            {"probes": partial(
                failure_probes, self.config.enable_failure_injection, self.shard_id)},
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self.stop)
        # ZeroMQ's I/O threads exist now (the pool's get the policy as they start).
        demote_helper_threads(threading.get_native_id())
        host, port = self.config.listen
        log.info(
            "shard %d (pid %d, core %s) serving Kafka on %s:%d, data in %s",
            self.shard_id,
            os.getpid(),
            ",".join(map(str, sorted(os.sched_getaffinity(0)))),
            host,
            port,
            self.settings.data_dir,
        )
        self._ready = True

    def snapshot(self) -> dict[str, Any]:
        """What this shard reports to the supervisor's admin server (shards/stats.py)."""
        router = self._router
        arena = self._arenas.own if self._arenas is not None else None
        return {
            "shard": self.shard_id,
            "pid": os.getpid(),
            "ready": self._ready and not self._stopping,
            "uptime_s": time.time() - self._started,
            "topics_version": self._table.version,
            "topics": [[name, info.partitions] for name, info in self._table.topics.items()],
            "partitions": [
                [topic, index, state.high_watermark, state.log_start_offset]
                for (topic, index), state in self.long_polls.table.published().items()
            ],
            "memory_in_flight": self.memory.in_flight_bytes,
            "memory_backlog": self._pipe_backlog_bytes(),
            "memory_limit": self.memory.limit_bytes,
            "long_poll_watches": self.long_polls.waiting,
            "watch_subscriptions": self.long_polls.subscriptions,
            "watch_subscriptions_served": self.long_polls.served,
            "cross_shard_pending": router.pending_calls if router is not None else 0,
            "arena_used": arena.used if arena is not None else 0,
            "arena_regions": arena.live_regions if arena is not None else 0,
            "io_outstanding": self._io.outstanding,
            "read_io_outstanding": self._read_io.outstanding,
            "connections_refused": self._acceptor.refused if self._acceptor is not None else 0,
            "disk_free_bytes": self.disk_space.free_bytes,
            "disk_alert": int(self.disk_space.alert),
            "metrics": None if self.metrics is None else self.metrics.snapshot(),
            **self._cluster_snapshot(),
        }

    def _start_node_rpc(self) -> None:
        config = self.config
        peers = dict(config.seed_nodes)
        self._node_mesh = NodeMesh(
            config.node_id, self.shard_id, self.loop, self._on_node_message,
            (config.rpc_host, config.rpc_port), peers=peers, local=self._mesh,
            on_unreachable=self._on_unreachable, listening_fd=self._rpc_fd)
        self._router = Router(self, self._node_mesh, self._arenas,
                              expires=self._node_mesh.is_remote)
        assert self.raft is not None
        self.raft.bind(self._router, self._node_mesh, self._shards_of)
        self.raft.on_role_change = self._role_changed

    def _on_pipe_message(self, source: int, header: Any, frames: list[Any]) -> None:
        assert self._router is not None
        try:
            self._router.on_message(source, header, frames)
        except PipeBroken as e:
            self.pipe_broken(source, str(e))

    def pipe_broken(self, source: int, reason: str) -> None:
        """A message from shard `source` cannot be read: our bug, and the request it carried
        can never be answered. Fail fast, as Seastar does: this shard exits, the supervisor
        stops the node, and nothing acknowledged is lost (acks follow fdatasync)."""
        log.critical("pipe from shard %d broken: %s; stopping the node", source, reason)
        self.exit_code = EXIT_PIPE_BROKEN
        self.stop()

    def stop_failed(self, reason: str) -> None:
        """Something this shard cannot go on without failed (the controller log's fdatasync):
        stop the node, as a broken pipe does."""
        log.critical("shard %d: %s; stopping the node", self.shard_id, reason)
        self.exit_code = EXIT_PIPE_BROKEN
        self.stop()

    def _pipe_backlog_bytes(self) -> int:
        mesh = self._mesh
        pipes = 0 if mesh is None else sum(
            mesh.writer(t).backlog_bytes for t in range(self.shards) if t != self.shard_id)
        return pipes + (self._node_mesh.backlog_bytes if self._node_mesh is not None else 0)

    def connection_closed(self) -> None:
        if self._acceptor is not None:
            self._acceptor.closed()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("shard %d stopping", self.shard_id)
        if self._acceptor is not None:
            self._acceptor.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._stats is not None:
            self._stats.close()
            self._stats = None
        if self._disk_watch is not None:
            self._disk_watch.close()
        if self.cluster and not self.exit_code:
            self._hand_over(self.loop.time() + limits.leadership_transfer_timeout_s)
        else:
            self._stop_actors()

    def _stop_actors(self) -> None:
        stop_all_actors()
        self.loop.call_soon(self._check_stopped, self.loop.time() + limits.shard_drain_timeout_s)

    def _check_stopped(self, deadline: float) -> None:
        # Partitions close their logs when their last flush returns: wait for the pool too.
        busy = (ActorRegistry.get_all() or self._io.busy or self._read_io.busy
                or self._clean_io.busy)
        if busy and self.loop.time() < deadline:
            self.loop.call_later(0.01, self._check_stopped, deadline)
            return
        self.loop.stop()

    def run(self) -> None:
        self.start()
        self._loop_watch.install()
        try:
            self.loop.run_forever()
        finally:
            self._loop_watch.close()
            if self._reader is not None:
                self._reader.close()
            if self._stats is not None:
                self._stats.close()
            if self._stats_context is not None:
                self._stats_context.term()
            self._io.shutdown()
            self._read_io.shutdown()
            self._clean_io.shutdown()
            if self.raft is not None:
                self.raft.close()
            if self._router is not None:
                self._router.close()
            if self._node_mesh is not None:
                self._node_mesh.close()
            if self._mesh is not None:
                self._mesh.close()
            self.loop.close()
        log.info("shard %d stopped", self.shard_id)
