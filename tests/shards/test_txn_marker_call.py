"""A transaction marker and a read_committed read across shards (shards/calls/txn_marker.py,
calls/read.py), over the in-memory pipes of test_two_phase.py: shard 1 owns t-0, shard 0
reaches it only through its Router, as a coordinator or a Connection on shard 0 would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actors.partition_messages import (
    LATEST_TIMESTAMP,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
    WriteTxnMarker,
)
from shards.calls import txn_marker
from shards.calls.base import UNREACHABLE
from shards.remote import RemotePartition
from tests.shards.test_two_phase import loop, two_shards  # noqa: F401 (fixtures)
from tests.support.actor_loop import settle
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = pytest.mark.timeout(30)

PID = 77


def _ask(loop: asyncio.AbstractEventLoop, remote: RemotePartition,  # noqa: F811
         make: Any) -> Any:
    answers: list[Any] = []
    remote.tell(make(answers.append))
    settle(loop, lambda: bool(answers))
    return answers[0]


def test_a_marker_and_read_committed_cross_shards(
    loop: asyncio.AbstractEventLoop, two_shards: Any  # noqa: F811
) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "t", 0)
    for pid in (PID, PID + 1):
        batch = build_batch([(None, b"v", [])], producer_id=pid, producer_epoch=0,
                            base_sequence=0, transactional=True)
        produced: ProduceResult = _ask(loop, remote, lambda reply, b=batch: Produce(
            memoryview(b), iter_batches(b), -1, reply))
        assert produced.error == ErrorCode.NONE
    error = _ask(loop, remote, lambda reply: WriteTxnMarker(PID, 0, False, 3, reply))
    assert error == ErrorCode.NONE
    stale = _ask(loop, remote, lambda reply: WriteTxnMarker(PID + 1, -1, True, 3, reply))
    assert stale == ErrorCode.INVALID_PRODUCER_EPOCH
    read: ReadResult = _ask(loop, remote, lambda reply: Read(
        0, 1 << 20, -1, FetchBudget(1 << 20), reply, committed=True))
    assert (read.high_watermark, read.last_stable_offset) == (3, 1)  # PID + 1's is open
    assert read.aborted_transactions == [(PID, 0)]
    assert read.records is not None and read.records.records == 1  # the aborted batch only
    latest: ListOffsetResult = _ask(loop, remote, lambda reply: ListOffset(
        LATEST_TIMESTAMP, -1, reply, True))
    assert latest.offset == 1
    error = _ask(loop, remote, lambda reply: WriteTxnMarker(PID + 1, 0, True, 3, reply))
    assert error == ErrorCode.NONE
    uncommitted: ReadResult = _ask(loop, remote, lambda reply: Read(
        0, 1 << 20, -1, FetchBudget(1 << 20), reply))
    assert uncommitted.last_stable_offset == uncommitted.high_watermark == 4
    assert uncommitted.aborted_transactions is None


def test_a_marker_to_a_shard_without_the_partition_is_not_leader(
    loop: asyncio.AbstractEventLoop, two_shards: Any  # noqa: F811
) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "nope", 0)
    error = _ask(loop, remote, lambda reply: WriteTxnMarker(PID, 0, True, 0, reply))
    assert error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_an_unreachable_node_is_a_retriable_timeout() -> None:
    answers: list[ErrorCode] = []

    class Router:
        def call(self, to: Any, kind: int, body: Any, frames: list[Any], on_reply: Any) -> None:
            assert kind == txn_marker.KIND and to == (2, 0)
            on_reply(UNREACHABLE, [])

    txn_marker.send(Router(), (2, 0), "t", 0,  # type: ignore[arg-type]
                    WriteTxnMarker(PID, 0, True, 0, answers.append))
    assert answers == [ErrorCode.REQUEST_TIMED_OUT]
