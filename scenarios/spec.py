"""A scenario file: YAML, checked against one JSON Schema, read into a `Scenario`.

Every mistake is one `SpecError` line naming the file, the line and column, and the key:

    my-flow.yaml:12:5: workload.producerRate: 'fast' is not of type 'integer'

The sections (every field is documented in scenarios/README.md):

- `cluster`: `mode` (`real`, the default: node processes and Kafka clients; `simulated`: the
  actors in one process, scenarios/sim/), `nodes`, `shards` per node, node `settings` (the
  keys of `krill start --config`), `disk_size` (the data directory on a filesystem of that
  size, so `disk_full` is a real full disk).
- `topics`: name, partitions, config (topic configs, as `krill topic create --config`).
- `workload`: OpenMessaging Benchmark's fields, spelled as OMB spells them, plus `client`
  and its `producerConfig` / `consumerConfig`. A bare OMB workload file (its fields at the top
  level) runs unchanged: it is read as the `workload` of a one-node cluster.
- `steps`: faults on a timeline (`at: 10s`, or `at: 5s..20s`, drawn from the seed) or after
  a condition (`after: {acked: 10000}`), each undone `for:` a time later, by a later
  `undo:` step, or at the end.
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

from scenarios.checker import ANOMALIES, Bounds

__all__ = ["ACTIONS", "Scenario", "SpecError", "Step", "Workload", "load", "parse"]

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
    "link": "heal",              # cut, delay or one-way drop a link between nodes
}
NEEDS_REPLICATION = "comes with replication (the Raft issue, #17): a one-node Krill has no link"

_DURATION = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$"
_RANGE = r"^\s*(\d+(?:\.\d+)?\s*(?:ms|s|m|min|h)?)\s*\.\.\s*(\d+(?:\.\d+)?\s*(?:ms|s|m|min|h)?)\s*$"
_SIZE = r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$"
_TARGET = r"^(node|shard) (\d+|random)( of node \d+)?$"

_duration = {"oneOf": [{"type": "number", "minimum": 0},
                       {"type": "string", "pattern": _DURATION}]}
_size = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": _SIZE}]}
_target = {"type": "string", "pattern": _TARGET}
_node_target = {"type": "string", "pattern": r"^node (\d+|random)$"}
_count = {"type": "integer", "minimum": 0}
_config_map = {"type": "object", "additionalProperties": {"type": ["string", "number",
                                                                   "boolean"]}}


def _action(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or [],
            "additionalProperties": False}


_ACTION_SCHEMAS: dict[str, Any] = {
    "kill": _target, "stop": _target, "restart": _node_target,
    "disk_full": {"oneOf": [_node_target, _action({"node": _node_target,
                                                   "leave": _size})]},
    "slow_disk": _action({"node": _node_target, "fdatasync_ms": _count}, ["fdatasync_ms"]),
    "fsync_error": _node_target,
    "slow_consumer": {"type": "string", "pattern": r"^(consumer \d+|all)$"},
    "producer_flood": _action({"producers": {"type": "integer", "minimum": 1},
                               "messageSize": {"type": "integer", "minimum": 1},
                               "topic": {"type": "string"}}),
    "delete_topic": {"type": "string", "minLength": 1},
    "add_partitions": _action({"topic": {"type": "string"},
                               "count": {"type": "integer", "minimum": 1}}, ["topic", "count"]),
    "link": {"type": "object"},
}

_STEP = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "at": {"oneOf": [_duration, {"type": "string", "pattern": _RANGE}]},
        "after": _action({"acked": _count, "previous": _duration, "recovered": {"const": True}}),
        "for": _duration,
        "undo": {"type": ["integer", "string"]},
        **_ACTION_SCHEMAS,
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
        "client": {"enum": ["confluent-kafka", "kafka-python", "aiokafka"]},
        "producerConfig": _config_map,
        "consumerConfig": _config_map,
    },
    "additionalProperties": False,
}

_TOPIC = _action({"name": {"type": "string", "minLength": 1},
                  "partitions": {"type": "integer", "minimum": 1},
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
    client: str = "confluent-kafka"
    producer_config: dict[str, Any] = field(default_factory=dict)
    consumer_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    action: str  # one of ACTIONS, or "undo"
    arg: Any  # the action's value as written (target string or mapping)
    at_s: float | None = None  # seconds after the workload's start (drawn for a range)
    after: dict[str, Any] | None = None
    for_s: float | None = None
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
    topics: list[dict[str, Any]]  # name, partitions, config: every topic the run creates
    workload_topics: list[str]  # the topics the workload writes and reads
    workload: Workload
    steps: list[Step]
    bounds: Bounds
    anomalies: tuple[str, ...]  # those that fail the run
    min_throughput_ratio: float | None
    seed: int
    document: dict[str, Any]  # as read, for the simulated mode and the report

    @property
    def skip_topics(self) -> set[str]:
        """Topics whose gaps are by design (compacted): no poll-skip there."""
        return {t["name"] for t in self.topics
                if "compact" in str(t.get("config", {}).get("cleanup.policy", ""))}

    @property
    def unchecked_topics(self) -> set[str]:
        """Topics a step deletes: their acknowledged records go with them and a re-created
        topic's offsets start again, so the checker leaves them out (their load stays)."""
        return {s.arg for s in self.steps if s.action == "delete_topic"}


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
    if nodes > 1:
        raise _FieldError(["cluster", "nodes"], f"{nodes} nodes come with replication (the "
                          "Raft issue, #17); until then a cluster is one node")
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
    topics = [{"name": t["name"], "partitions": t.get("partitions", partitions),
               "config": {k: str(v) for k, v in (t.get("config") or {}).items()}}
              for t in topics_section]
    topics += [{"name": n, "partitions": partitions, "config": {}}
               for n in workload_topics if n not in names]
    payload = None
    if "payloadFile" in w:
        payload = _payload(w["payloadFile"], path, w.get("messageSize", 1024))
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
        client=w.get("client", "confluent-kafka"),
        producer_config=dict(w.get("producerConfig") or {}),
        consumer_config=dict(w.get("consumerConfig") or {}),
    )
    steps = _steps(doc.get("steps") or [], mode, random.Random(seed), written,
                   {t["name"] for t in topics}, scale)
    checks = doc.get("checks") or {}
    listed = checks.get("anomalies", "all")
    failing = tuple(ANOMALIES if listed == "all" else listed)
    failing = tuple(a for a in failing if a not in set(checks.get("allow", ())))
    return Scenario(
        name=doc.get("name") or (path.stem if path else "scenario"), path=path, mode=mode,
        nodes=nodes, shards=cluster.get("shards", 2), settings=dict(cluster.get("settings") or {}),
        disk_size=_bytes(cluster["disk_size"]) if "disk_size" in cluster else None,
        topics=topics, workload_topics=workload_topics, workload=workload, steps=steps,
        bounds=Bounds(p99_ms_outside_faults=checks.get("p99_ms_outside_faults"),
                      recovery_ms=checks.get("recovery_ms"),
                      error_rate=checks.get("error_rate")),
        anomalies=failing, min_throughput_ratio=checks.get("min_throughput_ratio"),
        seed=seed, document=doc,
    )


def _steps(raw: list[dict[str, Any]], mode: str, rng: random.Random, duration_s: float,
           topics: set[str], scale: float = 1.0) -> list[Step]:
    if mode == "simulated":
        return []  # scenarios/sim/ reads its own steps from the document
    steps: list[Step] = []
    names: dict[str, int] = {}
    for i, s in enumerate(raw):
        actions = [k for k in s if k in ACTIONS or k == "undo"]
        if len(actions) != 1:
            raise _FieldError(["steps", i], "a step does exactly one thing: one of "
                              f"{', '.join(ACTIONS)} or undo (found {len(actions)})")
        action = actions[0]
        if action == "link":
            raise _FieldError(["steps", i, "link"], f"a link fault {NEEDS_REPLICATION}")
        if "at" in s and "after" in s:
            raise _FieldError(["steps", i], "a step has `at` or `after`, not both")
        at_s = None
        if "at" in s:
            if isinstance(s["at"], str) and ".." in s["at"]:
                low, high = (_seconds(x) for x in s["at"].split(".."))
                if high < low:
                    raise _FieldError(["steps", i, "at"], "a range runs from low to high")
                at_s = round(rng.uniform(low, high), 3)
            else:
                at_s = _seconds(s["at"])
            if at_s > duration_s:
                raise _FieldError(["steps", i, "at"],
                                  f"{at_s:g}s is past the workload's end ({duration_s:g}s)")
        undo = None
        if action == "undo":
            ref = s["undo"]
            undo = ref if isinstance(ref, int) else names.get(ref)
            if undo is None or not 0 <= undo < i or not ACTIONS.get(steps[undo].action):
                raise _FieldError(["steps", i, "undo"],
                                  f"{ref!r} is not an earlier step that can be undone")
        elif "for" in s and not ACTIONS[action]:
            raise _FieldError(["steps", i, "for"], f"{action} is not undone, so takes no `for`")
        if action in ("delete_topic",) and s[action] not in topics:
            raise _FieldError(["steps", i, action], f"no topic {s[action]!r} in this scenario")
        if action == "add_partitions" and s[action]["topic"] not in topics:
            raise _FieldError(["steps", i, action, "topic"],
                              f"no topic {s[action]['topic']!r} in this scenario")
        value = s[action]
        said = " ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) \
            else str(value)
        name = s.get("name", f"{action} {said}" if action != "undo" else f"undo {undo}")
        names[s.get("name", str(i))] = i
        after = dict(s["after"]) if "after" in s else None
        if after and "previous" in after:
            after["previous"] = _seconds(after["previous"]) * scale
        steps.append(Step(index=i, name=name, action=action, arg=s[action],
                          at_s=None if at_s is None else round(at_s * scale, 3), after=after,
                          for_s=_seconds(s["for"]) * scale if "for" in s else None, undo=undo))
    return steps


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
          _TARGET: "'node 0', 'shard 1', 'shard 1 of node 0', 'shard random'",
          r"^node (\d+|random)$": "'node 0'", r"^(consumer \d+|all)$": "'consumer 0' or 'all'"}


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
