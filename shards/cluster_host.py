"""What a shard of a cluster's node adds to shards/shard.py: the controller's host, the
stand-in for partitions with no replica on this node, reads of a replica's role for stats
and shutdown, and the cluster id.

Kept apart so shard.py reads as the shard's life (start, serve, stop); the Raft services
themselves are in shards/raft_host.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.cluster.state import ClusterView
from actors.controller import load_cluster_id
from actors.partition_messages import refuse
from actors.runtime import actor_of
from actors.services import TopicTable
from shards.calls import cluster_info
from shards.calls.raft import CONTROLLER_GROUP
from shards.config import NodeConfig
from shards.remote import RemoteController
from wire.errors import ErrorCode

if TYPE_CHECKING:
    from shards.shard import Shard

__all__ = ["NOT_HOSTED", "ControllerHost", "cluster_id", "leads", "raft_status"]

log = logging.getLogger(__name__)

class ControllerHost:
    """What shard 0 gives the cluster controller (actors/cluster_controller.py)."""

    def __init__(self, shard: Shard) -> None:
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


def leads(ref: Any) -> bool:
    """Whether a partition actor leads its partition of the cluster (read on the loop)."""
    actor = actor_of(ref)
    return actor is not None and actor.leads_in_cluster  # type: ignore[attr-defined]


def raft_status(ref: Any) -> list[Any] | None:
    """A partition actor's Raft status, read on the loop (its state is not shared)."""
    actor = actor_of(ref)
    return None if actor is None else actor.raft_status()  # type: ignore[attr-defined]


class _NotHosted:
    """Stands in for a partition of a cluster's topic with no replica on this node: every
    message is answered NOT_LEADER_OR_FOLLOWER (the client asks Metadata for its leader)."""

    def tell(self, message: Any) -> None:
        refuse(message, ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def __repr__(self) -> str:
        return "NOT_HOSTED"


NOT_HOSTED = _NotHosted()


def cluster_id(config: NodeConfig) -> str:
    """A node of its own: the id made when its data directory was new. A cluster's: derived
    from its seeds (every node has the same list), so every node reports the same id."""
    if not config.seed_nodes:
        return load_cluster_id(config.data_dir)
    seeds = ",".join(f"{n}@{h}:{p}" for n, (h, p) in sorted(config.seed_nodes.items()))
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "krill-cluster:" + seeds))
