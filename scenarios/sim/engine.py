"""One simulated run: a node of real actors, its clients, its steps and faults, from a seed.

`Simulation(spec, seed).run()` makes a temporary data directory, installs the simulated disk,
the virtual clock (as the actors' wall clock too) and seeded ids, starts the node's shards,
creates the topics, starts the workload's producers and consumers, schedules the scripted
steps (scenarios/sim/steps.py) and the seeded faults, and runs the loop:

    0 .. duration         producers send at their rate; steps and faults happen
    duration              producers stop; held pipes deliver, crashed shards restart,
                          slow disks recover (every fault is undone)
    .. drained            producers' records are all answered (or time out)
    .. caught up          consumers have read up to every high watermark
    end                   what was never answered ends `unknown`; final partition state

Every random choice comes from streams seeded by the seed, and nothing runs on another
thread, so one seed gives one history, byte for byte: the digest says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.controller import CreateTopics, TopicSpec
from actors.partition_messages import PartitionInfo
from actors.runtime import bind_loop
from actors.services import set_wall_clock
from scenarios.history import Op
from scenarios.sim import steps as step_actions
from scenarios.sim.clients import ClientSettings, SimConsumer, SimProducer
from scenarios.sim.clock import VirtualClock, VirtualLoop
from scenarios.sim.cluster import SimNode
from scenarios.sim.disk import SimDisk
from scenarios.sim.pipes import PipeFaults, SimPipeNetwork

__all__ = ["SimResult", "Simulation"]

log = logging.getLogger(__name__)

# After the workload: how long (simulated) producers may take to get their answers, and
# consumers to read up to the end, before what is left is given up.
DRAIN_S = 120.0
PROGRESS_EVERY_S = 1.0  # simulated seconds between progress reports
SETUP_S = 60.0  # simulated seconds the topics may take to be made (no faults meanwhile)


@dataclass(slots=True)
class SimResult:
    ops: list[Op]
    faults: list[tuple[str, int, int]]
    figures: dict[str, Any]
    step_checks: list[dict[str, Any]]
    seed: int
    digest: str
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)  # final state

    @property
    def steps_ok(self) -> bool:
        return all(c["ok"] for c in self.step_checks)


class Simulation:
    def __init__(
        self, spec: dict[str, Any], seed: int,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.spec = spec
        self.seed = seed
        self.progress = progress
        self.rng = random.Random(f"krill-sim/{seed}/clients")
        self.fault_rng = random.Random(f"krill-sim/{seed}/faults")
        self.clock = VirtualClock()
        self.loop = VirtualLoop(self.clock)
        self.history: list[Op] = []
        self.fault_windows: list[tuple[str, int, int]] = []
        self.open_faults: dict[str, tuple[str, int]] = {}  # key -> (name, start ns)
        self.figures: defaultdict[str, Any] = defaultdict(int)
        self.step_checks: list[dict[str, Any]] = []
        self.acked = 0
        self.producers: list[SimProducer] = []
        self.consumers: list[SimConsumer] = []
        self.pending_steps: dict[int, dict[str, Any]] = {}  # `after` steps not yet run
        self.steps_done: set[int] = set()
        self.partitions: dict[str, dict[str, int]] = {}
        cluster = spec.get("cluster", {})
        self.shards = int(cluster.get("shards", 1))
        faults = spec.get("faults") or {}
        self.pipe_faults = PipeFaults()  # none while the topics are made
        self.seeded_pipe_faults = PipeFaults(
            drop_rate=float(faults.get("pipe_drop", 0.0)),
            delay_rate=float(faults.get("pipe_delay", 0.0)),
            delay_s=_range_ms(faults.get("pipe_delay_ms", [0, 0])),
        )
        self.fsync_s = _range_ms(faults.get("fsync_ms", [0.1, 2.0]))
        self.fsync_fail_rate = float(faults.get("fsync_fail", 0.0))
        self.fsync_lie_rate = float(faults.get("fsync_lies", 0.0))
        self.crash_every_s = float(faults.get("crash_every_s", 0) or 0)
        self.restart_after_s = _range_ms(faults.get("restart_after_ms", [100, 1000]))
        workload = spec.get("workload") or {}
        self.client_settings = ClientSettings.of(
            {**(workload.get("consumerConfig") or {}), **(workload.get("producerConfig") or {})})
        self._duration_s = _duration_s(workload)
        self.node: SimNode
        self.network: SimPipeNetwork
        self.disk: SimDisk

    # What clients and steps use ---------------------------------------------------------

    def now_ns(self) -> int:
        return self.clock.ns()

    def record(self, op: Op) -> None:
        self.history.append(op)

    def open_fault(self, key: str, name: str) -> None:
        if key not in self.open_faults:
            self.open_faults[key] = (name, self.now_ns())
            self.figures["faults"] += 1

    def close_fault(self, key: str) -> None:
        opened = self.open_faults.pop(key, None)
        if opened is not None:
            name, start = opened
            self._fault_window(name, start, self.now_ns())

    def instant_fault(self, name: str) -> None:
        self.figures["faults"] += 1
        self._fault_window(name, self.now_ns(), self.now_ns())

    def _fault_window(self, name: str, start: int, end: int) -> None:
        self.fault_windows.append((name, start, end))
        self.record(Op("fault", "nemesis", start, end, "ok", name=name))

    def check(self, step: int, what: str, ok: bool, got: Any, want: Any) -> None:
        self.step_checks.append({"step": step, "what": what, "ok": ok, "got": got, "want": want})
        if not ok:
            log.warning("seed %d: step %d: %s: got %r, want %r", self.seed, step, what, got,
                        want)

    # The run ----------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        root = Path(tempfile.mkdtemp(prefix="krill-sim-"))
        self.disk = SimDisk(root.resolve())
        pipe_rng = random.Random(f"krill-sim/{self.seed}/pipes")
        self.network = SimPipeNetwork(self.shards, self.loop, pipe_rng, self.pipe_faults)
        disk_rng = random.Random(f"krill-sim/{self.seed}/disk")
        try:
            with self.disk.installed(), _seeded_ids(self.seed), self._clock_installed():
                self.node = SimNode(
                    self.loop, root, self.shards, self.spec.get("cluster", {}).get(
                        "settings") or {}, self.disk, disk_rng, self.network, self.fsync_s,
                    0.0, 0.0,  # no disk faults while the topics are made
                )
                self.node.start()
                self.loop.run_until_complete(
                    asyncio.wait_for(self._main(), SETUP_S + self._duration_s + 3 * DRAIN_S))
                self.node.stop()
                self.loop.run_until_complete(asyncio.sleep(0.1))
        finally:
            self.loop.close()
            shutil.rmtree(root, ignore_errors=True)
        wall_s = time.perf_counter() - started
        return self._result(wall_s)

    @contextlib.contextmanager
    def _clock_installed(self) -> Iterator[None]:
        bind_loop(self.loop)
        asyncio.set_event_loop(self.loop)
        set_wall_clock(self.clock.wall_ns)
        try:
            yield
        finally:
            set_wall_clock(None)
            asyncio.set_event_loop(None)

    async def _main(self) -> None:
        workload = self.spec.get("workload") or {}
        topics = await asyncio.wait_for(self._create_topics(workload), SETUP_S)
        self.figures["setup_s"] = self.clock.now
        self.network.faults = self.seeded_pipe_faults
        self.node.disk_faults(self.fsync_fail_rate, self.fsync_lie_rate)
        self._start_clients(workload, topics)
        step_actions.schedule(self, self.spec.get("steps") or [])
        if self.crash_every_s > 0:
            self._schedule_random_crash()
        reporter = self.loop.call_later(PROGRESS_EVERY_S, self._report)
        await asyncio.sleep(self._duration_s)
        self.figures["workload_end_s"] = self.clock.now
        for producer in self.producers:
            producer.stop()
        step_actions.undo_all(self)
        await self._until(lambda: all(p.pending == 0 for p in self.producers), DRAIN_S)
        drained = self.now_ns()
        await self._until(lambda: all(c.caught_up(drained) for c in self.consumers), DRAIN_S)
        reporter.cancel()
        step_actions.finish(self)
        for producer in self.producers:
            producer.abandon()
        for consumer in self.consumers:
            consumer.stop()
        self.partitions = await self._partition_state(topics)
        self.figures["end_s"] = self.clock.now

    async def _until(self, done: Callable[[], bool], limit_s: float, every_s: float = 0.01
                     ) -> bool:
        deadline = self.clock.now + limit_s
        while not done():
            if self.clock.now >= deadline:
                return False
            await asyncio.sleep(every_s)
        return True

    async def _create_topics(self, workload: dict[str, Any]) -> list[tuple[str, int]]:
        """The spec's topics, or the workload's (`topics` of `partitionsPerTopic`)."""
        specs = [(t["name"], int(t.get("partitions", 1)), t.get("config") or {})
                 for t in self.spec.get("topics") or []]
        wanted = int(workload.get("topics", len(specs) or 1))
        per_topic = int(workload.get("partitionsPerTopic", 1))
        while len(specs) < wanted:
            specs.append((f"sim-topic-{len(specs)}", per_topic, {}))
        controller = self.node.up(0).controller()  # type: ignore[union-attr]
        done = self.loop.create_future()
        controller.tell(CreateTopics(
            [TopicSpec(name, parts, -1, [], {k: str(v) for k, v in config.items()})
             for name, parts, config in specs],
            False, done.set_result,
        ))
        results = await done
        for result in results:
            assert result.error == 0, f"cannot create topic {result.name}: {result}"
        return [(name, parts) for name, parts, _ in specs[:wanted]]

    def _start_clients(self, workload: dict[str, Any], topics: list[tuple[str, int]]) -> None:
        producers_per_topic = int(workload.get("producersPerTopic", 1))
        total = max(1, producers_per_topic * len(topics))
        rate = float(workload.get("producerRate", 100)) / total
        size = int(workload.get("messageSize", 100))
        subscriptions = int(workload.get("subscriptionsPerTopic", 1))
        per_subscription = int(workload.get("consumerPerSubscription", 1))
        clients = 0
        for topic, partitions in topics:
            for _ in range(producers_per_topic):
                name = f"p{len(self.producers)}"
                self.producers.append(SimProducer(
                    self, name, clients % self.shards, topic, partitions, rate, size))
                clients += 1
            for _ in range(subscriptions):
                for k in range(per_subscription):
                    assignment = [(topic, p) for p in range(partitions)
                                  if p % per_subscription == k]
                    name = f"c{len(self.consumers)}"
                    self.consumers.append(
                        SimConsumer(self, name, clients % self.shards, assignment))
                    clients += 1
        for consumer in self.consumers:
            consumer.start()
        for producer in self.producers:
            producer.start()

    def _schedule_random_crash(self) -> None:
        delay = self.fault_rng.expovariate(1 / self.crash_every_s)
        self.loop.call_later(delay, self._random_crash)

    def _random_crash(self) -> None:
        if self.producers and self.producers[0].stopped:
            return  # the workload is over
        shard = self.fault_rng.randrange(self.shards)
        if self.node.up(shard) is not None:
            step_actions.crash(self, shard)
            restart = self.fault_rng.uniform(*self.restart_after_s)
            self.loop.call_later(restart, step_actions.restart, self, shard)
        self._schedule_random_crash()

    def _report(self, acked_before: int = 0) -> None:
        """Progress, every simulated second: acknowledged sends in that second."""
        if self.progress is not None:
            self.progress({"elapsed_s": round(self.clock.now, 3),
                           "msgs_per_s": (self.acked - acked_before) / PROGRESS_EVERY_S,
                           "p99_ms": None, "faults": self.figures["faults"],
                           "acked": self.acked,
                           "produce_requests": self.figures["produce_requests"]})
        self.loop.call_later(PROGRESS_EVERY_S, self._report, self.acked)

    async def _partition_state(self, topics: list[tuple[str, int]]) -> dict[str, dict[str, int]]:
        state: dict[str, dict[str, int]] = {}
        for topic, partitions in topics:
            for index in range(partitions):
                info = await self.partition_info(topic, index)
                if info is not None:
                    state[f"{topic}/{index}"] = {k: info[k] for k in (
                        "log_start_offset", "high_watermark", "next_offset", "flushed_offset")}
        return state

    async def partition_info(self, topic: str, index: int) -> dict[str, int] | None:
        """The partition actor's own account of its offsets (None: its shard is down)."""
        from shards.shard_table import shard_of

        shard = self.node.up(shard_of(topic, index, self.shards))
        ref = None if shard is None else shard.partition_ref(topic, index)
        if ref is None:
            return None
        done = self.loop.create_future()
        ref.tell(PartitionInfo(done.set_result))
        info: dict[str, int] = await done
        return info

    def _result(self, wall_s: float) -> SimResult:
        figures = dict(self.figures)
        figures.update(self.network.counts())
        figures.update(
            wall_s=round(wall_s, 3), simulated_s=round(self.clock.now, 3),
            acked=self.acked, crashes=self.node.crashes, bytes_lost=self.node.bytes_lost,
            fdatasyncs=self.disk.fdatasyncs, failed_fdatasyncs=self.disk.failed_fdatasyncs,
            produces_per_wall_s=round(figures.get("produce_requests", 0) / wall_s, 1),
            replay=f"--seed {self.seed}",
        )
        digest = self._digest()
        figures["digest"] = digest
        return SimResult(self.history, self.fault_windows, figures, self.step_checks,
                         self.seed, digest, self.partitions)

    def _digest(self) -> str:
        h = hashlib.sha256()
        for op in self.history:
            h.update(json.dumps(op.to_json(), sort_keys=True).encode())
        h.update(json.dumps([self.fault_windows, self.step_checks,
                             self.partitions], sort_keys=True,
                            default=str).encode())
        return h.hexdigest()


@contextlib.contextmanager
def _seeded_ids(seed: int) -> Iterator[None]:
    """uuid4 (member ids, topic ids, the cluster id) and the `random` module drawn from the
    seed while a run lasts."""
    rng = random.Random(f"krill-sim/{seed}/ids")
    real = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)
    # The module's own stream too (a cleanup timer's phase, a segment's roll jitter).
    state = random.getstate()
    random.seed(f"krill-sim/{seed}/random")
    try:
        yield
    finally:
        uuid.uuid4 = real
        random.setstate(state)


def _range_ms(value: Any) -> tuple[float, float]:
    """[low, high] milliseconds (or one number) as seconds."""
    if isinstance(value, int | float):
        return value / 1000, value / 1000
    low, high = value
    return float(low) / 1000, float(high) / 1000


def _duration_s(workload: dict[str, Any]) -> float:
    if "testDurationSeconds" in workload:
        return float(workload["testDurationSeconds"])
    if "testDurationMinutes" in workload:
        return float(workload["testDurationMinutes"]) * 60
    return 10.0

