"""produce: a `Produce` to a partition another shard owns, answered in two phases.

    source                                             owner
    ProduceCall(topic, partition, acks,           -->  Partition: append (phase one), the
      arena_offset, nbytes): the batches' place in       batches read in place
      the source's arena; or -1 and payload frame 0
                    <-- ProduceAnswer(PHASE_ONE)           order fixed, region free again
                    <-- ProduceAnswer(PHASE_TWO, result)   durable (acks=1/all) or refused

Phase one ("dispatched") tells the source the owner is done with the batch's bytes and their
order is fixed: it frees the source's arena region and lets its connection dispatch the next
request. It leaves lazily (Caller.answer_lazily): with the next message to the source, usually
this request's own phase two, which then carries it (PHASE_ONE | PHASE_TWO).

Each request's answers reach the source in one of two shapes, never another: phase one then
phase two, or phase two carrying phase one. A partition answers a refused, duplicate or
write-caching produce while it takes it, before its `on_dispatched` runs; that "produced"
carries phase one (a partition answers only once it has appended or refused the batch, and
reads it no more), and the "dispatched" that follows is dropped here (`_Answers`). Before,
that "produced" could leave alone, its source forgot the request, and the late "dispatched"
found none (tests/shards/test_two_phase.py has the sequence).

The produces that came in one pipe message are answered together (`_AnswerGroup`). A batch
goes by reference only between shards of one node, whose arenas are shared memory; to another
node (node RPC) it will go as payload frame 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from actors.partition_messages import Produce, ProduceResult, RecordError
from actors.trace import ProduceTrace
from shards.calls.base import Address, Caller, Request, tell_partition
from wire.errors import DecodeError, ErrorCode
from wire.record_batch import iter_batches

__all__ = ["KIND", "PHASE_ONE", "PHASE_TWO", "ProduceAnswer", "ProduceCall", "send", "serve"]

log = logging.getLogger(__name__)

KIND = 2
PHASE_ONE = 1  # dispatched: the order is fixed, the batch's bytes are the owner's
PHASE_TWO = 2  # produced: the result


class ProduceCall(NamedTuple):
    topic: str
    partition: int
    acks: int
    arena_offset: int  # where the batches are in the source's arena; -1: payload frame 0
    nbytes: int
    traced: bool = False  # a sampled request: the owner stamps it (actors/trace.py)


class ProduceAnswer(NamedTuple):
    phases: int  # PHASE_ONE, PHASE_TWO or both
    error: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: list[list[Any]] | None = None  # [batch index, message] of each
    stamps: list[float] | None = None  # a traced produce's owner stamps (actors/trace.py)

    def result(self) -> ProduceResult:
        record_errors = tuple(RecordError(index, message)
                              for index, message in self.record_errors or ())
        return ProduceResult(
            ErrorCode(self.error), self.base_offset, self.log_append_time_ms,
            self.log_start_offset, self.message, record_errors,
        )  # fmt: skip


DISPATCHED = ProduceAnswer(PHASE_ONE)


# The source side ------------------------------------------------------------------------


def send(router: Caller, to: Address, topic: str, partition: int, m: Produce) -> None:
    region: int | None = None  # a region of our own, to free on the first answer
    where = router.arena_offset(m.records) if m.on_dispatched is not None else None
    if where is None:
        where = region = router.arena_put(m.records)
    # else: received into our arena, held by the caller until on_dispatched: pass it on
    first = True

    def on_reply(body: Any, _frames: list[Any]) -> bool:
        nonlocal first
        answer = ProduceAnswer._make(body)
        if first:  # phase one comes first, alone or inside phase two: the batch is free
            first = False
            if region is not None:
                router.arena_release(region)
            if m.on_dispatched is not None:
                m.on_dispatched()
        if answer.phases & PHASE_ONE:
            router.dispatched += 1
        if not answer.phases & PHASE_TWO:
            return m.reply is not None  # phase two follows unless acks=0
        if m.trace is not None and answer.stamps:
            m.trace.take_owner_stamps(answer.stamps)
        if m.reply is not None:
            m.reply(answer.result())
        return False

    traced = m.trace is not None
    if where is None:
        call, payloads = ProduceCall(topic, partition, m.acks, -1, 0, traced), [m.records]
    else:  # the batches are in this shard's arena; the owner reads them there
        call = ProduceCall(topic, partition, m.acks, where, m.records.nbytes, traced)
        payloads = []
    # With acks=0 and a payload frame nothing need come back; a region must, to be freed.
    wants_reply = m.reply is not None or where is not None or m.on_dispatched is not None
    router.call(to, KIND, call, payloads, on_reply if wants_reply else None)


# The owner side ------------------------------------------------------------------------


def serve(request: Request, body: Any, frames: list[Any]) -> None:
    call = ProduceCall._make(body)
    router = request.router
    if call.arena_offset >= 0:  # in the source's arena, ours until we answer phase one
        records = router.arena_view(request.source, call.arena_offset, call.nbytes)
    else:
        # The pipe's frame is read-only: the log patches offsets in place, so copy it once.
        records = memoryview(bytearray(frames[0]))
    trace = ProduceTrace() if call.traced else None
    answers = _Answers(request, trace)
    produced: Callable[[ProduceResult], None] = answers.produced
    # A write-caching topic answers at append time: it must not wait for others' flushes.
    if request.id and call.acks != 0 and not router.shard.write_caching(call.topic):
        group = router.batch_state(_AnswerGroup)
        if group is not None:
            produced = group.member(produced)

    def refused(result: ProduceResult) -> None:
        # One answer either way; with acks=0 the source only waits to free its region.
        if call.acks != 0:
            produced(result)
        else:
            answers.dispatched()

    try:
        headers = iter_batches(records, check_crc=False)  # checked by the source shard
    except DecodeError:  # our bug: the source shard validated these bytes
        log.exception("batches from %s do not parse", request.source)
        refused(ProduceResult(ErrorCode.CORRUPT_MESSAGE))
        return
    # The partition appends in the turn it takes the message, before "dispatched" can
    # leave this shard: so "dispatched" also tells the source its region is free.
    wants_reply = bool(request.id)
    message = Produce(
        records,
        headers,
        call.acks,
        produced if wants_reply and call.acks != 0 else None,
        answers.dispatched if wants_reply else None,
        trace=trace,
    )
    if not tell_partition(request, call.topic, call.partition, message):
        refused(ProduceResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))


_NOT_YET, _WAITING, _SENT = 0, 1, 2  # where a request's phase one is


class _Answers:
    """One produce's answers on its owner: phase one leaves at most once, on its own or
    inside phase two."""

    __slots__ = ("_request", "_phase_one", "_trace")

    def __init__(self, request: Request, trace: ProduceTrace | None = None) -> None:
        self._request = request
        self._phase_one = _NOT_YET
        self._trace = trace

    def dispatched(self) -> None:
        if self._phase_one != _NOT_YET:
            return  # phase two carried it already (answered while taken)
        self._phase_one = _WAITING
        self._request.router.answer_lazily(self._request, DISPATCHED)

    def produced(self, result: ProduceResult) -> None:
        request = self._request
        phases = PHASE_TWO
        if self._phase_one == _NOT_YET or (
            self._phase_one == _WAITING and request.router.withdraw_lazy(request)
        ):
            phases |= PHASE_ONE  # one answer for the source to handle instead of two
        self._phase_one = _SENT
        request.answer(
            ProduceAnswer(
                phases, int(result.error), result.base_offset, result.log_append_time_ms,
                result.log_start_offset, result.message,
                [list(e) for e in result.record_errors] if result.record_errors else None,
                None if self._trace is None else self._trace.owner_stamps(),
            )
        )  # fmt: skip


class _AnswerGroup:
    """Holds the phase-two answers of the produces that came in one pipe message until every
    one of them is ready, then sends them in the same loop turn, so in one pipe message.

    Those produces are usually one Kafka request's partitions owned by this shard, and the
    source answers that request only when all of them are produced anyway; each partition's
    flush completes on its own, so without this each would cost a pipe message. Produces to
    write-caching topics are not members: they are answered at append time.
    """

    __slots__ = ("_waiting", "_ready", "_open")

    def __init__(self) -> None:
        self._waiting = 0
        self._ready: list[tuple[Callable[[ProduceResult], None], ProduceResult]] = []
        self._open = True  # members may still join (the batch is being served)

    def member(self, answer: Callable[[ProduceResult], None]) -> Callable[[ProduceResult], None]:
        self._waiting += 1

        def ready(result: ProduceResult) -> None:
            self._ready.append((answer, result))
            self._waiting -= 1
            self._release()

        return ready

    def close(self) -> None:
        self._open = False
        self._release()

    def _release(self) -> None:
        if self._open or self._waiting or not self._ready:
            return
        ready, self._ready = self._ready, []
        for answer, result in ready:
            answer(result)
