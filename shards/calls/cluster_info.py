"""cluster_info: the registered nodes and the controller's leader, from shard 0 to the others.

    ClusterInfoCall(controller leader, nodes)  -->  every other shard of the node
    (no answer)

Shard 0 runs the controller group (actors/cluster_controller.py); every shard answers
Metadata (brokers, controller id) and FindCoordinator, so each keeps a copy, sent whenever
the nodes or the controller's leader change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from actors.cluster.commands import NodeInfo
from shards.calls.base import Address, Caller, Request

__all__ = ["KIND", "ClusterInfoCall", "send", "serve"]

KIND = 15


class ClusterInfoCall(NamedTuple):
    controller_leader: int | None
    nodes: list[list[Any]]  # NodeInfo's fields


def send(router: Caller, to: Address, controller_leader: int | None,
         nodes: Mapping[int, NodeInfo]) -> None:
    call = ClusterInfoCall(controller_leader, [list(n) for n in nodes.values()])
    router.call(to, KIND, call, [], None)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = ClusterInfoCall._make(body)
    nodes = {fields[0]: NodeInfo(*fields) for fields in call.nodes}
    request.router.shard.cluster_changed(call.controller_leader, nodes)
