"""Topic and broker configuration entries as DescribeConfigs and CreateTopics report them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from actors.services import BrokerSettings
from actors.topic_config import effective

__all__ = ["ConfigEntry", "config_entries", "broker_entries"]

# DescribeConfigs ConfigSource values (KIP-226).
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class ConfigEntry(NamedTuple):
    name: str
    value: str
    source: int

    @property
    def is_default(self) -> bool:
        return self.source == SOURCE_DEFAULT


def config_entries(configs: Mapping[str, str], settings: BrokerSettings) -> list[ConfigEntry]:
    values = effective(configs, settings)
    return [
        ConfigEntry(key, value, SOURCE_TOPIC if key in configs else SOURCE_DEFAULT)
        for key, value in sorted(values.items())
    ]


def broker_entries(settings: BrokerSettings) -> list[ConfigEntry]:
    values = {
        "broker.id": str(settings.node_id),
        "node.id": str(settings.node_id),
        "advertised.listeners": (
            f"PLAINTEXT://{settings.advertised_host}:{settings.advertised_port}"
        ),
        "auto.create.topics.enable": "true" if settings.auto_create_topics else "false",
        "num.partitions": str(settings.default_partitions),
        "default.replication.factor": "1",
        "message.max.bytes": str(settings.message_max_bytes),
        "log.segment.bytes": str(settings.segment_bytes),
        "log.roll.ms": str(settings.segment_ms),
        "log.dirs": settings.data_dir,
        # Not a Kafka key: how many shards own this node's partitions (`krill topic describe`
        # shows each partition's shard with shards.shard_table.shard_of).
        "krill.shards": str(settings.shards),
    }
    return [ConfigEntry(k, v, SOURCE_STATIC_BROKER) for k, v in sorted(values.items())]
