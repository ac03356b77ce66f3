"""The two-phase cross-core produce, and cross-core reads, over the in-memory pipe transport.

Two shards live in this one process on one loop: shard 1 owns partition t-0 (a real
Partition actor on a real DiskLog); shard 0 reaches it only through its Router and the
pipes, exactly as a Connection on shard 0 would. Every test runs twice: batches carried in
shared-memory arenas (as `krill start` runs) and as payload frames on the pipe (no arena, or
an arena too small for the batch).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.partition import Partition
from actors.partition_messages import (
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
)
from actors.services import BrokerSettings, TopicTable
from actors.topic_config import TopicSettings
from actors.trace import ProduceTrace
from actors.watermarks import Waiter
from shards import limits
from shards.arena import ArenaSet
from shards.calls.base import BATCH, REPLY
from shards.calls.produce import PHASE_ONE, PHASE_TWO, ProduceAnswer
from shards.pipes import MemoryPipeNetwork
from shards.remote import RemotePartition
from shards.router import Router
from shards.watch import WatchService
from tests.support.actor_loop import actor_loop, settle
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch, iter_records

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to

pytestmark = pytest.mark.timeout(30)


class FakeShard:
    """What a Router needs of its shard, and what a Partition needs of Services."""

    def __init__(self, shard_id: int, data_dir: Path) -> None:
        self.shard_id = shard_id
        self.shards = 2
        self.settings = BrokerSettings(0, "127.0.0.1", 9092, str(data_dir), "cluster")
        self.partitions: dict[tuple[str, int], Any] = {}
        self.tables: list[TopicTable] = []
        self.long_polls = WatchService(shard_id, lambda _topic, _index: 1)  # shard 1 owns all
        self.metrics = None  # record nothing (disable_metrics)
        self.disk_space = None  # no free-space guard
        self.chunks = None  # buffered mode

    def local_partition(self, topic: str, index: int) -> Any:
        return self.partitions.get((topic, index))

    def write_caching(self, topic: str) -> bool:
        return topic == "cached"  # the topic test_write_caching_... creates

    def on_topics_changed(self, table: TopicTable) -> None:
        self.tables.append(table)

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        asyncio.get_event_loop().call_soon(lambda: done(fn(), None))

    read_blocking = run_blocking


loop = pytest.fixture(actor_loop)


@pytest.fixture(params=["arena", "frames"])
def two_shards(
    request: pytest.FixtureRequest, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> tuple[Router, Router, FakeShard]:
    network = MemoryPipeNetwork(2, loop)
    arenas = ArenaSet.in_memory(2, 1 << 20) if request.param == "arena" else [None, None]
    shard0, shard1 = FakeShard(0, tmp_path), FakeShard(1, tmp_path)
    routers: list[Router] = []
    for shard in (shard0, shard1):
        router_box: list[Router] = []
        mesh = network.mesh(
            shard.shard_id, lambda s, h, f, box=router_box: box[0].on_message(s, h, f)
        )
        router = Router(shard, mesh, arenas[shard.shard_id])
        router_box.append(router)
        shard.long_polls.bind(router, lambda t, i, shard=shard: (t, i) in shard.partitions)
        routers.append(router)
    settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
    shard1.partitions[("t", 0)] = Partition.start(
        "t", 0, TOPIC_ID, tmp_path / "t-0", settings, shard1)
    shard0.two_shards_peer = shard1  # type: ignore[attr-defined]
    return routers[0], routers[1], shard1


def test_produce_crosses_in_two_phases(loop: asyncio.AbstractEventLoop, two_shards: Any) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "t", 0)
    seen: list[tuple[str, int, ProduceResult]] = []
    for i in range(3):
        batch = build_batch([(None, f"v{i}".encode(), [])] * 2)
        remote.tell(
            Produce(
                memoryview(batch),
                iter_batches(batch),
                -1,
                lambda r: seen.append(("produced", router0.dispatched, r)),
            )
        )
    settle(loop, lambda: len(seen) == 3)
    # Phase one ("dispatched") came back for each request before its phase two ("produced");
    # one flush may produce several requests at once, after all their dispatches.
    assert all(dispatched >= i + 1 for i, (_, dispatched, _) in enumerate(seen))
    assert router0.dispatched == 3
    assert [r.base_offset for _, _, r in seen] == [0, 2, 4]
    assert all(r.error == ErrorCode.NONE for _, _, r in seen)
    assert router0.pending_calls == 0
    assert_arena_empty(router0)


def _hold_flushes(shard: FakeShard) -> list[Callable[[], None]]:
    """Make `shard`'s blocking calls (its fdatasyncs) wait: each is appended to the list
    returned, and runs, with its completion, when the test calls it."""
    held: list[Callable[[], None]] = []

    def run_blocking(fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        held.append(lambda: done(fn(), None))

    shard.run_blocking = run_blocking  # type: ignore[method-assign]
    return held


def assert_arena_empty(router: Router) -> None:
    """Every region the source took was given back, and no batch missed the arena."""
    arenas = router._arenas
    if arenas is not None:
        assert arenas.own.live_regions == 0 and arenas.own.used == 0
        assert router.arena_misses == 0


def test_batches_larger_than_the_arena_go_as_frames(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "t", 0)
    big = build_batch([(None, b"x" * 700_000, [])])  # over half the 1 MiB arena
    produced: list[ProduceResult] = []
    for _ in range(2):  # the second finds the first still in the arena
        remote.tell(Produce(memoryview(big), iter_batches(big), -1, produced.append))
    settle(loop, lambda: len(produced) == 2)
    assert [(r.error, r.base_offset) for r in produced] == [(ErrorCode.NONE, i) for i in (0, 1)]
    if router0._arenas is not None:
        assert router0.arena_misses == 1
        assert router0._arenas.own.live_regions == 0
    reads: list[ReadResult] = []
    remote.tell(Read(0, 4 << 20, -1, FetchBudget(4 << 20), reads.append))
    settle(loop, lambda: bool(reads))
    values = [r.value for r in iter_records(reads[0].records.read())]  # type: ignore[union-attr]
    assert values == [b"x" * 700_000] * 2


def test_acks_0_gets_no_answer_but_frees_its_region(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    router0, _router1, shard1 = two_shards
    remote = RemotePartition(router0, 1, "t", 0)
    for i in range(5):
        batch = build_batch([(None, f"fire-and-forget {i}".encode(), [])])
        remote.tell(Produce(memoryview(batch), iter_batches(batch), 0, None))
    infos: list[Any] = []
    settle(loop, lambda: router0.pending_calls == 0)
    shard1.partitions[("t", 0)].tell(PartitionInfo(infos.append))
    settle(loop, lambda: bool(infos))
    assert infos[0]["next_offset"] == 5
    assert_arena_empty(router0)


def test_read_watch_and_list_offsets_cross(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    router0, _router1, shard1 = two_shards
    watches0 = router0.shard.long_polls
    remote = RemotePartition(router0, 1, "t", 0)
    woken: list[bool] = []
    assert watches0.watch(("t", 0), 0, Waiter(lambda: woken.append(True)))
    produced: list[ProduceResult] = []
    batch = build_batch([(b"k", b"hello", [])])
    remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, produced.append))
    settle(loop, lambda: bool(produced) and bool(woken))
    # The subscription was answered: nothing of it is left on either shard.
    settle(loop, lambda: router0.pending_calls == 0)
    assert watches0.table.waiting() == 0 and shard1.long_polls.table.waiting() == 0

    reads: list[ReadResult] = []
    budget = FetchBudget(1 << 20)
    remote.tell(Read(0, 1 << 20, -1, budget, reads.append))
    settle(loop, lambda: bool(reads))
    result = reads[0]
    assert result.error == ErrorCode.NONE and result.high_watermark == 1
    # The bytes did not cross the pipe: shard 0 got a place in a file and opened it itself.
    assert result.records is not None and result.records.path.endswith(".log")  # type: ignore[union-attr]
    values = [r.value for r in iter_records(result.records.read())]  # type: ignore[union-attr]
    assert values == [b"hello"]
    assert budget.taken == result.size

    offsets: list[ListOffsetResult] = []
    remote.tell(ListOffset(-1, -1, offsets.append))
    remote.tell(ListOffset(-2, -1, offsets.append))
    settle(loop, lambda: len(offsets) == 2)
    assert [o.offset for o in offsets] == [1, 0]


def test_many_waiting_watches_make_one_subscription(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    """A hundred long polls on one remote partition: one pipe call, one watch at the owner;
    cancelled ones leave nothing behind but that one subscription, until the next move."""
    router0, _router1, shard1 = two_shards
    watches0 = router0.shard.long_polls
    woken: list[int] = []
    waiters = [Waiter(lambda i=i: woken.append(i)) for i in range(100)]
    assert all(watches0.watch(("t", 0), 0, w) for w in waiters)
    settle(loop, lambda: shard1.long_polls.table.waiting(("t", 0)) == 1)
    assert router0.pending_calls == 1 and watches0.subscriptions == 1
    for w in waiters[:99]:
        w.cancel()
    assert watches0.table.waiting() == 1
    remote = RemotePartition(router0, 1, "t", 0)
    produced: list[ProduceResult] = []
    batch = build_batch([(b"k", b"v", [])])
    remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, produced.append))
    settle(loop, lambda: woken == [99])
    settle(loop, lambda: router0.pending_calls == 0)
    assert watches0.table.waiting() == 0 and shard1.long_polls.table.waiting() == 0
    assert watches0.subscriptions == 0
    # A watch that read less than the owner has now fires at once: nothing to register.
    assert not watches0.watch(("t", 0), 0, Waiter(lambda: None))


def test_a_watch_newer_than_its_subscription_subscribes_again(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    """The subscription's answer wakes the watches it passes; one that read further (here:
    past 1) stays, and a new subscription goes out for it at once."""
    router0, _router1, shard1 = two_shards
    watches0 = router0.shard.long_polls
    remote = RemotePartition(router0, 1, "t", 0)
    first: list[bool] = []
    further: list[bool] = []
    watches0.watch(("t", 0), 0, Waiter(lambda: first.append(True)))
    watches0.watch(("t", 0), 1, Waiter(lambda: further.append(True)))
    produced: list[ProduceResult] = []
    for count, value in enumerate((b"one", b"two"), start=1):
        batch = build_batch([(b"k", value, [])])
        remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, produced.append))
        settle(loop, lambda n=count: len(produced) == n)
        if value == b"one":
            settle(loop, lambda: bool(first))
            assert not further
            # Subscribed again, from the watermark the answer carried.
            settle(loop, lambda: shard1.long_polls.table.waiting(("t", 0)) == 1)
            assert router0.pending_calls == 1
    settle(loop, lambda: bool(further))
    settle(loop, lambda: router0.pending_calls == 0)
    assert watches0.table.waiting() == 0 and shard1.long_polls.table.waiting() == 0


def test_missing_partition_answers_an_error(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "gone", 3)
    answers: list[Any] = []
    batch = build_batch([(None, b"x", [])])
    remote.tell(Produce(memoryview(batch), iter_batches(batch), 1, answers.append))
    remote.tell(Read(0, 100, -1, FetchBudget(100), answers.append))
    remote.tell(Produce(memoryview(batch), iter_batches(batch), 0, None))  # acks=0 as well
    settle(loop, lambda: len(answers) == 2 and router0.pending_calls == 0)
    assert [a.error for a in answers] == [ErrorCode.NOT_LEADER_OR_FOLLOWER] * 2
    assert_arena_empty(router0)


def test_produce_queued_behind_a_stop_is_answered(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    """A deleted topic's partition stops with messages still queued: each is answered, and
    phase one runs, so a cross-core sender gets its arena region back."""
    _router0, _router1, shard1 = two_shards
    ref = shard1.partitions[("t", 0)]
    events: list[Any] = []
    batch = build_batch([(None, b"late", [])])
    ref.stop(block=False)
    ref.tell(
        Produce(
            memoryview(batch),
            iter_batches(batch),
            -1,
            lambda r: events.append(r.error),
            lambda: events.append("dispatched"),
        )
    )
    ref.tell(Read(0, 100, -1, FetchBudget(100), lambda r: events.append(r.error)))
    settle(loop, lambda: len(events) == 3)
    gone = ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert events == ["dispatched", gone, gone]


def _answers_from_owner(router0: Router) -> list[list[tuple[int, ProduceAnswer]]]:
    """Record each pipe message shard 0 receives, as the produce answers it carries: (request
    id, answer) each."""
    messages: list[list[tuple[int, ProduceAnswer]]] = []
    mesh = router0._mesh
    on_message = mesh.on_message

    def recording(source: int, header: list[Any], frames: list[Any]) -> None:
        kind, _, body = header
        headers = [h for h, _ in body] if kind == BATCH else [header]
        assert all(h[0] == REPLY for h in headers), headers
        messages.append([(h[1], ProduceAnswer._make(h[2])) for h in headers])
        on_message(source, header, frames)

    mesh.on_message = recording
    return messages


def test_one_request_s_partitions_are_answered_in_one_pipe_message(
    loop: asyncio.AbstractEventLoop, two_shards: Any, tmp_path: Path
) -> None:
    """Produces to several partitions of one owner, sent in one loop turn, come back together:
    their phase-two answers in a single pipe message."""
    router0, _router1, shard1 = two_shards
    settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
    for index in (1, 2):
        shard1.partitions[("t", index)] = Partition.start(
            "t", index, TOPIC_ID, tmp_path / f"t-{index}", settings, shard1
        )
    # Each partition's flush completes in a loop turn of its own, as fdatasyncs on threads do.
    delays = iter([0.001, 0.002, 0.003])  # all within the 5 ms a phase-one answer waits

    def run_blocking(fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        asyncio.get_event_loop().call_later(next(delays, 0.0), lambda: done(fn(), None))

    shard1.run_blocking = run_blocking
    answers = _answers_from_owner(router0)
    produced: list[ProduceResult] = []
    for index in (0, 1, 2):
        batch = build_batch([(None, f"p{index}".encode(), [])])
        RemotePartition(router0, 1, "t", index).tell(
            Produce(memoryview(batch), iter_batches(batch), -1, produced.append)
        )
    settle(loop, lambda: len(produced) == 3)
    assert [r.error for r in produced] == [ErrorCode.NONE] * 3
    assert router0.dispatched == 3
    # All three phase-two answers in one message, though each flush ended in its own turn.
    # Phase one usually rides inside them, unless a slow loop let its 5 ms wait run out and
    # it left in a message of its own first.
    names = {PHASE_ONE: "dispatched", PHASE_TWO: "produced",
             PHASE_ONE | PHASE_TWO: "produced+dispatched"}
    kinds = [[names[a.phases] for _, a in message] for message in answers]
    with_produced = [k for k in kinds if any(x.startswith("produced") for x in k)]
    assert len(with_produced) == 1 and len(with_produced[0]) == 3, kinds
    assert sum(x.endswith("dispatched") for k in kinds for x in k) == 3, kinds
    assert_arena_empty(router0)


def test_write_caching_answers_do_not_wait_for_others_flushes(
    loop: asyncio.AbstractEventLoop, two_shards: Any, tmp_path: Path
) -> None:
    """Produces that share a pipe message are answered together, except a write-caching
    topic's, which is answered at append time and must not wait for another's fdatasync."""
    router0, _router1, shard1 = two_shards
    cached = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, True)
    shard1.partitions[("cached", 0)] = Partition.start(
        "cached", 0, TOPIC_ID, tmp_path / "cached-0", cached, shard1
    )
    flushes = _hold_flushes(shard1)  # t-0's flush waits here until released
    answered: list[str] = []
    for topic in ("t", "cached"):
        batch = build_batch([(None, topic.encode(), [])])
        RemotePartition(router0, 1, topic, 0).tell(
            Produce(
                memoryview(batch), iter_batches(batch), -1, lambda r, t=topic: answered.append(t)
            )
        )
    settle(loop, lambda: answered == ["cached"] and bool(flushes))
    for release in flushes:
        release()
    settle(loop, lambda: answered == ["cached", "t"])


def test_phase_one_goes_inside_its_own_phase_two(
    loop: asyncio.AbstractEventLoop, two_shards: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phase-one answer that waits for no longer than its delay leaves inside the same
    request's "produced": one answer per produce, and phase one still counted."""
    monkeypatch.setattr(limits, "pipe_lazy_answer_delay_s", 30.0)  # never runs out here
    router0, _router1, _ = two_shards
    answers = _answers_from_owner(router0)
    produced: list[ProduceResult] = []
    remote = RemotePartition(router0, 1, "t", 0)
    for i in range(5):
        batch = build_batch([(None, str(i).encode(), [])])
        remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, produced.append))
    settle(loop, lambda: len(produced) == 5)
    flat = [a for message in answers for a in message]
    assert len(flat) == 5 and all(a.phases == PHASE_ONE | PHASE_TWO for _, a in flat), flat
    assert router0.dispatched == 5
    assert [r.base_offset for r in produced] == [0, 1, 2, 3, 4]
    assert router0.pending_calls == 0
    assert_arena_empty(router0)
    assert not router0._lazy_timers  # nothing left waiting, no timer left behind


def test_phase_one_does_not_wait_for_a_slow_flush(
    loop: asyncio.AbstractEventLoop, two_shards: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush slower than the delay: phase one leaves alone when its delay runs out, so the
    source's arena region is free while the flush still runs."""
    monkeypatch.setattr(limits, "pipe_lazy_answer_delay_s", 0.001)
    router0, _router1, shard1 = two_shards
    flushes = _hold_flushes(shard1)
    answers = _answers_from_owner(router0)
    produced: list[ProduceResult] = []
    batch = build_batch([(None, b"slow", [])])
    RemotePartition(router0, 1, "t", 0).tell(
        Produce(memoryview(batch), iter_batches(batch), -1, produced.append)
    )
    settle(loop, lambda: router0.dispatched == 1 and bool(flushes))
    assert answers == [[(answers[0][0][0], ProduceAnswer(PHASE_ONE))]]
    assert_arena_empty(router0)  # freed by phase one, before the flush
    assert produced == []
    for release in flushes:
        release()
    settle(loop, lambda: len(produced) == 1)
    assert answers[-1][-1][1].phases == PHASE_TWO and router0.dispatched == 1
    assert produced[0].error == ErrorCode.NONE


def test_remote_phase_one_runs_the_producers_on_dispatched_once(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    router0, _router1, _ = two_shards
    remote = RemotePartition(router0, 1, "t", 0)
    events: list[str] = []
    for acks in (-1, 0):
        batch = build_batch([(None, b"x", [])])
        remote.tell(
            Produce(
                memoryview(batch),
                iter_batches(batch),
                acks,
                (lambda r: events.append("produced")) if acks else None,
                lambda a=acks: events.append(f"dispatched acks={a}"),
            )
        )
    settle(loop, lambda: len(events) == 3 and router0.pending_calls == 0)
    assert sorted(events) == ["dispatched acks=-1", "dispatched acks=0", "produced"]
    assert events.index("dispatched acks=-1") < events.index("produced")
    assert_arena_empty(router0)


@pytest.mark.parametrize("two_shards", ["arena"], indirect=True)
def test_a_batch_received_into_the_arena_goes_by_reference(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    """A produce frame received into shard 0's arena is not copied again to cross: the
    owner appends from the region the frame is in, and phase one gives it back."""
    router0, _router1, _ = two_shards
    arenas = router0._arenas
    assert arenas is not None
    batch = build_batch([(None, b"in place", [])])
    lease = arenas.own.lease(len(batch) + 10)
    assert lease is not None
    lease.view[10:] = batch  # as if received after a 10-byte request header
    records = lease.view[10:]
    lease.retain()  # what the produce handler does for the partition
    produced: list[ProduceResult] = []
    RemotePartition(router0, 1, "t", 0).tell(
        Produce(records, iter_batches(records), -1, produced.append, lease.release)
    )
    assert arenas.own.live_regions == 1  # the frame's region only: no copy was made
    lease.release()  # the connection is done with the frame
    settle(loop, lambda: bool(produced))
    assert produced[0].error == ErrorCode.NONE
    assert_arena_empty(router0)
    reads: list[ReadResult] = []
    RemotePartition(router0, 1, "t", 0).tell(
        Read(0, 1 << 20, -1, FetchBudget(1 << 20), reads.append)
    )
    settle(loop, lambda: bool(reads))
    values = [r.value for r in iter_records(reads[0].records.read())]  # type: ignore[union-attr]
    assert values == [b"in place"]


def test_waiting_phase_one_answers_never_make_an_oversize_pipe_message(
    loop: asyncio.AbstractEventLoop, two_shards: Any
) -> None:
    """More phase-one answers than one pipe message may carry wait for a ride: they leave in
    messages of at most `pipe_batch_messages_max`, and every request is still answered."""
    router0, _router1, _ = two_shards
    most = limits.pipe_batch_messages_max
    answers = _answers_from_owner(router0)
    produced: list[ProduceResult] = []
    remote = RemotePartition(router0, 1, "t", 0)
    count = most + most // 2
    for i in range(count):
        batch = build_batch([(None, str(i).encode(), [])])
        remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, produced.append))
    settle(loop, lambda: len(produced) == count)
    assert [r.base_offset for r in produced] == list(range(count))
    assert router0.dispatched == count
    assert all(len(message) <= most for message in answers)
    assert_arena_empty(router0)


@pytest.mark.parametrize("case", ["refused", "duplicate", "write caching"])
def test_answered_while_taken_phase_one_is_answered_once_in_order(
    loop: asyncio.AbstractEventLoop,
    two_shards: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    """Each request's answers reach the source as "dispatched" then "produced", or as one
    "produced" carrying phase one; never "produced" alone and "dispatched" after it.

    The sequence that broke it: a produce the partition answers while it takes it (refused,
    a duplicate of a durable batch, write caching) calls its reply before its `on_dispatched`.
    The owner queued that "produced" (no phase one was waiting to ride in it), then the lazy
    "dispatched". When that "produced" filled the outbox to the source to
    `pipe_batch_messages_max`, the outbox left at once, before the lazy answer existed; the
    source took "produced" as the last answer and forgot the request, and the "dispatched"
    that followed found none: "reply to unknown request N". Here `pipe_batch_messages_max`
    produces cross in one pipe message and are all answered while taken: refused and
    duplicate ones are answered together (one answer group), so the last fills the outbox;
    write-caching ones are answered one by one, and kept their order before only because each
    left in a loop turn of its own.
    """
    router0, _router1, shard1 = two_shards
    max_message_bytes = 10 if case == "refused" else 1 << 20  # refused: every batch is over
    settings = TopicSettings(1 << 30, 1 << 40, max_message_bytes, False, case == "write caching")
    topic = "cached" if case == "write caching" else "p"  # FakeShard.write_caching
    shard1.partitions[(topic, 0)] = Partition.start(
        topic, 0, TOPIC_ID, tmp_path / f"{topic}-0", settings, shard1
    )
    remote = RemotePartition(router0, 1, topic, 0)
    count = limits.pipe_batch_messages_max
    batches = [
        build_batch([(None, b"value %d" % i, [])], producer_id=i, producer_epoch=0,
                    base_sequence=0)
        for i in range(count)
    ]
    if case == "duplicate":  # the originals, durable before their copies arrive
        first: list[ProduceResult] = []
        for batch in batches:
            remote.tell(Produce(memoryview(batch), iter_batches(batch), -1, first.append))
        settle(loop, lambda: len(first) == count and router0.pending_calls == 0)
    answers = _answers_from_owner(router0)
    produced: list[ProduceResult] = []
    dispatched: list[int] = []
    phase_ones = router0.dispatched
    for i, batch in enumerate(batches):
        remote.tell(
            Produce(
                memoryview(bytearray(batch)), iter_batches(batch), -1, produced.append,
                lambda i=i: dispatched.append(i),
            )
        )
    with caplog.at_level(logging.ERROR, logger="shards"):
        settle(loop, lambda: len(produced) == count and router0.pending_calls == 0)
        loop.run_until_complete(asyncio.sleep(4 * limits.pipe_lazy_answer_delay_s))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    want = {"refused": ErrorCode.MESSAGE_TOO_LARGE}.get(case, ErrorCode.NONE)
    assert {r.error for r in produced} == {want}
    assert sorted(dispatched) == list(range(count))  # each producer's phase one, once
    assert router0.dispatched - phase_ones == count  # each request's, counted at the source
    shapes: dict[int, list[int]] = {}
    for message in answers:
        for request_id, answer in message:
            shapes.setdefault(request_id, []).append(answer.phases)
    both = PHASE_ONE | PHASE_TWO
    assert len(shapes) == count
    assert all(s in ([PHASE_ONE, PHASE_TWO], [both]) for s in shapes.values()), shapes
    assert_arena_empty(router0)


def test_a_traced_produce_brings_its_owner_stamps_back(
        loop: asyncio.AbstractEventLoop, two_shards: Any, tmp_path: Path) -> None:
    """A sampled produce (actors/trace.py) crosses flagged; its owner stamps it from taking it
    to answering it, and the stamps come back with phase two, in order after the source's."""
    router0, _router1, shard1 = two_shards
    shard1.settings = dataclasses.replace(shard1.settings, trace_produce_every=1)
    settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
    shard1.partitions[("t", 1)] = Partition.start(
        "t", 1, TOPIC_ID, tmp_path / "t-1", settings, shard1)
    trace = ProduceTrace(ProduceTrace.now())
    trace.decoded = trace.now()
    seen: list[ProduceResult] = []
    batch = build_batch([(None, b"traced", [])])
    RemotePartition(router0, 1, "t", 1).tell(
        Produce(memoryview(batch), iter_batches(batch), -1, seen.append, trace=trace))
    settle(loop, lambda: bool(seen))
    assert seen[0].error == ErrorCode.NONE
    trace.finish(None)
    stamps = [trace.read, trace.decoded, *trace.owner_stamps(), trace.sent]
    assert trace.at_partition > 0 and stamps == sorted(stamps), stamps
    assert trace.flushed > trace.flush_started > 0  # the flush that covered it
    assert len(trace.stages()) == 7 and min(trace.stages()) >= 0
