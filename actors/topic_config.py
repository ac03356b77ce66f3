"""Topic configuration: the keys Krill knows, their defaults, validation and alteration.

Names and defaults follow Kafka's topic configs (and Redpanda's `write.caching`). A topic
stores only the keys set explicitly; `effective()` fills in the defaults, some of them from
the node's settings (`node_defaults()`). CreateTopics, AlterConfigs and
IncrementalAlterConfigs all go through `validate()`: an unknown key or a bad value is refused
with INVALID_CONFIG and one line naming the key and the reason.

Every key is either enforced or refused; none is accepted and ignored:

- Enforced by the partition and its log: cleanup.policy (delete, compact or both),
  retention.ms, retention.bytes, segment.bytes, segment.ms, segment.jitter.ms,
  segment.index.bytes, index.interval.bytes, file.delete.delay.ms, delete.retention.ms,
  min.cleanable.dirty.ratio, min.compaction.lag.ms, max.compaction.lag.ms, max.message.bytes,
  message.timestamp.type and write.caching (see `TopicSettings`).
- Enforced by the partition's leader: min.insync.replicas, Kafka's meaning on top of Raft. An
  acks=all produce is refused NOT_ENOUGH_REPLICAS while the in-sync replicas (one on a node of
  its own) are fewer, answered NOT_ENOUGH_REPLICAS_AFTER_APPEND when they become fewer while
  it waits, and answered once max(a majority, min.insync.replicas) replicas have flushed it
  (actors/partition_produce.py); acks=0 and acks=1 are not affected.
- Met by construction, so any valid value holds: flush.ms and flush.messages bound how long
  an append may stay unflushed, and Krill flushes every append at once (fdatasync before
  acks=1 or acks=all is answered, unless write.caching), which meets any bound;
  message.downconversion.enable, because Krill never down-converts (Fetch 0-3, the versions
  that would need it, are not offered).
- Refused unless left at the default, with the reason: compression.type other than
  `producer`, preallocate, unclean.leader.election.enable, the message.timestamp.*.max.ms
  bounds, tiered storage (local.retention.*, remote.storage.enable) and replication throttles.

`write.caching` relaxes durability per topic: when "true", acks=1 and acks=all are answered
once the data is written to the page cache, and flushed in the background. The default,
"false", answers only after fdatasync (safe mode).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from actors.services import BrokerSettings
from storage import limits as storage_limits

__all__ = [
    "DEFAULTS",
    "ConfigError",
    "ConfigType",
    "OperationError",
    "Operation",
    "OP_SET",
    "OP_DELETE",
    "OP_APPEND",
    "OP_SUBTRACT",
    "TopicSettings",
    "altered",
    "check_offsets_topic",
    "config_type",
    "effective",
    "min_insync_replicas",
    "node_defaults",
    "replaced",
    "validate",
]


class ConfigError(ValueError):
    """A key or value the topic cannot take (INVALID_CONFIG); the message names the key."""


class OperationError(ValueError):
    """A malformed alteration (INVALID_REQUEST): an unknown operation, a null value to set,
    a key named twice."""


class ConfigType(IntEnum):
    """Kafka's ConfigEntry type, as DescribeConfigs v3+ reports it."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


_INT_MAX = 2**31 - 1  # the largest value of an INT-typed key (a Java int)
_LONG_MAX = 2**63 - 1  # the largest value of a LONG-typed key (a Java long)
_SEGMENT_BYTES_MIN = 1024 * 1024  # Krill's floor for segment.bytes (Kafka's is 14 bytes)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")  # as Java's Long.parseLong after a trim


def _int(minimum: int, maximum: int = _LONG_MAX) -> Callable[[str], None]:
    def check(value: str) -> None:
        if not _INTEGER.fullmatch(value):
            raise ConfigError(f"{value!r} is not an integer")
        number = int(value)
        if number < minimum:
            raise ConfigError(f"{value} is below the minimum {minimum}")
        if number > maximum:
            raise ConfigError(f"{value} is above the maximum {maximum}")

    return check


def _choice(*choices: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in choices:
            raise ConfigError(f"{value!r} is not one of {', '.join(choices)}")

    return check


def _cleanup_policy(value: str) -> None:
    parts = _list_items(value)
    if not parts:
        raise ConfigError("an empty list is not allowed: give delete, compact or both")
    for part in parts:
        if part not in ("delete", "compact"):
            raise ConfigError(f"{part!r} is not delete or compact")


def _bool(value: str) -> None:
    if value.lower() not in ("true", "false"):
        raise ConfigError(f"{value!r} is not true or false")


def _ratio(value: str) -> None:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number") from None
    if not 0.0 <= number <= 1.0:
        raise ConfigError(f"{value} is not between 0 and 1")


def _any(value: str) -> None:
    return None


def _refused_unless(
    check: Callable[[str], None], allowed: Callable[[str], bool], reason: str
) -> Callable[[str], None]:
    """A key Krill cannot honour: only the value `allowed` accepts (its default) is taken."""

    def refuse(value: str) -> None:
        check(value)
        if not allowed(value):
            raise ConfigError(f"{value!r} is refused: {reason}")

    return refuse


def _is_false(value: str) -> bool:
    return value.lower() == "false"


def _is_number(expected: int) -> Callable[[str], bool]:
    return lambda value: int(value) == expected


_NO_TIMESTAMP_BOUND = (
    "the broker does not decode records on the produce path, so a per-record timestamp "
    "bound cannot be checked"
)
_NO_TIERED_STORAGE = "Krill has no tiered storage: the local log is the whole log"
_NO_REPLICATION = "Krill has no replication yet: there is nothing to throttle"


class _Key(NamedTuple):
    default: str | None  # None: the node's setting (node_defaults)
    check: Callable[[str], None]
    type: ConfigType


_KEYS: dict[str, _Key] = {
    "cleanup.policy": _Key("delete", _cleanup_policy, ConfigType.LIST),
    "compression.type": _Key("producer", _refused_unless(
        _any, lambda value: value == "producer",
        "Krill stores batches as the producer compressed them and never recompresses "
        "(only 'producer' is accepted)"), ConfigType.STRING),
    "retention.ms": _Key(None, _int(-1), ConfigType.LONG),
    "retention.bytes": _Key(None, _int(-1), ConfigType.LONG),
    "segment.bytes": _Key(None, _int(_SEGMENT_BYTES_MIN, _INT_MAX), ConfigType.INT),
    "segment.ms": _Key(None, _int(1), ConfigType.LONG),
    "max.message.bytes": _Key(None, _int(0, _INT_MAX), ConfigType.INT),
    "message.timestamp.type": _Key(
        "CreateTime", _choice("CreateTime", "LogAppendTime"), ConfigType.STRING),
    "min.insync.replicas": _Key("1", _int(1, _INT_MAX), ConfigType.INT),
    "write.caching": _Key("false", _bool, ConfigType.BOOLEAN),
    "flush.ms": _Key(str(_LONG_MAX), _int(0), ConfigType.LONG),
    "flush.messages": _Key(str(_LONG_MAX), _int(1), ConfigType.LONG),
    "delete.retention.ms": _Key("86400000", _int(0), ConfigType.LONG),
    "min.cleanable.dirty.ratio": _Key("0.5", _ratio, ConfigType.DOUBLE),
    "unclean.leader.election.enable": _Key("false", _refused_unless(
        _bool, _is_false, "Raft never elects a replica that may lack acknowledged writes"),
        ConfigType.BOOLEAN),
    "message.timestamp.difference.max.ms": _Key(str(_LONG_MAX), _refused_unless(
        _int(0), _is_number(_LONG_MAX), _NO_TIMESTAMP_BOUND), ConfigType.LONG),
    "message.timestamp.before.max.ms": _Key(str(_LONG_MAX), _refused_unless(
        _int(0), _is_number(_LONG_MAX), _NO_TIMESTAMP_BOUND), ConfigType.LONG),
    "message.timestamp.after.max.ms": _Key(str(_LONG_MAX), _refused_unless(
        _int(0), _is_number(_LONG_MAX), _NO_TIMESTAMP_BOUND), ConfigType.LONG),
    "message.downconversion.enable": _Key("true", _bool, ConfigType.BOOLEAN),
    "preallocate": _Key("false", _refused_unless(
        _bool, _is_false, "segment files grow as they are written; none is preallocated"),
        ConfigType.BOOLEAN),
    "index.interval.bytes": _Key("4096", _int(0, _INT_MAX), ConfigType.INT),
    # Kafka's floor is 4; an index smaller than one time-index entry could hold nothing.
    "segment.index.bytes": _Key(
        "10485760", _int(storage_limits.time_index_entry_bytes, _INT_MAX), ConfigType.INT),
    "segment.jitter.ms": _Key("0", _int(0), ConfigType.LONG),
    "file.delete.delay.ms": _Key("60000", _int(0), ConfigType.LONG),
    "min.compaction.lag.ms": _Key("0", _int(0), ConfigType.LONG),
    "max.compaction.lag.ms": _Key(str(_LONG_MAX), _int(1), ConfigType.LONG),
    "local.retention.ms": _Key("-2", _refused_unless(
        _int(-2), _is_number(-2), _NO_TIERED_STORAGE), ConfigType.LONG),
    "local.retention.bytes": _Key("-2", _refused_unless(
        _int(-2), _is_number(-2), _NO_TIERED_STORAGE), ConfigType.LONG),
    "remote.storage.enable": _Key("false", _refused_unless(
        _bool, _is_false, _NO_TIERED_STORAGE), ConfigType.BOOLEAN),
    "follower.replication.throttled.replicas": _Key("", _refused_unless(
        _any, lambda value: not value.strip(), _NO_REPLICATION), ConfigType.LIST),
    "leader.replication.throttled.replicas": _Key("", _refused_unless(
        _any, lambda value: not value.strip(), _NO_REPLICATION), ConfigType.LIST),
}

DEFAULTS = {key: spec.default for key, spec in _KEYS.items()}


def config_type(key: str) -> ConfigType:
    return _KEYS[key].type


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The explicitly set keys, checked; ConfigError names the first bad key and why. A key
    whose value is None is left unset."""
    checked: dict[str, str] = {}
    for key, value in configs.items():
        if key not in _KEYS:
            raise ConfigError(f"unknown topic config {key!r}")
        if value is None:
            continue
        try:
            _KEYS[key].check(value)
        except ConfigError as e:
            raise ConfigError(f"{key}: {e}") from None
        checked[key] = value
    return checked


# Altering a topic's configs ---------------------------------------------------------------

# IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType ids).
OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2  # list-valued keys only: add the items not there yet
OP_SUBTRACT = 3  # list-valued keys only: remove the items given


class Operation(NamedTuple):
    key: str
    op: int  # OP_SET, OP_DELETE, OP_APPEND or OP_SUBTRACT
    value: str | None


def replaced(operations: Sequence[Operation]) -> dict[str, str]:
    """AlterConfigs: the keys given become the topic's whole set of explicit keys (a None
    value leaves its key unset); every other key returns to its default."""
    _check_unique(operations)
    return validate({o.key: o.value for o in operations})


def altered(explicit: Mapping[str, str], operations: Sequence[Operation]) -> dict[str, str]:
    """IncrementalAlterConfigs: the explicit keys after `operations`, in order, checked.

        altered({"retention.ms": "1000"}, [Operation("retention.ms", OP_DELETE, None),
            Operation("cleanup.policy", OP_APPEND, "compact")])
        == {"cleanup.policy": "delete,compact"}
    """
    _check_unique(operations)
    _check_incremental(operations)
    result = dict(explicit)
    for key, op, value in operations:
        if key not in _KEYS:
            raise ConfigError(f"unknown topic config {key!r}")
        if op == OP_DELETE:
            result.pop(key, None)
            continue
        assert value is not None  # _check_incremental
        if op == OP_SET:
            result[key] = value
            continue
        if _KEYS[key].type != ConfigType.LIST:
            verb = "append to" if op == OP_APPEND else "subtract from"
            raise ConfigError(f"{key}: cannot {verb} a key that is not a list")
        current = _list_items(result.get(key, _KEYS[key].default or ""))
        given = _list_items(value)
        if op == OP_APPEND:
            items = current + [item for item in given if item not in current]
        else:
            items = [item for item in current if item not in given]
        result[key] = ",".join(items)
    return validate(result)


def _check_unique(operations: Sequence[Operation]) -> None:
    seen: set[str] = set()
    for key, _op, _value in operations:
        if key in seen:
            raise OperationError(f"config {key!r} is named more than once")
        seen.add(key)


def _check_incremental(operations: Sequence[Operation]) -> None:
    for key, op, value in operations:
        if op not in (OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT):
            raise OperationError(f"{key}: unknown operation {op}")
        if value is None and op != OP_DELETE:
            raise OperationError(f"{key}: a null value is only for DELETE")


def _list_items(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def check_offsets_topic(configs: Mapping[str, str], replication_factor: int = 1) -> None:
    """What the group coordinator needs of `__consumer_offsets`: compaction alone (it keeps
    each group's last commit; retention would delete live offsets) and min.insync.replicas no
    more than a majority of its `replication_factor` replicas (1 on a node of its own, 2 of
    3). The coordinator writes group state and commits with acks=all, which min.insync.replicas
    governs as any producer's: up to a majority it asks nothing Raft's commit does not give
    already (Kafka setups commonly set 2 of 3), and above it every group would stop committing
    and joining whenever one replica's node is down. ConfigError names the key."""
    policy = _list_items(configs.get("cleanup.policy", DEFAULTS["cleanup.policy"] or ""))
    if set(policy) != {"compact"}:
        raise ConfigError(
            "cleanup.policy: __consumer_offsets stays compact: the group coordinator keeps "
            "each group's last committed offsets there, which deletion would lose"
        )
    majority = replication_factor // 2 + 1
    if min_insync_replicas(configs) > majority:
        raise ConfigError(
            f"min.insync.replicas: __consumer_offsets takes at most {majority}, a majority of "
            f"its {replication_factor} replica(s): the group coordinator writes with acks=all, "
            "and more would stop every group while one replica is down"
        )


def min_insync_replicas(configs: Mapping[str, str]) -> int:
    """The topic's min.insync.replicas, from its explicit configs (they were validated)."""
    return int(configs.get("min.insync.replicas", DEFAULTS["min.insync.replicas"] or "1"))


def effective(configs: Mapping[str, str], settings: BrokerSettings) -> dict[str, str]:
    """Every known key with its value for a topic: explicit, else node setting, else default."""
    broker = node_defaults(settings)
    result = {}
    for key, default in DEFAULTS.items():
        result[key] = configs.get(key, broker.get(key, default or ""))
    return result


def node_defaults(settings: BrokerSettings) -> dict[str, str]:
    """The topic keys whose default is a node setting (DescribeConfigs source: node)."""
    return {
        "segment.bytes": str(settings.segment_bytes),
        "segment.ms": str(settings.segment_ms),
        "max.message.bytes": str(settings.message_max_bytes),
        "retention.ms": str(settings.log_retention_ms),
        "retention.bytes": str(settings.retention_bytes),
    }


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """The settings a Partition acts on, parsed once when the topic table changes."""

    segment_bytes: int
    segment_ms: int
    max_message_bytes: int
    log_append_time: bool
    write_caching: bool
    retention_ms: int = -1  # -1: no limit by age
    retention_bytes: int = -1  # -1: no limit by size
    delete: bool = True  # cleanup.policy has "delete": retention applies
    compact: bool = False  # cleanup.policy has "compact"
    file_delete_delay_ms: int = 60_000
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * 1024 * 1024
    segment_jitter_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86_400_000
    min_insync_replicas: int = 1

    @classmethod
    def of(cls, configs: Mapping[str, str], settings: BrokerSettings) -> TopicSettings:
        values = effective(configs, settings)
        policy = {part.strip() for part in values["cleanup.policy"].split(",")}
        return cls(
            segment_bytes=int(values["segment.bytes"]),
            segment_ms=int(values["segment.ms"]),
            max_message_bytes=int(values["max.message.bytes"]),
            log_append_time=values["message.timestamp.type"] == "LogAppendTime",
            write_caching=values["write.caching"].lower() == "true",
            retention_ms=int(values["retention.ms"]),
            retention_bytes=int(values["retention.bytes"]),
            delete="delete" in policy,
            compact="compact" in policy,
            file_delete_delay_ms=int(values["file.delete.delay.ms"]),
            # 0 is Kafka's "an entry for every batch", which 1 byte also gives.
            index_interval_bytes=max(1, int(values["index.interval.bytes"])),
            segment_index_bytes=int(values["segment.index.bytes"]),
            segment_jitter_ms=int(values["segment.jitter.ms"]),
            min_cleanable_dirty_ratio=float(values["min.cleanable.dirty.ratio"]),
            min_compaction_lag_ms=int(values["min.compaction.lag.ms"]),
            max_compaction_lag_ms=int(values["max.compaction.lag.ms"]),
            delete_retention_ms=int(values["delete.retention.ms"]),
            min_insync_replicas=int(values["min.insync.replicas"]),
        )
