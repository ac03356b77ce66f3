"""Topic and broker configs as DescribeConfigs and CreateTopics report them, and the part of
AlterConfigs and IncrementalAlterConfigs that both share (which resources may change).

A topic key's source is where its value comes from: TOPIC_CONFIG when the topic sets it,
STATIC_BROKER_CONFIG when its default is a node setting (`node_defaults`: retention.ms is the
node's `log.retention.ms`, ...), DEFAULT_CONFIG otherwise. Its synonyms, as Kafka lists them
when asked (DescribeConfigs v1+), go from the strongest to the weakest: the topic's own value,
then the node setting, then the built-in default.

Broker configs are the node's static settings: they change only with the node's configuration
and a restart, so they are read-only and an alteration of a broker is refused with
INVALID_REQUEST, never accepted and ignored. An IncrementalAlterConfigs that only deletes
broker keys is answered NONE: no dynamic broker config is ever set, so each key it names is at
its node setting already, as Kafka answers a delete of a key that is not set
(`kafka-reassign-partitions.sh --verify` deletes the replication throttles this way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from actors.controller import AlterTopicConfigs, TopicResult
from actors.services import BrokerSettings
from actors.topic_config import (
    DEFAULTS,
    OP_DELETE,
    ConfigType,
    Operation,
    config_type,
    effective,
    node_defaults,
)
from wire.errors import ErrorCode

__all__ = [
    "ConfigEntry",
    "ResourceResult",
    "Synonym",
    "alter_resources",
    "alter_responder",
    "broker_entries",
    "config_entries",
    "RESOURCE_TOPIC",
    "RESOURCE_BROKER",
]

# DescribeConfigs ConfigSource values (KIP-226).
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# ConfigResource types.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# Each topic key whose default is a node setting, and that setting's Kafka broker key.
_NODE_KEYS = {
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "max.message.bytes": "message.max.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
}

# The node's settings as they are when its configuration sets none (shards/config.py).
_BUILT_IN = BrokerSettings(
    node_id=0, advertised_host="", advertised_port=0, data_dir="", cluster_id=""
)


class Synonym(NamedTuple):
    name: str
    value: str
    source: int


class ConfigEntry(NamedTuple):
    name: str
    value: str
    source: int
    type: ConfigType = ConfigType.STRING
    synonyms: tuple[Synonym, ...] = ()
    read_only: bool = False

    @property
    def is_default(self) -> bool:
        return self.source == SOURCE_DEFAULT


def config_entries(configs: Mapping[str, str], settings: BrokerSettings) -> list[ConfigEntry]:
    """Every topic key with its effective value, source, type and synonyms."""
    values = effective(configs, settings)
    node = node_defaults(settings)
    built_in = node_defaults(_BUILT_IN)
    entries = []
    for key, value in sorted(values.items()):
        synonyms = []
        if key in configs:
            synonyms.append(Synonym(key, configs[key], SOURCE_TOPIC))
        if key in _NODE_KEYS:
            synonyms.append(Synonym(_NODE_KEYS[key], node[key], SOURCE_STATIC_BROKER))
            synonyms.append(Synonym(_NODE_KEYS[key], built_in[key], SOURCE_DEFAULT))
        else:
            synonyms.append(Synonym(key, DEFAULTS[key] or "", SOURCE_DEFAULT))
        entries.append(ConfigEntry(key, value, synonyms[0].source, config_type(key),
                                   tuple(synonyms)))
    return entries


def broker_entries(settings: BrokerSettings) -> list[ConfigEntry]:
    """The node's settings under Kafka's broker keys, read-only (static)."""
    values = {
        "broker.id": (str(settings.node_id), ConfigType.INT),
        "node.id": (str(settings.node_id), ConfigType.INT),
        "advertised.listeners": (
            f"PLAINTEXT://{settings.advertised_host}:{settings.advertised_port}",
            ConfigType.STRING,
        ),
        "auto.create.topics.enable": (
            "true" if settings.auto_create_topics else "false", ConfigType.BOOLEAN),
        "num.partitions": (str(settings.default_partitions), ConfigType.INT),
        "default.replication.factor": ("1", ConfigType.SHORT),
        "message.max.bytes": (str(settings.message_max_bytes), ConfigType.INT),
        "log.segment.bytes": (str(settings.segment_bytes), ConfigType.INT),
        "log.roll.ms": (str(settings.segment_ms), ConfigType.LONG),
        "log.retention.ms": (str(settings.log_retention_ms), ConfigType.LONG),
        "log.retention.bytes": (str(settings.retention_bytes), ConfigType.LONG),
        "log.retention.check.interval.ms": (
            str(settings.log_cleanup_interval_ms), ConfigType.LONG),
        "log.dirs": (settings.data_dir, ConfigType.STRING),
        "replica.lag.time.max.ms": (str(settings.replica_lag_time_max_ms), ConfigType.LONG),
        # Not a Kafka key: how many shards own this node's partitions (`krill topic describe`
        # shows each partition's shard with shards.shard_table.shard_of).
        "krill.shards": (str(settings.shards), ConfigType.INT),
    }
    return [
        ConfigEntry(name, value, SOURCE_STATIC_BROKER, kind,
                    (Synonym(name, value, SOURCE_STATIC_BROKER),), read_only=True)
        for name, (value, kind) in sorted(values.items())
    ]


# Altering ---------------------------------------------------------------------------------


class ResourceResult(NamedTuple):
    resource_type: int
    name: str
    error: ErrorCode
    message: str | None


_BROKER_REFUSED = (
    "dynamic broker configs are not supported: set the node's configuration "
    "(krill start --config FILE, flags or KRILL_* variables) and restart it"
)


def alter_responder(
    ctx: Any, response: Any, entry: Any
) -> Callable[[list[ResourceResult]], None]:
    """`done` for alter_resources: answer with `response` of `entry`s, the same shape in
    AlterConfigs and IncrementalAlterConfigs (two generated classes)."""

    def done(results: list[ResourceResult]) -> None:
        ctx.respond(response(throttle_time_ms=0, responses=[
            entry(error_code=r.error, error_message=r.message, resource_type=r.resource_type,
                  resource_name=r.name)
            for r in results
        ]))

    return done


def alter_resources(
    ctx: Any,
    resources: list[tuple[int, str, list[Operation]]],
    replace: bool,
    validate_only: bool,
    done: Callable[[list[ResourceResult]], None],
) -> None:
    """Alter each (resource type, name, operations): topics through the Controller, in one
    message; anything else is refused here. `done(results)` in the resources' order."""
    named = Counter((kind, name) for kind, name, _ in resources)
    answers: list[ResourceResult | None] = []
    changes: list[tuple[str, list[Operation]]] = []
    for kind, name, ops in resources:
        if named[(kind, name)] > 1:
            answers.append(ResourceResult(
                kind, name, ErrorCode.INVALID_REQUEST, "the resource is named more than once"))
        elif kind == RESOURCE_TOPIC:
            answers.append(None)
            changes.append((name, ops))
        elif kind == RESOURCE_BROKER:
            unset = not replace and all(op.op == OP_DELETE for op in ops)
            answers.append(ResourceResult(kind, name, ErrorCode.NONE, None) if unset else
                           ResourceResult(kind, name, ErrorCode.INVALID_REQUEST, _BROKER_REFUSED))
        else:
            answers.append(ResourceResult(
                kind, name, ErrorCode.INVALID_REQUEST,
                f"resource type {kind} is not supported: only topics (2) have configs to alter"))
    if not changes:
        done([a for a in answers if a is not None])
        return

    def altered(results: list[TopicResult]) -> None:
        topics = iter(results)
        done([a if a is not None else _topic_result(next(topics)) for a in answers])

    ctx.services.controller().tell(AlterTopicConfigs(changes, replace, validate_only, altered))


def _topic_result(result: TopicResult) -> ResourceResult:
    return ResourceResult(RESOURCE_TOPIC, result.name, result.error, result.message)
