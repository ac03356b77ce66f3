"""Small pieces of a cluster's shard: the stand-in for partitions with no replica on this
node, reads of a replica's role for stats and shutdown, and the cluster id.

The cluster's side of the shard itself is shards/shard_cluster.py; the Raft services are
shards/raft_host.py's.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from actors.controller import load_cluster_id
from actors.partition_messages import refuse
from actors.runtime import actor_of
from shards.config import NodeConfig
from wire.errors import ErrorCode

__all__ = ["NOT_HOSTED", "cluster_id", "leads", "raft_status"]

log = logging.getLogger(__name__)

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
