"""raft: Raft groups' messages to their replicas on another shard, of this node or another.

    RaftCall(groups)  -->  that shard: each group's messages to its replica of the partition
                           of that topic id (the controller group: topic "", partition 0,
                           id b""); a replica of another incarnation of the topic name, or
                           none, drops them (counted); no groups: a keepalive, for quiesced
                           groups' liveness (shards/raft_host.py)
    (no answer: Raft answers with messages of its own, and takes lost ones in its stride)

One call carries every group's messages to one shard in one loop turn (the shard's RaftHost
gathers them), so a thousand idle groups' heartbeats to a peer are one call, not a thousand:
DESIGN.md §5's heartbeats batched per node pair, here per shard pair.

A message crosses as an array of its fields (actors/raft/messages.py), its ranges flattened,
its addresses as (node, shard) pairs, its membership changes (`confs`, rare: an append that
carries one, every install) as [offset, voters, outgoing voters, learners] with each set a
list of pairs; an append's batches are a payload frame of their own (`payload` names its
frame, -1 for none), sent without a copy. The Caller gathers a loop
turn's calls to one shard into one message (shards/router.py): the appends of every produce
of a turn, and every group's heartbeats, leave for each peer shard together.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

from actors.partition_replication import GroupKey
from actors.raft import Message, MsgType, Range
from actors.replica_memberships import membership_from_wire, membership_to_wire
from shards.calls.base import Address, Caller, Request

__all__ = ["CONTROLLER_GROUP", "KIND", "RaftCall", "send", "serve"]

KIND = 13

# The controller's Raft group, in the place of a partition's: "" is no topic.
CONTROLLER_GROUP = GroupKey("", 0, b"")


_TYPES = tuple(MsgType)  # by value (0..n, in order): a lookup, not an enum call
assert all(t == i for i, t in enumerate(_TYPES))


class RaftCall(NamedTuple):
    groups: list[list[Any]]  # [topic, partition, topic id, message, message, ...] per group


def _to_wire(m: Message, frames: list[Any]) -> list[Any]:
    payload = -1
    if m.payload is not None:
        payload = len(frames)
        frames.append(m.payload)
    ranges = [n for r in m.ranges for n in r]
    to, sender = cast(tuple[int, int], m.to), cast(tuple[int, int], m.sender)
    confs = [[offset, *membership_to_wire(conf)] for offset, conf in m.confs]
    return [int(m.type), *to, *sender, m.term, m.offset, m.log_term, ranges, m.commit,
            m.reject, m.hint, m.transfer, m.quiesce, m.log_start, payload, confs]


def _from_wire(value: list[Any], frames: list[Any]) -> Message:
    (kind, to_node, to_shard, from_node, from_shard, term, offset, log_term, flat, commit,
     reject, hint, transfer, quiesce, log_start, payload, confs) = value
    ranges = tuple(Range(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))
    return Message(_TYPES[kind], (to_node, to_shard), (from_node, from_shard), term, offset,
                   log_term, ranges, commit, reject, hint, transfer, quiesce, log_start,
                   None if payload < 0 else frames[payload],
                   tuple((c[0], membership_from_wire(c[1:])) for c in confs))


def send(router: Caller, to: Address, groups: list[tuple[GroupKey, list[Message]]]) -> None:
    frames: list[Any] = []
    wire = [[*key, *(_to_wire(m, frames) for m in messages)] for key, messages in groups]
    router.call(to, KIND, RaftCall(wire), frames, None)


def serve(request: Request, body: Any, frames: list[Any]) -> None:
    shard = request.router.shard
    shard.raft_heard_from(request.source)  # an empty call is a keepalive (shards/raft_host.py)
    for group in RaftCall._make(body).groups:
        messages = [_from_wire(m, frames) for m in group[3:]]
        shard.raft_receive(GroupKey(group[0], group[1], group[2]), messages)
