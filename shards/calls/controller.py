"""controller: the Controller's messages, from any shard to shard 0, which alone runs it.

    ControllerCall(op, header)  -->  shard 0's Controller
      op: which message (create topics, delete topics, create partitions, alter configs,
      producer id, a node's registration, a node's producer-id block, partition moves, a
      move's completion); header: that message's fields, its reply left out
                <-- ControllerAnswer(topic results, a producer id, an error code, a
                    producer-id block [node, start, size], or partition results
                    [[topic, partition, error, message], ...])

The Controller broadcasts each new topic table before it answers (calls/topics.py), so the
shard that asked has the table by the time the answer arrives (pipes are FIFO).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

from actors.cluster.commands import NodeInfo
from actors.cluster.state import ProducerIdBlock
from actors.cluster_controller import ProducerIdBlockFor, RegisterSelf
from actors.controller import (
    AllocateProducerId,
    AlterTopicConfigs,
    CompleteMove,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    MovePartitions,
    PartitionResult,
    TopicResult,
    TopicSpec,
    refuse_moves,
    topic_names_of,
)
from actors.topic_config import Operation
from shards.calls.base import UNREACHABLE, Address, Caller, Request
from shards.calls.topics import info_from_wire, info_to_wire
from wire.errors import ErrorCode

__all__ = ["KIND", "ControllerAnswer", "ControllerCall", "send", "serve"]

KIND = 9

Results = Callable[[list[TopicResult]], None]


# The headers: each message's fields but its reply. msgpack packs them as they are (the
# TopicSpecs and Operations in them as arrays); `from_wire` rebuilds the nested records.


class CreateTopicsCall(NamedTuple):
    specs: list[TopicSpec]
    validate_only: bool

    @classmethod
    def from_wire(cls, body: list[Any]) -> CreateTopicsCall:
        specs, validate_only = body
        return cls(
            [TopicSpec(n, p, rf, [tuple(a) for a in asg], dict(cfg))
             for n, p, rf, asg, cfg in specs],
            validate_only,
        )  # fmt: skip

    def message(self, reply: Results) -> CreateTopics:
        return CreateTopics(self.specs, self.validate_only, reply)


class DeleteTopicsCall(NamedTuple):
    names: list[str | None]
    ids: list[bytes | None]

    @classmethod
    def from_wire(cls, body: list[Any]) -> DeleteTopicsCall:
        names, ids = body
        return cls(list(names), [None if i is None else bytes(i) for i in ids])

    def message(self, reply: Results) -> DeleteTopics:
        return DeleteTopics(self.names, self.ids, reply)


class CreatePartitionsCall(NamedTuple):
    counts: list[tuple[str, int]]
    validate_only: bool

    @classmethod
    def from_wire(cls, body: list[Any]) -> CreatePartitionsCall:
        counts, validate_only = body
        return cls([(name, count) for name, count in counts], validate_only)

    def message(self, reply: Results) -> CreatePartitions:
        return CreatePartitions(self.counts, self.validate_only, reply)


class AlterConfigsCall(NamedTuple):
    changes: list[tuple[str, list[Operation]]]
    replace: bool
    validate_only: bool

    @classmethod
    def from_wire(cls, body: list[Any]) -> AlterConfigsCall:
        changes, replace, validate_only = body
        return cls(
            [(name, [Operation(*op) for op in ops]) for name, ops in changes], replace,
            validate_only,
        )  # fmt: skip

    def message(self, reply: Results) -> AlterTopicConfigs:
        return AlterTopicConfigs(self.changes, self.replace, self.validate_only, reply)


class RegisterNodeCall(NamedTuple):
    info: list[Any]  # NodeInfo's fields

    @classmethod
    def from_wire(cls, body: list[Any]) -> RegisterNodeCall:
        return cls(list(body[0]))

    def message(self, reply: Callable[[ErrorCode], None]) -> RegisterSelf:
        return RegisterSelf(NodeInfo(*self.info), reply)


class ProducerIdBlockCall(NamedTuple):
    node: int

    @classmethod
    def from_wire(cls, body: list[Any]) -> ProducerIdBlockCall:
        return cls(int(body[0]))

    def message(self, reply: Callable[[ProducerIdBlock | ErrorCode], None]
                ) -> ProducerIdBlockFor:
        return ProducerIdBlockFor(self.node, reply)


class ProducerIdCall(NamedTuple):
    @classmethod
    def from_wire(cls, _body: list[Any]) -> ProducerIdCall:
        return cls()

    def message(self, reply: Callable[[int], None]) -> AllocateProducerId:
        return AllocateProducerId(reply)


class MovePartitionsCall(NamedTuple):
    moves: list[tuple[str, list[tuple[int, list[int] | None]]]]

    @classmethod
    def from_wire(cls, body: list[Any]) -> MovePartitionsCall:
        return cls([(str(topic), [(int(p), None if nodes is None else [int(n) for n in nodes])
                                  for p, nodes in moves]) for topic, moves in body[0]])

    def message(self, reply: Callable[[list[PartitionResult]], None]) -> MovePartitions:
        return MovePartitions(self.moves, reply)


class CompleteMoveCall(NamedTuple):
    topic: str
    topic_id: bytes
    partition: int
    target: list[Any]  # [[node, shard], ...]

    @classmethod
    def from_wire(cls, body: list[Any]) -> CompleteMoveCall:
        topic, topic_id, partition, target = body
        return cls(topic, bytes(topic_id), partition, target)

    def message(self, reply: Callable[[ErrorCode], None]) -> CompleteMove:
        return CompleteMove(self.topic, self.topic_id, self.partition,
                            tuple((int(n), int(s)) for n, s in self.target), reply)


# The op on the wire is the header's place here: append, never reorder.
_HEADERS: tuple[Any, ...] = (
    CreateTopicsCall, DeleteTopicsCall, CreatePartitionsCall, AlterConfigsCall, ProducerIdCall,
    RegisterNodeCall, ProducerIdBlockCall, MovePartitionsCall, CompleteMoveCall,
)
_HEADER_OF: dict[type, Any] = {
    CreateTopics: CreateTopicsCall,
    DeleteTopics: DeleteTopicsCall,
    CreatePartitions: CreatePartitionsCall,
    AlterTopicConfigs: AlterConfigsCall,
    AllocateProducerId: ProducerIdCall,
    RegisterSelf: RegisterNodeCall,
    ProducerIdBlockFor: ProducerIdBlockCall,
    MovePartitions: MovePartitionsCall,
    CompleteMove: CompleteMoveCall,
}
# The calls answered with an error code alone, or (a block's) with a list when it succeeds.
_ANSWERED_WITH_ERROR = (RegisterSelf, ProducerIdBlockFor, CompleteMove)


class ControllerCall(NamedTuple):
    op: int  # the header's place in _HEADERS
    header: list[Any]


class ControllerAnswer(NamedTuple):
    # [[name, error, message, info], ...] for topic results; a producer id; an error code;
    # or a producer-id block, [node, start, size]
    value: Any


def _result_to_wire(r: TopicResult) -> list[Any]:
    info = None if r.info is None else info_to_wire(r.info)
    return [r.name, int(r.error), r.message, info]


def _result_from_wire(value: list[Any]) -> TopicResult:
    name, error, message, info = value
    topic = None if info is None else info_from_wire(info)
    return TopicResult(name, ErrorCode(error), message, topic)


def send(router: Caller, to: Address, message: Any) -> None:
    header_type = _HEADER_OF.get(type(message))
    assert header_type is not None, f"no pipe form for {type(message).__name__}"
    reply = message.reply

    def on_reply(body: Any, _frames: list[Any]) -> None:
        if body is UNREACHABLE:  # another node's controller, gone or too slow
            if isinstance(message, _ANSWERED_WITH_ERROR):
                reply(ErrorCode.REQUEST_TIMED_OUT)
            elif isinstance(message, AllocateProducerId):
                reply(-1)
            elif isinstance(message, MovePartitions):
                refuse_moves(message, ErrorCode.REQUEST_TIMED_OUT,
                             "the controller did not answer")
            else:
                reply([TopicResult(name or "", ErrorCode.REQUEST_TIMED_OUT,
                                   "the controller did not answer")
                       for name in topic_names_of(message)])
            return
        value = ControllerAnswer._make(body).value
        if isinstance(message, ProducerIdBlockFor) and isinstance(value, list):
            reply(ProducerIdBlock(*(int(v) for v in value)))
        elif isinstance(message, _ANSWERED_WITH_ERROR):
            reply(ErrorCode(value))
        elif isinstance(message, AllocateProducerId):
            reply(value)
        elif isinstance(message, MovePartitions):
            reply([PartitionResult(topic, partition, ErrorCode(error), text)
                   for topic, partition, error, text in value])
        else:
            reply([_result_from_wire(r) for r in value])

    header = header_type._make(message[:-1])  # every field but the reply, the last
    router.call(to, KIND, ControllerCall(_HEADERS.index(header_type), header), [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = ControllerCall._make(body)
    header = _HEADERS[call.op].from_wire(call.header)

    def reply(value: list[TopicResult] | list[PartitionResult] | ProducerIdBlock | int
              ) -> None:
        wire: Any
        if isinstance(value, ProducerIdBlock):
            wire = list(value)
        elif isinstance(value, int):
            wire = int(value)
        elif isinstance(header, MovePartitionsCall):
            wire = [[r.topic, r.partition, int(r.error), r.message]
                    for r in cast(list[PartitionResult], value)]
        else:
            wire = [_result_to_wire(r) for r in value]  # type: ignore[arg-type]
        request.answer(ControllerAnswer(wire))

    request.router.shard.controller().tell(header.message(reply))
