"""The GroupCoordinator as its ownership of `__consumer_offsets` partitions moves
(OffsetsOwnership): loaded when gained, forgotten when lost, read again when regained, requests
waiting while their partition loads, a load cut short by a read error, and the append errors
a new leader gives.

Real actors on a real loop: the coordinator and one real Partition actor per offsets partition,
on a tmp directory. The coordinator reaches each partition through a `Gate`, which the tests
close to hold its messages (a load in progress), or set to answer reads or produces with an
error (a replica that lost its leadership).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.group import OFFSETS_TOPIC, limits, offsets_partition
from actors.group.coordinator import GroupCoordinator
from actors.group.events import Join, JoinResult
from actors.group.log_records import OffsetValue, encode_offset_key, encode_offset_value
from actors.group.messages import (
    CommitEntry,
    CommitOffsets,
    DescribeGroups,
    EnsureReady,
    FetchOffsets,
    ListGroups,
    OffsetsOwnership,
)
from actors.partition import Partition
from actors.partition_messages import Produce, ProduceResult, Read, ReadResult
from actors.services import BrokerSettings, TopicInfo, TopicTable
from actors.topic_config import TopicSettings
from shards.watch import WatchService
from tests.support.actor_loop import actor_loop, settle
from tests.support.io_pool import pool_call
from wire.errors import ErrorCode as E
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 4
TOPIC_ID = bytes(range(16))


def group_in(partition: int, tag: str = "g") -> str:
    """A group id whose offsets partition is `partition`."""
    for n in range(10_000):
        group_id = f"{tag}{n}"
        if offsets_partition(group_id, PARTITIONS) == partition:
            return group_id
    raise AssertionError("no such group id")


class Gate:
    """Stands between the coordinator and a Partition actor: open, it passes messages on;
    closed, it holds them; with `fail_reads` or `fail_produces`, it answers those itself."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.open = True
        self.held: list[Any] = []
        self.fail_reads: E | None = None
        self.fail_produces: E | None = None

    def tell(self, message: Any) -> None:
        if isinstance(message, Read) and self.fail_reads is not None:
            message.reply(ReadResult(self.fail_reads))
        elif isinstance(message, Produce) and self.fail_produces is not None:
            assert message.reply is not None
            message.reply(ProduceResult(self.fail_produces))
        elif self.open:
            self.ref.tell(message)
        else:
            self.held.append(message)

    def release(self) -> None:
        self.open = True
        held, self.held = self.held, []
        for message in held:
            self.tell(message)


class Node:
    """What the coordinator and the Partition actors need of their shard: settings, the topic
    table (with `__consumer_offsets`), the partitions (behind gates), the watermark table and
    an I/O pool that runs at once (or holds its jobs while `hold_io`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, data_dir: Path) -> None:
        self.loop = loop
        self.settings = BrokerSettings(
            0, "127.0.0.1", 9092, str(data_dir), "cluster",
            offsets_topic_partitions=PARTITIONS, group_initial_rebalance_delay_ms=0)
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = None
        self.disk_space = None
        self.chunks = None  # buffered mode
        self.hold_io = False
        self.held_io: list[Callable[[], None]] = []
        info = TopicInfo(OFFSETS_TOPIC, TOPIC_ID, PARTITIONS, {"cleanup.policy": "compact"},
                         internal=True)
        self.table = TopicTable({OFFSETS_TOPIC: info}, 1)
        settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
        self.gates = {
            p: Gate(Partition.start(OFFSETS_TOPIC, p, TOPIC_ID, data_dir / f"{OFFSETS_TOPIC}-{p}",
                                    settings, self))
            for p in range(PARTITIONS)
        }

    def topics(self) -> TopicTable:
        return self.table

    def partition(self, topic: str, index: int) -> Any:
        return self.gates.get(index) if topic == OFFSETS_TOPIC else None

    def controller(self) -> Any:
        raise AssertionError("the topic exists: nothing to create")

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        run = pool_call(fn, done)
        if self.hold_io:
            self.held_io.append(run)
        else:
            self.loop.call_soon(run)

    read_blocking = run_blocking
    clean_blocking = run_blocking

    def segments_removed(self, paths: list[str]) -> None:
        pass

    def release_io(self) -> None:
        self.hold_io = False
        held, self.held_io = self.held_io, []
        for run in held:
            self.loop.call_soon(run)


# Driving it ---------------------------------------------------------------------------------


loop = pytest.fixture(actor_loop)


@pytest.fixture
def node(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Iterator[Node]:
    yield Node(loop, tmp_path)


def start(node: Node, owns: Callable[[int], bool] = lambda _p: False) -> Any:
    return GroupCoordinator.start(node, owns)


def ask(loop: asyncio.AbstractEventLoop, send: Callable[[Callable[..., None]], None]) -> Any:
    """Send a request whose reply callback is given, and wait for the answer."""
    answers: list[Any] = []
    send(lambda *args: answers.append(args[0] if len(args) == 1 else args))
    settle(loop, lambda: bool(answers))
    return answers[0]


def fetch(loop: asyncio.AbstractEventLoop, coordinator: Any, group_id: str) -> tuple[E, dict]:
    error, fetched = ask(loop, lambda reply: coordinator.tell(
        FetchOffsets(group_id, None, reply, with_error=True)))
    return error, {(f.topic, f.partition): f.value.offset for f in fetched}


def commit(loop: asyncio.AbstractEventLoop, coordinator: Any, group_id: str,
           offset: int) -> list[E]:
    entry = CommitEntry("t", 0, offset, -1, None)
    errors: list[E] = ask(loop, lambda reply: coordinator.tell(
        CommitOffsets(group_id, -1, "", None, [entry], reply)))
    return errors


def write_commit(loop: asyncio.AbstractEventLoop, node: Node, group_id: str,
                 offset: int) -> None:
    """A commit record produced into the group's partition directly, as another replica
    leading it would have."""
    value = OffsetValue(offset, -1, "", 0)
    batch = build_batch([(encode_offset_key(group_id, "t", 0), encode_offset_value(value), ())])
    view = memoryview(batch)
    ref = node.gates[offsets_partition(group_id, PARTITIONS)].ref
    result: ProduceResult = ask(
        loop, lambda reply: ref.tell(Produce(view, iter_batches(view), -1, reply)))
    assert result.error == E.NONE


def listed(loop: asyncio.AbstractEventLoop, coordinator: Any) -> set[str]:
    listings = ask(loop, lambda reply: coordinator.tell(ListGroups(reply)))
    return {g.group_id for g in listings}


# Ownership as it moves ----------------------------------------------------------------------


def test_ownership_gained_after_start_loads_and_serves(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g1, g2 = group_in(1), group_in(2)
    write_commit(loop, node, g1, 7)
    coordinator = start(node)  # owns nothing yet
    assert fetch(loop, coordinator, g1) == (E.NOT_COORDINATOR, {})
    assert commit(loop, coordinator, g2, 3) == [E.NOT_COORDINATOR]
    assert ask(loop, lambda r: coordinator.tell(EnsureReady(r, g1))) == E.NOT_COORDINATOR

    coordinator.tell(OffsetsOwnership(frozenset({1, 2})))
    assert fetch(loop, coordinator, g1) == (E.NONE, {("t", 0): 7})  # waited for the load
    assert commit(loop, coordinator, g2, 3) == [E.NONE]
    assert fetch(loop, coordinator, g2) == (E.NONE, {("t", 0): 3})
    assert ask(loop, lambda r: coordinator.tell(EnsureReady(r, g1))) == E.NONE
    assert listed(loop, coordinator) == {g1, g2}
    # The older reply form (no error) still answers.
    assert [f.value.offset for f in ask(loop, lambda r: coordinator.tell(
        FetchOffsets(g1, [("t", 0)], r)))] == [7]


def test_lost_answers_not_coordinator_and_forgets(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g, other = group_in(1), group_in(2)
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({1, 2})))
    assert commit(loop, coordinator, g, 5) == [E.NONE]
    assert commit(loop, coordinator, other, 6) == [E.NONE]

    coordinator.tell(OffsetsOwnership(frozenset({2})))
    assert fetch(loop, coordinator, g) == (E.NOT_COORDINATOR, {})
    assert commit(loop, coordinator, g, 9) == [E.NOT_COORDINATOR]
    described = ask(loop, lambda r: coordinator.tell(DescribeGroups([g, other], r)))
    assert [d.error for d in described] == [E.NOT_COORDINATOR, E.NONE]
    assert listed(loop, coordinator) == {other}  # g forgotten; the other served
    assert fetch(loop, coordinator, other) == (E.NONE, {("t", 0): 6})


def test_a_join_waiting_when_the_partition_is_lost_is_answered_not_coordinator(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(3)
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({3})))
    first: list[JoinResult] = []
    coordinator.tell(Join(g, "", None, "a", "/h", 10_000, 60_000, "consumer",
                          (("range", b""),), reply=first.append))
    settle(loop, lambda: bool(first))
    assert first[0].error == E.NONE
    second: list[JoinResult] = []
    # A second member makes the first rejoin: the second's join waits for it.
    coordinator.tell(Join(g, "", None, "b", "/h", 10_000, 60_000, "consumer",
                          (("range", b""),), reply=second.append))
    loop.run_until_complete(asyncio.sleep(0.05))
    assert second == []
    coordinator.tell(OffsetsOwnership(frozenset()))
    settle(loop, lambda: bool(second))
    assert second[0].error == E.NOT_COORDINATOR


def test_regained_reads_again_what_was_written_while_not_owned(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(0)
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({0})))
    assert commit(loop, coordinator, g, 5) == [E.NONE]
    coordinator.tell(OffsetsOwnership(frozenset()))
    assert fetch(loop, coordinator, g) == (E.NOT_COORDINATOR, {})
    write_commit(loop, node, g, 9)  # another replica led meanwhile
    coordinator.tell(OffsetsOwnership(frozenset({0})))
    assert fetch(loop, coordinator, g) == (E.NONE, {("t", 0): 9})


def test_one_node_ownership_is_fixed_and_survives_a_restart(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(2)
    coordinator = start(node, owns=lambda _p: True)  # never told: `owns` decides
    assert commit(loop, coordinator, g, 4) == [E.NONE]
    coordinator.stop(block=False)
    settle(loop, lambda: not coordinator.is_alive())
    again = start(node, owns=lambda _p: True)
    assert fetch(loop, again, g) == (E.NONE, {("t", 0): 4})


# Requests waiting for a load ----------------------------------------------------------------


def test_requests_wait_for_their_partition_while_others_are_served(
    loop: asyncio.AbstractEventLoop, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading, served = group_in(1), group_in(2)
    write_commit(loop, node, loading, 11)
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({2})))
    assert commit(loop, coordinator, served, 1) == [E.NONE]

    node.gates[1].open = False  # the load of 1 is held at its first step
    coordinator.tell(OffsetsOwnership(frozenset({1, 2})))
    monkeypatch.setattr(limits, "requests_waiting_for_load_max", 3)
    answers: list[Any] = []
    coordinator.tell(FetchOffsets(loading, None, lambda *a: answers.append(("f1", a)), True))
    coordinator.tell(CommitOffsets(loading, -1, "", None, [CommitEntry("t", 0, 12, -1, None)],
                                   lambda errors: answers.append(("c", errors))))
    coordinator.tell(ListGroups(lambda groups: answers.append(("l", groups))))
    coordinator.tell(FetchOffsets(loading, None, lambda *a: answers.append(("f2", a)), True))
    # The other partition is served meanwhile; the fourth waiting request finds no room.
    assert fetch(loop, coordinator, served) == (E.NONE, {("t", 0): 1})
    assert answers == [("f2", (E.COORDINATOR_LOAD_IN_PROGRESS, []))]

    node.gates[1].release()
    settle(loop, lambda: len(answers) == 4)
    by_tag = dict(answers[1:])  # the commit's answer waits for its append
    error, fetched = by_tag["f1"]
    assert error == E.NONE
    assert [f.value.offset for f in fetched] == [11]  # served in arrival order: before 12
    assert by_tag["c"] == [E.NONE]
    assert {g.group_id for g in by_tag["l"]} == {loading, served}
    assert fetch(loop, coordinator, loading) == (E.NONE, {("t", 0): 12})


def test_requests_waiting_on_a_load_when_ownership_goes_are_not_coordinator(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(1)
    coordinator = start(node)
    node.gates[1].open = False
    coordinator.tell(OffsetsOwnership(frozenset({1})))
    answers: list[Any] = []
    coordinator.tell(FetchOffsets(g, None, lambda *a: answers.append(a), True))
    loop.run_until_complete(asyncio.sleep(0.05))
    assert answers == []
    coordinator.tell(OffsetsOwnership(frozenset()))
    settle(loop, lambda: bool(answers))
    assert answers == [(E.NOT_COORDINATOR, [])]
    node.gates[1].release()  # the stale load's answers are ignored
    loop.run_until_complete(asyncio.sleep(0.05))
    assert fetch(loop, coordinator, g) == (E.NOT_COORDINATOR, {})


def test_a_load_waits_for_the_high_watermark_to_reach_the_log_end(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(3)
    write_commit(loop, node, g, 1)
    node.hold_io = True  # the next record is appended but not yet flushed (committed)
    value = OffsetValue(2, -1, "", 0)
    batch = build_batch([(encode_offset_key(g, "t", 0), encode_offset_value(value), ())])
    view = memoryview(batch)
    produced: list[ProduceResult] = []
    node.gates[3].ref.tell(Produce(view, iter_batches(view), -1, produced.append))
    loop.run_until_complete(asyncio.sleep(0.05))
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({3})))
    answers: list[Any] = []
    coordinator.tell(FetchOffsets(g, None, lambda *a: answers.append(a), True))
    loop.run_until_complete(asyncio.sleep(0.1))
    assert answers == []  # the load has read offset 1 and waits for the rest
    node.release_io()
    settle(loop, lambda: bool(answers))
    assert [f.value.offset for f in answers[0][1]] == [2]
    assert produced[0].error == E.NONE


# Errors from the partition ------------------------------------------------------------------


def test_a_read_error_ends_the_load_until_ownership_names_it_again(
    loop: asyncio.AbstractEventLoop, node: Node
) -> None:
    g = group_in(2)
    write_commit(loop, node, g, 8)
    coordinator = start(node)
    node.gates[2].fail_reads = E.NOT_LEADER_OR_FOLLOWER  # leadership moved again
    coordinator.tell(OffsetsOwnership(frozenset({2})))
    assert fetch(loop, coordinator, g) == (E.NOT_COORDINATOR, {})
    node.gates[2].fail_reads = None
    loop.run_until_complete(asyncio.sleep(0.05))
    assert fetch(loop, coordinator, g) == (E.NOT_COORDINATOR, {})  # not retried by itself
    coordinator.tell(OffsetsOwnership(frozenset({2})))
    assert fetch(loop, coordinator, g) == (E.NONE, {("t", 0): 8})


@pytest.mark.parametrize(
    ("append_error", "answered"),
    [
        (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
        (E.REQUEST_TIMED_OUT, E.COORDINATOR_NOT_AVAILABLE),  # outcome unknown: retry here
        (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
        (E.KAFKA_STORAGE_ERROR, E.NOT_COORDINATOR),
    ],
)
def test_append_errors_are_coordinator_errors_the_client_retries(
    loop: asyncio.AbstractEventLoop, node: Node, append_error: E, answered: E
) -> None:
    g = group_in(0)
    coordinator = start(node)
    coordinator.tell(OffsetsOwnership(frozenset({0})))
    assert commit(loop, coordinator, g, 1) == [E.NONE]
    node.gates[0].fail_produces = append_error
    assert commit(loop, coordinator, g, 2) == [answered]
    node.gates[0].fail_produces = None
    assert fetch(loop, coordinator, g) == (E.NONE, {("t", 0): 1})
