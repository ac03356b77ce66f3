"""The messages a partition holds while it cannot answer (actors/partition_held.py), without
an actor: order, the bound, a turn's share, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from actors import limits
from actors.partition_held import WAIT_FOR_STATE, HeldMessages
from actors.partition_messages import (
    DeleteRecords,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
)
from actors.partition_reads import Warmed
from wire.errors import ErrorCode

pytestmark = pytest.mark.timeout(30)


def info(answers: list[Any]) -> PartitionInfo:
    return PartitionInfo(answers.append)


def test_held_messages_are_handled_in_order_once_serving() -> None:
    held, answers, handled = HeldMessages(), [], []
    messages = [info(answers) for _ in range(3)]
    for message in messages:
        held.hold(message, offline=False)
    assert held
    assert not held.release(handled.append, ready=lambda _m: False, offline=lambda: False)
    assert handled == [] and held
    assert not held.release(handled.append, ready=lambda _m: True, offline=lambda: False)
    assert handled == messages and not held and answers == []


def test_a_turn_handles_its_share_and_says_the_rest_waits(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(limits, "inbox_drain_messages_max", 2)
    held, handled = HeldMessages(), []
    for _ in range(5):
        held.hold(info([]), offline=False)
    assert held.release(handled.append, lambda _m: True, lambda: False)
    assert len(handled) == 2
    assert held.release(handled.append, lambda _m: True, lambda: False)
    assert not held.release(handled.append, lambda _m: True, lambda: False)
    assert len(handled) == 5


def test_past_the_bound_a_message_is_refused_retriable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "partition_held_messages_max", 2)
    held, answers = HeldMessages(), []
    for _ in range(3):
        held.hold(DeleteRecords(5, answers.append), offline=False)
    assert answers == [(ErrorCode.REQUEST_TIMED_OUT, -1)]


def test_offline_refuses_what_comes_and_what_was_held() -> None:
    held, answers, handled, dispatched = HeldMessages(), [], [], []
    held.hold(Produce(memoryview(b""), [], -1, answers.append,
                      on_dispatched=lambda: dispatched.append(1)), offline=False)
    held.hold(info(answers), offline=True)  # refused at once
    assert answers == [{"error": int(ErrorCode.KAFKA_STORAGE_ERROR)}]
    assert not held.release(handled.append, lambda _m: True, offline=lambda: True)
    assert handled == [] and dispatched == [1]  # the produce's bytes are given back
    assert answers[1] == ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR)


def test_refuse_all_answers_a_warmed_read_as_its_read() -> None:
    held, answers = HeldMessages(), []
    read = Read(0, 1024, -1, None, answers.append)  # type: ignore[arg-type]
    listing = ListOffset(-1, -1, answers.append)
    held.hold(Warmed(read, 1), offline=False)
    held.hold(Warmed(listing, 1), offline=False)
    held.refuse_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert answers == [ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER),
                       ListOffsetResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    assert not held


def test_what_waits_is_what_needs_the_log_or_the_producer_state() -> None:
    assert {Produce, Read, ListOffset, PartitionInfo, Warmed} <= WAIT_FOR_STATE
