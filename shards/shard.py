"""One shard: the process that runs one core's actors on one event loop.

Started by the supervisor as `python -m shards.shard --shard N --shards M ...`. It pins
itself to its core, binds the actor runtime to its loop, joins the pipe mesh of the node's
shards, and starts its actors: a Partition per partition it owns (shards/shard_table.py), a
GroupCoordinator, and on shard 0 the Controller (which owns the topic table and sends every
change to all shards) and the Spark reader endpoint. It listens on the Kafka port with
SO_REUSEPORT, so the kernel spreads connections over the shards; each accepted socket becomes
a Connection actor.

This class also implements `actors.services.Services`: it is how actors reach each other, on
this shard or, through the Router's stand-ins, on another (shards/remote.py), and the I/O
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from pykka import ActorRef, ActorRegistry

from actors.connection import Connection
from actors.controller import Controller, load_cluster_id, load_topic_table
from actors.group import OFFSETS_TOPIC, offsets_partition
from actors.group.coordinator import GroupCoordinator
from actors.partition import Delete, Partition, UpdateSettings
from actors.runtime import bind_loop, stop_all_actors
from actors.services import BrokerSettings, TopicTable
from actors.topic_config import TopicSettings
from shards import limits
from shards.arena import ArenaLease, ArenaSet
from shards.config import NodeConfig
from shards.io_pool import IoPool
from shards.memory import MemoryBudget
from shards.pipes import ZmqPipeMesh
from shards.reader import ReaderEndpoint
from shards.remote import RemoteController, RemoteCoordinator, RemotePartition
from shards.router import Router
from shards.shard_table import shard_of
from shards.threads import demote_helper_threads

__all__ = ["Shard", "main"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Shard:
    def __init__(
        self,
        config: NodeConfig,
        shard_id: int,
        shards: int,
        run_dir: str,
        arena_fds: list[int] | None = None,
    ) -> None:
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
            cluster_id=load_cluster_id(config.data_dir),
            auto_create_topics=config.auto_create_topics,
            default_partitions=config.default_partitions,
            message_max_bytes=config.message_max_bytes,
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            shards=shards,
            offsets_topic_partitions=config.offsets_topic_partitions,
            group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        )
        self.loop = asyncio.new_event_loop()
        self._io = IoPool(
            self.loop, limits.io_threads, f"shard{shard_id}-io", limits.io_calls_per_job
        )
        self._table = TopicTable()
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

    # Services -----------------------------------------------------------------------------

    def topics(self) -> TopicTable:
        return self._table

    def partition(self, topic: str, index: int) -> Any:
        key = (topic, index)
        local = self._partitions.get(key)
        if local is not None:
            return local
        return self._remote_partitions.get(key)

    def local_partition(self, topic: str, index: int) -> ActorRef[Any] | None:
        return self._partitions.get((topic, index))

    def frame_buffer(self, nbytes: int) -> ArenaLease | None:
        return None if self._arenas is None else self._arenas.own.lease(nbytes)

    def write_caching(self, topic: str) -> bool:
        """Whether the topic answers produces at append time (`write.caching=true`)."""
        settings = self._topic_settings.get(topic)
        return settings is not None and settings.write_caching

    def owner_of(self, topic: str, index: int) -> int:
        return shard_of(topic, index, self.shards)

    def controller(self) -> Any:
        assert self._controller is not None
        return self._controller

    def group_coordinator(self, group_id: str) -> Any:
        """The coordinator of `group_id`: the one on the shard that owns the group's
        `__consumer_offsets` partition (a stand-in when that is another shard)."""
        info = self._table.topics.get(OFFSETS_TOPIC)
        count = info.partitions if info is not None else self.settings.offsets_topic_partitions
        return self._coordinator_on(
            self.owner_of(OFFSETS_TOPIC, offsets_partition(group_id, count))
        )

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
        return self.owner_of(OFFSETS_TOPIC, index) == self.shard_id

    def run_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._io.run(fn, done)

    # Topic table --------------------------------------------------------------------------

    def publish_topics(self, table: TopicTable, done: Callable[[], None]) -> None:
        """The Controller (shard 0 only) changed the table: apply it here, then on every
        other shard; `done()` once every shard has it."""
        self.on_topics_changed(table)
        if self._router is None:
            done()
        else:
            self._router.broadcast_topics(table, done)

    def on_topics_changed(self, table: TopicTable) -> None:
        """Start and stop Partition actors so this shard owns exactly its share of the table."""
        old = self._table
        if table.version <= old.version and old.version:
            return  # a copy of the table this shard already has (start-up races)
        self._table = table
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
                if owner != self.shard_id:
                    assert self._router is not None
                    self._remote_partitions[(name, index)] = RemotePartition(
                        self._router, owner, name, index
                    )
                    continue
                directory = Path(self.settings.data_dir) / f"{name}-{index}"
                self._partitions[(name, index)] = Partition.start(
                    name, index, directory, settings, self
                )
        for name, info in old.topics.items():
            if name not in table.topics:
                self._delete_topic(name, info.partitions)

    def _delete_topic(self, name: str, partitions: int) -> None:
        self._topic_settings.pop(name, None)
        for index in range(partitions):
            self._remote_partitions.pop((name, index), None)
            ref = self._partitions.pop((name, index), None)
            if ref is not None:
                ref.tell(Delete())
            elif self._router is not None:
                self._router.forget_segments(
                    str(Path(self.settings.data_dir) / f"{name}-{index}") + "/"
                )

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
            )
            self._router = Router(self, self._mesh, self._arenas)
        if self.shard_id == 0:
            self._controller = Controller.start(self.settings, self.publish_topics)
        else:
            assert self._router is not None
            self._controller = RemoteController(self._router)
            # The table as shard 0 last wrote it (a read-only file); newer versions follow
            # on the pipe from shard 0, in order.
            self.on_topics_changed(load_topic_table(self.settings.data_dir))
        self._group_coordinator = GroupCoordinator.start(self, self._owns_offsets_partition)
        accepting = self.config.kafka_shards
        if accepting == 0 or self.shard_id < accepting:
            self._listener = _listen(self.config.listen)
            self.loop.add_reader(self._listener.fileno(), self._accept)
        if self.shard_id == 0:
            self._start_reader()
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

    def _start_reader(self) -> None:
        # A node whose reader port is taken still serves Kafka: Spark is an add-on.
        try:
            self._reader = ReaderEndpoint(
                self, self.loop, self.config.reader_listen, _reader_advertised(self.config)
            )
        except zmq.ZMQError as e:
            log.error("shard 0: no Spark reader on %s:%d: %s", *self.config.reader_listen, e)

    def _on_pipe_message(self, source: int, header: Any, frames: list[Any]) -> None:
        assert self._router is not None
        self._router.on_message(source, header, frames)

    def _pipe_backlog_bytes(self) -> int:
        mesh = self._mesh
        if mesh is None:
            return 0
        return sum(mesh.writer(t).backlog_bytes for t in range(self.shards) if t != self.shard_id)

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
            Connection.start(sock, self)

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
        stop_all_actors()
        self.loop.call_soon(self._check_stopped, self.loop.time() + limits.shard_drain_timeout_s)

    def _check_stopped(self, deadline: float) -> None:
        if ActorRegistry.get_all() and self.loop.time() < deadline:
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
            self._io.shutdown()
            if self._router is not None:
                self._router.close()
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


def _listen(address: tuple[str, int]) -> socket.socket:
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(limits.listen_backlog)
    sock.setblocking(False)
    return sock


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
    args = parser.parse_args(argv)
    config = NodeConfig.from_json(args.config_json)
    setup_logging(config.log_level, args.shard)
    _die_with_supervisor(args.supervisor_pid)
    os.sched_setaffinity(0, {args.core})
    _raise_open_files_limit()
    threading.current_thread().name = f"shard{args.shard}"
    try:
        arena_fds = [int(fd) for fd in args.arena_fds.split(",")] if args.arena_fds else None
        Shard(config, args.shard, args.shards, args.run_dir, arena_fds).run()
    except OSError as e:
        log.error("shard %d cannot serve: %s", args.shard, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
