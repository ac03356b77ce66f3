"""A scenario file: YAML, checked against one JSON Schema, read into a `Scenario`.

Every mistake is one `SpecError` line naming the file, the line and column, and the key:

    my-flow.yaml:12:5: workload.producerRate: 'fast' is not of type 'integer'

The sections (every field is documented in scenarios/README.md):

- `cluster`: `mode` (`real`, the default: node processes and Kafka clients; `simulated`: the
  actors in one process, scenarios/sim/), `nodes` (more than one: a cluster whose nodes are
  numbered from 1, as its seeds are; one node is node 0), `shards` per node, node `settings`
  (the keys of `krill start --config`), `disk_size` (the data directory on a filesystem of
  that size, so `disk_full` is a real full disk), `consumer_bootstrap` (`all` nodes, or
  `spread`: subscription i bootstraps from one node), `link_proxies` (a proxy per ordered
  node pair even without a `link` step).
- `topics`: name, partitions, replicas, config (topic configs, as `krill topic create
  --config`).
- `workload`: OpenMessaging Benchmark's fields, spelled as OMB spells them, plus `client`
  and its `producerConfig` / `consumerConfig`. A bare OMB workload file (its fields at the top
  level) runs unchanged: it is read as the `workload` of a one-node cluster. `client` may
  list several libraries, and their configs be given per library.
- `steps`: faults on a timeline (`at: 10s`, or `at: 5s..20s`, drawn from the seed) or after
  a condition (`after: {acked: 10000}`), each undone `for:` a time later (`for: 4s..9s`:
  drawn from the seed), by a later `undo:` step, or at the end. A step addresses a node by
  number (`node 2`, `{node: 2}`) or by role, found when the step runs: `leader of orders-0`
  (the leader of partition 0 of `orders`). `link: cut | delay | loss | heal` with `from`,
  `to` (and `ms` for a delay) changes the links between nodes. `chaos: {...}` is a
  random mix of faults over a window, drawn from the seed here (scenarios/chaos.py).
- `checks`: the anomalies that may not occur and the bounds of scenarios/checker.py.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from scenarios.chaos import CHAOS_FAULTS, LINK_FAULTS, ChaosPlan, plan
from scenarios.checker import ANOMALIES, Bounds
from scenarios.node_ref import NodeRef

__all__ = ["ACTIONS", "LINK_MODES", "Link", "NodeRef", "Scenario", "SpecError", "Step", "Target",
           "Workload", "load", "node_ids", "parse", "target"]

# What a step may do in a real cluster, and what undoes it ("" for what is not undone).
ACTIONS = {
    "kill": "start",             # kill -9 of a node or one shard process; undo: start the node
    "stop": "cont",              # SIGSTOP of a node or one shard process; undo: SIGCONT
    "restart": "",               # SIGTERM and start again (a clean restart)
    "disk_full": "disk_free",    # fill the data directory's filesystem; undo: free it
    "slow_disk": "clear",        # every fdatasync takes `fdatasync_ms` more
    "fsync_error": "clear",      # every fdatasync fails with EIO
    "slow_consumer": "resume",   # a consumer stops reading
    "producer_flood": "end",     # producers over the node's memory budget
    "delete_topic": "recreate",  # delete a topic under load; undo: create it again
    "add_partitions": "",        # CreatePartitions under load
    "link": "heal",              # cut, delay or one-way drop the links between nodes
    "chaos": "end",              # a random mix of faults over a window (scenarios/chaos.py)
}
# `link:` modes: cut (both ways), loss (from -> to only), delay (both ways), heal (not undone).
LINK_MODES = ("cut", "delay", "loss", "heal")

_DURATION = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$"
_RANGE = r"^\s*(\d+(?:\.\d+)?\s*(?:ms|s|m|min|h)?)\s*\.\.\s*(\d+(?:\.\d+)?\s*(?:ms|s|m|min|h)?)\s*$"
_SIZE = r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$"
# A node: by number, drawn from the seed, or the leader of a partition (`<topic>-<partition>`,
# as Kafka spells it) when the step runs.
_NODE_WORDS = r"(?:node (?:\d+|random)|leader of \S+-\d+)"
_NODE_TARGET = rf"^{_NODE_WORDS}$"
_TARGET = rf"^(?:{_NODE_WORDS}|shard (?:\d+|random)(?: of {_NODE_WORDS})?)$"

_duration = {"oneOf": [{"type": "number", "minimum": 0},
                       {"type": "string", "pattern": _DURATION}]}
_size = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": _SIZE}]}
_count = {"type": "integer", "minimum": 0}
_node_ref = {"oneOf": [{"type": "string", "pattern": _NODE_TARGET}, _count]}
_node_target = {"oneOf": [{"type": "string", "pattern": _NODE_TARGET},
                          {"type": "object", "properties": {"node": _node_ref},
                           "required": ["node"], "additionalProperties": False}]}
_target = {"oneOf": [{"type": "string", "pattern": _TARGET},
                     {"type": "object",
                      "properties": {"node": _node_ref,
                                     "shard": {"oneOf": [_count, {"const": "random"}]}},
                      "required": ["node"], "additionalProperties": False}]}
_nodes = {"oneOf": [_node_ref, {"const": "others"},
                    {"type": "array", "items": _node_ref, "minItems": 1}]}
_config_map = {"type": "object", "additionalProperties": {"type": ["string", "number",
                                                                   "boolean"]}}
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
# A client's settings in its own spelling: one map for every client, or one per client.
_client_config = {"anyOf": [_config_map, {"type": "object", "minProperties": 1,
                                          "propertyNames": {"enum": list(CLIENTS)},
                                          "additionalProperties": _config_map}]}


def _action(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or [],
            "additionalProperties": False}


_ACTION_SCHEMAS: dict[str, Any] = {
    "kill": _target, "stop": _target, "restart": _node_target,
    "disk_full": {"oneOf": [_node_target, _action({"node": _node_ref, "leave": _size})]},
    "slow_disk": _action({"node": _node_ref, "fdatasync_ms": _count}, ["fdatasync_ms"]),
    "fsync_error": _node_target,
    "slow_consumer": {"type": "string", "pattern": r"^(consumer \d+|all)$"},
    "producer_flood": _action({"producers": {"type": "integer", "minimum": 1},
                               "messageSize": {"type": "integer", "minimum": 1},
                               "topic": {"type": "string"}}),
    "delete_topic": {"type": "string", "minLength": 1},
    "add_partitions": _action({"topic": {"type": "string"},
                               "count": {"type": "integer", "minimum": 1}}, ["topic", "count"]),
    "link": {"enum": list(LINK_MODES)},
}
_range = {"oneOf": [_duration, {"type": "string", "pattern": _RANGE}]}
_ACTION_SCHEMAS["chaos"] = _action({
    "faults": {"oneOf": [
        {"type": "array", "items": {"enum": list(CHAOS_FAULTS)}, "minItems": 1,
         "uniqueItems": True},
        {"type": "object", "propertyNames": {"enum": list(CHAOS_FAULTS)}, "minProperties": 1,
         "additionalProperties": {"type": "integer", "minimum": 0}}]},
    "gap": _range, "length": _range,
    "leaders": {"type": "number", "minimum": 0, "maximum": 1},
    "topic": {"type": "string", "minLength": 1},
    "records": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
})
# Keys of a `link` step beside its mode.
_LINK_KEYS = {"from": _nodes, "to": _nodes, "ms": {"type": "number", "minimum": 0}}

_STEP = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "at": {"oneOf": [_duration, {"type": "string", "pattern": _RANGE}]},
        "after": _action({"acked": _count, "previous": _duration, "recovered": {"const": True}}),
        "for": {"oneOf": [_duration, {"type": "string", "pattern": _RANGE}]},
        "undo": {"type": ["integer", "string"]},
        **_ACTION_SCHEMAS,
        **_LINK_KEYS,
    },
    "additionalProperties": False,
}

_WORKLOAD = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "topics": {"type": "integer", "minimum": 1},
        "partitionsPerTopic": {"type": "integer", "minimum": 1},
        "keyDistributor": {"enum": ["NO_KEY", "KEY_ROUND_ROBIN", "RANDOM_NANO"]},
        "messageSize": {"type": "integer", "minimum": 24},
        "payloadFile": {"type": "string"},
        "useRandomizedPayloads": {"type": "boolean"},
        "randomBytesRatio": {"type": "number"},
        "randomizedPayloadPoolSize": {"type": "integer"},
        "subscriptionsPerTopic": {"type": "integer", "minimum": 0},
        "consumerPerSubscription": {"type": "integer", "minimum": 0},
        "producersPerTopic": {"type": "integer", "minimum": 0},
        "producerRate": {"type": "integer", "minimum": 0},
        "consumerBacklogSizeGB": {"type": "number", "minimum": 0},
        "testDurationMinutes": {"type": "number", "exclusiveMinimum": 0},
        "testDurationSeconds": {"type": "number", "exclusiveMinimum": 0},
        "warmupDurationMinutes": {"type": "number", "minimum": 0},
        "messageRateReceivedForSubscription": {"type": "integer"},
        "client": {"oneOf": [{"enum": list(CLIENTS)},
                             {"type": "array", "items": {"enum": list(CLIENTS)},
                              "minItems": 1, "uniqueItems": True}]},
        "producerConfig": _client_config,
        "consumerConfig": _client_config,
    },
    "additionalProperties": False,
}

_TOPIC = _action({"name": {"type": "string", "minLength": 1},
                  "clients": {"type": "array", "items": {"enum": list(CLIENTS)},
                              "minItems": 1, "uniqueItems": True},
                  "partitions": {"type": "integer", "minimum": 1},
                  "replicas": {"type": "integer", "minimum": 1},
                  "config": _config_map}, ["name"])

_CHECKS = _action({
    "anomalies": {"oneOf": [{"const": "all"},
                            {"type": "array", "items": {"enum": list(ANOMALIES)}}]},
    "allow": {"type": "array", "items": {"enum": list(ANOMALIES)}},
    "p99_ms_outside_faults": {"type": "number", "exclusiveMinimum": 0},
    "recovery_ms": {"type": "number", "exclusiveMinimum": 0},
    "error_rate": {"type": "number", "minimum": 0, "maximum": 1},
    "min_throughput_ratio": {"type": "number", "minimum": 0},
    "steps": {"type": "boolean"},
})


def _schema(sim_step: Mapping[str, Any] | None, sim_faults: Mapping[str, Any] | None
            ) -> dict[str, Any]:
    cluster = _action({
        "mode": {"enum": ["real", "simulated"]},
        "nodes": {"type": "integer", "minimum": 1},
        "shards": {"type": "integer", "minimum": 1},
        "settings": {"type": "object"},
        "disk_size": _size,
        "consumer_bootstrap": {"enum": ["all", "spread"]},
        "link_proxies": {"type": "boolean"},
    })
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "name": {"type": "string"}, "description": {"type": "string"},
            "cluster": cluster, "topics": {"type": "array", "items": _TOPIC},
            "workload": _WORKLOAD,
            "steps": {"type": "array", "items": sim_step or _STEP},
            "faults": sim_faults or {"not": {}, "description": "simulated mode only"},
            "checks": _CHECKS, "seed": {"type": "integer"},
        },
        "required": ["workload"],
        "additionalProperties": False,
    }


class SpecError(ValueError):
    """A scenario file mistake: one line with the file position and the key."""


@dataclass(frozen=True)
class Workload:
    topics: int
    partitions_per_topic: int
    message_size: int
    producers_per_topic: int
    producer_rate: int  # messages per second over all producers; 0: as fast as they can
    subscriptions_per_topic: int
    consumer_per_subscription: int
    duration_s: float
    warmup_s: float
    consumer_backlog_bytes: int
    key_distributor: str = "NO_KEY"
    payload: bytes | None = None  # from payloadFile; None: random bytes from the seed
    client: str = "confluent-kafka"  # the first of `clients`
    producer_config: dict[str, Any] = field(default_factory=dict)
    consumer_config: dict[str, Any] = field(default_factory=dict)
    # Every client library the load uses: producer i and subscription i use clients[i % n].
    clients: tuple[str, ...] = ()

    def producer_config_for(self, client: str) -> dict[str, Any]:
        return _config_for(self.producer_config, client)

    def consumer_config_for(self, client: str) -> dict[str, Any]:
        return _config_for(self.consumer_config, client)


def _config_for(config: dict[str, Any], client: str) -> dict[str, Any]:
    """A client's settings from `producerConfig` / `consumerConfig`: the map itself, or its
    entry for the client when it has one per client."""
    if config and all(isinstance(v, dict) for v in config.values()):
        return dict(config.get(client) or {})
    return dict(config)


@dataclass(frozen=True)
class Target:
    """What a kill or stop hits: a node, or one shard process of it (`shard` a number, or -1
    for one drawn from the seed)."""

    node: NodeRef
    shard: int | None = None


def node_ids(nodes: int) -> list[int]:
    """A cluster's nodes are numbered from 1, as the seeds number them; one node is node 0."""
    return [0] if nodes == 1 else list(range(1, nodes + 1))


def node_ref(value: Any) -> NodeRef:
    """`2`, 'node 2', 'node random', 'leader of orders-0' (the schema checked the form)."""
    if isinstance(value, int):
        return NodeRef("id", id=value)
    text = str(value).strip()
    if text.startswith("leader of "):
        topic, _, partition = text[len("leader of "):].rpartition("-")
        return NodeRef("leader", topic=topic, partition=int(partition))
    word = text.split()[1]
    return NodeRef("random") if word == "random" else NodeRef("id", id=int(word))


def target(value: Any, first_node: int = 0) -> Target:
    """'node 2', 'leader of t-0', 'shard 1' (of the first node), 'shard 1 of node 2',
    'shard random of leader of t-0', or {node: 2, shard: 1}."""
    if isinstance(value, dict):
        shard = value.get("shard")
        return Target(node_ref(value["node"]), -1 if shard == "random" else shard)
    text = str(value).strip()
    if not text.startswith("shard "):
        return Target(node_ref(text))
    words = text.split(" ", 3)  # shard, K, of, node words
    shard = -1 if words[1] == "random" else int(words[1])
    node = node_ref(words[3]) if len(words) == 4 else NodeRef("id", id=first_node)
    return Target(node, shard)


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    action: str  # one of ACTIONS, or "undo"
    arg: Any  # the action's value as written (target string or mapping)
    at_s: float | None = None  # seconds after the workload's start (drawn for a range)
    after: dict[str, Any] | None = None
    for_s: float | None = None  # drawn for a range
    undo: int | None = None  # the index of the step this one undoes


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path | None
    mode: str
    nodes: int
    shards: int
    settings: dict[str, Any]
    disk_size: int | None
    topics: list[dict[str, Any]]  # name, partitions, config (replicas): every topic made
    workload_topics: list[str]  # the topics the workload writes and reads
    workload: Workload
    steps: list[Step]
    bounds: Bounds
    anomalies: tuple[str, ...]  # those that fail the run
    min_throughput_ratio: float | None
    seed: int
    document: dict[str, Any]  # as read, for the simulated mode and the report
    consumer_bootstrap: str = "all"  # or "spread": subscription i from one node
    link_proxies: bool = False  # a proxy per ordered node pair (always when a step links)

    @property
    def node_ids(self) -> list[int]:
        return node_ids(self.nodes)

    def clients_of(self, topic: str) -> tuple[str, ...]:
        """The client libraries that write and read a topic: its `clients`, or all."""
        for t in self.topics:
            if t["name"] == topic and "clients" in t:
                return tuple(t["clients"])
        return self.workload.clients or (self.workload.client,)

    @property
    def skip_topics(self) -> set[str]:
        """Topics whose gaps are by design (compacted): no poll-skip there."""
        return {t["name"] for t in self.topics
                if "compact" in str(t.get("config", {}).get("cleanup.policy", ""))}

    @property
    def unchecked_topics(self) -> set[str]:
        """Topics a step deletes (a `delete_topic` step, a chaos step's `recreate_topic`):
        their acknowledged records go with them and a re-created topic's offsets start
        again, so the checker leaves them out (their load stays)."""
        return {s.arg for s in self.steps if s.action == "delete_topic"} | {
            s.arg.topic for s in self.steps if s.action == "chaos" and s.arg.topic is not None
            and any(f.kind == "recreate_topic" for f in s.arg.faults)}


def load(path: str | Path, seed: int | None = None,
         duration_s: float | None = None) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror or e}") from None
    return parse(text, path, seed=seed, duration_s=duration_s)


def parse(text: str, path: Path | None = None, seed: int | None = None,
          duration_s: float | None = None) -> Scenario:
    where = str(path) if path else "<scenario>"
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise SpecError(f"{where}{at}: not YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(document, dict):
        raise SpecError(f"{where}: a scenario is a mapping of sections, "
                        f"not {type(document).__name__}")
    if "workload" not in document and _looks_like_omb(document):
        document, root = {"name": document.get("name", where), "workload": document}, None
    mode = (document.get("cluster") or {}).get("mode", "real")
    sim_step = sim_faults = None
    if mode == "simulated":
        from scenarios.sim.schema import SIM_FAULTS_SCHEMA, SIM_STEP_SCHEMA

        sim_step, sim_faults = SIM_STEP_SCHEMA, SIM_FAULTS_SCHEMA
    validator = jsonschema.Draft202012Validator(_schema(sim_step, sim_faults))
    errors = sorted(validator.iter_errors(document), key=lambda e: len(list(e.absolute_path)))
    if errors:
        error = _deepest(errors[0])
        keys = list(error.absolute_path)
        if error.validator == "additionalProperties":  # point at the key itself
            keys.append(sorted(set(error.instance) - set(error.schema.get("properties", {})))[0])
        raise SpecError(f"{where}{_position(root, keys)}: {_dotted(keys) or 'the file'}: "
                        f"{_message(error)}")
    try:
        return _build(document, root, path, where, seed, duration_s)
    except _FieldError as e:
        raise SpecError(f"{where}{_position(root, e.keys)}: {_dotted(e.keys)}: {e}") from None


_OMB_KEYS = {"topics", "partitionsPerTopic", "messageSize", "producerRate", "producersPerTopic"}


def _looks_like_omb(document: dict[str, Any]) -> bool:
    return _OMB_KEYS <= document.keys() and not isinstance(document.get("topics"), list)


class _FieldError(ValueError):
    def __init__(self, keys: list[Any], message: str) -> None:
        super().__init__(message)
        self.keys = keys


def _build(doc: dict[str, Any], root: Any, path: Path | None, where: str, seed: int | None,
           duration_s: float | None) -> Scenario:
    cluster = doc.get("cluster") or {}
    mode = cluster.get("mode", "real")
    nodes = cluster.get("nodes", 1)
    if nodes > 1 and mode == "simulated":
        raise _FieldError(["cluster", "nodes"], "the simulated mode runs one node; "
                          f"{nodes} nodes run in real mode")
    settings = dict(cluster.get("settings") or {})
    replicas = int(settings.get("default_replicas", min(3, nodes)))
    if replicas > nodes:
        raise _FieldError(["cluster", "settings", "default_replicas"],
                          f"{replicas} replicas need as many nodes, not {nodes}")
    seed = seed if seed is not None else int(doc.get("seed", 1))
    w = doc["workload"]
    topics_section = doc.get("topics") or []
    names = [t["name"] for t in topics_section]
    if len(set(names)) != len(names):
        raise _FieldError(["topics"], "a topic is named twice")
    count = w.get("topics", len(names) or 1)
    partitions = w.get("partitionsPerTopic", 1)
    if topics_section:
        if count > len(names):
            raise _FieldError(["workload", "topics"],
                              f"{count} workload topics but the topics section names {len(names)}")
        workload_topics = names[:count]
    else:
        workload_topics = [f"workload-{i}" for i in range(count)]
    for i, t in enumerate(topics_section):
        if t.get("replicas", 1) > nodes:
            raise _FieldError(["topics", i, "replicas"],
                              f"{t['replicas']} replicas need as many nodes, not {nodes}")
    topics = [{"name": t["name"], "partitions": t.get("partitions", partitions),
               **({"replicas": t["replicas"]} if "replicas" in t else {}),
               **({"clients": tuple(t["clients"])} if "clients" in t else {}),
               "config": {k: str(v) for k, v in (t.get("config") or {}).items()}}
              for t in topics_section]  # without `replicas`: the cluster's default_replicas
    topics += [{"name": n, "partitions": partitions, "config": {}}
               for n in workload_topics if n not in names]
    payload = None
    if "payloadFile" in w:
        payload = _payload(w["payloadFile"], path, w.get("messageSize", 1024))
    chosen = w.get("client", CLIENTS[0])
    clients = tuple(chosen) if isinstance(chosen, list) else (chosen,)
    for i, t in enumerate(topics_section):
        for k, client in enumerate(t.get("clients", ())):
            if client not in clients:
                raise _FieldError(["topics", i, "clients", k], f"{client!r} is not one of the "
                                  f"workload's clients ({', '.join(clients)})")
    minutes = w.get("testDurationMinutes")
    written = float(w.get("testDurationSeconds") or (minutes * 60 if minutes else 60.0))
    length = duration_s or written
    scale = length / written  # --duration: the whole timeline shrinks or grows with it
    workload = Workload(
        topics=count, partitions_per_topic=partitions,
        message_size=w.get("messageSize", 1024),
        producers_per_topic=w.get("producersPerTopic", 1),
        producer_rate=w.get("producerRate", 1000),
        subscriptions_per_topic=w.get("subscriptionsPerTopic", 1),
        consumer_per_subscription=w.get("consumerPerSubscription", 1),
        duration_s=float(length),
        warmup_s=float(w.get("warmupDurationMinutes", 0)) * 60 if not duration_s else 0.0,
        consumer_backlog_bytes=int(float(w.get("consumerBacklogSizeGB", 0)) * 2**30),
        key_distributor=w.get("keyDistributor", "NO_KEY"), payload=payload,
        client=clients[0], clients=clients,
        producer_config=dict(w.get("producerConfig") or {}),
        consumer_config=dict(w.get("consumerConfig") or {}),
    )
    steps = _steps(doc.get("steps") or [], mode, random.Random(seed), written,
                   {t["name"]: t["partitions"] for t in topics}, scale, node_ids(nodes),
                   shards=cluster.get("shards", 2), workload_topics=workload_topics)
    checks = doc.get("checks") or {}
    listed = checks.get("anomalies", "all")
    failing = tuple(ANOMALIES if listed == "all" else listed)
    failing = tuple(a for a in failing if a not in set(checks.get("allow", ())))
    return Scenario(
        name=doc.get("name") or (path.stem if path else "scenario"), path=path, mode=mode,
        nodes=nodes, shards=cluster.get("shards", 2), settings=settings,
        disk_size=_bytes(cluster["disk_size"]) if "disk_size" in cluster else None,
        topics=topics, workload_topics=workload_topics, workload=workload, steps=steps,
        bounds=Bounds(p99_ms_outside_faults=checks.get("p99_ms_outside_faults"),
                      recovery_ms=checks.get("recovery_ms"),
                      error_rate=checks.get("error_rate")),
        anomalies=failing, min_throughput_ratio=checks.get("min_throughput_ratio"),
        seed=seed, document=doc, consumer_bootstrap=cluster.get("consumer_bootstrap", "all"),
        link_proxies=bool(cluster.get("link_proxies"))
        or any(s.action == "link" or (s.action == "chaos" and any(
            f.kind in LINK_FAULTS for f in s.arg.faults)) for s in steps),
    )


def _steps(raw: list[dict[str, Any]], mode: str, rng: random.Random, duration_s: float,
           topics: dict[str, int], scale: float = 1.0, nodes: list[int] | None = None,
           shards: int = 1, workload_topics: list[str] | None = None) -> list[Step]:
    """The steps in order; `topics` maps each topic to its partitions, `nodes` the node ids."""
    if mode == "simulated":
        return []  # scenarios/sim/ reads its own steps from the document
    nodes = nodes or [0]
    steps: list[Step] = []
    names: dict[str, int] = {}
    for i, s in enumerate(raw):
        actions = [k for k in s if k in ACTIONS or k == "undo"]
        if len(actions) != 1:
            raise _FieldError(["steps", i], "a step does exactly one thing: one of "
                              f"{', '.join(ACTIONS)} or undo (found {len(actions)})")
        action = actions[0]
        if "at" in s and "after" in s:
            raise _FieldError(["steps", i], "a step has `at` or `after`, not both")
        at_s = _at(s, i, rng, duration_s)
        undo = None
        if action == "undo":
            ref = s["undo"]
            undo = ref if isinstance(ref, int) else names.get(ref)
            if undo is None or not 0 <= undo < i or not _undone(steps[undo]):
                raise _FieldError(["steps", i, "undo"],
                                  f"{ref!r} is not an earlier step that can be undone")
        elif "for" in s and not _undone_action(action, s):
            raise _FieldError(["steps", i, "for"],
                              f"{_said(action, s)} is not undone, so takes no `for`")
        for_s = _drawn(s, "for", i, rng) if "for" in s else None
        arg = _link(s, i, nodes, topics) if action == "link" else s[action]
        if action == "chaos":
            window = for_s if for_s is not None else duration_s - (at_s or 0.0)
            arg = _chaos(s["chaos"], ["steps", i, "chaos"], rng, window * scale, nodes,
                         shards, topics, workload_topics or list(topics))
        elif action != "link":
            stray = [k for k in _LINK_KEYS if k in s]
            if stray:
                raise _FieldError(["steps", i, stray[0]], "only a `link` step takes "
                                  "`from`, `to` and `ms`")
            _check_targets(action, arg, ["steps", i, action], nodes, topics)
        name = s.get("name", _said(action, s) if action != "undo" else f"undo {undo}")
        names[s.get("name", str(i))] = i
        after = dict(s["after"]) if "after" in s else None
        if after and "previous" in after:
            after["previous"] = _seconds(after["previous"]) * scale
        steps.append(Step(index=i, name=name, action=action, arg=arg,
                          at_s=None if at_s is None else round(at_s * scale, 3), after=after,
                          for_s=for_s * scale if for_s is not None else None, undo=undo))
    return steps


def _at(s: dict[str, Any], i: int, rng: random.Random, duration_s: float) -> float | None:
    if "at" not in s:
        return None
    at_s = _drawn(s, "at", i, rng)
    if at_s > duration_s:
        raise _FieldError(["steps", i, "at"],
                          f"{at_s:g}s is past the workload's end ({duration_s:g}s)")
    return at_s


def _drawn(s: dict[str, Any], key: str, i: int, rng: random.Random) -> float:
    """Step `i`'s `at` or `for` in seconds: a duration, or a range (`4s..9s`) drawn from the
    seed."""
    if isinstance(s[key], str) and ".." in s[key]:
        low, high = (_seconds(x) for x in s[key].split(".."))
        if high < low:
            raise _FieldError(["steps", i, key], "a range runs from low to high")
        return round(rng.uniform(low, high), 3)
    return _seconds(s[key])


def _chaos(spec: dict[str, Any], keys: list[Any], rng: random.Random, window_s: float,
           nodes: list[int], shards: int, topics: dict[str, int], workload_topics: list[str]
           ) -> ChaosPlan:
    """A chaos step's faults, drawn now (scenarios/chaos.py), once what they name exists."""
    kinds = set(spec.get("faults") or CHAOS_FAULTS)
    if len(nodes) < 2 and kinds & set(LINK_FAULTS):
        raise _FieldError([*keys, "faults"], f"{sorted(kinds & set(LINK_FAULTS))} join two "
                          "nodes: set `cluster.nodes` to 2 or more")
    topic = spec.get("topic")
    if "recreate_topic" in kinds and topic is None:
        raise _FieldError(keys, "recreate_topic needs `topic`: the topic it deletes and makes "
                          "again (left out of the checker)")
    if topic is not None and topic not in topics:
        raise _FieldError([*keys, "topic"], f"no topic {topic!r} in this scenario")
    for k, name in enumerate(spec.get("records") or ()):
        if name not in topics:
            raise _FieldError([*keys, "records", k], f"no topic {name!r} in this scenario")
        if name == topic:
            raise _FieldError([*keys, "records", k], f"{name!r} is deleted and made again: "
                              "DeleteRecords goes to a topic the checker reads")
    if "delete_records" in kinds and not [t for t in workload_topics if t != topic] \
            and not spec.get("records"):
        raise _FieldError(keys, "delete_records needs a topic besides `topic`")
    for key in ("gap", "length"):
        if key in spec and _range_s(spec[key])[1] < _range_s(spec[key])[0]:
            raise _FieldError([*keys, key], "a range runs from low to high")
    return plan(spec, rng, window_s, nodes, shards, topics, workload_topics, _range_s)


def _range_s(value: Any) -> tuple[float, float]:
    """A time ('5s') or a range ('2s..9s') as (low, high) seconds."""
    if isinstance(value, str) and ".." in value:
        low, high = (_seconds(x) for x in value.split(".."))
        return low, high
    return _seconds(value), _seconds(value)


def _undone_action(action: str, s: dict[str, Any]) -> bool:
    return bool(ACTIONS[action]) and not (action == "link" and s["link"] == "heal")


def _undone(step: Step) -> bool:
    return bool(ACTIONS.get(step.action)) and not (step.action == "link"
                                                   and step.arg.mode == "heal")


def _said(action: str, s: dict[str, Any]) -> str:
    """A step's default name: 'kill leader of t-0', 'link loss node 1 -> others'."""
    value = s[action]
    if action == "chaos":
        return "chaos"
    if action == "link":
        ends = [_ends_said(s[k]) for k in ("from", "to") if k in s]
        arrow = " -> " if value == "loss" else " <-> "
        ms = f" {s['ms']:g}ms" if "ms" in s else ""
        return f"link {value}{ms} {arrow.join(ends)}".rstrip()
    said = " ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) \
        else str(value)
    return f"{action} {said}"


def _ends_said(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(node_ref(v)) for v in value) + "]"
    return "others" if value == "others" else str(node_ref(value))


@dataclass(frozen=True)
class Link:
    """A `link` step: `mode` between every node of `sources` and every node of `targets`
    (loss: from sources to targets only). None on a side: every node not on the other
    (`others`); both None (a bare `heal`): every link."""

    mode: str
    sources: tuple[NodeRef, ...] | None
    targets: tuple[NodeRef, ...] | None
    ms: float = 0.0


def _link(s: dict[str, Any], i: int, nodes: list[int], topics: dict[str, int]) -> Link:
    mode = s["link"]
    where = ["steps", i]
    if len(nodes) < 2:
        raise _FieldError([*where, "link"], "a link joins two nodes: set `cluster.nodes` to 2 "
                          "or more")
    if mode != "heal":
        for key in ("from", "to"):
            if key not in s:
                raise _FieldError([*where, "link"], f"link {mode} needs `from` and `to`")
    if (mode == "delay") != ("ms" in s):
        raise _FieldError([*where, "ms" if "ms" in s else "link"],
                          "`ms` goes with link delay, and only with it")
    if s.get("from") == "others" and s.get("to") == "others":
        raise _FieldError([*where, "to"], "`from` and `to` cannot both be `others`")
    sides: list[tuple[NodeRef, ...] | None] = []
    for key in ("from", "to"):
        value = s.get(key, "others")
        if value == "others":
            sides.append(None)
            continue
        refs = tuple(node_ref(v) for v in (value if isinstance(value, list) else [value]))
        for k, ref in enumerate(refs):
            _check_node(ref, [*where, key] + ([k] if isinstance(value, list) else []), nodes,
                        topics)
        sides.append(refs)
    return Link(mode, sides[0], sides[1], float(s.get("ms", 0)))


def _check_targets(action: str, arg: Any, keys: list[Any], nodes: list[int],
                   topics: dict[str, int]) -> None:
    if action in ("kill", "stop"):
        t = target(arg, nodes[0])
        _check_node(t.node, keys, nodes, topics)
    elif action in ("restart", "fsync_error", "disk_full", "slow_disk"):
        value = arg.get("node", f"node {nodes[0]}") if isinstance(arg, dict) else arg
        _check_node(node_ref(value), keys, nodes, topics)
    elif action == "delete_topic" and arg not in topics:
        raise _FieldError(keys, f"no topic {arg!r} in this scenario")
    elif action == "add_partitions" and arg["topic"] not in topics:
        raise _FieldError([*keys, "topic"], f"no topic {arg['topic']!r} in this scenario")


def _check_node(ref: NodeRef, keys: list[Any], nodes: list[int],
                topics: dict[str, int]) -> None:
    if ref.kind == "id" and ref.id not in nodes:
        known = "node 0" if nodes == [0] else f"nodes {nodes[0]} to {nodes[-1]}"
        raise _FieldError(keys, f"there is no node {ref.id} ({known})")
    if ref.kind == "leader":
        partitions = topics.get(str(ref.topic))
        if partitions is None:
            raise _FieldError(keys, f"no topic {ref.topic!r} in this scenario")
        if not 0 <= int(ref.partition or 0) < partitions:
            raise _FieldError(keys, f"{ref.topic!r} has {partitions} partitions, "
                              f"not a partition {ref.partition}")


def _payload(name: str, path: Path | None, size: int) -> bytes:
    base = path.parent if path else Path.cwd()
    for candidate in (base / name, Path(__file__).parent / "library" / name):
        if candidate.is_file():
            data = candidate.read_bytes()
            if len(data) < size:
                data = (data * (size // max(1, len(data)) + 1))
            return data[:size]
    raise _FieldError(["workload", "payloadFile"], f"no file {name!r} (looked beside the "
                      "scenario and in scenarios/library/)")


def _seconds(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    match = re.match(_DURATION, str(value))
    if match is None:
        raise ValueError(f"{value!r} is not a time like '10s'")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]


def _bytes(value: Any) -> int:
    if isinstance(value, int):
        return value
    match = re.match(_SIZE, str(value))
    if match is None:
        raise ValueError(f"{value!r} is not a size like '256MiB'")
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6,
             "GB": 10**9}
    return int(match.group(1)) * scale[match.group(2) or "B"]


seconds, size_bytes = _seconds, _bytes  # the runner reads durations and sizes the same way


def _deepest(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a oneOf failure, the branch error that went deepest is the one a person means."""
    while error.context:
        error = max(error.context, key=lambda e: len(list(e.absolute_path)))
    return error


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(error.schema.get("properties", {}))
        return f"unknown key {', '.join(map(repr, extra))} (known: {known})"
    if error.validator == "pattern":
        form = _FORMS.get(error.validator_value, error.validator_value)
        return f"{error.instance!r} is not in the form {form}"
    return error.message


_FORMS = {_DURATION: "'10s', '500ms', '2m'", _RANGE: "'5s..20s'", _SIZE: "'256MiB'",
          _TARGET: "'node 0', 'leader of orders-0', 'shard 1', 'shard 1 of node 2', "
                   "'shard random'",
          _NODE_TARGET: "'node 0', 'node random' or 'leader of orders-0'",
          r"^(consumer \d+|all)$": "'consumer 0' or 'all'"}


def _dotted(keys: list[Any]) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _position(root: Any, keys: list[Any]) -> str:
    """`:line:column` of the node at `keys` in the composed YAML (the deepest one found)."""
    node, mark = root, getattr(root, "start_mark", None)
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    node, mark = v, k.start_mark
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) \
                and key < len(node.value):
            node = node.value[key]
            mark = node.start_mark
        else:
            break
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
