"""Topic configuration: the keys Krill knows, their defaults, and validation.

Names and defaults follow Kafka's topic configs (and Redpanda's `write.caching`). A topic
stores only the keys set explicitly; `effective()` fills in the defaults. Unknown keys and bad
values are refused with INVALID_CONFIG, as Kafka does on CreateTopics.

`write.caching` relaxes durability per topic: when "true", acks=1 and acks=all are answered
once the data is written to the page cache, and flushed in the background. The default,
"false", answers only after fdatasync (safe mode).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from actors.services import BrokerSettings

__all__ = ["DEFAULTS", "validate", "effective", "TopicSettings", "ConfigError"]


class ConfigError(ValueError):
    pass


def _int(minimum: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise ConfigError(f"{value} is below the minimum {minimum}")

    return check


def _choice(*choices: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        for part in value.split(","):
            if part.strip() not in choices:
                raise ConfigError(f"{value!r} is not one of {', '.join(choices)}")

    return check


def _bool(value: str) -> None:
    if value.lower() not in ("true", "false"):
        raise ConfigError(f"{value!r} is not true or false")


def _any(value: str) -> None:
    return None


# key -> (default, validator). A default of None means "the broker's setting" (see effective()).
_KEYS: dict[str, tuple[str | None, Callable[[str], None]]] = {
    "cleanup.policy": ("delete", _choice("delete", "compact")),
    "compression.type": (
        "producer",
        _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    ),
    "retention.ms": ("604800000", _int(-1)),
    "retention.bytes": ("-1", _int(-1)),
    "segment.bytes": (None, _int(1024 * 1024)),
    "segment.ms": (None, _int(1)),
    "max.message.bytes": (None, _int(0)),
    "message.timestamp.type": ("CreateTime", _choice("CreateTime", "LogAppendTime")),
    "min.insync.replicas": ("1", _int(1)),
    "write.caching": ("false", _bool),
    "flush.ms": ("9223372036854775807", _int(0)),
    "flush.messages": ("9223372036854775807", _int(1)),
    "delete.retention.ms": ("86400000", _int(0)),
    "min.cleanable.dirty.ratio": ("0.5", _any),
    "unclean.leader.election.enable": ("false", _bool),
    "message.timestamp.difference.max.ms": ("9223372036854775807", _int(0)),
    "message.timestamp.before.max.ms": ("9223372036854775807", _int(0)),
    "message.timestamp.after.max.ms": ("9223372036854775807", _int(0)),
    "message.downconversion.enable": ("true", _bool),
    "preallocate": ("false", _bool),
    "index.interval.bytes": ("4096", _int(0)),
    "segment.index.bytes": ("10485760", _int(4)),
    "segment.jitter.ms": ("0", _int(0)),
    "file.delete.delay.ms": ("60000", _int(0)),
    "min.compaction.lag.ms": ("0", _int(0)),
    "max.compaction.lag.ms": ("9223372036854775807", _int(1)),
    "local.retention.ms": ("-2", _int(-2)),
    "local.retention.bytes": ("-2", _int(-2)),
    "remote.storage.enable": ("false", _bool),
    "follower.replication.throttled.replicas": ("", _any),
    "leader.replication.throttled.replicas": ("", _any),
}

DEFAULTS = {key: default for key, (default, _) in _KEYS.items()}


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The explicitly set keys, checked; ConfigError names the first bad key."""
    checked: dict[str, str] = {}
    for key, value in configs.items():
        if key not in _KEYS:
            raise ConfigError(f"unknown topic config {key!r}")
        if value is None:
            continue
        try:
            _KEYS[key][1](value)
        except ConfigError as e:
            raise ConfigError(f"{key}: {e}") from None
        checked[key] = value
    return checked


def effective(configs: Mapping[str, str], settings: BrokerSettings) -> dict[str, str]:
    """Every known key with its value for a topic: explicit, else broker setting, else default."""
    broker = {
        "segment.bytes": str(settings.segment_bytes),
        "segment.ms": str(settings.segment_ms),
        "max.message.bytes": str(settings.message_max_bytes),
    }
    result = {}
    for key, default in DEFAULTS.items():
        result[key] = configs.get(key, broker.get(key, default or ""))
    return result


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """The settings a Partition acts on, parsed once when the topic table changes."""

    segment_bytes: int
    segment_ms: int
    max_message_bytes: int
    log_append_time: bool
    write_caching: bool

    @classmethod
    def of(cls, configs: Mapping[str, str], settings: BrokerSettings) -> TopicSettings:
        values = effective(configs, settings)
        return cls(
            segment_bytes=int(values["segment.bytes"]),
            segment_ms=int(values["segment.ms"]),
            max_message_bytes=int(values["max.message.bytes"]),
            log_append_time=values["message.timestamp.type"] == "LogAppendTime",
            write_caching=values["write.caching"].lower() == "true",
        )
