"""Transactions on a replicated partition: three real Partition actors (real logs, real Raft
replicas) on one loop, their Raft messages carried in memory. A marker written on the leader
reaches the followers through Raft like any batch, they derive the same open transactions,
last stable offset and aborted index from what they append, and after the leader goes away
the new leader answers read_committed reads as the old one did and ends the transaction left
open. ListOffsets MAX_TIMESTAMP names a data record, never a control batch stamped later (a
leader's LEADER_CHANGE, a marker)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.hard_state import HardStateStore
from actors.partition import (
    MAX_TIMESTAMP,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    Partition,
    PartitionInfo,
    Produce,
    ProduceResult,
    RaftReceive,
    Read,
    ReadResult,
    WriteTxnMarker,
)
from actors.partition_replication import GroupKey
from actors.raft import Message
from actors.services import BrokerSettings
from actors.topic_config import TopicSettings
from shards.watch import WatchService
from tests.support.actor_loop import actor_loop, settle
from tests.support.io_pool import pool_call
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to

pytestmark = pytest.mark.timeout(60)

Address = tuple[int, int]
REPLICAS: tuple[Address, ...] = ((1, 0), (2, 0), (3, 0))
TICK_S = 0.01
PID = 900
ASKS_MAX = 2000  # PartitionInfo asks while a follower's high watermark catches up (~ms each)


class Net:
    """The replicas' links: messages go from one actor's loop turn to the next, dropped to
    and from a replica that is down."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.refs: dict[Address, Any] = {}
        self.ticks: dict[Address, Callable[[], None]] = {}
        self.rafts: dict[Address, Raft] = {}
        self.leaders: dict[Address, Address | None] = {}
        self.down: set[Address] = set()
        self._timer = loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        for address, tick in list(self.ticks.items()):
            if address not in self.down:
                # What a shard's RaftHost finds by keepalives: the peers gone silent (a
                # quiesced group campaigns only when its leader is among them).
                self.rafts[address].lost = frozenset(self.down)
                tick()
        self._timer = self.loop.call_later(TICK_S, self._tick)

    def deliver(self, sender: Address, messages: list[Message]) -> None:
        for m in messages:
            to = m.to
            if sender in self.down or to in self.down or to not in self.refs:
                continue
            self.refs[to].tell(RaftReceive([m]))  # type: ignore[index]

    def close(self) -> None:
        self._timer.cancel()


class Raft:
    """One replica's RaftServices (shards/raft_host.py in a shard)."""

    election_ticks = 10
    heartbeat_ticks = 1

    def __init__(self, address: Address, net: Net, directory: Path,
                 run_io: Callable[[Any, Any], None]) -> None:
        self.address = address
        self.net = net
        self.lost: frozenset[Address] = frozenset()
        self.hard_states = HardStateStore(directory, run_io, net.loop.call_soon)
        net.rafts[address] = self

    def send(self, key: GroupKey, messages: list[Message]) -> None:
        self.net.loop.call_soon(self.net.deliver, self.address, messages)

    def register(self, key: GroupKey, tick: Callable[[], None],
                 replicas: tuple[Address, ...] = ()) -> None:
        self.net.ticks[self.address] = tick

    def unregister(self, key: GroupKey) -> None:
        self.net.ticks.pop(self.address, None)

    def schedule(self, fn: Callable[[], None]) -> None:
        self.net.loop.call_soon(fn)

    def leader_changed(self, key: GroupKey, leader: Address | None, epoch: int,
                       replicas: tuple[Address, ...]) -> None:
        self.net.leaders[self.address] = leader


class Services:
    def __init__(self, address: Address, net: Net, data_dir: Path) -> None:
        self.settings = BrokerSettings(address[0], "127.0.0.1", 9092, str(data_dir), "c")
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = None
        self.disk_space = None
        self.raft = Raft(address, net, data_dir / "raft", self.run_blocking)

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        asyncio.get_event_loop().call_soon(pool_call(fn, done))

    read_blocking = clean_blocking = run_blocking

    def segments_removed(self, paths: list[str]) -> None:
        pass


loop = pytest.fixture(actor_loop)


class Cluster:
    def __init__(self, loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
        self.loop = loop
        self.net = Net(loop)
        self.services = {a: Services(a, self.net, tmp_path / f"node{a[0]}") for a in REPLICAS}
        for address in REPLICAS:
            self.start(address)

    def start(self, address: Address) -> None:
        settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
        services = self.services[address]
        directory = Path(services.settings.data_dir) / "t-0"
        self.net.refs[address] = Partition.start("t", 0, TOPIC_ID, directory, settings,
                                                 services, REPLICAS)

    def restart_all(self) -> None:
        """Every replica stopped, then started again from its log and hard state."""
        refs = [self.net.refs.pop(a) for a in REPLICAS]
        self.net.leaders.clear()
        for ref in refs:
            ref.stop(block=False)
        settle(self.loop, lambda: not any(ref.is_alive() for ref in refs))
        for address in REPLICAS:
            self.start(address)

    def leader(self) -> Address:
        """The leader every replica up agrees on, once they do."""
        up = [a for a in REPLICAS if a not in self.net.down]

        def agreed() -> bool:
            seen = {self.net.leaders.get(a) for a in up}
            return len(seen) == 1 and None not in seen and seen.pop() in up

        settle(self.loop, agreed)
        leader = self.net.leaders[up[0]]
        assert leader is not None
        return leader

    def ask(self, address: Address, make: Callable[[Callable[[Any], None]], Any]) -> Any:
        answers: list[Any] = []
        self.net.refs[address].tell(make(answers.append))
        settle(self.loop, lambda: bool(answers))
        return answers[0]

    def produce(self, address: Address, pid: int, sequence: int = 0) -> ProduceResult:
        batch = build_batch([(None, b"v%d" % sequence, [])], producer_id=pid, producer_epoch=0,
                            base_sequence=sequence, transactional=True)
        result: ProduceResult = self.ask(address, lambda reply: Produce(
            memoryview(batch), iter_batches(batch), -1, reply))
        return result

    def read(self, address: Address) -> ReadResult:
        result: ReadResult = self.ask(address, lambda reply: Read(
            0, 1 << 20, -1, FetchBudget(1 << 20), reply, any_replica=True, committed=True))
        return result

    def info(self, address: Address) -> dict[str, int]:
        info: dict[str, int] = self.ask(address, PartitionInfo)
        return info


def test_markers_reach_followers_and_survive_failover(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    cluster = Cluster(loop, tmp_path)
    try:
        leader = cluster.leader()
        first = {}
        for pid in (PID, PID + 1, PID + 2):
            produced = cluster.produce(leader, pid)
            assert produced.error == ErrorCode.NONE, produced
            first[pid] = produced.base_offset
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID, 0, False, 1, reply))
        assert marker == ErrorCode.NONE
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID + 1, 0, True, 1, reply))
        assert marker == ErrorCode.NONE
        followers = [a for a in REPLICAS if a != leader]
        refused = cluster.ask(followers[0], lambda reply: WriteTxnMarker(PID, 0, True, 1,
                                                                          reply))
        assert refused == ErrorCode.NOT_LEADER_OR_FOLLOWER
        expected = cluster.read(leader)
        assert expected.last_stable_offset == first[PID + 2]  # the one left open
        assert expected.aborted_transactions == [(PID, first[PID])]
        # Every follower derives the same from what it appended, once its high watermark
        # covers the markers.
        for follower in followers:
            info = cluster.info(follower)
            for _ in range(ASKS_MAX):
                if info["high_watermark"] == expected.high_watermark:
                    break
                info = cluster.info(follower)
            assert (info["open_transactions"], info["aborted_transactions"]) == (1, 1)
            got = cluster.read(follower)
            assert got.last_stable_offset == expected.last_stable_offset
            assert got.aborted_transactions == expected.aborted_transactions
        # The leader goes away; a new one answers as it did and ends the open transaction.
        cluster.net.down.add(leader)
        new_leader = cluster.leader()
        assert new_leader != leader
        after = cluster.read(new_leader)
        assert after.last_stable_offset == expected.last_stable_offset
        assert after.aborted_transactions == expected.aborted_transactions
        marker = cluster.ask(new_leader, lambda reply: WriteTxnMarker(PID + 2, 0, True, 2,
                                                                       reply))
        assert marker == ErrorCode.NONE
        ended = cluster.read(new_leader)
        assert ended.last_stable_offset == ended.high_watermark
        assert ended.aborted_transactions == [(PID, first[PID])]
    finally:
        cluster.net.close()


def test_max_timestamp_names_a_data_record_never_a_control_batch(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    cluster = Cluster(loop, tmp_path)

    def max_timestamp(address: Address) -> tuple[int, int]:
        result: ListOffsetResult = cluster.ask(
            address, lambda reply: ListOffset(MAX_TIMESTAMP, -1, reply))
        assert result.error == ErrorCode.NONE
        return result.offset, result.timestamp

    try:
        leader = cluster.leader()
        batch = build_batch([(b"k", b"v", [])] * 3, timestamps=[1_000, 3_000, 2_000])
        produced: ProduceResult = cluster.ask(leader, lambda reply: Produce(
            memoryview(batch), iter_batches(batch), -1, reply))
        assert produced.base_offset == 0
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID, 0, True, 1, reply))
        assert marker == ErrorCode.NONE  # a control batch stamped now, at offset 3
        assert max_timestamp(leader) == (1, 3_000)
        # Restarted replicas know no commit: the new leader writes a LEADER_CHANGE (stamped
        # now, at offset 4, in a segment of its own as a new term starts one).
        cluster.restart_all()
        leader = cluster.leader()
        for _ in range(ASKS_MAX):
            info = cluster.info(leader)
            if info["high_watermark"] == info["next_offset"] == 5:
                break
        assert (info["high_watermark"], info["segments"]) == (5, 2)
        assert max_timestamp(leader) == (1, 3_000)
    finally:
        cluster.net.close()
