"""One simulated node: its shards' real actors on the virtual loop, joined by simulated pipes.

`SimShard` is the real shard runtime (`shards.shard.Shard`, which implements the actors'
`Services`) with what it reaches outside the process swapped for simulated parts: the pipe
mesh is a `SimPipeNetwork` mesh, the I/O pools are `SimIoPool`s on the simulated disk, and
connections come from socket pairs the simulated clients hold instead of a listening socket.
Topic tables, partitions, the controller (shard 0), the group coordinator and the Router are
the real ones, started as `Shard.start` starts them.

A crash of a shard: its actors stop with the disk frozen (their last flushes make nothing
durable), its I/O jobs never complete, what was in flight on its pipes is lost, its client
connections close, and its files are cut back to what was synced. A restart is a new
`SimShard` for the same id: its partitions open their logs through the real recovery path,
shard 0's controller reloads the topic table, every other shard reads the table file.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pykka import ActorRef

from actors.connection import Connection
from actors.controller import Controller, load_topic_table
from actors.group.coordinator import GroupCoordinator
from scenarios.sim.disk import SimDisk, SimIoPool, run_now
from scenarios.sim.pipes import SimPipeNetwork
from shards.config import NodeConfig
from shards.remote import RemoteController
from shards.router import Router
from shards.shard import Shard
from shards.shard_table import shard_of

__all__ = ["SimNode", "SimShard"]


class SimShard(Shard):
    """`Shard` on the virtual loop; see the module docstring."""

    def __init__(self, node: SimNode, shard_id: int) -> None:
        super().__init__(node.config, shard_id, node.shards, run_dir="")
        self.loop.close()  # the real shard's own loop: the simulation's runs everything
        self.loop = node.loop
        self.node = node
        self._sim_io = SimIoPool(
            node.loop, node.disk, shard_id, node.fsync_latency_s, node.fsync_fails,
            node.fsync_lies,
        )
        self.connections: list[ActorRef[Any]] = []

    # Services: the blocking jobs go to the simulated disk -------------------------------

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self._sim_io.run(fn, done)

    def read_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        run_now(self.loop, fn, done)

    def clean_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        run_now(self.loop, fn, done)

    # Start, connect, crash --------------------------------------------------------------

    def start(self) -> None:
        """What `Shard.start` does, without sockets, signals or threads."""
        if self.shards > 1:
            self._mesh = self.node.network.mesh(self.shard_id, self._on_pipe_message)
            self._router = Router(self, self._mesh, None)
            self.long_polls.bind(self._router, lambda t, i: (t, i) in self._partitions)
        if self.shard_id == 0:
            self._controller = Controller.start(
                self.settings, self.publish_topics, self.run_blocking
            )
        else:
            assert self._router is not None
            self._controller = RemoteController(self._router)
            self.on_topics_changed(load_topic_table(self.settings.data_dir))
        self._group_coordinator = GroupCoordinator.start(self, self._owns_offsets_partition)
        self._ready = True

    def pipe_broken(self, source: int, reason: str) -> None:
        raise AssertionError(f"pipe from shard {source} to {self.shard_id} broken: {reason}")

    def connect(self, sock: Any) -> ActorRef[Any]:
        """A client connection accepted by this shard."""
        ref = Connection.start(sock, self)
        self.connections.append(ref)
        return ref

    def actors(self) -> list[ActorRef[Any]]:
        refs: list[ActorRef[Any]] = list(self.connections)
        refs.extend(self._partitions.values())
        if self._group_coordinator is not None:
            refs.append(self._group_coordinator)
        if isinstance(self._controller, ActorRef):
            refs.append(self._controller)
        return refs

    def crash(self) -> None:
        """Stop every actor at once, as a killed process would, with nothing made durable."""
        disk = self.node.disk
        disk.frozen = True
        try:
            for ref in self.actors():
                stop_now(ref)
            # Its I/O never completes: no callback runs (a dead process runs no code). A
            # partition whose flush was out keeps its log's files open until it is freed.
            self._sim_io.abandon()
        finally:
            disk.frozen = False
        self._stopping = True

    def partition_ref(self, topic: str, index: int) -> ActorRef[Any] | None:
        return self._partitions.get((topic, index))

    def coordinator_actor(self) -> Any:
        ref = self._group_coordinator
        return None if ref is None else ref._actor_weakref()


class SimNode:
    """The node: `shards` SimShards on one virtual loop, one simulated disk and pipe mesh."""

    def __init__(
        self,
        loop: Any,
        data_dir: Path,
        shards: int,
        settings: dict[str, Any],
        disk: SimDisk,
        rng: random.Random,
        network: SimPipeNetwork,
        fsync_s: tuple[float, float],
        fsync_fail_rate: float,
        fsync_lie_rate: float = 0.0,
    ) -> None:
        self.loop = loop
        self.shards = shards
        self.disk = disk
        self.rng = rng
        self.network = network
        self._fsync_s = fsync_s
        self._fsync_fail_rate = fsync_fail_rate
        self._fsync_lie_rate = fsync_lie_rate
        self.slow_fsync_s = 0.0  # added to every fdatasync while a slow_disk fault holds
        values = {"disable_metrics": True, "pipe_arena_bytes": 0, **settings}
        self.config = NodeConfig(data_dir=str(data_dir), smp=shards, **values)
        self.data_dir = Path(self.config.data_dir).resolve()
        self.shard: list[SimShard | None] = [None] * shards
        self.crashes = 0
        self.bytes_lost = 0

    def fsync_latency_s(self) -> float:
        low, high = self._fsync_s
        return self.rng.uniform(low, high) + self.slow_fsync_s

    def disk_faults(self, fail_rate: float, lie_rate: float) -> None:
        """The seeded chances that an fdatasync fails, or lies."""
        self._fsync_fail_rate, self._fsync_lie_rate = fail_rate, lie_rate

    def fsync_fail_off(self) -> None:
        """No more fdatasync failures, seeded or scripted."""
        self._fsync_fail_rate = 0.0
        self.disk.clear_failures()

    def fsync_lies(self) -> bool:
        return bool(self._fsync_lie_rate) and self.rng.random() < self._fsync_lie_rate

    def fsync_fails(self) -> bool:
        return bool(self._fsync_fail_rate) and self.rng.random() < self._fsync_fail_rate

    def start(self) -> None:
        for shard_id in range(self.shards):
            self.start_shard(shard_id)

    def start_shard(self, shard_id: int) -> None:
        assert self.shard[shard_id] is None, f"shard {shard_id} is running"
        shard = SimShard(self, shard_id)
        self.shard[shard_id] = shard
        shard.start()

    def up(self, shard_id: int) -> SimShard | None:
        return self.shard[shard_id]

    def crash_shard(self, shard_id: int) -> None:
        shard = self.shard[shard_id]
        if shard is None:
            return
        self.shard[shard_id] = None
        self.crashes += 1
        shard.crash()
        self.network.crash(shard_id)
        self.bytes_lost += self.disk.crash(lambda path: self.owner_of_path(path) == shard_id)

    def owner_of_path(self, path: Path) -> int:
        """The shard whose files these are: a partition directory's owner; shard 0 for the
        controller's metadata and anything else."""
        relative = path.relative_to(self.data_dir)
        top = relative.parts[0] if len(relative.parts) > 1 else ""
        topic, _, index = top.rpartition("-")
        if topic and index.isdigit():
            return shard_of(topic, int(index), self.shards)
        return 0

    def stop(self) -> None:
        for shard in self.shard:
            if shard is not None:
                for ref in shard.actors():
                    stop_now(ref)


def stop_now(ref: ActorRef[Any]) -> None:
    """Stop an actor in this very turn (on_stop runs; its inbox is never read again)."""
    actor = ref._actor_weakref()
    if actor is not None and not actor.actor_stopped.is_set():
        actor._stop()
