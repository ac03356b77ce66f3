"""A random mix of faults over a window, drawn from the run's seed: the `chaos` step.

    steps:
      - at: 10s
        chaos:
          faults: [kill, pause, pause_shard, cut, loss, power_loss, recreate_topic,
                   delete_records]
          gap: 3s..8s        # calm before each fault
          length: 2s..9s     # how long each one stays on
          topic: side        # the topic recreate_topic deletes and makes again
        for: 4m              # the window; without it, until the load ends

`plan` draws the whole schedule when the file is read, so the same seed gives the same
faults in the same order with the same lengths, gaps, nodes, shards and partitions; only
which node leads a partition is found when a fault strikes (half the node faults, `leaders`,
hit the leader of a workload partition drawn from the seed). The kinds are dealt as a
shuffled deck (each kind once, or `faults: {kind: count}` times, per round), so every kind
comes up once a round however short the window.

Faults come one at a time: each is undone before the next one's gap starts, so at most one
node is down, paused, cut off or powered off at once and a majority of 3 nodes stays (power
loss only of a minority, as Krill's durability promise says). A node that exited by itself
meanwhile is started again before the next fault (the runner has recorded its exit, which
fails the run). What each kind does and how it is undone:

    kill            kill -9 of a node                      undone: started again
    kill_shard      kill -9 of one shard process (the      started again
                    supervisor then stops the node)
    pause           SIGSTOP of a node                      SIGCONT
    pause_shard     SIGSTOP of one shard process           SIGCONT
    cut             the links between two nodes, both ways healed
    isolate         every link to and from a node          healed
    loss            one way: a node's RPC to another (or   healed
                    to all the others)
    power_loss      kill -9, then each of the node's       started again, then waited for
                    files cut where its page cache still   until its replicas reach their
                    held dirty pages (power_loss.py),      leaders' high watermarks (bounded)
                    never below what its leader counted
                    as acknowledged by it, nor below the
                    high watermark
    recreate_topic  DeleteTopics of `topic` under load     CreateTopics again
    delete_records  DeleteRecords on a partition of        (at once)
                    `records` (default: the workload
                    topics but `topic`), a drawn share of
                    the way from its log start to its
                    high watermark

A `recreate_topic` topic is left out of the checker (its acknowledged records go with it and
its offsets start again, as for a `delete_topic` step); records below a DeleteRecords offset
are gone by request, and the checker does not call them lost (scenarios/checker.py).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scenarios import limits
from scenarios.node_ref import NodeRef
from scenarios.power_loss import cachestat_available, lose_unsynced
from scenarios.replicas import behind, leaders_high_watermarks, synced_offsets

if TYPE_CHECKING:
    from scenarios.cluster import Cluster, Node

__all__ = ["CHAOS_FAULTS", "LINK_FAULTS", "NODE_FAULTS", "Chaos", "ChaosPlan", "Fault", "plan"]

NODE_FAULTS = ("kill", "kill_shard", "pause", "pause_shard", "power_loss")
LINK_FAULTS = ("cut", "isolate", "loss")
CHAOS_FAULTS = (*NODE_FAULTS, *LINK_FAULTS, "recreate_topic", "delete_records")
# Faults a plan draws at most (a window that long is over before they are done).
PLANNED_FAULTS_MAX = 10_000
# The share of a DeleteRecords' way from the log start to the high watermark, drawn.
DELETE_FRACTION = (0.2, 0.9)
ADMIN_TIMEOUT_S = 30.0  # a DeleteRecords' or ListOffsets' answer
CATCH_UP_LOOK_S = 0.5  # how often a node back from a power loss is looked at


@dataclass(frozen=True)
class Fault:
    """One drawn fault: its kind, the calm before it and how long it stays on, and what it
    hits. `peer` picks among the other nodes (sorted) when it strikes; -1: all of them."""

    kind: str
    gap_s: float
    length_s: float
    node: NodeRef | None = None
    peer: int | None = None
    shard: int | None = None
    partition: tuple[str, int] | None = None
    fraction: float | None = None

    def __str__(self) -> str:
        where = "" if self.node is None else f" {self.node}"
        if self.shard is not None:
            where = f" shard {self.shard} of{where}"
        if self.peer is not None:
            arrow = " <-> " if self.kind == "cut" else " -> "
            where += arrow + ("the others" if self.peer < 0 else f"other node #{self.peer}")
        if self.partition is not None:
            where = f" {self.partition[0]}-{self.partition[1]} at {self.fraction:.2f}"
        return f"{self.kind}{where} after {self.gap_s:g}s for {self.length_s:g}s"


@dataclass(frozen=True)
class ChaosPlan:
    faults: tuple[Fault, ...]
    topic: str | None  # recreate_topic's
    records: tuple[str, ...]  # delete_records' topics


def plan(spec: Mapping[str, Any], rng: random.Random, window_s: float, nodes: list[int],
         shards: int, topics: Mapping[str, int], workload_topics: list[str],
         seconds: Callable[[Any], tuple[float, float]]) -> ChaosPlan:
    """The faults of a window of `window_s` seconds, drawn from `rng` (`seconds` reads a
    time or a range as (low, high))."""
    weights = spec.get("faults") or list(CHAOS_FAULTS)
    deck = [kind for kind, count in (weights.items() if isinstance(weights, dict)
                                     else ((k, 1) for k in weights)) for _ in range(count)]
    gap, length = seconds(spec.get("gap", "3s..8s")), seconds(spec.get("length", "2s..9s"))
    leaders = float(spec.get("leaders", 0.5))
    topic = spec.get("topic")
    records = tuple(spec.get("records") or [t for t in workload_topics if t != topic])
    led = [t for t in workload_topics if t != topic] or list(workload_topics)
    faults: list[Fault] = []
    hand: list[str] = []
    total = 0.0
    while total < window_s and len(faults) < PLANNED_FAULTS_MAX and deck:
        if not hand:
            hand = rng.sample(deck, len(deck))
        kind = hand.pop()
        fault = Fault(kind, round(rng.uniform(*gap), 3),
                      0.0 if kind == "delete_records" else round(rng.uniform(*length), 3))
        if kind in NODE_FAULTS or kind in LINK_FAULTS:
            if kind != "power_loss" and rng.random() < leaders:
                topic_led = rng.choice(led)
                node: NodeRef = NodeRef("leader", topic=topic_led,
                                        partition=rng.randrange(topics[topic_led]))
            else:
                node = NodeRef("id", id=rng.choice(nodes))
            shard = rng.randrange(shards) if kind.endswith("_shard") else None
            peer = None
            if kind == "cut":
                peer = rng.randrange(len(nodes) - 1)
            elif kind == "loss":
                peer = rng.choice([-1, *range(len(nodes) - 1)])
            fault = Fault(kind, fault.gap_s, fault.length_s, node=node, peer=peer, shard=shard)
        elif kind == "delete_records":
            chosen = rng.choice(records)
            fault = Fault(kind, fault.gap_s, 0.0,
                          partition=(chosen, rng.randrange(topics[chosen])),
                          fraction=round(rng.uniform(*DELETE_FRACTION), 3))
        faults.append(fault)
        total += fault.gap_s + fault.length_s
    return ChaosPlan(tuple(faults), topic, records)


class Run(Protocol):
    """What a chaos step asks of the scenario run that does it (scenarios/runner.py's `Run`)."""

    cluster: Cluster | None
    errors: list[str]  # what went wrong, for the report
    faults: list[dict[str, Any]]  # each fault's window in the history

    def revive(self) -> None: ...
    def elapsed_s(self) -> float: ...
    def bootstrap(self, node_ids: list[int] | None = None) -> str: ...
    def node_of(self, ref: NodeRef, notes: dict[str, Any] | None = None) -> Node: ...
    def partition_views(self) -> dict[int, Any]: ...
    def delete_topic(self, name: str) -> Callable[[], None]: ...


class Chaos:
    """A chaos step being done: its plan run on a thread of its own, each fault a window in
    the run's history, until `stop` (the step's undo) ends it and undoes the fault on."""

    def __init__(self, run: Run, index: int, chaos: ChaosPlan, entry: dict[str, Any]) -> None:
        self.run, self.index, self.plan = run, index, chaos
        self.done: list[dict[str, Any]] = []
        entry["chaos"] = self.done
        entry["plan"] = [str(f) for f in chaos.faults]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="chaos", daemon=True)

    def start(self) -> Callable[[], None]:
        self.thread.start()
        return self.stop

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def _loop(self) -> None:
        for fault in self.plan.faults:
            if self.stopping.wait(fault.gap_s):
                return
            self.run.revive()
            record: dict[str, Any] = {"kind": fault.kind,
                                      "at_s": round(self.run.elapsed_s(), 3)}
            self.done.append(record)
            try:
                undo = self._strike(fault, record)
            except Exception as e:  # noqa: BLE001 - a fault that could not be done: the run's error
                record["error"] = str(e)
                self.run.errors.append(f"chaos fault {len(self.done)} ({fault.kind}): {e}")
                continue
            self.stopping.wait(fault.length_s)
            self._end(undo, record)

    def _strike(self, fault: Fault, record: dict[str, Any]
                ) -> tuple[Callable[[], None] | None, dict[str, Any]]:
        """Do the fault; its undo (None: done at once) and its window in the run's faults."""
        name, undo, extra = getattr(self, f"_{fault.kind}")(fault, record)
        record["name"] = name
        window: dict[str, Any] = {"step": self.index, "name": name,
                                  "start_ns": record.pop("found_ns", time.monotonic_ns()),
                                  "end_ns": None, **({"extra": extra} if extra else {})}
        self.run.faults.append(window)
        if undo is None:
            window["end_ns"] = time.monotonic_ns()
        return undo, window

    def _end(self, struck: tuple[Callable[[], None] | None, dict[str, Any]],
             record: dict[str, Any]) -> None:
        undo, window = struck
        if undo is not None:
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - recorded; the run fails with it
                record["undo_error"] = str(e)
                self.run.errors.append(f"undo of chaos fault {record['name']}: {e}")
            window["end_ns"] = time.monotonic_ns()
        record["window_s"] = round((window["end_ns"] - window["start_ns"]) / 1e9, 3)

    # --- the kinds ----------------------------------------------------------------------------

    def _node(self, fault: Fault, record: dict[str, Any]) -> Node:
        assert fault.node is not None
        node = self.run.node_of(fault.node, record)
        record["node"] = node.node_id
        return node

    def _kill(self, fault: Fault, record: dict[str, Any]) -> Any:
        node = self._node(fault, record)
        node.kill("node")
        return f"kill node {node.node_id}", node.start, None

    def _kill_shard(self, fault: Fault, record: dict[str, Any]) -> Any:
        node = self._node(fault, record)
        shard = (fault.shard or 0) % node.shards
        node.kill(str(shard))
        node.wait_gone()
        return f"kill shard {shard} of node {node.node_id}", node.start, None

    def _pause(self, fault: Fault, record: dict[str, Any]) -> Any:
        node = self._node(fault, record)
        node.pause("node")
        return f"pause node {node.node_id}", node.resume, None

    def _pause_shard(self, fault: Fault, record: dict[str, Any]) -> Any:
        node = self._node(fault, record)
        shard = (fault.shard or 0) % node.shards
        node.pause(str(shard))
        return f"pause shard {shard} of node {node.node_id}", node.resume, None

    def _links(self, pairs: set[tuple[int, int]], record: dict[str, Any]) -> Callable[[], None]:
        assert self.run.cluster is not None
        proxies = [self.run.cluster.link(a, b) for a, b in sorted(pairs)]
        record["links"] = ", ".join(f"{a}->{b}" for a, b in sorted(pairs))
        for proxy in proxies:
            proxy.cut()

        def heal() -> None:
            for proxy in proxies:
                proxy.heal()

        return heal

    def _others(self, node: int) -> list[int]:
        assert self.run.cluster is not None
        return sorted(i for i in self.run.cluster.nodes if i != node)

    def _cut(self, fault: Fault, record: dict[str, Any]) -> Any:
        a = self._node(fault, record).node_id
        others = self._others(a)
        b = others[(fault.peer or 0) % len(others)]
        return f"cut {a}<->{b}", self._links({(a, b), (b, a)}, record), None

    def _isolate(self, fault: Fault, record: dict[str, Any]) -> Any:
        a = self._node(fault, record).node_id
        pairs = {p for b in self._others(a) for p in ((a, b), (b, a))}
        return f"isolate node {a}", self._links(pairs, record), None

    def _loss(self, fault: Fault, record: dict[str, Any]) -> Any:
        a = self._node(fault, record).node_id
        others = self._others(a)
        to = others if fault.peer is None or fault.peer < 0 \
            else [others[fault.peer % len(others)]]
        said = "others" if len(to) > 1 else str(to[0])
        return f"loss {a}->{said}", self._links({(a, b) for b in to}, record), None

    def _power_loss(self, fault: Fault, record: dict[str, Any]) -> Any:
        node = self._node(fault, record)
        node.kill("node")
        kept = synced_offsets(self.run.partition_views(), node.node_id)
        if cachestat_available():
            cut = {}
            for directory in sorted(p for p in node.data_dir.rglob("*") if p.is_dir()):
                for name, at in lose_unsynced(directory, kept.get(directory.name)).items():
                    cut[str((directory / name).relative_to(node.data_dir))] = at
            record["files_cut"] = len(cut)
        else:  # no way to tell what a power cut would take: say so, and it is a kill -9
            record["files_cut"] = None
            record["note"] = "cachestat(2) unavailable (Linux 6.5): a kill -9 only"

        def start_and_catch_up() -> None:
            node.start()
            record["caught_up"] = self._caught_up(node.node_id, limits.power_loss_catch_up_s)

        return f"power loss node {node.node_id}", start_and_catch_up, None

    def _caught_up(self, node_id: int, timeout_s: float) -> dict[str, Any]:
        """Until each of the node's replicas reaches the high watermark its leader had at the
        first look (at most `timeout_s`): how long it took, or which were still behind."""
        started = time.monotonic()
        targets: dict[tuple[str, int], int] = {}
        while True:
            views = self.run.partition_views()
            targets = targets or leaders_high_watermarks(views, node_id)
            late = behind(views, node_id, targets)
            elapsed = round(time.monotonic() - started, 1)
            if not late and (targets or elapsed >= CATCH_UP_LOOK_S):
                return {"seconds": elapsed}
            if elapsed >= timeout_s:
                return {"seconds": None, "behind": late[:5], "behind_count": len(late)}
            time.sleep(CATCH_UP_LOOK_S)

    def _recreate_topic(self, fault: Fault, record: dict[str, Any]) -> Any:
        topic = self.plan.topic
        assert topic is not None
        return f"recreate {topic}", self.run.delete_topic(topic), None

    def _delete_records(self, fault: Fault, record: dict[str, Any]) -> Any:
        assert fault.partition is not None and fault.fraction is not None
        topic, partition = fault.partition
        asked, outcome = delete_records(self.run.bootstrap(), topic, partition, fault.fraction)
        record.update(offset=asked, outcome=outcome)
        extra = None if asked is None else {"deleted_below": [topic, partition, asked],
                                            "acknowledged": outcome.startswith("ok")}
        return f"delete records {topic}-{partition} below {asked}", None, extra


def delete_records(bootstrap: str, topic: str, partition: int, fraction: float
                   ) -> tuple[int | None, str]:
    """DeleteRecords to `fraction` of the way from the partition's log start to its high
    watermark: the offset asked for (None: none was) and how it went."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    client = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition)
    try:
        ends = [client.list_offsets({tp: spec})[tp].result(timeout=ADMIN_TIMEOUT_S).offset
                for spec in (OffsetSpec.earliest(), OffsetSpec.latest())]
    except Exception as e:  # noqa: BLE001 - a KafkaException: nothing asked
        return None, f"list offsets: {e}"
    offset = ends[0] + int((ends[1] - ends[0]) * fraction)
    try:
        [future] = client.delete_records([TopicPartition(topic, partition, offset)]).values()
        low = future.result(timeout=ADMIN_TIMEOUT_S)
        return offset, f"ok (log start {low.low_watermark})"
    except Exception as e:  # noqa: BLE001 - it may have been done: the checker assumes so
        return offset, f"unknown: {e}"
