"""leaders: who leads which partition, from the shard that hosts a replica to every shard of
the cluster (actors/cluster/leaders.py says why leaders are not in the controller's log).

    LeadersCall(updates)  -->  every shard of every node: its LeaderTable takes the newer ones
    (no answer)
    LeadersCall([], ask=True)  -->  every shard of every node: each sends the asking shard a
    LeadersCall of the partitions it leads

Sent when a local replica's leader or term changes, and again for every partition a shard
leads every `leader_refresh_interval_s` (shards/limits.py), so a node that missed a report
while cut off learns every leader within that long. A shard that has just started asks, once
it has its first topic table (a report about a topic it does not know yet is dropped): it
learns the leaders as soon as its peers can answer, not at their next refresh.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.cluster.leaders import LeaderUpdate
from shards.calls.base import Address, Caller, Request

__all__ = ["KIND", "LeadersCall", "send", "serve"]

KIND = 14


class LeadersCall(NamedTuple):
    updates: list[list[Any]]
    ask: bool = False  # the sender has just started: send it what you lead


def _to_wire(u: LeaderUpdate) -> list[Any]:
    leader = list(u.leader) if u.leader is not None else None
    return [u.topic, u.topic_id, u.partition, leader, u.epoch, [n for a in u.isr for n in a],
            u.version]


def _from_wire(value: list[Any]) -> LeaderUpdate:
    topic, topic_id, partition, leader, epoch, isr, version = value
    return LeaderUpdate(topic, bytes(topic_id), partition,
                        None if leader is None else (leader[0], leader[1]), epoch,
                        tuple((isr[i], isr[i + 1]) for i in range(0, len(isr), 2)), version)


def send(router: Caller, to: Address, updates: list[LeaderUpdate], ask: bool = False) -> None:
    router.call(to, KIND, LeadersCall([_to_wire(u) for u in updates], ask), [], None)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = LeadersCall(*body)
    shard = request.router.shard
    shard.leaders_heard([_from_wire(u) for u in call.updates])
    if call.ask:
        shard.leaders_asked(request.source)
