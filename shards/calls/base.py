"""What every call module shares: addresses, the reply type, the request being served.

A call crosses as one message: the header frame `[kind, request id, body]` (msgpack) and raw
payload frames. `kind` names the call module (its `KIND`); `body` is the call's typed header,
a NamedTuple of msgpack values that crosses as an array of its fields in order and comes back
with `Header._make(body)`, unless its module says otherwise in its `to_wire`/`from_wire`. An
answer is `[REPLY, request id, body]`; request id 0 asks for none. `BATCH` carries several
messages gathered in one loop turn (shards/router.py).

Addresses are opaque here and in the Router: whatever the mesh resolves (a shard of this
node, or with node RPC `(node, shard)` of another node; shards/node_mesh.py).

A call to another node may get `UNREACHABLE` instead of an answer: its message was refused
(the peer's bound was hit) or no answer came within `node_rpc_call_timeout_s`
(shards/router.py). It is never a body that crossed the wire, so `body is UNREACHABLE` tells
it apart; a call module sent to other nodes maps it to its own error. Calls to this node's
shards never get it (a dead shard stops the node).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from actors.handlers.join import send

if TYPE_CHECKING:
    from actors.services import TopicTable
    from storage.segment import OpenFile

__all__ = [
    "Address",
    "BATCH",
    "REPLY",
    "UNREACHABLE",
    "Host",
    "Reply",
    "Request",
    "Serve",
    "Unreachable",
    "tell_partition",
]

# Where a call goes, or came from: only the mesh looks inside.
Address = Hashable

# The kinds the Router itself handles; call modules number theirs from 2.
REPLY = 0
BATCH = 1


class Unreachable:
    """The one answer no peer sends: the call's target did not answer in time, or its message
    was refused (module docstring)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREACHABLE"


UNREACHABLE = Unreachable()

# Handles one answer `(body, payload frames)` to a call; returns True to keep waiting for
# more (a produce's "dispatched" comes before its "produced").
Reply = Callable[[Any, list[Any]], "bool | None"]


class LongPolls(Protocol):
    """The shard's long polls, as the watch call serves a peer's subscription
    (shards/watch.py's WatchService)."""

    def serve(self, topic: str, index: int, seen: int, answer: Callable[[int], None]) -> None: ...


class Host(Protocol):
    """What the serve sides need of the shard they run on (shards.shard.Shard)."""

    shard_id: int
    shards: int

    @property
    def long_polls(self) -> LongPolls: ...

    def local_partition(self, topic: str, index: int) -> Any: ...
    def write_caching(self, topic: str) -> bool: ...
    def controller(self) -> Any: ...
    def local_group_coordinator(self) -> Any: ...
    def on_topics_changed(self, table: TopicTable) -> None: ...
    def raft_heard_from(self, source: Any) -> None: ...
    def raft_receive(self, key: Any, messages: list[Any]) -> None: ...
    def leaders_heard(self, updates: list[Any]) -> None: ...
    def leaders_asked(self, source: Any) -> None: ...
    def cluster_changed(self, controller_leader: int | None, nodes: Any) -> None: ...


class SegmentFileCache(Protocol):
    """Other shards' segment files, kept open (calls/segments.py's SegmentFiles)."""

    def open(self, path: str, inode: int) -> OpenFile | None: ...
    def forget(self, paths: list[str]) -> None: ...


class BatchState(Protocol):
    """What a call keeps for the rest of a batch being served (`Caller.batch_state`)."""

    def close(self) -> None: ...


State = TypeVar("State", bound=BatchState)


class Caller(Protocol):
    """What the calls need of the Router they go out and come in on (shards/router.py's
    Router): sending calls and answers, the batch being served, the arena, the shard it
    serves. A Protocol, so the calls never import the Router that imports their table."""

    dispatched: int  # phase-one answers sent (produce)

    @property
    def shard(self) -> Host: ...
    @property
    def segment_files(self) -> SegmentFileCache: ...

    def peers(self) -> list[Address]: ...
    def call(self, to: Address, kind: int, body: Any, payloads: Sequence[Any],
             reply: Reply | None) -> None: ...
    def answer(self, to: Address, request_id: int, body: Any,
               payloads: Sequence[Any] = ()) -> None: ...
    def answer_lazily(self, request: Request, body: Any) -> None: ...
    def withdraw_lazy(self, request: Request) -> bool: ...
    def batch_state(self, make: type[State]) -> State | None: ...
    def arena_put(self, records: memoryview) -> int | None: ...
    def arena_offset(self, records: memoryview) -> int | None: ...
    def arena_release(self, start: int) -> None: ...
    def arena_view(self, source: Address, start: int, nbytes: int) -> memoryview: ...


class Request(NamedTuple):
    """A call being served: the Router it came in on, its sender, the id its answers go back
    under (0: the sender wants none)."""

    router: Caller
    source: Address
    id: int

    def answer(self, body: Any, payloads: Sequence[Any] = ()) -> None:
        if self.id:
            self.router.answer(self.source, self.id, body, payloads)


# Serves one call: the request, its header's body as it crossed, its payload frames.
Serve = Callable[[Request, Any, list[Any]], None]


def tell_partition(request: Request, topic: str, partition: int, message: Any) -> bool:
    """Tell the partition actor on this shard; False if there is none here (a partition of
    another shard, or a deleted topic's), so the serve side answers an error."""
    ref = request.router.shard.local_partition(topic, partition)
    return ref is not None and send(ref, message)
