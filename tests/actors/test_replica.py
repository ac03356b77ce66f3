"""Three replicas of one partition on one loop: real Raft machines, real segment logs in
temporary directories, real fdatasyncs on a thread, hard states in their real table; only the
network between them is a dictionary (the node transport is tested in tests/shards).

What must hold: batches proposed by the leader reach every follower byte for byte and commit;
a leader cut off from the others is replaced, and when it comes back its uncommitted tail is
cut and replaced by the new leader's log, the terms of every batch as the leaders wrote them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.hard_state import HardStateStore
from actors.raft import Config, LogState, Message, MsgType, RaftMachine, Role, SoftState
from actors.replica import Replica, log_batch_reader, read_range
from storage import DiskLog
from wire.record_batch import iter_batches
from wire.records import build_batch, iter_records

pytestmark = pytest.mark.timeout(60)

GROUP = "orders-0"
NODES = (1, 2, 3)
TICK_S = 0.002  # election timeout 10 ticks: 20-40 ms


def log_state(log: DiskLog) -> LogState:
    before = log.epoch_before_start
    return LogState(log.log_start_offset, before or 0,
                    tuple((start, epoch) for epoch, start in log.epochs()), log.next_offset - 1)


class Node:
    def __init__(self, n: int, root: Path, net: Net, quiesce: bool = False) -> None:
        self.n, self.id, self.net = n, (n, 0), net
        self.loop = asyncio.get_running_loop()
        self.log = DiskLog.open(root / f"node-{n}" / GROUP)
        self.log.serve()
        self.store = HardStateStore(root / f"node-{n}", self.run_io, self.loop.call_soon)
        machine = RaftMachine(
            Config(self.id, tuple((p, 0) for p in NODES), election_ticks=10, quiesce=quiesce),
            random.Random(n), hard_state=self.store.get(GROUP), log=log_state(self.log),
            batch_reader=log_batch_reader(self.log))
        self.replica = Replica(GROUP, machine, self, self.store, self.loop.call_soon)
        self.high_watermark = 0
        self.flushing = False
        self.roles: list[tuple[Role, int]] = []

    # ReplicaHost
    def replica_log(self) -> DiskLog:
        return self.log

    def appended(self, last_offset: int, headers: Any = None, data: Any = None) -> None:
        self.flush()

    def log_rewritten(self) -> None:
        pass

    def advance_log_start(self, offset: int) -> None:
        self.log.advance_log_start(offset)  # in memory: these tests never reopen a start

    def cut_complete(self) -> None:
        self.flush()

    def committed(self, high_watermark: int) -> None:
        self.high_watermark = high_watermark

    def role_changed(self, soft: SoftState, term: int) -> None:
        self.roles.append((soft.role, term))

    def send(self, messages: list[Message]) -> None:
        self.net.send(messages)

    def run_io(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
               ) -> None:
        future = self.loop.run_in_executor(None, fn)
        future.add_done_callback(lambda f: done(None, f.exception()))

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
    def produce(self, values: list[bytes]) -> bool:
        machine = self.replica.machine
        if machine.role != Role.Leader:
            return False
        self.replica.before_append()
        batch = build_batch([(None, v, []) for v in values], base_timestamp=self.now_ms())
        self.log.append(batch, iter_batches(batch), machine.term, self.now_ms())
        proposed = self.replica.propose(len(values))
        assert proposed is not None and proposed.last == self.log.next_offset - 1, proposed
        self.flush()
        return True

    def values(self) -> list[bytes]:
        data = read_range(self.log, self.log.log_start_offset, self.log.next_offset - 1)
        return [r.value for r in iter_records(data) if r.value is not None]

    def close(self) -> None:
        self.replica.close()
        self.log.close()


class Net:
    def __init__(self) -> None:
        self.sent = 0
        self.nodes: dict[tuple[int, int], Node] = {}
        self.cut: set[int] = set()  # nodes whose links are all down
        self.only_appends_from: int | None = None  # this node's first append per peer only
        self.appends_let_through: set[int] = set()

    def send(self, messages: list[Message]) -> None:
        loop = asyncio.get_running_loop()
        self.sent += len(messages)
        for m in messages:
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
            sent = [f"v-{i}".encode() for i in range(90)]
            for i in range(0, 90, 3):
                assert first.produce(sent[i:i + 3])
            end = first.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit everywhere")
            await until(lambda: all(n.log.next_offset == end for n in nodes), "every log")
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
