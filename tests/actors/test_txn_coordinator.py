"""The transaction coordinator inside the GroupCoordinator actor (actors/group/txn_coordinator.py):
producer ids from the controller, records in `__consumer_offsets`, markers sent to partition
writers and retried while they refuse, a deleted topic's marker dropped, and a transaction
left prepared by one coordinator completed by the next that loads its partition.

Real actors on a real loop, with the real Partition actors of test_group_coordinator's `Node`;
the partitions that receive markers are `Writers`, scripted stand-ins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.controller import AllocateProducerId
from actors.group.messages import (
    AddTxnPartitions,
    DescribeTxns,
    EndTransaction,
    InitTransactional,
    OffsetsOwnership,
)
from actors.partition_messages import WriteTxnMarker
from actors.services import TopicInfo, TopicTable
from tests.actors.test_group_coordinator import Node, ask, group_in, start
from tests.support.actor_loop import actor_loop
from wire.errors import ErrorCode as E

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
TP0, TP1 = (TOPIC, 0), (TOPIC, 1)


class Writers:
    """Every partition's leader as the coordinator reaches it: records each marker, answers
    it with the next scripted error for its partition (then NONE), or holds it."""

    def __init__(self) -> None:
        self.markers: list[tuple[tuple[str, int], WriteTxnMarker]] = []
        self.script: dict[tuple[str, int], list[E]] = {}
        self.hold = False

    def writer(self, topic: str, index: int) -> Any:
        writers = self

        class Writer:
            def tell(self, message: WriteTxnMarker) -> None:
                writers.markers.append(((topic, index), message))
                if writers.hold:
                    return
                errors = writers.script.get((topic, index), [])
                message.reply(errors.pop(0) if errors else E.NONE)

        return Writer()


class TxnNode(Node):
    def __init__(self, loop: asyncio.AbstractEventLoop, data_dir: Path) -> None:
        super().__init__(loop, data_dir)
        topics = dict(self.table.topics)
        topics[TOPIC] = TopicInfo(TOPIC, bytes(16), 2)
        self.table = TopicTable(topics, 2)
        self.writers = Writers()
        self.next_producer_id = 1000

    def partition_writer(self, topic: str, index: int) -> Any:
        return self.writers.writer(topic, index)

    def controller(self) -> Any:
        node = self

        class Controller:
            def tell(self, message: AllocateProducerId) -> None:
                node.next_producer_id += 1
                message.reply(node.next_producer_id)

        return Controller()


loop = pytest.fixture(actor_loop)


@pytest.fixture
def node(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Iterator[TxnNode]:
    yield TxnNode(loop, tmp_path)


def init(loop: asyncio.AbstractEventLoop, coordinator: Any, tid: str) -> tuple[E, int, int]:
    result: tuple[E, int, int] = ask(loop, lambda r: coordinator.tell(
        InitTransactional(tid, 60_000, -1, -1, r)))
    return result


def begin(loop: asyncio.AbstractEventLoop, coordinator: Any, tid: str) -> int:
    error, producer_id, epoch = init(loop, coordinator, tid)
    assert (error, epoch) == (E.NONE, 0)
    added = ask(loop, lambda r: coordinator.tell(
        AddTxnPartitions(tid, producer_id, 0, [TP0, TP1], r)))
    assert added == E.NONE
    return producer_id


def state(loop: asyncio.AbstractEventLoop, coordinator: Any, tid: str) -> str:
    described = ask(loop, lambda r: coordinator.tell(DescribeTxns([tid], r)))
    return str(described[0].state)


def wait_state(loop: asyncio.AbstractEventLoop, coordinator: Any, tid: str, wanted: str) -> None:
    """Describe the id until it is in `wanted` (markers retry after backoffs: up to ~10 s)."""
    seen = ""
    for _ in range(500):
        seen = state(loop, coordinator, tid)
        if seen == wanted:
            return
        loop.run_until_complete(asyncio.sleep(0.02))
    raise AssertionError(f"{tid}: {seen}, never {wanted}")


def test_commit_retries_refused_markers_then_completes(
    loop: asyncio.AbstractEventLoop, node: TxnNode
) -> None:
    tid = group_in(1, "tx")
    coordinator = start(node, lambda p: True)
    producer_id = begin(loop, coordinator, tid)
    assert state(loop, coordinator, tid) == "Ongoing"
    node.writers.script[TP0] = [E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT]
    assert ask(loop, lambda r: coordinator.tell(
        EndTransaction(tid, producer_id, 0, True, r))) == E.NONE
    wait_state(loop, coordinator, tid, "CompleteCommit")
    sent = [(tp, m.producer_id, m.producer_epoch, m.commit) for tp, m in node.writers.markers]
    assert sent.count((TP0, producer_id, 0, True)) == 3  # two refusals, then written
    assert sent.count((TP1, producer_id, 0, True)) == 1
    # A retried EndTxn after completion is NONE; the next InitProducerId bumps the epoch.
    assert ask(loop, lambda r: coordinator.tell(
        EndTransaction(tid, producer_id, 0, True, r))) == E.NONE
    assert init(loop, coordinator, tid) == (E.NONE, producer_id, 1)


def test_a_deleted_topics_marker_is_dropped(
    loop: asyncio.AbstractEventLoop, node: TxnNode
) -> None:
    tid = group_in(2, "tx")
    coordinator = start(node, lambda p: True)
    producer_id = begin(loop, coordinator, tid)
    node.writers.script[TP0] = [E.UNKNOWN_TOPIC_OR_PARTITION] * 1000
    node.table = TopicTable({k: v for k, v in node.table.topics.items() if k != TOPIC}, 3)
    assert ask(loop, lambda r: coordinator.tell(
        EndTransaction(tid, producer_id, 0, False, r))) == E.NONE
    wait_state(loop, coordinator, tid, "CompleteAbort")


def test_the_next_coordinator_completes_a_prepared_transaction(
    loop: asyncio.AbstractEventLoop, node: TxnNode
) -> None:
    tid = group_in(3, "tx")
    first = start(node)
    first.tell(OffsetsOwnership(frozenset({3})))
    producer_id = begin(loop, first, tid)
    node.writers.hold = True  # the markers never come back
    assert ask(loop, lambda r: first.tell(
        EndTransaction(tid, producer_id, 0, True, r))) == E.NONE
    assert state(loop, first, tid) == "PrepareCommit"
    # Another InitProducerId waits for the markers.
    assert init(loop, first, tid) == (E.CONCURRENT_TRANSACTIONS, -1, -1)
    first.tell(OffsetsOwnership(frozenset()))  # its leadership moves away
    described = ask(loop, lambda r: first.tell(DescribeTxns([tid], r)))
    assert described[0].error == E.NOT_COORDINATOR
    first.stop(block=False)

    node.writers.hold = False
    node.writers.markers.clear()
    second = start(node)
    second.tell(OffsetsOwnership(frozenset({3})))
    wait_state(loop, second, tid, "CompleteCommit")
    assert {tp for tp, m in node.writers.markers if m.commit} == {TP0, TP1}
    assert init(loop, second, tid) == (E.NONE, producer_id, 1)


def test_an_ongoing_transaction_keeps_its_timeout_across_loads(
    loop: asyncio.AbstractEventLoop, node: TxnNode
) -> None:
    tid = group_in(0, "tx")
    first = start(node)
    first.tell(OffsetsOwnership(frozenset({0})))
    producer_id = begin(loop, first, tid)
    started = ask(loop, lambda r: first.tell(DescribeTxns([tid], r)))[0].start_ms
    first.tell(OffsetsOwnership(frozenset()))
    first.stop(block=False)
    second = start(node)
    second.tell(OffsetsOwnership(frozenset({0})))
    described = ask(loop, lambda r: second.tell(DescribeTxns([tid], r)))[0]
    assert (described.state, described.start_ms, described.producer_id) == (
        "Ongoing", started, producer_id)
    assert [tuple(tp) for tp in described.partitions] == [TP0, TP1]
