"""A cluster's side of a shard: node RPC, Raft messages and leaders, the controller group,
and the answers Metadata and FindCoordinator need (DESIGN.md §5, §7).

`Shard` (shards/shard.py) takes these methods from `ClusterShard`, so shard.py reads as the
shard's life (start, serve, stop) and this module as what a cluster adds to it. The class
names what it reads of the shard below (its attributes and the few methods it calls); a node
of its own (`cluster` false) has no Raft host, and the answers here fall back to "this node
leads everything". What shard 0 gives the controller group is `ControllerHost`, below. The
Raft services themselves are shards/raft_host.py's; the stand-in for partitions hosted on
other nodes and the reads of a replica's role are shards/cluster_host.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pykka import ActorRef

from actors.cluster.commands import NodeInfo
from actors.cluster.state import ClusterView, PlacedTopic
from actors.cluster_controller import ClusterController
from actors.group import OFFSETS_TOPIC, offsets_partition
from actors.group.messages import OffsetsOwnership
from actors.handlers.join import send as send_to
from actors.partition import Partition
from actors.partition_messages import RaftReceive, RaftUnreachable, TransferLeadership
from actors.partition_replication import GroupKey
from actors.runtime import actor_of
from actors.services import BrokerSettings, TopicTable
from shards import limits
from shards.calls import cluster_info
from shards.calls.raft import CONTROLLER_GROUP
from shards.cluster_host import leads, raft_status
from shards.config import NodeConfig, reader_advertised
from shards.node_mesh import NodeMesh
from shards.raft_host import RaftHost
from shards.remote import RemoteController, RemotePartition
from shards.router import Router

__all__ = ["ClusterShard"]

log = logging.getLogger("shards.shard")  # the shard's lines, as they have always been named


class ClusterShard:
    """The cluster's methods of `Shard`; what they read of it is declared here."""

    config: NodeConfig
    settings: BrokerSettings
    shard_id: int
    shards: int
    loop: asyncio.AbstractEventLoop
    cluster: bool  # seeds were given: node RPC, Raft groups, the controller group
    raft: RaftHost | None
    _table: TopicTable
    _partitions: dict[tuple[str, int], ActorRef[Any]]  # the replicas on this shard
    _controller: Any
    _group_coordinator: ActorRef[Any] | None
    _router: Router | None
    _node_mesh: NodeMesh | None
    _cluster_nodes: dict[int, NodeInfo]  # registered nodes (Metadata's brokers)
    _controller_leader: int | None
    _controller_actor: ClusterController | None
    _offsets_led: frozenset[int] | None  # last told to the coordinator

    if TYPE_CHECKING:
        def partition(self, topic: str, index: int) -> Any: ...
        def publish_topics(self, table: TopicTable, done: Callable[[], None]) -> None: ...
        def run_blocking(self, fn: Callable[[], Any],
                         done: Callable[[Any, BaseException | None], None]) -> None: ...
        def stop_failed(self, reason: str) -> None: ...
        def _stop_actors(self) -> None: ...

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

    def brokers(self) -> list[tuple[int, str, int, str | None]]:
        """(id, host, port, rack) of every node Metadata lists."""
        if not self.cluster or not self._cluster_nodes:
            s = self.settings
            return [(s.node_id, s.advertised_host, s.advertised_port, None)]
        return [(n.node, n.host, n.port, n.rack) for n in self._cluster_nodes.values()]

    def reader_addresses(self) -> dict[int, str]:
        """Every registered node's Spark reader address (the reader endpoint's metadata)."""
        nodes = {n.node: n.reader for n in self._cluster_nodes.values() if n.reader is not None}
        nodes[self.config.node_id] = reader_advertised(self.config)
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
                      reader=reader_advertised(config))
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


class ControllerHost:
    """What shard 0 gives the cluster controller (actors/cluster_controller.py)."""

    def __init__(self, shard: ClusterShard) -> None:
        self.shard = shard

    def publish(self, table: TopicTable, done: Callable[[], None]) -> None:
        self.shard.publish_topics(table, done)

    def nodes_changed(self, view: ClusterView) -> None:
        shard = self.shard
        actor = shard._controller_actor  # noqa: SLF001
        controller = actor.leader_node if actor is not None else None
        shard.cluster_changed(controller, dict(view.nodes))
        if shard._router is not None:  # noqa: SLF001
            for peer in shard._router.peers():  # noqa: SLF001
                cluster_info.send(shard._router, peer, controller, view.nodes)  # noqa: SLF001

    def forward(self, leader_node: int, message: Any) -> None:
        shard = self.shard
        assert shard._router is not None and shard._node_mesh is not None  # noqa: SLF001
        RemoteController(shard._router, shard._node_mesh.address(leader_node, 0)).tell(message)  # noqa: SLF001

    def send_raft(self, messages: list[Any]) -> None:
        assert self.shard.raft is not None
        self.shard.raft.send(CONTROLLER_GROUP, messages)

    def run_blocking(self, fn: Callable[[], Any],
                     done: Callable[[Any, BaseException | None], None]) -> None:
        self.shard.run_blocking(fn, done)

    def schedule(self, fn: Callable[[], None]) -> None:
        self.shard.loop.call_soon(fn)

    def later(self, delay_s: float, fn: Callable[[], None]) -> Any:
        return self.shard.loop.call_later(delay_s, fn)

    def live_nodes(self) -> set[int]:
        return set(self.shard._cluster_nodes)  # noqa: SLF001

    def fatal(self, reason: str) -> None:
        self.shard.stop_failed(reason)
