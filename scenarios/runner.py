"""Run a real-mode scenario: nodes, clients, the nemesis, then the checker and the report.

    run(scenario, out) -> report dict

1. The nodes start (scenarios/cluster.py) and the topics are made. A cluster (more than one
   node) starts every node with the others as seeds, through link proxies when a step cuts
   or delays links, and the run waits until every node names a leader for every partition.
2. The client workers start (scenarios/worker.py): consumers first, so they are in their
   groups before the first record; then producers at the workload's rate, a process per
   client library. With `consumerBacklogSizeGB` the consumers wait, paused, until that much
   is written (OMB).
3. The nemesis runs the steps in order on its own thread: each waits for its time (`at`) or
   condition (`after`), does its fault, and the fault is undone `for` a time later, by a later
   `undo` step, or when the workload ends. Every fault is a window in the history. A `chaos`
   step runs its drawn faults on a thread of its own (scenarios/chaos.py). Meanwhile a watch
   records every node process that exits though nothing of the runner's ended it.
4. When the workload ends, the producers stop and wait for what is in flight, the runner
   reads every partition's end offset, and the consumers read up to it (bounded), so an
   acknowledged write nobody read is a lost write, not a slow consumer. A cluster's replicas
   are then compared, by their nodes' word and on disk, until they agree (bounded:
   scenarios/replicas.py).
5. The history (`history.jsonl`) is checked (scenarios/checker.py), with the runner's own
   checks (no node exited by itself; the replicas agreed), and the report written:
   `report.json`, `timeline.png`, and a verdict table on stdout.

The nemesis only ever acts through what a user or an operator has: signals to processes,
the admin API's failure probes, a filesystem of a given size, Kafka admin requests, and the
network between nodes (the link proxies). A step that names `leader of <topic>-<partition>`
asks the nodes that are up when it runs; the step's record in the report says which node it
hit (`node`), what each node answered (`leaders_seen`), and, when it is undone, which node led
then (`leader_at_undo`), so a run shows that leadership moved.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from scenarios import limits
from scenarios.chaos import Chaos
from scenarios.checker import check
from scenarios.cluster import CLUSTER_READY_TIMEOUT_S, REPO, Cluster, Node
from scenarios.history import Op, write_history
from scenarios.replicas import Convergence, converge
from scenarios.spec import Link, NodeRef, Scenario, Step, node_ref, seconds, size_bytes, target

__all__ = ["RunError", "build_history", "run"]

OUTCOMES = ("ok", "failed", "unknown")
FLOOD_TOPIC = "scenario-flood"
WARMUP_TOPIC = "scenario-warmup"  # each producer's first record (its producer id) goes here
PROBES = "/v1/failure-probes"
# The guard's threshold a `disk_full` fills past when the scenario sets none (bytes left).
DISK_FULL_LEAVE_BYTES = 1 << 20
CREATE_RETRY_S = 0.5  # a cluster's CreateTopics asked again while its controller is elected


class RunError(RuntimeError):
    """A run that could not be carried out (not a failed check): one line."""


class Worker:
    """One client process: commands in on stdin, stats lines out on stdout. `name` (the role,
    unless several processes share one: `consumers-n2`) names its files and stats."""

    def __init__(self, role: str, config: dict[str, Any], out: Path,
                 on_stats: Callable[[str, dict[str, Any]], None], name: str = "") -> None:
        self.role = role
        self.name = name = name or role
        path = out / f"worker-{name}.json"
        config = {**config, "role": role, "history": str(out / f"history-{name}.msgpack")}
        path.write_text(json.dumps(config))
        self.log_path = out / f"worker-{name}.log"
        self.killed = False  # by the runner, for not ending in time (an error of its own)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "scenarios.worker", str(path)], cwd=REPO,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                bufsize=1)
        self.ready = threading.Event()
        self.done: dict[str, Any] | None = None
        self._on_stats = on_stats
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(limits.worker_ready_timeout_s):
            self.kill()
            raise RunError(f"the {name} worker did not start; see {out}/worker-{name}.log")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                stats = json.loads(line)
            except json.JSONDecodeError:
                continue
            if stats.get("ready"):
                self.ready.set()
            elif stats.get("done"):
                self.done = stats
            else:
                self._on_stats(self.name, stats)
        self.ready.set()

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def wait(self, timeout_s: float) -> bool:
        try:
            self.process.wait(timeout=timeout_s)
            self.reader.join(timeout=5.0)  # its last line (`done`) read
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        if self.process.poll() is None:
            self.killed = True
            self.process.kill()
            self.process.wait()

    def crashed(self) -> str | None:
        """How the process ended if it ended badly by itself (an exception in a client):
        its exit code and its log's last line; None otherwise."""
        code = self.process.poll()
        if code in (0, None) or self.killed:
            return None
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            lines = []
        return f"exited with code {code}: {lines[-1] if lines else '(empty log)'}"


class _Live:
    """What the progress line shows: the workers' last second, summed over the producer
    processes (one per client library)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked_total = 0
        self.last: dict[str, dict[str, Any]] = {}
        self.last_acked_ns = 0  # when a producer process last said it had acknowledgements

    def on_stats(self, role: str, stats: dict[str, Any]) -> None:
        with self.lock:
            self.last[role] = stats
            if role.startswith("producers"):
                self.acked_total += stats.get("acked", 0)
                if stats.get("acked"):
                    self.last_acked_ns = max(self.last_acked_ns, stats.get("t", 0))

    def producers(self) -> tuple[int, float]:
        """Acknowledged in the last second over every producer process, and the worst p99."""
        with self.lock:
            lines = [v for k, v in self.last.items() if k.startswith("producers")]
        return (sum(v.get("acked", 0) or 0 for v in lines),
                max((v.get("p99_ms") or 0.0 for v in lines), default=0.0))


class Run:
    def __init__(self, scenario: Scenario, out: Path, recording: bool = True) -> None:
        self.s = scenario
        self.recording = recording
        self.out = out
        self.cluster: Cluster | None = None
        self.workers: dict[str, Worker] = {}
        self.consumer_workers: list[tuple[Worker, list[str]]] = []  # and its consumers' names
        self.live = _Live()
        self.faults: list[dict[str, Any]] = []  # name, start_ns, end_ns (None while on)
        self.undo: dict[int, Callable[[], None]] = {}  # step index -> undo, while on
        self.step_log: list[dict[str, Any]] = []
        self.start_ns = 0
        self.rng = random.Random(scenario.seed)
        self.errors: list[str] = []
        self.backlog_pending = scenario.workload.consumer_backlog_bytes > 0
        self.notes: dict[str, Any] = {}  # what the step being done found (its node, leaders)
        self.link_pairs: dict[int, set[tuple[int, int]]] = {}  # link step -> its links
        self.doing = -1  # the index of the step being done
        self.links: dict[str, dict[str, int]] = {}  # each link proxy's counters, at the end
        self.node_exits: list[dict[str, Any]] = []  # node processes that ended by themselves
        self._exits_lock = threading.Lock()  # the watch and the chaos both look
        self.convergence: Convergence | None = None  # a cluster's replicas after the load

    @property
    def nodes(self) -> list[Node]:
        return list(self.cluster.nodes.values()) if self.cluster is not None else []

    # --- the cluster --------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        settings = dict(self.s.settings)
        # The consumers are in their groups before the clock starts; waiting 3 s for more
        # members to join a group that has them all only lengthens every run.
        settings.setdefault("group_initial_rebalance_delay_ms", 0)
        if any(step.action in ("slow_disk", "fsync_error") for step in self.s.steps):
            settings.setdefault("enable_failure_injection", True)
        if self.s.nodes > 1:
            settings.setdefault("default_replicas", min(3, self.s.nodes))
        return settings

    def start_cluster(self) -> None:
        work = self.out / "data"
        if work.exists():
            shutil.rmtree(work)
        self.cluster = Cluster(self.out, self.s.node_ids, self.s.shards, self.settings(),
                               self.s.disk_size, self.s.link_proxies)
        self.cluster.start()
        warmup = {"name": WARMUP_TOPIC, "partitions": 1, "config": {}}
        self.create_topics([*self.s.topics, warmup])

    def create_topics(self, topics: list[dict[str, Any]]) -> None:
        """Made, and in a cluster led: every node names a leader for every partition (the
        controller may still be electing at first: asked again until the deadline)."""
        if self.s.nodes == 1:
            self.admin_client().create_topics(self._new_topics(topics))
            return
        assert self.cluster is not None
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        attempt = 0
        while True:
            try:
                self.admin_client().create_topics(self._new_topics(topics), exist_ok=attempt > 0)
                break
            except RunError:
                if time.monotonic() >= deadline:
                    raise
                attempt += 1
                time.sleep(CREATE_RETRY_S)
        self.cluster.wait_for_leaders([(t["name"], t["partitions"]) for t in topics],
                                      max(1.0, deadline - time.monotonic()))

    def bootstrap(self, node_ids: list[int] | None = None) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap(node_ids)

    def admin_client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return _Admin(AdminClient({"bootstrap.servers": self.bootstrap()}))

    def _new_topics(self, topics: list[dict[str, Any]]) -> list[Any]:
        from confluent_kafka.admin import NewTopic

        replicas = int(self.settings().get("default_replicas", 1))
        return [NewTopic(t["name"], t["partitions"], t.get("replicas", replicas),
                         config=t["config"]) for t in topics]

    # --- the workload -------------------------------------------------------------------

    def worker_config(self, client: str | None = None) -> dict[str, Any]:
        """A worker's settings, for one client library (the workload's first by default)."""
        w = self.s.workload
        client = client or w.client
        payload = w.payload or random.Random(self.s.seed).randbytes(w.message_size)
        return {"bootstrap": self.bootstrap(), "client": client, "seed": self.s.seed,
                "producer_config": w.producer_config_for(client),
                "consumer_config": w.consumer_config_for(client),
                "payload_hex": payload.hex(), "key_distributor": w.key_distributor,
                "finish_timeout_s": limits.finish_timeout_s, "warmup_topic": WARMUP_TOPIC,
                "recording": self.recording,
                "drain_timeout_s": limits.drain_timeout_s}

    def start_workers(self) -> None:
        """Consumer processes first (in their groups before the first record), then one
        producer process per client library. With several libraries (`client: [...]`),
        producer i and subscription i use clients[i % n] (producer i of a topic that names
        its `clients`: one of those), each library in processes of its own, named after it
        (`producers-aiokafka`, `consumers-kafka-python-n2`); a subscription reads the
        workload topics its library may use."""
        w = self.s.workload
        clients = w.clients or (w.client,)
        subscriptions = {f"sub-{i}": [t for t in self.s.workload_topics
                                      if clients[i % len(clients)] in self.s.clients_of(t)]
                         for i in range(w.subscriptions_per_topic)}
        consumers = [(f"c{i * w.consumer_per_subscription + j}", group, topics)
                     for i, (group, topics) in enumerate(subscriptions.items())
                     for j in range(w.consumer_per_subscription)]
        for i, client in enumerate(clients):
            groups = [g for g in list(subscriptions)[i::len(clients)] if subscriptions[g]]
            suffix = f"-{client}" if len(clients) > 1 else ""
            for name, bootstrap, mine_groups in self._consumer_processes(groups, suffix):
                members = [c for c in consumers if c[1] in mine_groups]
                worker = Worker("consumers", {
                    **self.worker_config(client), "bootstrap": bootstrap, "consumers": members,
                    "subscriptions": {g: subscriptions[g] for g in mine_groups}},
                    self.out, self.live.on_stats, name=name)
                self.workers[name] = worker
                self.consumer_workers.append((worker, [c[0] for c in members]))
                if w.consumer_backlog_bytes:
                    worker.command("pause all")
        producers = [topic for topic in self.s.workload_topics
                     for _ in range(w.producers_per_topic)]
        by_client: dict[str, list[tuple[str, str]]] = {}
        for i, topic in enumerate(producers):
            allowed = [c for c in clients if c in self.s.clients_of(topic)]
            by_client.setdefault(allowed[i % len(allowed)], []).append((f"p{i}", topic))
        for client, mine in by_client.items():
            name = "producers" if len(clients) == 1 else f"producers-{client}"
            rate = w.producer_rate * len(mine) / len(producers)
            self.workers[name] = Worker(
                "producers", {**self.worker_config(client), "producers": mine, "rate": rate},
                self.out, self.live.on_stats, name=name)

    def _consumer_processes(self, groups: list[str], suffix: str = ""
                            ) -> list[tuple[str, str, list[str]]]:
        """(worker name, bootstrap, groups) per consumer process: one bootstrapped from every
        node, or with `consumer_bootstrap: spread` one per node, subscription i's consumers
        bootstrapped from node i mod N alone. A group stays in one process: its drain asks
        every member's position."""
        if not groups:
            return []
        if self.s.consumer_bootstrap != "spread" or self.s.nodes == 1:
            return [(f"consumers{suffix}", self.bootstrap(), groups)]
        ids = self.s.node_ids
        by_node: dict[int, list[str]] = {}
        for group in groups:
            i = int(group.split("-")[1])  # sub-i
            by_node.setdefault(ids[i % len(ids)], []).append(group)
        return [(f"consumers{suffix}-n{node}", self.bootstrap([node]), mine)
                for node, mine in by_node.items()]

    def end_offsets(self) -> list[tuple[str, int, int]]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap(), "group.id": "scenario-ends"})
        try:
            metadata = consumer.list_topics(timeout=10)
            out = []
            for name in self.s.workload_topics:
                if name in self.s.unchecked_topics:  # deleted and made again: not checked
                    continue
                topic = metadata.topics.get(name)
                if topic is None or topic.error is not None:
                    continue
                for p in topic.partitions:
                    _, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                    out.append((name, p, high))
            return out
        finally:
            consumer.close()

    # --- the nemesis ----------------------------------------------------------------------

    def elapsed_s(self) -> float:
        return (time.monotonic_ns() - self.start_ns) / 1e9

    def nemesis(self, stop: threading.Event) -> None:
        timers: list[tuple[float, int]] = []  # (time, step index) of `for` undos
        previous_done = 0.0
        for step in self.s.steps:
            while not stop.is_set():
                self._due_undos(timers)
                if self._ready(step, previous_done):
                    break
                stop.wait(limits.condition_poll_s)
            if stop.is_set():
                return
            try:
                self.do(step)
            except Exception as e:  # noqa: BLE001 - a fault that failed is the run's error
                self.errors.append(f"step {step.index} ({step.name}): {e}")
                self.step_log.append({"step": step.index, "name": step.name,
                                      "at_s": round(self.elapsed_s(), 3), "error": str(e)})
                continue
            previous_done = self.elapsed_s()
            if step.for_s is not None:
                heapq.heappush(timers, (previous_done + step.for_s, step.index))
        while not stop.is_set() and timers:
            self._due_undos(timers)
            stop.wait(limits.condition_poll_s)

    def _due_undos(self, timers: list[tuple[float, int]]) -> None:
        while timers and timers[0][0] <= self.elapsed_s():
            _, index = heapq.heappop(timers)
            self.undo_step(index)

    def _ready(self, step: Step, previous_done: float) -> bool:
        if step.at_s is not None:
            return self.elapsed_s() >= step.at_s
        after = step.after or {}
        if "previous" in after and self.elapsed_s() < previous_done + seconds(after["previous"]):
            return False
        if "acked" in after and self.live.acked_total < after["acked"]:
            return False
        if after.get("recovered"):
            ended = [f for f in self.faults if f["end_ns"] is not None]
            if not ended or self.live.last_acked_ns < ended[-1]["end_ns"]:
                return False
        return True

    def do(self, step: Step) -> None:
        if step.action == "undo":
            assert step.undo is not None
            self.undo_step(step.undo)
            return
        self.notes, self.doing = {}, step.index
        if step.action == "chaos":  # its faults are the windows, each its own
            entry = {"step": step.index, "name": step.name, "at_s": round(self.elapsed_s(), 3)}
            self.step_log.append(entry)
            self.undo[step.index] = Chaos(self, step.index, step.arg, entry).start()
            return
        start = time.monotonic_ns()
        undo = getattr(self, f"_{step.action}")(step.arg)
        notes, self.notes = self.notes, {}
        found = "found_ns" in notes  # a node drawn or asked for, or links: name them
        start = notes.pop("found_ns", start)  # the fault began once its node was found
        entry = {"step": step.index, "name": step.name,
                 "at_s": round((start - self.start_ns) / 1e9, 3), **notes}
        self.step_log.append(entry)
        said = notes.get("links", notes.get("node"))
        name = f"{step.name} ({said})" if found and said is not None else step.name
        fault = {"step": step.index, "name": name, "start_ns": start, "end_ns": None}
        self.faults.append(fault)
        if undo is None:  # done at once (restart, add_partitions): its window is its length
            fault["end_ns"] = time.monotonic_ns()
            if "leader_of" in notes:
                entry["leader_after"] = self._leader_now(notes["leader_of"])
        else:
            self.undo[step.index] = self._noting_leader(undo, entry) \
                if "leader_of" in notes else undo

    def _leader_now(self, partition: str) -> int | None:
        """The node the nodes that are up name as the partition's leader now (asked once)."""
        assert self.cluster is not None
        topic, _, number = partition.rpartition("-")
        return self.cluster.leader_of(topic, int(number), timeout_s=0)[0]

    def _noting_leader(self, undo: Callable[[], None], entry: dict[str, Any]
                       ) -> Callable[[], None]:
        """`undo`, after writing down who leads the step's partition just before it: the
        report's proof that a fault on a leader moved leadership."""
        def noted() -> None:
            entry["leader_at_undo"] = self._leader_now(entry["leader_of"])
            undo()

        return noted

    def undo_step(self, index: int) -> None:
        undo = self.undo.pop(index, None)
        if undo is None:
            return
        try:
            undo()
        except Exception as e:  # noqa: BLE001 - recorded; the run fails with it
            self.errors.append(f"undo of step {index}: {e}")
        for fault in self.faults:
            if fault["step"] == index and fault["end_ns"] is None:
                fault["end_ns"] = time.monotonic_ns()

    def undo_all(self) -> None:
        for index in sorted(self.undo, reverse=True):
            self.undo_step(index)

    def node_of(self, ref: NodeRef, notes: dict[str, Any] | None = None) -> Node:
        """The node a step names, found now: by number, drawn from the seed, or the leader
        most nodes that are up name (waiting for one to be elected). What was found goes to
        `notes` (the step's, by default)."""
        assert self.cluster is not None
        notes = self.notes if notes is None else notes
        ids = list(self.cluster.nodes)
        if ref.kind == "id":
            assert ref.id is not None
            return self.cluster.node(ref.id)
        if ref.kind == "random":
            node = self.cluster.node(ids[self.rng.randrange(len(ids))])
        else:
            assert ref.topic is not None and ref.partition is not None
            leader, answers = self.cluster.leader_of(ref.topic, ref.partition)
            notes.setdefault("leader_of", f"{ref.topic}-{ref.partition}")
            notes.setdefault("leaders_seen", {str(k): v for k, v in answers.items()})
            if leader is None:
                raise RunError(f"no node that is up names a leader of {ref.topic}-"
                               f"{ref.partition} (answers: {answers})")
            node = self.cluster.node(leader)
        notes["found_ns"] = time.monotonic_ns()
        return node

    def _named(self, value: Any) -> Node:
        """restart/disk_full/slow_disk/fsync_error's node: 'node 2', 'leader of t-0', {node}."""
        if isinstance(value, dict):
            value = value.get("node", self.s.node_ids[0])
        node = self.node_of(node_ref(value))
        self.notes["node"] = node.node_id
        return node

    def _target(self, arg: Any) -> tuple[Node, str]:
        """kill/stop's target -> (node, 'node' or the shard's number as a string)."""
        aim = target(arg, self.s.node_ids[0])
        node = self.node_of(aim.node)
        self.notes["node"] = node.node_id
        if aim.shard is None:
            return node, "node"
        shard = self.rng.randrange(node.shards) if aim.shard == -1 else aim.shard
        if shard >= node.shards:
            raise RunError(f"node {node.node_id} has {node.shards} shards, not a shard {shard}")
        return node, str(shard)

    def _kill(self, arg: Any) -> Callable[[], None]:
        node, what = self._target(arg)
        node.kill(what)
        node.wait_gone()  # a shard killed takes its node down (the supervisor stops it)
        return node.start

    def _stop(self, arg: Any) -> Callable[[], None]:
        node, what = self._target(arg)
        node.pause(what)
        return node.resume

    def _restart(self, arg: Any) -> None:
        node = self._named(arg)
        node.stop()
        node.start()

    def _disk_full(self, arg: Any) -> Callable[[], None]:
        leave = DISK_FULL_LEAVE_BYTES if isinstance(arg, str) else size_bytes(
            arg.get("leave", DISK_FULL_LEAVE_BYTES))
        node = self._named(arg)
        node.fill_disk(leave)
        return node.free_disk

    def _link(self, link: Link) -> Callable[[], None] | None:
        """Cut (both ways), lose (from -> to), delay (both ways) or heal the links between
        the step's nodes, each one direction's proxy (scenarios/link_proxy.py)."""
        assert self.cluster is not None
        pairs = self._pairs(link)
        self.notes["links"] = ", ".join(f"{a}->{b}" for a, b in sorted(pairs))
        self.notes["found_ns"] = time.monotonic_ns()
        proxies = [self.cluster.link(a, b) for a, b in sorted(pairs)]
        if link.mode == "heal":  # and a link fault still on over these links is over
            for index, held in list(self.link_pairs.items()):
                if held & pairs:
                    self.undo_step(index)
            for proxy in proxies:
                proxy.heal()
            return None
        for proxy in proxies:
            if link.mode == "delay":
                proxy.delay(link.ms)
            else:
                proxy.cut()
        index = self.doing
        self.link_pairs[index] = pairs

        def heal() -> None:
            self.link_pairs.pop(index, None)
            for proxy in proxies:
                proxy.heal()

        return heal

    def _pairs(self, link: Link) -> set[tuple[int, int]]:
        """The (from, to) node pairs whose proxies a link step sets; a side that is None is
        every node not on the other, both None every pair."""
        assert self.cluster is not None
        ids = list(self.cluster.nodes)
        sources = None if link.sources is None else [self.node_of(r).node_id for r in link.sources]
        targets = None if link.targets is None else [self.node_of(r).node_id for r in link.targets]
        if sources is None and targets is None:
            return {(a, b) for a in ids for b in ids if a != b}
        if sources is None:
            sources = [i for i in ids if i not in (targets or [])]
        if targets is None:
            targets = [i for i in ids if i not in sources]
        pairs = {(a, b) for a in sources for b in targets if a != b}
        if link.mode != "loss":
            pairs |= {(b, a) for a, b in pairs}
        if not pairs:
            raise RunError(f"link {link.mode}: from {sources} to {targets} names no two nodes")
        self.notes["from"], self.notes["to"] = sources, targets
        return pairs

    def _probe(self, node: Node, path: str) -> Callable[[], None]:
        status, body = node.admin("PUT", f"{PROBES}/{path}")
        if status != 200:
            raise RunError(f"node {node.node_id} refused the failure probe {path}: "
                           f"{status} {body.decode(errors='replace').strip()[:200]}")

        def clear() -> None:
            if node.alive():
                node.admin("DELETE", PROBES)

        return clear

    def _slow_disk(self, arg: dict[str, Any]) -> Callable[[], None]:
        node = self._named(arg)
        return self._probe(node, f"storage/fdatasync/delay?ms={arg['fdatasync_ms']}")

    def _fsync_error(self, arg: Any) -> Callable[[], None]:
        node = self._named(arg)
        return self._probe(node, "storage/fdatasync/exception")

    def _slow_consumer(self, arg: str) -> Callable[[], None]:
        if not self.consumer_workers:
            raise RunError("slow_consumer needs consumers (subscriptionsPerTopic)")
        if arg == "all":
            held = [(worker, "all") for worker, _ in self.consumer_workers]
        else:  # consumer k is in one process, at its own index there
            name = f"c{arg.split()[1]}"
            held = [(worker, str(names.index(name))) for worker, names in self.consumer_workers
                    if name in names]
            if not held:
                raise RunError(f"there is no {arg}")
        for worker, which in held:
            worker.command(f"pause {which}")

        def resume() -> None:
            for worker, which in held:
                worker.command(f"resume {which}")

        return resume

    def _producer_flood(self, arg: dict[str, Any]) -> Callable[[], None]:
        topic = arg.get("topic", FLOOD_TOPIC)
        flood = Worker("flood", {**self.worker_config(), "flood_topic": topic,
                                 "flood_producers": arg.get("producers", 16),
                                 "flood_message_size": arg.get("messageSize", 65536)},
                       self.out, self.live.on_stats)
        self.workers["flood"] = flood

        def end() -> None:
            flood.command("stop")
            flood.wait(limits.worker_exit_timeout_s)

        return end

    def delete_topic(self, name: str) -> Callable[[], None]:
        """The `delete_topic` step's work, for a chaos fault (`recreate_topic`): delete the
        topic; the undo makes it again."""
        return self._delete_topic(name)

    def _delete_topic(self, name: str) -> Callable[[], None]:
        topic = next(t for t in self.s.topics if t["name"] == name)
        self.admin_client().delete_topics([name])

        def recreate() -> None:  # unless the producers' metadata requests made it already
            self.admin_client().create_topics(self._new_topics([topic]), exist_ok=True)

        return recreate

    def _add_partitions(self, arg: dict[str, Any]) -> None:
        from confluent_kafka.admin import NewPartitions

        self.admin_client().create_partitions([NewPartitions(arg["topic"], arg["count"])])

    # --- the whole run ----------------------------------------------------------------------

    def execute(self, progress: Any) -> None:
        self.start_cluster()
        watching = threading.Event()
        threading.Thread(target=self.watch_nodes, args=(watching,), name="node-watch",
                         daemon=True).start()
        try:
            self._load(progress)
            self.finish()
            if self.s.nodes > 1:
                self.convergence = converge(
                    {n.node_id: n.data_dir for n in self.nodes}, self.partition_views,
                    self.replica_sets(), limits.replicas_converge_timeout_s,
                    self.deleted_below())
        finally:
            watching.set()
            self.note_exits()

    def _load(self, progress: Any) -> None:
        """The workload's clients and the nemesis, until the load ends; then every fault
        undone (and in a cluster, a node that exited by itself started again)."""
        w = self.s.workload
        if any(s.action == "producer_flood" for s in self.s.steps):
            self.create_topics([{"name": FLOOD_TOPIC, "partitions": self.s.shards,
                                 "config": {}}])
        self.start_workers()
        self.start_ns = time.monotonic_ns()  # the clock starts once every client is ready
        total_s = w.warmup_s + w.duration_s
        stop = threading.Event()
        nemesis = threading.Thread(target=self.nemesis, args=(stop,), daemon=True)
        warmed = False
        try:
            while self.elapsed_s() < total_s:
                time.sleep(min(1.0, max(0.01, total_s - self.elapsed_s())))
                if not warmed and self.elapsed_s() >= w.warmup_s:
                    warmed = True
                    self.start_ns += int(w.warmup_s * 1e9)  # steps count from the warm-up's end
                    total_s -= w.warmup_s
                    nemesis.start()
                self._backlog_reached()
                self._show(progress, total_s)
        finally:
            stop.set()
            if nemesis.is_alive():
                nemesis.join(timeout=limits.node_start_timeout_s)
            self.undo_all()
            if self.s.nodes > 1:
                self.revive()

    # --- a node that exits by itself; replicas compared ------------------------------------

    def watch_nodes(self, stopping: threading.Event) -> None:
        while not stopping.wait(limits.node_watch_s):
            self.note_exits()

    def note_exits(self) -> None:
        """Record each node process that ended though nothing of the runner's ended it: its
        exit code, when, and the log lines that say why."""
        with self._exits_lock:
            for node in self.nodes:
                self._note_exit(node)

    def _note_exit(self, node: Node) -> None:
        code = node.exited_by_itself()
        if code is None:
            return
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        found: dict[str, Any] = {
            "node": node.node_id, "how": how, "code": code,
            "at_s": round(self.elapsed_s(), 3) if self.start_ns else None,
            "log": node.log_evidence()}
        self.node_exits.append(found)
        print(f"node {node.node_id} {how} by itself; its log says: "
              + " | ".join(found["log"][-3:]), file=sys.stderr, flush=True)

    def revive(self) -> None:
        """Start again every node that is not running (one that exited by itself: recorded
        first), so the run goes on with a majority and the replicas can be compared."""
        self.note_exits()
        for node in self.nodes:
            if not node.alive():
                try:
                    node.start()
                except Exception as e:  # noqa: BLE001 - ClusterError: the run's error
                    self.errors.append(f"node {node.node_id} could not be started again: {e}")

    def partition_views(self) -> dict[int, Any]:
        """Each node's `/v1/partitions` answer (None: no answer)."""
        assert self.cluster is not None
        return self.cluster.partition_views()

    def deleted_below(self) -> dict[str, int]:
        """Per partition (`<topic>-<partition>`), the highest offset an acknowledged
        DeleteRecords moved its log start to."""
        moved: dict[str, int] = {}
        for fault in self.faults:
            extra = fault.get("extra") or {}
            if extra.get("acknowledged"):
                topic, partition, offset = extra["deleted_below"]
                name = f"{topic}-{partition}"
                moved[name] = max(moved.get(name, 0), offset)
        return moved

    def replica_sets(self) -> dict[tuple[str, int], list[int]]:
        """Every partition's replicas as Metadata names them (internal topics if listed)."""
        from confluent_kafka.admin import AdminClient

        client = AdminClient({"bootstrap.servers": self.bootstrap()})
        metadata = client.list_topics(timeout=limits.connect_timeout_s)
        return {(name, p): list(part.replicas) for name, topic in metadata.topics.items()
                if topic.error is None for p, part in topic.partitions.items()}

    def _backlog_reached(self) -> None:
        w = self.s.workload
        if self.backlog_pending and self.consumer_workers and \
                self.live.acked_total * w.message_size >= w.consumer_backlog_bytes:
            for consumers, _ in self.consumer_workers:
                consumers.command("resume all")
            self.backlog_pending = False

    def _show(self, progress: Any, total_s: float) -> None:
        acked, p99 = self.live.producers()
        progress.update(max(0.0, self.elapsed_s()), total_s, acked, p99, len(self.faults))

    def finish(self) -> None:
        producers = [w for name, w in self.workers.items() if name.startswith("producers")]
        for worker in producers:  # they stop together, then each is waited for
            worker.command("stop")
        for worker in producers:
            if not worker.wait(limits.finish_timeout_s + 30):
                self.errors.append(f"the {worker.name} did not finish in time (killed)")
        if self.consumer_workers:
            try:
                ends = self.end_offsets()
            except Exception as e:  # noqa: BLE001 - a node that is down: drain what can be
                self.errors.append(f"could not read end offsets: {e}")
                ends = []
            for consumers, _ in self.consumer_workers:
                consumers.command("drain " + json.dumps(ends))
            for consumers, _ in self.consumer_workers:  # they drain together
                if not consumers.wait(limits.drain_timeout_s + 30):
                    self.errors.append(f"the {consumers.name} did not drain in time (killed)")
                    continue
                for group, behind in ((consumers.done or {}).get("undrained") or {}).items():
                    shown = ", ".join(f"{t}-{p} at {pos} of {end}" for t, p, pos, end in behind[:5])
                    self.errors.append(
                        f"group {group} did not read to the end in {limits.drain_timeout_s:g} s: "
                        f"{shown}{f' and {len(behind) - 5} more' if len(behind) > 5 else ''}"
                        " (position -1: not assigned)")
        for worker in self.workers.values():
            worker.command("stop")
            worker.wait(limits.worker_exit_timeout_s)
            crashed = worker.crashed()
            if crashed:  # what it recorded until then is in the history; the rest is not
                self.errors.append(f"the {worker.name} worker {crashed} "
                                   f"(see {worker.log_path.name})")

    def cluster_checks(self) -> dict[str, dict[str, Any]]:
        """The runner's own checks: no node exited by itself; a cluster's replicas agreed
        after the load (scenarios/replicas.py)."""
        checks: dict[str, dict[str, Any]] = {
            "nodes_exited": {"value": len(self.node_exits), "bound": 0,
                             "ok": not self.node_exits}}
        if self.convergence is not None:
            c = self.convergence
            checks["replicas_converged"] = {
                "value": round(c.seconds, 1) if c.ok else None,
                "bound": limits.replicas_converge_timeout_s, "ok": c.ok}
        return checks

    def close(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        if self.cluster is not None:
            if self.cluster.proxies:
                self.links = {name: dataclasses.asdict(stats)
                              for name, stats in self.cluster.link_stats().items()}
            self.cluster.close()


class _Admin:
    """confluent-kafka's AdminClient, each call waited for, with one-line errors."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def _wait(self, futures: dict[Any, Any], what: str) -> None:
        for name, future in futures.items():
            try:
                future.result(timeout=30)
            except Exception as e:  # noqa: BLE001 - a KafkaException: its one-line reason
                raise RunError(f"{what} {name}: {e}") from None

    def create_topics(self, topics: list[Any], exist_ok: bool = False) -> None:
        if not topics:
            return
        futures = self.client.create_topics(topics, operation_timeout=30)
        if exist_ok:
            from confluent_kafka import KafkaError

            for name, future in list(futures.items()):
                error = future.exception(timeout=30)
                if error is not None and error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    del futures[name]
        self._wait(futures, "create topic")

    def delete_topics(self, names: list[str]) -> None:
        self._wait(self.client.delete_topics(names, operation_timeout=30), "delete topic")

    def create_partitions(self, partitions: list[Any]) -> None:
        self._wait(self.client.create_partitions(partitions, operation_timeout=30),
                   "add partitions to")


def build_history(out: Path, faults: list[dict[str, Any]]) -> list[Op]:
    """The workers' packed operations (the format is in scenarios/worker.py) and the
    nemesis's faults, as `Op`s in completion order. Every worker's file counts (a cluster's
    consumers may be one process per node); its header says whose operations it holds."""
    ops: list[Op] = []
    for path in sorted(out.glob("history-*.msgpack")):
        with open(path, "rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, use_list=False)
            header = next(unpacker, None)
            if not isinstance(header, dict) or not {"producers", "consumers"} & header.keys():
                continue
            for sends, polls, assigns in unpacker:
                if "producers" in header:
                    ops.extend(_send(header["producers"], raw) for raw in sends)
                else:
                    names = [name for name, _ in header["consumers"]]
                    ops.extend(_poll(names, raw) for raw in polls)
                    ops.extend(_assign(names, raw) for raw in assigns)
                if len(ops) > limits.history_ops_max:
                    raise RunError(f"the history passed {limits.history_ops_max} operations")
    for fault in faults:
        ops.append(Op(op="fault", client="nemesis", invoke_ns=fault["start_ns"],
                      complete_ns=fault["end_ns"] or fault["start_ns"], outcome="ok",
                      name=fault["name"], extra=dict(fault.get("extra") or {})))
    ops.sort(key=lambda op: op.complete_ns)
    return ops


def _send(clients: tuple[tuple[str, str], ...], raw: tuple[Any, ...]) -> Op:
    index, invoke, done, outcome, partition, n, offset = raw
    client, topic = clients[index]
    return Op(op="send", client=client, invoke_ns=invoke, complete_ns=done,
              outcome=OUTCOMES[outcome], topic=topic, partition=partition,
              value=f"{client}-{n}", offset=offset)


def _poll(names: list[str], raw: tuple[Any, ...]) -> Op:
    index, invoke, done, topics, partitions, offsets, stamps = raw
    if isinstance(topics, str):
        topics = (topics,) * len(offsets)
    return Op(op="poll", client=names[index], invoke_ns=invoke, complete_ns=done, outcome="ok",
              records=tuple((t, p, o, v.rstrip().decode(errors="replace"))
                            for t, p, o, v in zip(topics, partitions, offsets, stamps,
                                                  strict=True)))


def _assign(names: list[str], raw: tuple[Any, ...]) -> Op:
    index, at, held = raw
    return Op(op="assign", client=names[index], invoke_ns=at, complete_ns=at, outcome="ok",
              partitions=tuple((t, p) for t, p in held))


def _without(op: Op, topics: set[str]) -> Op:
    if op.op == "poll":
        return dataclasses.replace(op, records=tuple(r for r in op.records if r[0] not in topics))
    if op.op == "assign":
        return dataclasses.replace(op, partitions=tuple(p for p in op.partitions
                                                        if p[0] not in topics))
    return op


def judge(scenario: Scenario, ops: list[Op], faults: list[tuple[str, int, int]] | None = None,
          errors: list[str] | None = None,
          cluster_checks: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The checker's result, reduced to the anomalies this scenario forbids, and the verdict;
    `cluster_checks` are the runner's own (nodes that exited by themselves, replicas that
    did not converge), kept with the history's."""
    unchecked = scenario.unchecked_topics
    if unchecked:
        ops = [_without(op, unchecked) for op in ops
               if not (op.op == "send" and op.topic in unchecked)]
    result = check(ops, scenario.bounds, skip_topics=scenario.skip_topics).to_json()
    failing = {name: found for name, found in result["anomalies"].items()
               if found and name in scenario.anomalies}
    tolerated = {name: len(found) for name, found in result["anomalies"].items()
                 if found and name not in scenario.anomalies}
    checks = {**result["checks"], **(cluster_checks or {})}
    if scenario.min_throughput_ratio is not None and scenario.workload.producer_rate:
        sends = [op for op in ops if op.op == "send" and op.outcome == "ok"]
        span_s = ((max(op.complete_ns for op in sends) - min(op.invoke_ns for op in sends)) / 1e9
                  if len(sends) > 1 else 0.0)
        achieved = len(sends) / span_s if span_s else 0.0
        ratio = achieved / scenario.workload.producer_rate
        checks["throughput_ratio"] = {"value": round(ratio, 3),
                                      "bound": scenario.min_throughput_ratio,
                                      "ok": ratio >= scenario.min_throughput_ratio}
    verdict = "PASS" if not failing and all(c["ok"] for c in checks.values()) and not errors \
        else "FAIL"
    return {"verdict": verdict, "valid": verdict == "PASS", "anomalies": failing,
            "tolerated_anomalies": tolerated, "figures": result["figures"], "checks": checks,
            "errors": errors or []}


def run(scenario: Scenario, out: Path, quiet: bool = False, keep_data: bool = False,
        recording: bool = True) -> dict[str, Any]:
    from scenarios.report import Progress, timeline_png, verdict_table

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("history-*.msgpack"):
        stale.unlink()
    runner = Run(scenario, out, recording)
    progress = Progress(quiet=quiet)
    started = time.monotonic()
    try:
        runner.execute(progress)
    finally:
        progress.close()
        runner.close()
        if not keep_data:
            shutil.rmtree(out / "data", ignore_errors=True)
    ops = build_history(out, runner.faults)
    write_history(out / "history.jsonl", ops)
    for packed in out.glob("history-*.msgpack"):
        packed.unlink()
    faults = [(f["name"], f["start_ns"], f["end_ns"] or f["start_ns"]) for f in runner.faults]
    cluster_checks = runner.cluster_checks()
    report = judge(scenario, ops, faults, runner.errors, cluster_checks)
    report.update(scenario=scenario.name, file=str(scenario.path) if scenario.path else None,
                  mode="real", seed=scenario.seed, steps=runner.step_log,
                  start_ns=runner.start_ns, faults=[list(f) for f in faults],
                  duration_s=round(time.monotonic() - started, 1),
                  clients={role: {"cpu_s": round(w.done.get("cpu_s", 0.0), 3),
                                  "cpu_load_s": round(w.done.get("cpu_load_s", 0.0), 3),
                                  "main_load_s": round(w.done.get("main_load_s", 0.0), 3),
                                  "acked": w.done.get("acked_total", 0)}
                           for role, w in runner.workers.items() if w.done},
                  workload={"rate": scenario.workload.producer_rate,
                            "messageSize": scenario.workload.message_size,
                            "client": scenario.workload.client,
                            "clients": list(scenario.workload.clients)},
                  cluster_checks=cluster_checks, node_exits=runner.node_exits,
                  replicas=runner.convergence.to_json() if runner.convergence else None,
                  cluster={"nodes": scenario.node_ids, "shards": scenario.shards,
                           "replicas": runner.settings().get("default_replicas", 1),
                           "consumer_bootstrap": scenario.consumer_bootstrap,
                           "links": runner.links})
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    timeline_png(out / "timeline.png", ops, faults, runner.start_ns)
    if not quiet:
        verdict_table(report)
    return report

