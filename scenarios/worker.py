"""A scenario's clients: one process of producers, one of consumers (and a flood's).

`python -m scenarios.worker CONFIG.json` runs the role the config names and records what its
clients did. The runner talks to it over stdin (one command a line) and reads a stats line a
second from stdout; the process ends when told `stop` or when stdin closes (the runner died).

Recording is kept off the clients' way (issue #16: at most 5% of the client side's CPU at
20k msg/s). A send is a tuple of seven ints appended to a list (the client's name and topic
are written once, in the file's header); a poll is one tuple of columns (partitions,
offsets, stamps), so a record read costs three attribute calls and no object of its own. Once
a second the lists are packed with msgpack onto the history file (`history-<role>.msgpack`),
which the runner turns into `history.jsonl` after the run:

    header  {"producers": [[name, topic], ...]}  or  {"consumers": [[name, [topic, ...]], ...]}
    chunk   [sends, polls, assigns], once a second
            send    (client, invoke_ns, complete_ns, outcome, partition, n, offset)
            poll    (member, invoke_ns, complete_ns, topic or [topic per record],
                     [partition, ...], [offset, ...], [stamp, ...])
            assign  (member, at_ns, [[topic, partition], ...])

Times are `time.monotonic_ns()`: CLOCK_MONOTONIC is one clock for every process on the
machine, so the runner, the nemesis and the clients agree.

Each sent value begins with its 20-byte stamp `<client>-<n>` (space-padded), the rest is the
workload's payload; a consumer reads the stamp back. The values are therefore unique per run,
which is what the checker needs to tell a duplicate from two writes.

A send still without an answer when the producers stop (kafka-python's and aiokafka's
flush ran out of time) is recorded as unknown: it may have been written, and a consumer may
read it.

Commands: `stop` (producers: stop sending, wait for what is in flight; consumers: stop now),
`pause I` / `resume I` (consumer I stops reading: the slow-consumer fault), `drain JSON`
(consumers: read until every subscription's position reaches these end offsets, then stop).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import queue
import random
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack
from confluent_kafka import KafkaException
from confluent_kafka import Message as _Message

from scenarios import limits

__all__ = ["STAMP_BYTES", "main", "stamp"]

STAMP_BYTES = 20
OK, FAILED, UNKNOWN = 0, 1, 2  # outcome codes in the packed history (history.OUTCOMES order)


def stamp(client: str, n: int) -> bytes:
    return f"{client}-{n}".encode().ljust(STAMP_BYTES)


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


class Stats:
    """What the progress line shows, reset each second; and the CPU the load itself cost,
    from ready to stop or drain (bench/scenarios.py runner_overhead): the whole process's,
    and the main thread's alone. Recording runs on the main thread only (every client's
    callbacks are brought there), while a client's own threads (librdkafka's, aiokafka's
    loop) vary with timing far more than recording costs."""

    def __init__(self) -> None:
        self.acked = self.failed = self.polled = 0
        self.acked_total = 0
        self.cpu_ready_s = self.cpu_end_s = 0.0
        self.main_ready_s = self.main_end_s = 0.0
        self.latencies_ns: list[int] = []
        self.undrained: dict[str, Any] = {}  # what a drain that ran out of time left unread

    def ready(self) -> None:
        self.cpu_ready_s, self.main_ready_s = cpu_s(), time.thread_time()

    def end(self) -> None:
        """The load is over (called on the main thread); later calls change nothing."""
        if not self.cpu_end_s:
            self.cpu_end_s, self.main_end_s = cpu_s(), time.thread_time()

    def load(self) -> dict[str, float]:
        self.end()
        return {"cpu_load_s": self.cpu_end_s - self.cpu_ready_s,
                "main_load_s": self.main_end_s - self.main_ready_s}

    def line(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ns)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6 if lat else None
        out = {"t": time.monotonic_ns(), "acked": self.acked, "failed": self.failed,
               "polled": self.polled, "p99_ms": p99}
        self.acked = self.failed = self.polled = 0
        self.latencies_ns = []
        return out


class Recorder:
    """Operations as tuples, packed onto the history file once a second by `tick`, which the
    role's own loop calls (client callbacks run on that thread too, so nothing races)."""

    def __init__(self, path: str, stats: Stats, recording: bool = True) -> None:
        self.recording = recording  # off only to measure what recording costs (bench/)
        self.sends: list[tuple[int | None, ...]] = []
        self.polls: list[tuple[Any, ...]] = []
        self.assigns: list[tuple[Any, ...]] = []
        self.file = open(path, "ab")
        self.lock = threading.Lock()  # only for callbacks from a client's own thread
        self.stats = stats
        self.next_tick = time.monotonic() + limits.stats_interval_s

    def header(self, names: dict[str, Any]) -> None:
        """Who the indexes in the operations are: written once, before any chunk."""
        self.file.write(msgpack.packb(names, use_bin_type=True))

    def tick(self) -> None:
        if time.monotonic() >= self.next_tick:
            self.next_tick += limits.stats_interval_s
            self.flush()
            print(json.dumps(self.stats.line()), flush=True)

    def flush(self) -> None:
        with self.lock:
            chunk = [self.sends, self.polls, self.assigns]
            self.sends, self.polls, self.assigns = [], [], []
        if any(chunk):
            self.file.write(msgpack.packb(chunk, use_bin_type=True))
            self.file.flush()

    def close(self) -> None:
        self.flush()
        self.file.close()


# --- producers -------------------------------------------------------------------------------

# librdkafka errors that say the message never left the client: certainly not written. Every
# other error may follow an attempt the broker took (a timeout, a lost connection, a retried
# broker error): its outcome is unknown.
_NEVER_SENT = {"_QUEUE_FULL", "_MSG_SIZE_TOO_LARGE", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION",
               "_PURGE_QUEUE", "_INVALID_ARG"}


class ConfluentProducers:
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from confluent_kafka import Producer

        settings = {"bootstrap.servers": config["bootstrap"], "acks": "all",
                    "enable.idempotence": True, "linger.ms": 5,
                    "message.timeout.ms": limits.send_timeout_ms,
                    "topic.metadata.refresh.interval.ms": limits.metadata_refresh_ms,
                    **config["producer_config"]}
        self.clients: list[tuple[str, str, Any]] = [
            (name, topic, Producer(settings)) for name, topic in config["producers"]]
        self.recorder, self.stats = recorder, stats
        recorder.header({"producers": config["producers"]})

    def send(self, index: int, n: int, value: bytes, key: bytes | None) -> None:
        _, topic, producer = self.clients[index]
        invoke = time.monotonic_ns()
        try:
            producer.produce(topic, value, key, on_delivery=partial(self._done, index, n, invoke))
        except BufferError:  # the client's queue is full: never sent
            self._record(index, n, invoke, FAILED, -1, None)
            producer.poll(0.001)
        except KafkaException as e:  # refused before queueing (a topic deleted meanwhile)
            code = e.args[0].name() if e.args else ""
            self._record(index, n, invoke, FAILED if code in _NEVER_SENT else UNKNOWN, -1, None)

    def _done(self, index: int, n: int, invoke: int, err: Any, msg: Any) -> None:
        if err is None:
            self._record(index, n, invoke, OK, msg.partition(), msg.offset())
        else:
            outcome = FAILED if err.name() in _NEVER_SENT else UNKNOWN
            self._record(index, n, invoke, outcome, msg.partition(), None)

    def _record(self, index: int, n: int, invoke: int, outcome: int, partition: int,
                offset: int | None) -> None:
        done = time.monotonic_ns()
        if self.recorder.recording:
            self.recorder.sends.append((index, invoke, done, outcome, partition, n, offset))
        if outcome == OK:
            self.stats.acked += 1
            self.stats.acked_total += 1
            self.stats.latencies_ns.append(done - invoke)
        else:
            self.stats.failed += 1

    def connect(self, warmup_topic: str) -> None:
        """Metadata, connections and the idempotent producer id before the clock starts (one
        record each to a topic nobody checks), so the first sends' latency is the broker's,
        not the client's start-up."""
        for _, topic, producer in self.clients:
            producer.list_topics(topic, timeout=limits.connect_timeout_s)
            producer.produce(warmup_topic, b"warm-up")
            producer.flush(limits.connect_timeout_s)

    def serve(self) -> None:
        for _, _, producer in self.clients:
            producer.poll(0)

    def finish(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _, _, producer in self.clients:
            producer.flush(max(0.0, deadline - time.monotonic()))
        for _, _, producer in self.clients:
            producer.purge()  # what is still queued is reported (_PURGE_QUEUE, or unknown)
            producer.flush(1.0)


class KafkaPythonProducers(ConfluentProducers):
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from kafka import KafkaProducer

        settings = {"bootstrap_servers": config["bootstrap"], "acks": "all", "linger_ms": 5,
                    "enable_idempotence": True,
                    "delivery_timeout_ms": limits.send_timeout_ms,
                    "metadata_max_age_ms": limits.metadata_refresh_ms, **config["producer_config"]}
        self.clients = [(name, topic, KafkaProducer(**settings))
                        for name, topic in config["producers"]]
        self.recorder, self.stats = recorder, stats
        recorder.header({"producers": config["producers"]})
        self._completed: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pending: dict[tuple[int, int], int] = {}  # sent, no answer yet: -> invoke_ns

    def send(self, index: int, n: int, value: bytes, key: bytes | None) -> None:
        _, topic, producer = self.clients[index]
        invoke = time.monotonic_ns()
        try:
            future = producer.send(topic, value=value, key=key)
        except Exception:  # noqa: BLE001 - refused before sending (buffer full, too large)
            self._record(index, n, invoke, FAILED, -1, None)
            return
        self._pending[(index, n)] = invoke
        # Callbacks run on the client's I/O thread: hand them to the sending thread.
        future.add_callback(lambda md: self._completed.put(
            partial(self._record, index, n, invoke, OK, md.partition, md.offset)))
        future.add_errback(lambda e: self._completed.put(
            partial(self._record, index, n, invoke, UNKNOWN, -1, None)))

    def connect(self, warmup_topic: str) -> None:
        for _, topic, producer in self.clients:
            producer.partitions_for(topic)
            producer.send(warmup_topic, b"warm-up").get(timeout=limits.connect_timeout_s)

    def serve(self) -> None:
        while True:
            try:
                self._completed.get_nowait()()
            except queue.Empty:
                return

    def _record(self, index: int, n: int, invoke: int, outcome: int, partition: int,
                offset: int | None) -> None:
        self._pending.pop((index, n), None)
        super()._record(index, n, invoke, outcome, partition, offset)

    def finish(self, timeout_s: float) -> None:
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + timeout_s
        for _, _, producer in self.clients:
            try:
                producer.flush(timeout=max(0.0, deadline - time.monotonic()))
                producer.close(timeout=1.0)
            except KafkaTimeoutError:  # still in flight: unknown, below
                pass
        self.serve()
        self._unanswered()

    def _unanswered(self) -> None:
        """Sends still without an answer when the producers stop: they may have been written
        (a consumer may read them), so they are recorded, as unknown."""
        if self._pending:
            print(f"{len(self._pending)} sends without an answer at the end: unknown",
                  file=sys.stderr, flush=True)
        for (index, n), invoke in list(self._pending.items()):
            self._record(index, n, invoke, UNKNOWN, -1, None)


def run_producers(config: dict[str, Any], recorder: Recorder, stats: Stats,
                  commands: queue.SimpleQueue[str], ready: Callable[[], None]) -> None:
    kind = {"confluent-kafka": ConfluentProducers, "kafka-python": KafkaPythonProducers,
            "aiokafka": AioKafkaProducers}[config["client"]]
    producers = kind(config, recorder, stats)
    producers.connect(config["warmup_topic"])
    ready()
    rate = config["rate"]  # messages per second over this process's producers; 0: max
    payload = bytes.fromhex(config["payload_hex"])[STAMP_BYTES:]
    rng = random.Random(config["seed"])
    keys = config["key_distributor"]
    count = len(producers.clients)
    sent = 0
    start = time.monotonic()
    while True:
        try:
            if commands.get_nowait() == "stop":
                stats.end()
                break
        except queue.Empty:
            pass
        due = int((time.monotonic() - start) * rate) - sent if rate else limits.burst_max
        for _ in range(min(due, limits.burst_max)):
            index = sent % count
            name = producers.clients[index][0]
            n = sent // count
            key = None
            if keys == "KEY_ROUND_ROBIN":
                key = str(n % 1000).encode()
            elif keys == "RANDOM_NANO":
                key = str(rng.getrandbits(32)).encode()
            producers.send(index, n, stamp(name, n) + payload, key)
            sent += 1
        producers.serve()
        recorder.tick()
        if rate and due <= 0:
            time.sleep(limits.pace_tick_s)
    producers.finish(config["finish_timeout_s"])


# --- consumers -------------------------------------------------------------------------------


def _single_topics(config: dict[str, Any], recorder: Recorder) -> list[str | None]:
    """Each member's topic if it reads one (a poll then names it once, not per record), and
    the file's header."""
    recorder.header({"consumers": [[name, topics] for name, _, topics in config["consumers"]]})
    return [topics[0] if len(topics) == 1 else None for _, _, topics in config["consumers"]]


class ConfluentConsumers:
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from confluent_kafka import Consumer

        self.recorder, self.stats = recorder, stats
        self.members: list[tuple[str, str, Any]] = []
        self.topic = _single_topics(config, recorder)
        for index, (name, group, topics) in enumerate(config["consumers"]):
            consumer = Consumer({
                "bootstrap.servers": config["bootstrap"], "group.id": group,
                "auto.offset.reset": "earliest", "enable.partition.eof": False,
                "topic.metadata.refresh.interval.ms": limits.metadata_refresh_ms,
                **config["consumer_config"]})
            consumer.subscribe(topics, on_assign=partial(self._assigned, index),
                               on_revoke=partial(self._assigned, index, revoked=True))
            self.members.append((name, group, consumer))

    def _assigned(self, index: int, consumer: Any, partitions: list[Any],
                  revoked: bool = False) -> None:
        held = [] if revoked else [(p.topic, p.partition) for p in partitions]
        with self.recorder.lock:  # aiokafka calls this on its loop thread
            self.recorder.assigns.append((index, time.monotonic_ns(), held))

    def poll(self, index: int, timeout_s: float) -> None:
        consumer = self.members[index][2]
        invoke = time.monotonic_ns()
        messages = consumer.consume(limits.poll_records_max, timeout_s)
        if not messages:
            return
        if not self.recorder.recording:  # the benchmark's baseline: a client that counts
            self.stats.polled += len(messages)
            return
        if any(map(_Message.error, messages)):
            messages = [m for m in messages if m.error() is None]
        topic = self.topic[index]
        self.recorder.polls.append((
            index, invoke, time.monotonic_ns(),
            topic if topic is not None else list(map(_Message.topic, messages)),
            list(map(_Message.partition, messages)), list(map(_Message.offset, messages)),
            [v[:STAMP_BYTES] if v else b"" for v in map(_Message.value, messages)]))
        self.stats.polled += len(messages)

    def _record_batches(self, index: int, invoke: int, batches: dict[Any, list[Any]]) -> None:
        """kafka-python's and aiokafka's answer, {partition: [records]}, as one poll."""
        records = [m for messages in batches.values() for m in messages]
        if records:
            self.recorder.polls.append((
                index, invoke, time.monotonic_ns(), [m.topic for m in records],
                [m.partition for m in records], [m.offset for m in records],
                [m.value[:STAMP_BYTES] if m.value else b"" for m in records]))
            self.stats.polled += len(records)

    def assigned(self, index: int) -> bool:
        return bool(self.members[index][2].assignment())

    def positions(self, index: int) -> dict[tuple[str, int], int]:
        """Where each assigned partition's next read starts. librdkafka's position is the
        last record consumed + 1, unset for a partition that has given this member nothing
        since it was assigned (another member read it to its end before a rebalance): there
        the group's committed offset is where it stands."""
        _, _, consumer = self.members[index]
        at = consumer.position(consumer.assignment())
        unset = [p for p in at if p.offset < 0]
        if unset:
            try:
                committed = consumer.committed(unset, timeout=limits.committed_timeout_s)
                at = [p for p in at if p.offset >= 0] + committed
            except Exception:  # noqa: BLE001 - a KafkaException: asked again next turn
                pass
        return {(p.topic, p.partition): p.offset for p in at if p.offset >= 0}

    def close(self) -> None:
        for _, _, consumer in self.members:
            consumer.close()


class KafkaPythonConsumers(ConfluentConsumers):
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        self.recorder, self.stats = recorder, stats
        self.members = []
        self.topic = _single_topics(config, recorder)
        outer = self

        for index, (name, group, topics) in enumerate(config["consumers"]):
            class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
                def __init__(self, index: int) -> None:
                    self.index = index

                def on_partitions_revoked(self, revoked: Any) -> None:
                    outer._assigned(self.index, None, [], revoked=True)

                def on_partitions_assigned(self, assigned: Any) -> None:
                    outer._assigned(self.index, None, list(assigned))

            consumer = KafkaConsumer(
                bootstrap_servers=config["bootstrap"], group_id=group,
                auto_offset_reset="earliest", metadata_max_age_ms=limits.metadata_refresh_ms,
                **config["consumer_config"])
            consumer.subscribe(topics, listener=Listener(index))
            self.members.append((name, group, consumer))
        self.topics = {group: topics for _, group, topics in config["consumers"]}
        self.unassigned_since: dict[int, float] = {}

    def poll(self, index: int, timeout_s: float) -> None:
        consumer = self.members[index][2]
        invoke = time.monotonic_ns()
        batches = consumer.poll(timeout_ms=int(timeout_s * 1000),
                                max_records=limits.poll_records_max)
        self._record_batches(index, invoke, batches)
        self._unstick(index)

    def _unstick(self, index: int) -> None:
        """kafka-python 3.0.12 can come out of a rebalance joined, its generation set and no
        rejoin pending, but holding no partition, and stay so: seen in scenario runs, where
        its SyncGroup answer (an assignment of every partition) arrived and was never
        applied, and once in CI. Where every member must hold one (a subscribed topic has
        at least as many partitions as the group has members, all in this process), a
        member that held none for `limits.kafka_python_unassigned_s` asks to rejoin, and
        says so on stderr (the worker's log)."""
        _, group, consumer = self.members[index]
        if consumer.assignment():
            self.unassigned_since.pop(index, None)
            return
        now = time.monotonic()
        since = self.unassigned_since.setdefault(index, now)
        if now - since < limits.kafka_python_unassigned_s:
            return
        self.unassigned_since[index] = now
        members = sum(1 for _, g, _ in self.members if g == group)
        partitions = max(len(consumer.partitions_for_topic(t) or ()) for t in self.topics[group])
        coordinator = getattr(consumer, "_coordinator", None)
        if partitions >= members and coordinator is not None and not coordinator.need_rejoin():
            print(f"kafka-python consumer {index} of group {group}: no partition for "
                  f"{limits.kafka_python_unassigned_s:g} s though the group has {members} "
                  f"members and {partitions} partitions: asking to rejoin", file=sys.stderr,
                  flush=True)
            coordinator.request_rejoin()

    def positions(self, index: int) -> dict[tuple[str, int], int]:
        _, _, consumer = self.members[index]
        return {(tp.topic, tp.partition): consumer.position(tp)
                for tp in consumer.assignment()}


def run_consumers(config: dict[str, Any], recorder: Recorder, stats: Stats,
                  commands: queue.SimpleQueue[str], ready: Callable[[], None]) -> None:
    kind = {"confluent-kafka": ConfluentConsumers, "kafka-python": KafkaPythonConsumers,
            "aiokafka": AioKafkaConsumers}[config["client"]]
    consumers = kind(config, recorder, stats)
    # In their groups before the producers start: a group's first rebalance waits
    # group.initial.rebalance.delay.ms for more members.
    deadline = time.monotonic() + limits.connect_timeout_s
    while time.monotonic() < deadline and not all(
            consumers.assigned(i) for i in range(len(consumers.members))):
        for i in range(len(consumers.members)):
            consumers.poll(i, limits.poll_timeout_s)
    ready()
    paused: set[int] = set()
    drain: dict[tuple[str, int], int] | None = None
    drain_deadline = 0.0
    count = len(consumers.members)
    while True:
        try:
            command = commands.get_nowait()
            word, _, arg = command.partition(" ")
            if word in ("stop", "drain"):
                stats.end()
            if word == "stop":
                break
            if word == "pause":
                paused.update(range(count) if arg == "all" else {int(arg)})
            elif word == "resume":
                paused.difference_update(range(count) if arg == "all" else {int(arg)})
            elif word == "drain":
                drain = {(t, p): o for t, p, o in json.loads(arg)}
                drain_deadline = time.monotonic() + config["drain_timeout_s"]
                paused.clear()
        except queue.Empty:
            pass
        recorder.tick()
        active = [i for i in range(count) if i not in paused]
        for i in active:
            consumers.poll(i, limits.poll_timeout_s / max(1, len(active)))
        if not active:
            time.sleep(limits.poll_timeout_s)
        if drain is not None:
            short = _short_of(consumers, config, drain)
            if not short:
                break
            if time.monotonic() > drain_deadline:  # the runner reports it: not a silent pass
                stats.undrained = short
                break
    consumers.close()


def _short_of(consumers: Any, config: dict[str, Any],
              ends: dict[tuple[str, int], int]) -> dict[str, list[tuple[str, int, int, int]]]:
    """Per subscription (group), the partitions it has not yet read to `ends`, as
    (topic, partition, position or -1 when not assigned, end); empty when all have. A
    partition that never held a record (end 0: a few seconds of sticky partitioning over a
    hundred partitions leaves some empty) has nothing to read, and no consumer has a position
    in it."""
    reached: dict[str, dict[tuple[str, int], int]] = {}
    for i, (_, group, _) in enumerate(consumers.members):
        reached.setdefault(group, {}).update(consumers.positions(i))
    short: dict[str, list[tuple[str, int, int, int]]] = {}
    for group, topics in config["subscriptions"].items():
        at = reached.get(group, {})
        behind = [(t, p, at.get((t, p), -1), end) for (t, p), end in sorted(ends.items())
                  if t in topics and end > 0 and at.get((t, p), -1) < end]
        if behind:
            short[group] = behind
    return short


# --- aiokafka: its own loop thread, the same interface ------------------------------------


class _AioLoop:
    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def call(self, coro: Any, timeout_s: float = 30.0) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)


class AioKafkaProducers(KafkaPythonProducers):
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from aiokafka import AIOKafkaProducer

        self.aio = _AioLoop()
        self.recorder, self.stats = recorder, stats
        self._completed = queue.SimpleQueue()
        self._pending = {}
        settings = {"bootstrap_servers": config["bootstrap"], "acks": "all", "linger_ms": 5,
                    "enable_idempotence": True, "request_timeout_ms": limits.send_timeout_ms,
                    "metadata_max_age_ms": limits.metadata_refresh_ms, **config["producer_config"]}

        async def make() -> Any:
            producer = AIOKafkaProducer(**settings)
            await producer.start()
            return producer

        self.clients = [(name, topic, self.aio.call(make())) for name, topic in config["producers"]]
        # One lock per producer: its sends enter the client's queue in the order they were
        # made. `send()` waits when the partition's open batch is full; without the lock a
        # send made later can find the next batch empty first and be appended ahead of the
        # sends still waiting (asyncio.Lock is first come, first served), which the checker
        # would take for the broker reordering one producer's writes (nonmonotonic-send).
        self._appending = [asyncio.Lock() for _ in self.clients]
        recorder.header({"producers": config["producers"]})

    def send(self, index: int, n: int, value: bytes, key: bytes | None) -> None:
        _, topic, producer = self.clients[index]
        appending = self._appending[index]
        invoke = time.monotonic_ns()
        self._pending[(index, n)] = invoke

        async def one() -> None:
            try:
                async with appending:
                    delivered = await producer.send(topic, value=value, key=key)
                md = await delivered
                outcome = (OK, md.partition, md.offset)
            except Exception:  # noqa: BLE001 - a timeout or a lost connection: unknown
                outcome = (UNKNOWN, -1, None)
            self._completed.put(partial(self._record, index, n, invoke, *outcome))

        self.aio.loop.call_soon_threadsafe(self.aio.loop.create_task, one())

    def connect(self, warmup_topic: str) -> None:
        for _, topic, producer in self.clients:
            self.aio.call(producer.partitions_for(topic))
            self.aio.call(producer.send_and_wait(warmup_topic, b"warm-up"))

    def finish(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _, _, producer in self.clients:
            try:
                self.aio.call(producer.flush(), max(0.0, deadline - time.monotonic()))
                self.aio.call(producer.stop(), max(1.0, deadline - time.monotonic()))
            except TimeoutError:  # still in flight: unknown, below
                pass
        time.sleep(0.1)
        self.serve()
        self._unanswered()


class AioKafkaConsumers(ConfluentConsumers):
    def __init__(self, config: dict[str, Any], recorder: Recorder, stats: Stats) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

        self.aio = _AioLoop()
        self.recorder, self.stats = recorder, stats
        self.members = []
        self.topic = _single_topics(config, recorder)
        outer = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def __init__(self, index: int) -> None:
                self.index = index

            async def on_partitions_revoked(self, revoked: Any) -> None:
                outer._assigned(self.index, None, [], revoked=True)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                outer._assigned(self.index, None, list(assigned))

        for index, (name, group, topics) in enumerate(config["consumers"]):
            async def make(index: int = index, group: str = group, topics: Any = topics) -> Any:
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=config["bootstrap"], group_id=group,
                    auto_offset_reset="earliest", metadata_max_age_ms=limits.metadata_refresh_ms,
                    **config["consumer_config"])
                consumer.subscribe(topics, listener=Listener(index))
                await consumer.start()
                return consumer

            self.members.append((name, group, self.aio.call(make())))
        self._getting: dict[int, tuple[int, Any]] = {}  # a getmany still waiting, per member

    def poll(self, index: int, timeout_s: float) -> None:
        """aiokafka's `getmany` waits for an assignment however short its timeout (a group
        rebalancing while its coordinator is down: a minute and more under faults): one
        still waiting is waited for again on the next turn, not given up on nor doubled."""
        consumer = self.members[index][2]
        waiting = self._getting.pop(index, None)
        if waiting is None:
            waiting = (time.monotonic_ns(), asyncio.run_coroutine_threadsafe(
                consumer.getmany(timeout_ms=int(timeout_s * 1000),
                                 max_records=limits.poll_records_max), self.aio.loop))
        invoke, future = waiting
        try:
            batches = future.result(timeout_s + limits.poll_timeout_s)
        except TimeoutError:
            self._getting[index] = waiting
            return
        self._record_batches(index, invoke, batches)

    def positions(self, index: int) -> dict[tuple[str, int], int]:
        _, _, consumer = self.members[index]

        async def positions() -> dict[tuple[str, int], int]:
            return {(tp.topic, tp.partition): await consumer.position(tp)
                    for tp in consumer.assignment()}

        return dict(self.aio.call(positions()))

    def close(self) -> None:
        for _, _, consumer in self.members:
            self.aio.call(consumer.stop())


# --- the flood: producers over the node's memory budget, not recorded ----------------------


def run_flood(config: dict[str, Any], recorder: Recorder, stats: Stats,
              commands: queue.SimpleQueue[str], ready: Callable[[], None]) -> None:
    from confluent_kafka import Producer

    producers = [Producer({"bootstrap.servers": config["bootstrap"], "acks": "all",
                           "linger.ms": 0, "queue.buffering.max.kbytes": 65536,
                           "message.timeout.ms": limits.send_timeout_ms})
                 for _ in range(config["flood_producers"])]
    value = os.urandom(config["flood_message_size"])
    ready()

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            stats.acked += 1
        else:
            stats.failed += 1

    while True:
        try:
            if commands.get_nowait() == "stop":
                break
        except queue.Empty:
            pass
        for producer in producers:
            for _ in range(limits.burst_max):
                try:
                    producer.produce(config["flood_topic"], value, on_delivery=delivered)
                except BufferError:
                    break
            producer.poll(0)
        recorder.tick()
    for producer in producers:
        producer.purge()
        producer.flush(1.0)


ROLES: dict[str, Callable[..., None]] = {
    "producers": run_producers, "consumers": run_consumers, "flood": run_flood}


# The client libraries' loggers kept at INFO in the worker's log: where a consumer's position
# moved without a rebalance (an offset reset, a truncation found by OffsetForLeaderEpoch),
# which a history's nonmonotonic-poll alone does not explain.
CLIENT_INFO_LOGGERS = ("kafka.consumer.fetcher", "aiokafka.consumer.fetcher")


def _client_logs() -> None:
    """kafka-python's and aiokafka's warnings (and their fetchers' resets) on stderr, which is
    the worker's log; librdkafka writes its own there."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in CLIENT_INFO_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    _client_logs()
    stats = Stats()
    recorder = Recorder(config["history"], stats, config.get("recording", True))
    commands: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("stop")  # the runner is gone

    threading.Thread(target=read_commands, daemon=True).start()
    try:
        def ready() -> None:
            # The history is a list of small tuples held for up to a second: with the
            # default thresholds the cyclic GC walks them again and again (it was a third
            # of what recording cost). Clients and set-up are frozen out of its sight; what
            # the load allocates has no cycles to find.
            gc.collect()
            gc.freeze()
            gc.set_threshold(*limits.gc_thresholds)
            stats.ready()
            print(json.dumps({"ready": True}), flush=True)

        ROLES[config["role"]](config, recorder, stats, commands, ready)
    finally:
        recorder.close()
        print(json.dumps({"done": True, "cpu_s": cpu_s(), **stats.load(),
                          "acked_total": stats.acked_total, "undrained": stats.undrained,
                          **stats.line()}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
