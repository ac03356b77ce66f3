"""Three real Partition actors of one replicated partition (real logs, real Raft replicas) on
one test loop, their Raft messages carried in memory: what the shard's RaftHost gives a
partition, without processes.

`Cluster(loop, tmp_path)` starts the three replicas of "t-0"; a test takes a replica down
(`net.down`: its messages dropped both ways, and the others' `lost` names it at their next
tick, as a shard's keepalives would), or holds what one sends (`net.held`, then
`net.release(address)`: a slow follower whose answers are late, its node still heard from),
or slows one's disk (`services[address].io_delay_s`).
Each replica's latest leader report is in `net.leaders` and, from a leader, its in-sync
replicas in `net.isr`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.hard_state import HardStateStore
from actors.partition import Partition
from actors.partition_messages import PartitionInfo, Produce, ProduceResult, RaftReceive
from actors.partition_replication import GroupKey
from actors.raft import Message
from actors.services import BrokerSettings
from actors.topic_config import TopicSettings
from shards.watch import WatchService
from storage.appender import ChunkPool
from tests.support.actor_loop import settle
from tests.support.io_pool import pool_call
from wire.record_batch import iter_batches
from wire.records import build_batch

__all__ = ["ASKS_MAX", "REPLICAS", "TOPIC_ID", "Address", "Cluster", "Net"]

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to
Address = tuple[int, int]
REPLICAS: tuple[Address, ...] = ((1, 0), (2, 0), (3, 0))
TICK_S = 0.01
ASKS_MAX = 2000  # PartitionInfo asks while a follower's high watermark catches up (~ms each)


class Net:
    """The replicas' links: messages go from one actor's loop turn to the next, dropped to
    and from a replica that is down or when `drops` says so, kept from one that is held
    until it is released."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.refs: dict[Address, Any] = {}
        self.ticks: dict[Address, Callable[[], None]] = {}
        self.rafts: dict[Address, Raft] = {}
        self.leaders: dict[Address, Address | None] = {}
        self.isr: dict[Address, tuple[Address, ...]] = {}  # a leader's last report
        self.down: set[Address] = set()
        self.held: set[Address] = set()
        self.drops: Callable[[Address, Message], bool] = lambda _sender, _m: False
        self._holding: list[tuple[Address, list[Message]]] = []
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
        if sender in self.held:
            self._holding.append((sender, messages))
            return
        for m in messages:
            to = m.to
            if (sender in self.down or to in self.down or to not in self.refs
                    or self.drops(sender, m)):
                continue
            self.refs[to].tell(RaftReceive([m]))  # type: ignore[index]

    def release(self, address: Address) -> None:
        """Stop holding what `address` sends, and deliver what it sent meanwhile in order."""
        self.held.discard(address)
        holding, self._holding = self._holding, []
        for sender, messages in holding:
            self.deliver(sender, messages)

    def close(self) -> None:
        self._timer.cancel()


class Raft:
    """One replica's RaftServices (shards/raft_host.py in a shard)."""

    election_ticks = 10
    heartbeat_ticks = 1
    recovery = None  # appends to learners not throttled

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

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.net.loop.call_later(delay_s, fn)

    def leader_changed(self, key: GroupKey, leader: Address | None, epoch: int,
                       isr: tuple[Address, ...]) -> None:
        self.net.leaders[self.address] = leader
        if leader == self.address:
            self.net.isr[self.address] = isr


class Services:
    def __init__(self, address: Address, net: Net, data_dir: Path, lag_ms: int,
                 storage_mode: str = "buffered") -> None:
        self.settings = BrokerSettings(address[0], "127.0.0.1", 9092, str(data_dir), "c",
                                       replica_lag_time_max_ms=lag_ms)
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = None
        self.disk_space = None
        self.chunks = ChunkPool(64 * 1024, 1 << 20) if storage_mode == "direct" else None
        self.raft = Raft(address, net, data_dir / "raft", self.run_blocking)
        self.io_delay_s = 0.0  # a slow disk: each I/O call returns this much later

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        asyncio.get_event_loop().call_later(self.io_delay_s, pool_call(fn, done))

    read_blocking = clean_blocking = run_blocking

    def segments_removed(self, paths: list[str]) -> None:
        pass


class Cluster:
    """The three replicas of "t-0" with `settings` (default: plain), each node's
    replica.lag.time.max.ms `lag_ms`, each node's storage in `storage_mode` (the
    `storage_mode` fixture of tests/actors/conftest.py sets it for a module's tests)."""

    storage_mode = "buffered"

    def __init__(self, loop: asyncio.AbstractEventLoop, tmp_path: Path,
                 settings: TopicSettings | None = None, lag_ms: int = 30_000) -> None:
        self.loop = loop
        self.net = Net(loop)
        self.settings = settings or TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
        self.services = {a: Services(a, self.net, tmp_path / f"node{a[0]}", lag_ms,
                                     self.storage_mode)
                         for a in REPLICAS}
        for address in REPLICAS:
            self.start(address)

    def start(self, address: Address) -> None:
        services = self.services[address]
        directory = Path(services.settings.data_dir) / "t-0"
        self.net.refs[address] = Partition.start("t", 0, TOPIC_ID, directory, self.settings,
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

    def send_produce(self, address: Address, acks: int, value: bytes = b"v") -> list[Any]:
        """A plain produce, not waited for: the list its answer will be appended to."""
        batch = build_batch([(None, value, [])])
        answers: list[ProduceResult] = []
        self.net.refs[address].tell(Produce(memoryview(batch), iter_batches(batch), acks,
                                            answers.append))
        return answers

    def info(self, address: Address) -> dict[str, int]:
        info: dict[str, int] = self.ask(address, PartitionInfo)
        return info
