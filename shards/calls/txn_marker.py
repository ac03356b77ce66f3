"""txn_marker: a transaction coordinator's `WriteTxnMarker` to a partition's leader, on
another shard of this node or on another node (node RPC).

    TxnMarkerCall(topic, partition, producer id,  -->  the leader's Partition: append the
      producer epoch, commit, coordinator epoch)       COMMIT or ABORT control batch
                <-- TxnMarkerAnswer(error)              once it is committed, or refused

The coordinator finds the leader with `Services.partition_writer` (shards/shard_cluster.py)
and tells the stand-in (shards/remote.py `RemotePartition`) the marker like any partition
message. A call to another node that gets `UNREACHABLE` (calls/base.py) is answered
REQUEST_TIMED_OUT: whether the marker was written is unknown, and the coordinator retries it,
which is safe (a second marker for a transaction already ended here lists nothing,
actors/txn_state.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import WriteTxnMarker
from shards.calls.base import UNREACHABLE, Address, Caller, Request, tell_partition
from wire.errors import ErrorCode

__all__ = ["KIND", "TxnMarkerAnswer", "TxnMarkerCall", "send", "serve"]

KIND = 16


class TxnMarkerCall(NamedTuple):
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


class TxnMarkerAnswer(NamedTuple):
    error: int


def send(router: Caller, to: Address, topic: str, partition: int, m: WriteTxnMarker) -> None:
    def on_reply(body: Any, _frames: list[Any]) -> None:
        if body is UNREACHABLE:
            m.reply(ErrorCode.REQUEST_TIMED_OUT)
            return
        m.reply(ErrorCode(TxnMarkerAnswer._make(body).error))

    call = TxnMarkerCall(topic, partition, m.producer_id, m.producer_epoch, m.commit,
                         m.coordinator_epoch)
    router.call(to, KIND, call, [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = TxnMarkerCall._make(body)

    def reply(error: ErrorCode) -> None:
        request.answer(TxnMarkerAnswer(int(error)))

    message = WriteTxnMarker(call.producer_id, call.producer_epoch, call.commit,
                             call.coordinator_epoch, reply)
    if not tell_partition(request, call.topic, call.partition, message):
        reply(ErrorCode.NOT_LEADER_OR_FOLLOWER)
