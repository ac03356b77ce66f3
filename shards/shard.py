"""One shard: the process that runs one core's actors on one event loop.

Started by the supervisor as `python -m shards.shard --shard N --shards M ...`. It pins
itself to its core, binds the actor runtime to its loop, joins the pipe mesh of the node's
shards, and starts its actors: a Partition per partition it owns (shards/shard_table.py), a
GroupCoordinator, and on shard 0 the Controller (which owns the topic table and sends every
change to all shards) and the Spark reader endpoint. It accepts Kafka connections on the
listening socket the supervisor bound for it (shards/ports.py: one per shard, SO_REUSEPORT, so
the kernel spreads connections over the shards); each accepted socket becomes a Connection
actor, up to the shard's share of `kafka_connections_max`. Its stats endpoint
(shards/stats.py) answers the supervisor's /metrics and health scrapes.

This class also implements `actors.services.Services`: it is how actors reach each other, on
this shard or, through the stand-ins' calls, on another (shards/remote.py), and the I/O
pool, without knowing which shard they are on.

SIGTERM/SIGINT: stop accepting, stop every actor (connections close; partitions flush and
close their logs), then exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
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
from actors.group.messages import OffsetsOwnership
from actors.handlers.join import send as send_to
from actors.metrics import ShardMetrics
from actors.partition import Delete, Partition, UpdateSettings
from actors.partition_messages import RaftReceive, RaftUnreachable, TransferLeadership
from actors.partition_replication import GroupKey
from actors.runtime import actor_of, bind_loop, stop_all_actors
from actors.services import BrokerSettings, TopicTable
from actors.topic_config import TopicSettings
from shards import limits
from shards.arena import ArenaLease, ArenaSet
from shards.calls import segments, topics
from shards.calls.raft import CONTROLLER_GROUP
from shards.cluster_host import NOT_HOSTED, ControllerHost, cluster_id, leads, raft_status
from shards.config import NodeConfig
from shards.disk_space import DiskSpaceWatch
from shards.io_pool import IoPool
from shards.memory import MemoryBudget
from shards.node_mesh import NodeMesh
from shards.pipes import PipeBroken, ZmqPipeMesh
from shards.raft_host import RaftHost
from shards.reader import ReaderEndpoint
from shards.remote import RemoteController, RemoteCoordinator, RemotePartition
from shards.router import Router
from shards.shard_table import shard_of
from shards.stats import StatsEndpoint
from shards.threads import demote_helper_threads
from shards.watch import WatchService
from storage.free_space import FreeSpaceGuard
from storage.partition_dir import move_to_trash
from storage.probes import PROBES, clear_probe, set_probe
from wire.frame import SCRATCH_BYTES

__all__ = ["Shard", "main"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
EXIT_PIPE_BROKEN = 70  # EX_SOFTWARE: a shard stopped itself on a broken invariant


class Shard:
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
        )
        self.metrics = None if config.disable_metrics else ShardMetrics()
        self.disk_space = FreeSpaceGuard(config.storage_min_free_bytes)
        # One receive buffer for all this shard's connections: they read one at a time.
        self.frame_scratch = bytearray(SCRATCH_BYTES)
        self._listen_fd = listen_fd
        self._reader_fd = reader_fd
        # The node's kafka_connections_max split over the accepting shards, to the last one.
        accepting = config.kafka_shards or shards
        share, rest = divmod(config.kafka_connections_max, accepting)
        self._connections_max = share + (1 if shard_id < rest else 0)
        self._connection_count = 0
        self._refused_connections = 0
        self._stats: StatsEndpoint | None = None
        self._disk_watch: DiskSpaceWatch | None = None
        self._stats_context: zmq.Context[Any] | None = None
        self._ready = False
        self._started = time.time()
        self.exit_code = 0  # what the process exits with once the loop stops
        self.loop = asyncio.new_event_loop()
        self._io = IoPool(
            self.loop, limits.io_threads, f"shard{shard_id}-io", limits.io_calls_per_job
        )
        # Bulk reads (cold data brought into the page cache, large Spark reads, removing a
        # deleted partition) on threads of their own, so an fdatasync never waits behind one.
        self._read_io = IoPool(self.loop, limits.read_io_threads, f"shard{shard_id}-read")
        # The shard's log cleaner (compaction): one thread, one clean at a time; it throttles
        # itself, so it never holds up a flush or a cold read.
        self._clean_io = IoPool(self.loop, limits.cleaner_threads, f"shard{shard_id}-cleaner")
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
        self._listener: socket.socket | None = None
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
                config.raft_election_ticks, 1, config.raft_heartbeat_interval_ms / 1000)

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

    def partition_writer(self, topic: str, index: int) -> Any:
        """The partition's leader replica for a transaction coordinator's `WriteTxnMarker`:
        this shard's actor, or a stand-in whose `tell()` makes the call (calls/txn_marker.py)
        to another shard of this node or, in a cluster, to the leader's (node, shard) as this
        shard last heard it; None when no leader is known (or no such partition)."""
        if not self.cluster or self.raft is None:
            return self.partition(topic, index)  # a node of its own leads every partition
        entry = self.raft.leaders.get(topic, index)
        if entry is None or entry.leader is None:
            return None
        node, shard = entry.leader
        if node == self.config.node_id:
            if shard == self.shard_id:
                return self._partitions.get((topic, index))
            target: Any = shard  # this node's shards are addressed by number
        else:
            target = (node, shard)
        assert self._router is not None, "a cluster's shard has a router"
        return RemotePartition(self._router, target, topic, index)

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

    # Cluster services (Metadata, FindCoordinator) -------------------------------------------

    def brokers(self) -> list[tuple[int, str, int, str | None]]:
        """(id, host, port, rack) of every node Metadata lists."""
        if not self.cluster or not self._cluster_nodes:
            s = self.settings
            return [(s.node_id, s.advertised_host, s.advertised_port, None)]
        return [(n.node, n.host, n.port, n.rack) for n in self._cluster_nodes.values()]

    def reader_addresses(self) -> dict[int, str]:
        """Every registered node's Spark reader address (the reader endpoint's metadata)."""
        nodes = {n.node: n.reader for n in self._cluster_nodes.values() if n.reader is not None}
        nodes[self.config.node_id] = _reader_advertised(self.config)
        return nodes

    def controller_id(self) -> int:
        if not self.cluster:
            return self.settings.node_id
        return -1 if self._controller_leader is None else self._controller_leader

    def partition_leader(self, topic: str, index: int, guess: bool = False
                         ) -> tuple[int, int, list[int], list[int]] | None:
        """(leader node or -1, leader epoch, replica nodes, in-sync nodes) of a partition of a
        cluster's topic; None on a node of its own (it leads everything, epoch 0).

        With `guess`, for Metadata, while an election is on the leader before it is named,
        at its epoch (actors/cluster/leaders.py): a stale leader costs a client one
        NOT_LEADER_OR_FOLLOWER and a new Metadata request, where -1 costs a librdkafka
        client's ListOffsets the wait until its next periodic refresh. A node that has heard
        of no leader at all (a new topic's first election; a shard that has just started,
        until its peers answer its `ask_leaders`) still answers -1: tools wait on that to
        know a new topic's partitions are led."""
        if not self.cluster or self.raft is None:
            return None
        info = self._table.topics.get(topic)
        if not isinstance(info, PlacedTopic) or not 0 <= index < info.partitions:
            return None
        replicas = [node for node, _ in info.replicas[index]]
        entry = self.raft.leaders.get(topic, index)
        if entry is None or entry.leader is None:
            named = self.raft.leaders.last_named(topic, index) if guess else None
            if named is not None and named.leader is not None:
                isr = [node for node, _ in named.isr] or [named.leader[0]]
                return named.leader[0], named.epoch, replicas, isr
            return -1, entry.epoch if entry is not None else -1, replicas, []
        isr = [node for node, _ in entry.isr] or [entry.leader[0]]
        return entry.leader[0], entry.epoch, replicas, isr

    def coordinator_node(self, group_id: str) -> tuple[int, str, int] | None:
        """The node that coordinates `group_id` (its offsets partition's leader): (id, host,
        port), or None when no leader is known."""
        if not self.cluster:
            s = self.settings
            return s.node_id, s.advertised_host, s.advertised_port
        info = self._table.topics.get(OFFSETS_TOPIC)
        if info is None:
            return None
        leader = self.partition_leader(
            OFFSETS_TOPIC, offsets_partition(group_id, info.partitions))
        if leader is None or leader[0] < 0:
            return None
        node = self._cluster_nodes.get(leader[0])
        if node is None:
            return None
        return node.node, node.host, node.port

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

    def on_topics_changed(self, table: TopicTable) -> None:
        """Start and stop Partition actors so this shard owns exactly its share of the table."""
        old = self._table
        if table.version <= old.version and old.version:
            return  # a copy of the table this shard already has (start-up races)
        self._table = table
        if self.raft is not None:
            self.raft.leaders.set_topics(table)
            if not old.version:  # the first table: ask the peers who leads (calls/leaders.py)
                self.raft.ask_leaders()
        for name, info in table.topics.items():
            settings = TopicSettings.of(info.configs, self.settings)
            previous = old.topics.get(name)
            if previous is not None and previous.topic_id != info.topic_id:
                self._delete_topic(name, previous.partitions)
                previous = None
            if previous is not None and self._topic_settings.get(name) != settings:
                for index in range(previous.partitions):
                    ref = self._partitions.get((name, index))
                    if ref is not None:
                        ref.tell(UpdateSettings(settings))
            self._topic_settings[name] = settings
            first_new = previous.partitions if previous is not None else 0
            for index in range(first_new, info.partitions):
                owner = self.owner_of(name, index)
                if owner < 0:
                    continue  # a cluster's partition with no replica on this node
                if owner != self.shard_id:
                    assert self._router is not None
                    self._remote_partitions[(name, index)] = RemotePartition(
                        self._router, owner, name, index
                    )
                    continue
                directory = Path(self.settings.data_dir) / f"{name}-{index}"
                replicas = info.replicas[index] if isinstance(info, PlacedTopic) else ()
                self._partitions[(name, index)] = Partition.start(
                    name, index, info.topic_id, directory, settings, self, replicas
                )
        for name, info in old.topics.items():
            if name not in table.topics:
                self._delete_topic(name, info.partitions)

    def _delete_topic(self, name: str, partitions: int) -> None:
        self._topic_settings.pop(name, None)
        if self.metrics is not None:  # a topic made again under its name counts from zero
            self.metrics.forget(name)
        for index in range(partitions):
            self._remote_partitions.pop((name, index), None)
            directory = Path(self.settings.data_dir) / f"{name}-{index}"
            ref = self._partitions.pop((name, index), None)
            if ref is not None:
                ref.tell(Delete(move_to_trash(directory)))
            else:
                self.long_polls.gone((name, index))
                if self._router is not None:
                    self._router.segment_files.forget_under(str(directory) + "/")

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
            self._listener = socket.socket(fileno=self._listen_fd)
            self._listener.setblocking(False)
            self.loop.add_reader(self._listener.fileno(), self._accept)
        if self._reader_fd is not None:
            self._reader = ReaderEndpoint(
                self, self.loop, self.config.reader_listen, _reader_advertised(self.config),
                listening_fd=self._reader_fd,
            )
        self._disk_watch = DiskSpaceWatch(
            self.loop, self.disk_space, self.settings.data_dir, self.read_blocking)
        self._disk_watch.start()
        self._stats_context = zmq.Context(io_threads=1)
        self._stats = StatsEndpoint(
            self.loop, self._stats_context, self.run_dir, self.shard_id, self.snapshot,
            {"probes": self._failure_probes},
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

    # The cluster: node RPC, the controller group, Raft messages ---------------------------

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

    def _shards_of(self, node: int) -> int:
        if node == self.config.node_id:
            return self.shards
        info = self._cluster_nodes.get(node)
        return info.shards if info is not None else 1

    def _start_cluster_controller(self) -> Any:
        config = self.config
        host, port = config.advertise
        me = NodeInfo(config.node_id, host, port, config.rpc_host, config.rpc_port,
                      self.shards, self.settings.partitions_max,
                      reader=_reader_advertised(config))
        assert self.raft is not None
        controller = ClusterController.start(
            self.settings, me, tuple(sorted(config.seed_nodes)), ControllerHost(self),
            self.raft.hard_states, config.raft_election_ticks, 1, config.default_replicas)
        actor = actor_of(controller)
        assert isinstance(actor, ClusterController)
        self._controller_actor = actor
        self.raft.register(CONTROLLER_GROUP, actor.tick)
        return controller

    def _on_node_message(self, source: Any, header: Any, frames: list[Any]) -> None:
        assert self._router is not None
        self._router.on_message(source, header, frames)

    def _on_unreachable(self, address: Any) -> None:
        """Node RPC gave up on a send to `address`: the groups with a replica there probe it
        again later (Raft's MsgUnreachable)."""
        node, shard = address
        for (topic, index), ref in list(self._partitions.items()):
            info = self._table.topics.get(topic)
            if isinstance(info, PlacedTopic) and address in info.replicas[index]:
                ref.tell(RaftUnreachable(address))

    def raft_heard_from(self, source: Any) -> None:
        if self.raft is not None:
            self.raft.heard_from(source)

    def raft_receive(self, key: GroupKey, messages: list[Any]) -> None:
        """Messages for the replica here of the group `key`. One of another incarnation of
        the topic name (deleted and created again: actors/partition_replication.GroupKey) must
        never take them, nor answer: they are dropped and counted, as are those for a replica
        not started here (yet, or any more; Raft sends again)."""
        assert self.raft is not None
        if key == CONTROLLER_GROUP:
            target = self._controller if self.shard_id == 0 else None
            if target is not None:
                send_to(target, RaftReceive(messages))
            return
        ref = self._partitions.get((key.topic, key.partition))
        actor = actor_of(ref) if ref is not None else None
        if not isinstance(actor, Partition):
            self.raft.dropped["no_replica"] += len(messages)
        elif actor.topic_id != key.topic_id:
            self.raft.dropped["other_incarnation"] += len(messages)
        else:
            actor.raft_input(messages)

    def leaders_heard(self, updates: list[Any]) -> None:
        if self.raft is not None:
            self.raft.heard(updates)

    def leaders_asked(self, source: Any) -> None:
        if self.raft is not None:
            self.raft.tell_led(source)

    def cluster_changed(self, controller_leader: int | None, nodes: dict[int, NodeInfo]) -> None:
        """Shard 0's controller says who leads it and which nodes are registered."""
        self._controller_leader = controller_leader
        if nodes != self._cluster_nodes:
            self._cluster_nodes = dict(nodes)
            if self._node_mesh is not None:
                peers = dict(self.config.seed_nodes)
                peers.update({n: (i.rpc_host, i.rpc_port) for n, i in nodes.items()
                              if n not in peers})
                self._node_mesh.set_peers(peers)

    def _role_changed(self, topic: str, _index: int) -> None:
        if topic == OFFSETS_TOPIC:
            self._offsets_leadership_changed()

    def _offsets_leadership_changed(self) -> None:
        """Tell this shard's group coordinator which `__consumer_offsets` partitions it owns
        now: those whose replica here leads (a coordinator moves with its partition's
        leader, actors/group/coordinator.py)."""
        coordinator = self._group_coordinator
        if coordinator is None:
            return
        led = frozenset(index for (topic, index), ref in self._partitions.items()
                        if topic == OFFSETS_TOPIC and leads(ref))
        if led != self._offsets_led:
            self._offsets_led = led
            coordinator.tell(OffsetsOwnership(led))

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
            "connections_refused": self._refused_connections,
            "disk_free_bytes": self.disk_space.free_bytes,
            "disk_alert": int(self.disk_space.alert),
            "metrics": None if self.metrics is None else self.metrics.snapshot(),
            **self._cluster_snapshot(),
        }

    def _cluster_snapshot(self) -> dict[str, Any]:
        if not self.cluster:
            return {}
        raft = []
        for ref in self._partitions.values():
            status = raft_status(ref)
            if status is not None:
                raft.append(status)
        assert self.raft is not None
        extra: dict[str, Any] = {"raft": raft, "raft_dropped": dict(self.raft.dropped)}
        if self.shard_id == 0 and self._controller is not None:
            actor = self._controller_actor
            extra["controller"] = {
                "leader": self.controller_id(), "nodes": sorted(self._cluster_nodes),
                "term": actor.status()["term"] if actor is not None else -1}
        if self._node_mesh is not None:
            extra["node_rpc"] = self._node_mesh.snapshot()
        return extra

    def _failure_probes(self, request: dict[str, Any]) -> dict[str, Any]:
        """The admin API's /v1/failure-probes, on this shard (shards/stats.py): set or clear
        a probe (storage/probes.py), then say which are set."""
        if not self.config.enable_failure_injection:
            return {"error": "failure injection is off (enable_failure_injection: false)"}
        op, name = request.get("op"), request.get("probe")
        try:
            if op == "set":
                set_probe(str(name), int(request.get("ms", 0)))
                log.warning("shard %d: failure probe %s set %s", self.shard_id, name,
                            request.get("ms", ""))
            elif op == "clear":
                clear_probe(None if name is None else str(name))
                log.warning("shard %d: failure probe %s cleared", self.shard_id, name or "(all)")
            elif op != "list":
                return {"error": f"unknown probe operation {op!r}"}
        except (KeyError, ValueError, TypeError):
            return {"error": f"bad probe request {request!r}"}
        return {"probes": PROBES.describe()}

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

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(limits.accepts_per_turn_max):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("accept failed: %s", e)
                return
            if self._connection_count >= self._connections_max:
                self._refuse(sock)
                continue
            self._connection_count += 1
            Connection.start(sock, self)

    def connection_closed(self) -> None:
        self._connection_count -= 1

    def _refuse(self, sock: socket.socket) -> None:
        """Over the connection limit: close at once (the client backs off and retries)."""
        sock.close()
        self._refused_connections += 1
        if self._refused_connections % limits.refused_connections_log_every == 1:
            log.warning(
                "shard %d: %d connections open, the most it takes (kafka_connections_max "
                "%d over %d shards): refused %d so far",
                self.shard_id, self._connection_count, self.config.kafka_connections_max,
                self.config.kafka_shards or self.shards, self._refused_connections,
            )  # fmt: skip

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        log.info("shard %d stopping", self.shard_id)
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
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

    def _hand_over(self, deadline: float) -> None:
        """A clean stop of a cluster's node: every group this shard leads hands leadership to
        its most caught-up follower first (Raft's leadership transfer: the follower campaigns
        at once, no election timeout), so its partitions are writable again within a round
        trip or two; then the actors stop. A transfer that does not finish by `deadline`
        (no follower reachable) is given up: the others elect after their timeout."""
        leading = [ref for ref in self._partitions.values() if leads(ref)]
        controller = self._controller_actor
        if controller is not None and controller.is_leader():
            controller.transfer_leadership()
        for ref in leading:
            ref.tell(TransferLeadership(lambda _started: None))
        self.loop.call_later(0.01, self._handed_over, deadline)

    def _handed_over(self, deadline: float) -> None:
        controller = self._controller_actor
        busy = any(leads(ref) for ref in self._partitions.values()) or (
            controller is not None and controller.is_leader())
        if busy and self.loop.time() < deadline:
            self.loop.call_later(0.01, self._handed_over, deadline)
            return
        if busy:
            log.warning("shard %d: leadership not handed over within %.1f s; stopping anyway",
                        self.shard_id, limits.leadership_transfer_timeout_s)
        self._stop_actors()

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
        try:
            self.loop.run_forever()
        finally:
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


def _reader_advertised(config: NodeConfig) -> str:
    """The reader address the Spark source is told to connect to (never a wildcard)."""
    host, port = config.reader_listen
    if host in ("0.0.0.0", "::", ""):
        host = config.advertise[0]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = (
        min(hard, limits.open_files_wanted)
        if hard != resource.RLIM_INFINITY
        else limits.open_files_wanted
    )
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def setup_logging(level: str, shard_id: int | None) -> None:
    who = "supervisor" if shard_id is None else f"shard{shard_id}"
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s {who} %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _die_with_supervisor(supervisor_pid: int) -> None:
    """Ask the kernel to SIGTERM this shard when the supervisor dies, even by SIGKILL.

    Without it a killed supervisor leaves shards serving the port and holding the logs.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != supervisor_pid:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shards.shard")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--core", type=int, required=True)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--supervisor-pid", type=int, default=os.getppid())
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--run-dir", default="")
    parser.add_argument("--arena-fds", default="", help="memfds of every shard's arena, in order")
    parser.add_argument("--listen-fd", type=int, help="the Kafka listening socket to accept on")
    parser.add_argument("--reader-fd", type=int, help="the Spark reader's listening socket")
    parser.add_argument("--rpc-fd", type=int, help="the node RPC socket (a cluster's node)")
    args = parser.parse_args(argv)
    config = NodeConfig.from_json(args.config_json)
    setup_logging(config.log_level, args.shard)
    _die_with_supervisor(args.supervisor_pid)
    os.sched_setaffinity(0, {args.core})
    _raise_open_files_limit()
    threading.current_thread().name = f"shard{args.shard}"
    try:
        arena_fds = [int(fd) for fd in args.arena_fds.split(",")] if args.arena_fds else None
        shard = Shard(
            config, args.shard, args.shards, args.run_dir, arena_fds, args.listen_fd,
            args.reader_fd, args.rpc_fd,
        )
        shard.run()
    except OSError as e:
        log.error("shard %d cannot serve: %s", args.shard, e)
        return 1
    return shard.exit_code


if __name__ == "__main__":
    sys.exit(main())
