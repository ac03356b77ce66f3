"""Three replicas of one partition on one loop: real Raft machines, real segment logs in
temporary directories, real fdatasyncs on a thread, hard states in their real table; only the
network between them is a dictionary (the node transport is tested in tests/shards).

What must hold: batches proposed by the leader reach every follower byte for byte and commit;
a leader cut off from the others is replaced, and when it comes back its uncommitted tail is
cut and replaced by the new leader's log, the terms of every batch as the leaders wrote them.
A log write that cannot be made (a disk error, batches that do not continue the log) leaves
the group running: the follower answers where its log ends and catches up. And a replica's
messages wait for its term and vote to be durable, across a failed write of them too.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors import limits
from actors.hard_state import HardStateStore, load_hard_states
from actors.raft import (
    Config,
    HardState,
    LogState,
    LogView,
    Membership,
    Message,
    MsgType,
    RaftMachine,
    Role,
    SoftState,
)
from actors.replica import Replica, log_batch_reader, read_range
from actors.replica_memberships import recovered
from storage import DiskLog, LogConfig
from storage.compaction import CleanerConfig, clean_log
from storage.log import AppendFailed
from storage.replica import CutTicket
from tests.support.io_pool import pool_call
from wire.record_batch import iter_batches
from wire.records import build_batch, iter_records

pytestmark = pytest.mark.timeout(60)

GROUP = "orders-0"
NODES = (1, 2, 3)
TICK_S = 0.002  # election timeout 10 ticks: 20-40 ms


def log_state(log: DiskLog, confs: tuple[tuple[int, Membership], ...] = ()) -> LogState:
    before = log.epoch_before_start
    return LogState(log.log_start_offset, before or 0,
                    tuple((start, epoch) for epoch, start in log.epochs()), log.next_offset - 1,
                    confs)


class Node:
    def __init__(self, n: int, root: Path, net: Net, quiesce: bool = False,
                 log_config: LogConfig = LogConfig(),  # noqa: B008
                 voters: tuple[int, ...] = NODES, learners: tuple[int, ...] = ()) -> None:
        """`voters`, `learners`: the group's first membership (its Config's); the log's own
        changes, recovered from its memberships file (actors/replica_memberships.py), win."""
        self.n, self.id, self.net = n, (n, 0), net
        self.loop = asyncio.get_running_loop()
        self.log = DiskLog.open(root / f"node-{n}" / GROUP, log_config)
        self.log.serve()
        self.store = HardStateStore(root / f"node-{n}", self.run_io, self.loop.call_soon)
        confs, exact = recovered(self.log)
        machine = RaftMachine(
            Config(self.id, tuple((p, 0) for p in voters), election_ticks=10,
                   quiesce=quiesce, learners=tuple((p, 0) for p in learners)),
            random.Random(n), hard_state=self.store.get(GROUP),
            log=log_state(self.log, confs), batch_reader=log_batch_reader(self.log))
        self.replica = Replica(GROUP, machine, self, self.store, self.loop.call_soon,
                               confs_saved=exact)
        self.high_watermark = 0
        self.flushing = False
        self.roles: list[tuple[Role, int]] = []
        self.hold_cuts = False
        self.held_cuts: list[tuple[Callable[[], Any], Callable[[Any, Any], None]]] = []
        self.hold_files = False  # the memberships file's writes wait (`release_files`)
        self.held_files: list[tuple[Callable[[], Any], Callable[[Any, Any], None]]] = []

    # ReplicaHost
    def replica_log(self) -> DiskLog:
        return self.log

    def appended(self, last_offset: int, headers: Any = None, data: Any = None) -> None:
        self.flush()

    def log_rewritten(self) -> None:
        pass

    def advance_log_start(self, offset: int) -> None:
        if self.log.advance_log_start(offset):
            self.log.log_start_writer(offset)()  # on the loop: a test's small file

    def cut_complete(self) -> None:
        self.flush()

    def writes_resumed(self) -> None:
        pass

    def committed(self, high_watermark: int) -> None:
        self.high_watermark = high_watermark

    def role_changed(self, soft: SoftState, term: int) -> None:
        self.roles.append((soft.role, term))

    def send(self, messages: list[Message]) -> None:
        self.net.send(messages)

    def run_io(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
               ) -> None:
        if self.hold_cuts and isinstance(getattr(fn, "__self__", None), CutTicket):
            self.held_cuts.append((fn, done))  # a disk slow to make a cut durable
            return
        if self.hold_files and "state_writer" in getattr(fn, "__qualname__", ""):
            self.held_files.append((fn, done))  # a disk slow to write the memberships file
            return
        future = self.loop.run_in_executor(None, fn)
        future.add_done_callback(
            lambda f: done(None if f.exception() else f.result(), f.exception()))

    def release_files(self) -> None:
        self.hold_files = False
        held, self.held_files = self.held_files, []
        for fn, done in held:
            self.run_io(fn, done)

    def release_cuts(self) -> None:
        self.hold_cuts = False
        held, self.held_cuts = self.held_cuts, []
        for fn, done in held:
            self.run_io(fn, done)

    def read_io(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
                ) -> None:
        self.run_io(fn, done)

    def now_ms(self) -> int:
        return 1_700_000_000_000

    def leader_change_ids(self) -> tuple[int, list[int]]:
        return self.n, list(NODES)

    # The partition's flush path, one fdatasync at a time, reported to the machine.
    def flush(self) -> None:
        if self.flushing or self.log.cut_pending:
            return
        ticket = self.log.flush_prepare()
        if ticket is None:
            return
        self.flushing = True
        term = self.log.term_at(ticket.offset - 1)

        def done(_result: Any, error: BaseException | None) -> None:
            assert error is None
            self.flushing = False
            self.log.flush_complete(ticket)
            if term is not None:
                self.replica.flushed(ticket.offset - 1, term)
            if self.log.written_offset > self.log.flushed_offset:
                self.flush()

        self.run_io(ticket.run, done)

    # The leader's produce path.
    def produce(self, values: list[bytes], key: bytes | None = None) -> bool:
        machine = self.replica.machine
        if machine.role != Role.Leader:
            return False
        self.replica.before_append()
        batch = build_batch([(key, v, []) for v in values], base_timestamp=self.now_ms())
        self.log.append(batch, iter_batches(batch), machine.term, self.now_ms())
        proposed = self.replica.propose(len(values), bytes(batch))  # as the Partition does
        assert proposed is not None and proposed.last == self.log.next_offset - 1, proposed
        self.flush()
        return True

    def values(self) -> list[bytes]:
        data = read_range(self.log, self.log.log_start_offset, self.log.next_offset - 1)
        return [r.value for r in iter_records(data) if r.value is not None]

    def close(self) -> None:
        self.replica.close()
        self.log.close()


def count_calls(obj: Any, name: str) -> list[tuple[Any, ...]]:
    """The arguments of every call of `obj.name` from now on (the calls go through)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(obj, name)

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(obj, name, counted)
    return calls


class Net:
    def __init__(self) -> None:
        self.sent = 0
        self.nodes: dict[tuple[int, int], Node] = {}
        self.cut: set[int] = set()  # nodes whose links are all down
        self.only_appends_from: int | None = None  # this node's first append per peer only
        self.appends_let_through: set[int] = set()
        self.appends: list[Message] = []  # every append that named offsets

    def send(self, messages: list[Message]) -> None:
        loop = asyncio.get_running_loop()
        self.sent += len(messages)
        for m in messages:
            if m.type == MsgType.MsgApp and m.ranges:
                self.appends.append(m)
            src, dst = m.sender[0], m.to[0]
            if src in self.cut or dst in self.cut:
                continue
            if src == self.only_appends_from:
                if m.type != MsgType.MsgApp or not m.ranges or dst in self.appends_let_through:
                    continue
                self.appends_let_through.add(dst)
            target = self.nodes[m.to]
            loop.call_soon(lambda t=target, m=m: None if t.replica.closed
                           else t.replica.receive(m))


async def stop(nodes: list[Node]) -> None:
    for node in nodes:
        node.replica.close()
    await until(lambda: not any(n.flushing for n in nodes), "flushes out", 10)
    for node in nodes:
        node.close()


async def ticking(nodes: list[Node]) -> None:
    while True:
        for node in nodes:
            if not node.replica.closed:
                # The host's liveness (shards/raft_host.py): a cut-off node is not heard.
                lost = {(n, 0) for n in node.net.cut if n != node.n}
                node.replica.tick(lost if node.n not in node.net.cut else
                                  {(n, 0) for n in NODES if n != node.n})
        await asyncio.sleep(TICK_S)


async def until(done: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out: {what}")


def leader(nodes: list[Node], excluding: set[int] = frozenset()) -> Node | None:  # type: ignore[assignment]
    leaders = [n for n in nodes if n.replica.machine.role == Role.Leader and n.n not in excluding]
    return max(leaders, key=lambda n: n.replica.machine.term) if leaders else None


def test_the_leaders_batches_reach_every_replica_byte_for_byte_and_commit(
        tmp_path: Path) -> None:
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None
            reads = count_calls(first.log, "read_bytes")
            sent = [f"v-{i}".encode() for i in range(90)]
            for i in range(0, 90, 3):
                assert first.produce(sent[i:i + 3])
                await asyncio.sleep(0)  # a turn each: its Ready sends it
            end = first.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit everywhere")
            await until(lambda: all(n.log.next_offset == end for n in nodes), "every log")
            # Followers keeping up were sent each batch from the produce's own bytes, not
            # read back from the log.
            assert reads == [], reads
            logs = [read_range(n.log, 0, end - 1) for n in nodes]
            assert logs[0] == logs[1] == logs[2]
            assert first.values() == sent  # no no-op: the first leader's log ended at its commit
            term = first.replica.machine.term
            assert {e for e, _ in first.log.epochs()} == {term}
        finally:
            ticker.cancel()
            await stop(nodes)
        # Durable: the hard states and the logs come back from the files.
        for node in nodes:
            reopened = DiskLog.open(tmp_path / f"node-{node.n}" / GROUP)
            assert reopened.next_offset == end
            reopened.close()

    asyncio.run(main())


def test_a_cut_off_leader_is_replaced_and_its_uncommitted_tail_cut_on_return(
        tmp_path: Path) -> None:
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            old = leader(nodes)
            assert old is not None
            committed = [f"c-{i}".encode() for i in range(20)]
            for i in range(0, 20, 2):
                assert old.produce(committed[i:i + 2])
            end = old.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit")

            net.cut.add(old.n)  # the leader alone: what it takes now never commits
            lost = [b"lost-1", b"lost-2", b"lost-3"]
            assert old.produce(lost[:2]) and old.produce(lost[2:])
            await until(lambda: leader(nodes, {old.n}) is not None, "a new leader")
            new = leader(nodes, {old.n})
            assert new is not None and new.replica.machine.term > old.replica.machine.term - 1
            kept = [f"k-{i}".encode() for i in range(10)]
            for i in range(0, 10, 5):
                assert new.produce(kept[i:i + 5])
            new_end = new.log.next_offset
            others = [n for n in nodes if n is not old]
            await until(lambda: all(n.high_watermark == new_end for n in others), "new commit")

            net.cut.clear()  # it comes back: steps down, its tail goes, it catches up
            await until(lambda: old.log.next_offset == new_end
                        and old.replica.machine.role == Role.Follower
                        and old.high_watermark == new_end, "the old leader caught up")
            logs = [read_range(n.log, 0, new_end - 1) for n in nodes]
            assert logs[0] == logs[1] == logs[2]
            assert old.values() == committed + kept
            assert not set(lost) & set(old.values())
            # Two terms in the log, each batch with the term of the leader that wrote it.
            epochs = old.log.epochs()
            assert [e for e, _ in epochs][0] < [e for e, _ in epochs][-1]
            assert old.log.term_at(new_end - 1) == new.replica.machine.term
        finally:
            ticker.cancel()
            await stop(nodes)

    asyncio.run(main())


def test_a_leader_whose_log_ends_past_its_known_commit_writes_a_leader_change_first(
        tmp_path: Path) -> None:
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            old = leader(nodes)
            assert old is not None
            # The followers get the batches but never hear that they committed.
            net.only_appends_from = old.n
            assert old.produce([b"a", b"b"])
            end = old.log.next_offset
            others = [n for n in nodes if n is not old]
            await until(lambda: all(n.log.flushed_offset == end for n in others), "replicated")
            net.cut.add(old.n)
            await until(lambda: leader(nodes, {old.n}) is not None, "a new leader")
            new = leader(nodes, {old.n})
            assert new is not None
            await until(lambda: new.log.next_offset == end + 1, "the no-op")
            headers = list(new.log.iter_batch_headers(end))
            assert len(headers) == 1 and headers[0].is_control
            assert headers[0].partition_leader_epoch == new.replica.machine.term
            # It commits the old leader's tail with it, and a produce after it takes end + 1.
            await until(lambda: new.high_watermark == end + 1, "the tail committed")
            assert new.produce([b"c"])
            assert new.log.next_offset == end + 2
            assert new.values()[:2] == [b"a", b"b"] and new.values()[-1] == b"c"
        finally:
            ticker.cancel()
            await stop(nodes)

    asyncio.run(main())


def test_an_idle_group_goes_quiet_and_a_lost_leader_is_replaced_all_the_same(
        tmp_path: Path) -> None:
    """Quiescence: once everything is committed the group sends nothing, however long; when
    the host stops hearing the leader (cut off), the followers are woken, one leads, and the
    leader, hearing no quorum, steps down."""
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net, quiesce=True) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None and first.produce([b"before"])
            end = first.log.next_offset
            await until(lambda: all(n.replica.machine.quiesced for n in nodes), "all quiet")
            assert all(n.high_watermark == end for n in nodes)
            sent = net.sent
            await asyncio.sleep(TICK_S * 10 * 5)  # five election timeouts
            assert net.sent == sent, "a quiet group sent messages"
            assert all(n.replica.machine.quiesced for n in nodes)

            net.cut = {first.n}
            await until(lambda: leader(nodes, excluding={first.n}) is not None, "a new leader")
            second = leader(nodes, excluding={first.n})
            assert second is not None and second.produce([b"after"])
            await until(lambda: first.replica.machine.role != Role.Leader,
                        "the cut-off leader steps down")
            net.cut = set()
            await until(lambda: first.log.next_offset == second.log.next_offset
                        and first.values() == [b"before", b"after"], "the old leader catches up")
        finally:
            ticker.cancel()
            await stop(nodes)

    asyncio.run(main())


# Log writes that cannot be made ----------------------------------------------------------------


def caught(loop: asyncio.AbstractEventLoop) -> list[Any]:
    """What the loop's callbacks raise from now on (a replica stuck between ready() and
    advance() raises at every turn)."""
    errors: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(
        context.get("exception", context.get("message"))))
    return errors


class FailingAppends:
    """A follower's disk that refuses its next `count` appends with EIO, as DiskLog reports a
    failed write: AppendFailed, nothing of it in the log."""

    def __init__(self, log: DiskLog, count: int) -> None:
        self.original = log.append_replicated
        self.left = count
        self.calls = 0
        log.append_replicated = self  # type: ignore[method-assign]

    def __call__(self, records: bytearray, headers: Any, now_ms: int) -> Any:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise AppendFailed(OSError(errno.EIO, "Input/output error"))
        return self.original(records, headers, now_ms)


def test_a_follower_whose_log_write_fails_answers_where_its_log_ends_and_catches_up(
        tmp_path: Path) -> None:
    async def main() -> None:
        errors = caught(asyncio.get_running_loop())
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None and first.produce([b"a", b"b"])
            end = first.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit")
            follower = next(n for n in nodes if n is not first)
            disk = FailingAppends(follower.log, 1)
            sent = [f"v-{i}".encode() for i in range(10)]
            for i in range(0, 10, 2):
                assert first.produce(sent[i:i + 2])
                await asyncio.sleep(TICK_S)
            end = first.log.next_offset
            await until(lambda: all(n.log.next_offset == end and n.high_watermark == end
                                    for n in nodes), "every replica caught up")
            assert disk.left == 0 and disk.calls > 1  # it failed, then wrote again
            logs = [read_range(n.log, 0, end - 1) for n in nodes]
            assert logs[0] == logs[1] == logs[2]
            assert follower.values() == [b"a", b"b", *sent]
        finally:
            ticker.cancel()
            await stop(nodes)
        assert errors == []

    asyncio.run(main())


def test_a_follower_behind_a_compacted_leader_takes_its_batches_across_the_gaps(
        tmp_path: Path) -> None:
    """Compaction drops emptied batches from the leader's sealed segments (storage/compaction.py),
    so what it sends a follower that is behind can start past the follower's log end and skip
    offsets between batches, as Kafka's followers see too (a `__consumer_offsets` partition
    after a restart: "batch at offset 146 where the log continues at 14"). The follower takes
    the batches, an empty batch in each gap (its segments must follow each other for
    recovery), catches up, and reopens with every record."""
    async def main() -> None:
        errors = caught(asyncio.get_running_loop())
        net = Net()
        small = LogConfig(segment_bytes=400)  # a few batches a segment
        nodes = [Node(n, tmp_path, net, log_config=small) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None and first.produce([b"kept"], key=b"other")
            end = first.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit")
            behind = next(n for n in nodes if n is not first)
            net.cut.add(behind.n)
            for i in range(30):  # one key committed again and again, as offset commits are
                assert first.produce([f"offset-{i}".encode()], key=b"group/topic/0")
            end = first.log.next_offset
            await until(lambda: first.high_watermark == end, "commit without it")
            sealed = first.log._segments[:-1]
            result = clean_log(first.log.directory, sealed, 0, first.now_ms(),
                               CleanerConfig(io_bytes_per_second=1 << 40), set())
            first.log.replace_segments(result.old_segments, result.new_segments)
            gap_from = behind.log.next_offset
            assert next(first.log.iter_batch_headers(gap_from)).base_offset > gap_from

            net.cut.clear()
            await until(lambda: behind.log.next_offset == end and behind.high_watermark == end,
                        "the follower caught up")
            expected = records(first.log, gap_from, end)
            assert records(behind.log, gap_from, end) == expected
            headers = list(behind.log.iter_batch_headers(gap_from))
            assert headers[0].base_offset == gap_from and headers[0].record_count == 0
            assert all(a.next_offset == b.base_offset
                       for a, b in zip(headers, headers[1:], strict=False))
            assert behind.values()[-1] == b"offset-29"
        finally:
            ticker.cancel()
            await stop(nodes)
        assert errors == []
        reopened = DiskLog.open(behind.log.directory, small)
        assert reopened.next_offset == end
        assert records(reopened, gap_from, end) == expected
        reopened.close()

    asyncio.run(main())


def records(log_: DiskLog, first: int, end: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in iter_records(read_range(log_, first, end - 1))]


def test_a_leader_elected_while_its_cut_is_not_durable_sends_no_append_its_log_lacks(
        tmp_path: Path) -> None:
    """A follower cuts its divergent tail and takes the leader's batches behind the cut, which
    waits for its fdatasync; before that completes it is elected (here by a transfer), and its
    no-op waits behind the cut too. An append naming the no-op leaves only once the log holds
    it: sent without its bytes, it let the followers believe they held a batch they never
    wrote, and the next one failed with NotContiguous there for good."""
    async def main() -> None:
        errors = caught(asyncio.get_running_loop())
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            old = leader(nodes)
            assert old is not None and old.produce([b"c"])
            end = old.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit")
            net.cut.add(old.n)
            assert old.produce([b"lost"])  # a tail of its own, never committed
            await until(lambda: leader(nodes, {old.n}) is not None, "a new leader")
            new = leader(nodes, {old.n})
            assert new is not None and new.produce([b"kept-1"])
            end = new.log.next_offset
            await until(lambda: new.high_watermark == end, "the new leader's commit")
            third = next(n for n in nodes if n not in (old, new))
            net.cut.add(third.n)
            assert new.produce([b"kept-2"])  # not committed: the old leader's log will end
            end = new.log.next_offset  # past its commit, so it writes a no-op when elected

            old.hold_cuts = True
            net.cut.discard(old.n)
            await until(lambda: old.log.cut_pending, "the old leader cuts its tail")
            old.replica.receive(Message(MsgType.MsgTimeoutNow, old.id, new.id,
                                        new.replica.machine.term))
            await until(lambda: old.replica.machine.role == Role.Leader, "elected, cut pending")
            assert old.replica.machine.log.last_offset == end  # the no-op, not in the log yet
            await asyncio.sleep(TICK_S * 20)  # heartbeats, answers, probes
            assert old.log.cut_pending and old.log.next_offset < end
            old.release_cuts()
            net.cut.clear()
            await until(lambda: all(n.high_watermark == end + 1 for n in nodes), "the no-op")
            assert old.produce([b"after"])
            end = old.log.next_offset
            await until(lambda: all(n.log.next_offset == end and n.high_watermark == end
                                    for n in nodes), "every replica caught up")
            logs = [read_range(n.log, 0, end - 1) for n in nodes]
            assert logs[0] == logs[1] == logs[2]
            assert old.values() == [b"c", b"kept-1", b"kept-2", b"after"]
            for m in net.appends:
                headers = iter_batches(m.payload)
                assert headers and headers[-1].last_offset == m.ranges[-1].last, m
        finally:
            ticker.cancel()
            old.release_cuts()
            await stop(nodes)
        assert errors == []

    asyncio.run(main())


# A log start inside a batch -----------------------------------------------------------------------


def delete_records(node: Node, offset: int) -> None:
    """DeleteRecords on the leader, as actors/log_lifecycle.py and the partition do it."""
    node.advance_log_start(offset)
    node.replica.machine.set_log_start(offset)


def view(state: LogState) -> tuple[int, int, list[tuple[int, int]]]:
    """What the machine reads of a log: its start, its end, the term of each offset from
    the one before the start (LogStates that differ only in how they write runs are one)."""
    log = LogView(state, Membership(frozenset({0})))  # (terms only: any membership)
    return log.log_start, log.last_offset, log.runs()


def produce_tens(node: Node, batches: int, tag: str) -> None:
    for b in range(batches):
        assert node.produce([f"{tag}-{b}-{i}".encode() for i in range(10)])


def test_a_follower_installed_at_a_log_start_inside_a_batch_takes_that_batch_whole(
        tmp_path: Path) -> None:
    """DeleteRecords moves the leader's log start to any offset, here inside a batch of 10.
    A follower that was away needs an install at that start, then the batch holding it,
    which the leader sends whole: the follower starts its log at that batch's base offset,
    its log start staying the leader's (Kafka's truncateFullyAndStartAt the batch's base).
    Before, its empty log refused a batch that began below its end, and it asked again, at
    every heartbeat, for good. The follower that stayed takes the same start inside its own
    batch. Every log reopens as it was, and the group goes on from the reopened logs."""
    async def main() -> None:
        errors = caught(asyncio.get_running_loop())
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None
            produce_tens(first, 1, "a")  # 0..9 everywhere
            await until(lambda: all(n.high_watermark == 10 for n in nodes), "commit")
            away, stayed = (n for n in nodes if n is not first)
            net.cut.add(away.n)
            produce_tens(first, 4, "b")  # 10..49 without it
            await until(lambda: first.high_watermark == 50, "commit without it")
            delete_records(first, 25)  # inside the batch 20..29
            await until(lambda: stayed.log.log_start_offset == 25, "the start followed")
            net.cut.clear()
            await until(lambda: away.log.next_offset == 50 and away.high_watermark == 50,
                        "the follower caught up")
            for node in nodes:
                assert node.log.log_start_offset == 25
                assert node.log.epochs() == [(node.replica.machine.term, 25)]
                assert node.log.epoch_before_start == node.replica.machine.term
                assert view(log_state(node.log)) == view(node.replica.machine.log.state())
            assert away.log.segment_base_offsets[0] == 20
            expected = records(first.log, 25, 50)
            assert expected[0][0] == 20  # the batch holding the start, whole
            assert records(away.log, 25, 50) == records(stayed.log, 25, 50) == expected
        finally:
            ticker.cancel()
            await stop(nodes)
        assert errors == []
        for node in nodes:  # reopened: the start, the epoch before it, every record
            reopened = DiskLog.open(node.log.directory)
            assert view(log_state(reopened)) == view(node.replica.machine.log.state())
            assert records(reopened, 25, 50) == expected
            reopened.close()

        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader after the restart")
            second = leader(nodes)
            assert second is not None
            produce_tens(second, 1, "c")
            end = second.log.next_offset
            await until(lambda: all(n.log.next_offset == end and n.high_watermark == end
                                    for n in nodes), "every replica after the restart")
            assert all(n.log.log_start_offset == 25 for n in nodes)
            logs = [read_range(n.log, 25, end - 1) for n in nodes]
            assert logs[0] == logs[1] == logs[2]
        finally:
            ticker.cancel()
            await stop(nodes)
        assert errors == []

    asyncio.run(main())


def test_a_follower_reset_inside_a_batch_takes_it_from_a_leader_whose_log_starts_lower(
        tmp_path: Path) -> None:
    """A follower installed at a start inside a batch, then restarted, meets a leader whose
    own log starts below that batch (one that had not taken its predecessor's start yet):
    the leader probes back to the follower's start and sends the batch that holds it whole,
    though its own log does not start there. Before, that append was never sent (the leader
    sent a batch starting below the append's first offset only from its own log start), and
    the follower was probed again and again."""
    async def main() -> None:
        errors = caught(asyncio.get_running_loop())
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None
            produce_tens(first, 5, "a")  # 0..49
            await until(lambda: all(n.log.next_offset == 50 and n.high_watermark == 50
                                    for n in nodes), "commit everywhere")
            term = first.replica.machine.term
            reset = next(n for n in nodes if n is not first)
            expected = records(first.log, 25, 50)
        finally:
            ticker.cancel()
            await stop(nodes)
        log = DiskLog.open(reset.log.directory)  # what an install at 25 leaves, reopened
        ticket = log.reset(25, term)
        ticket.run()
        log.cut_complete(ticket)
        log.close()

        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        behind = next(n for n in nodes if n.n == reset.n)
        assert (behind.log.log_start_offset, behind.log.next_offset) == (25, 25)
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            second = leader(nodes)
            assert second is not None and second is not behind
            assert second.log.log_start_offset == 0
            produce_tens(second, 1, "b")
            end = second.log.next_offset
            await until(lambda: behind.log.next_offset == end and behind.high_watermark == end,
                        "the reset follower caught up")
            assert behind.log.log_start_offset == 25
            assert behind.log.segment_base_offsets[0] == 20
            assert records(behind.log, 25, 50) == expected
            assert read_range(behind.log, 25, end - 1) == read_range(second.log, 20, end - 1)
        finally:
            ticker.cancel()
            await stop(nodes)
        assert errors == []

    asyncio.run(main())


# Term and vote before messages, across a failed write ------------------------------------------


class Turns:
    """The loop, turned by hand: what is scheduled runs when the test says."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def schedule(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def run(self) -> None:
        for _ in range(100):
            if not self.soon:
                return
            self.soon.pop(0)()
        raise AssertionError("the loop never settles")


class HeldPool:
    """The I/O pool, each call held until `release`; the first `fail` calls fail with EIO
    instead of writing."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[Callable[[], None]] = []
        self.fail = fail

    def run(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        if self.fail:
            self.fail -= 1
            fn = _eio
        self.calls.append(pool_call(fn, done))

    def release(self) -> None:
        calls, self.calls = self.calls, []
        for call in calls:
            call()


def _eio() -> None:
    raise OSError(errno.EIO, "Input/output error")


class Wire:
    """A ReplicaHost without a log (votes need none): what it sends is kept."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, messages: list[Message]) -> None:
        self.sent.extend(messages)

    def committed(self, high_watermark: int) -> None:
        pass

    def role_changed(self, soft: SoftState, term: int) -> None:
        pass

    def replica_log(self) -> Any:
        raise AssertionError("no log write expected")


def a_voter(tmp_path: Path, fail: int) -> tuple[Replica, Wire, HeldPool, Turns]:
    turns, pool, wire = Turns(), HeldPool(fail), Wire()
    store = HardStateStore(tmp_path, pool.run, turns.schedule)
    machine = RaftMachine(Config(1, NODES, election_ticks=10), random.Random(1))
    replica = Replica(GROUP, machine, wire, store, turns.schedule)  # type: ignore[arg-type]
    return replica, wire, pool, turns


VOTE = Message(MsgType.MsgVote, 1, 2, 5, offset=-1, log_term=0)  # 2 asks 1, term 5


def test_messages_wait_for_the_vote_across_a_failed_write_until_a_retry_saves_it(
        tmp_path: Path) -> None:
    """1 votes for 2 in term 5; the write of that vote fails. 2 asks again (the first answer
    lost): the answer must not leave while the vote is not durable, or 1, crashing now, comes
    back without it and may vote for 3 in term 5 too."""
    replica, wire, pool, turns = a_voter(tmp_path, fail=1)
    replica.receive(VOTE)
    turns.run()
    assert wire.sent == [] and len(pool.calls) == 1  # the answer waits for the write
    pool.release()  # it fails
    turns.run()
    assert wire.sent == [] and load_hard_states(tmp_path) == {}
    replica.receive(VOTE)
    turns.run()
    assert wire.sent == [], "an answer left before the vote it grants was durable"

    for _ in range(3):  # the retry: at the latest at the next tick
        replica.tick()
        turns.run()
        pool.release()
        turns.run()
        if wire.sent:
            break
    assert load_hard_states(tmp_path) == {GROUP: HardState(5, 2)}
    assert [(m.type, m.to, m.term, m.reject) for m in wire.sent] == [
        (MsgType.MsgVoteResp, 2, 5, False)] * 2


def test_the_messages_held_for_a_vote_are_bounded_the_oldest_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "replica_held_messages_max", 3)
    replica, wire, pool, turns = a_voter(tmp_path, fail=1)
    replica.receive(VOTE)
    turns.run()
    pool.release()  # the write fails: every answer from here waits for a retry
    turns.run()
    for i in range(5):
        replica.receive(Message(MsgType.MsgHeartbeat, 1, 2, 5, commit=-1 + 0 * i))
        turns.run()
    assert wire.sent == []
    for _ in range(3):
        replica.tick()
        turns.run()
        pool.release()
        turns.run()
        if wire.sent:
            break
    assert [m.type for m in wire.sent] == [MsgType.MsgHeartbeatResp] * 3  # the latest three
