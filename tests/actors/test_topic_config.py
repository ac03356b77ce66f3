"""Topic configs: every key enforced or refused (actors/topic_config.py), alterations applied
as Kafka applies them, and DescribeConfigs' sources and synonyms (actors/handlers/configs.py)."""

from __future__ import annotations

import pytest

from actors.handlers.configs import (
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    Synonym,
    broker_entries,
    config_entries,
)
from actors.services import BrokerSettings
from actors.topic_config import (
    DEFAULTS,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    ConfigError,
    ConfigType,
    Operation,
    OperationError,
    TopicSettings,
    altered,
    check_offsets_topic,
    min_insync_replicas,
    replaced,
    validate,
)

pytestmark = pytest.mark.timeout(30)

LONG_MAX = str(2**63 - 1)

SETTINGS = BrokerSettings(
    0, "127.0.0.1", 9092, "/data", "cluster", log_retention_ms=3_600_000, retention_bytes=5000
)


@pytest.mark.parametrize(
    "key, value",
    [
        ("cleanup.policy", "delete"),
        ("cleanup.policy", "compact"),
        ("cleanup.policy", "compact,delete"),
        ("cleanup.policy", "delete, compact"),
        ("retention.ms", "-1"),
        ("retention.ms", "0"),
        ("retention.bytes", "-1"),
        ("retention.bytes", "1048576"),
        ("segment.bytes", str(1024 * 1024)),
        ("segment.ms", "1"),
        ("segment.jitter.ms", "100"),
        ("segment.index.bytes", "4096"),
        ("segment.index.bytes", "12"),
        ("index.interval.bytes", "0"),
        ("file.delete.delay.ms", "0"),
        ("delete.retention.ms", "1000"),
        ("min.cleanable.dirty.ratio", "0"),
        ("min.cleanable.dirty.ratio", "1"),
        ("min.cleanable.dirty.ratio", "0.25"),
        ("min.compaction.lag.ms", "5"),
        ("max.compaction.lag.ms", "1"),
        ("max.message.bytes", "0"),
        ("max.message.bytes", str(2**31 - 1)),
        ("message.timestamp.type", "LogAppendTime"),
        ("write.caching", "TRUE"),
        ("flush.ms", "0"),
        ("flush.messages", "1"),
        ("message.downconversion.enable", "false"),
        ("min.insync.replicas", "3"),
        ("compression.type", "producer"),
        ("preallocate", "false"),
        ("unclean.leader.election.enable", "false"),
        ("message.timestamp.difference.max.ms", LONG_MAX),
        ("message.timestamp.before.max.ms", LONG_MAX),
        ("message.timestamp.after.max.ms", LONG_MAX),
        ("local.retention.ms", "-2"),
        ("local.retention.bytes", "-2"),
        ("remote.storage.enable", "false"),
        ("follower.replication.throttled.replicas", ""),
        ("leader.replication.throttled.replicas", ""),
    ],
)
def test_accepted(key: str, value: str) -> None:
    assert validate({key: value}) == {key: value}


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("compression.type", "gzip", "never recompresses"),
        ("compression.type", "uncompressed", "never recompresses"),
        ("compression.type", "zstd", "never recompresses"),
        ("preallocate", "true", "grow as they are written"),
        ("unclean.leader.election.enable", "true", "Raft never elects"),
        ("message.timestamp.difference.max.ms", "1000", "timestamp bound cannot be checked"),
        ("message.timestamp.before.max.ms", "0", "timestamp bound cannot be checked"),
        ("message.timestamp.after.max.ms", "3600000", "timestamp bound cannot be checked"),
        ("local.retention.ms", "-1", "no tiered storage"),
        ("local.retention.ms", "1000", "no tiered storage"),
        ("local.retention.bytes", "1000", "no tiered storage"),
        ("remote.storage.enable", "true", "no tiered storage"),
        ("follower.replication.throttled.replicas", "*", "no replication"),
        ("leader.replication.throttled.replicas", "0:0", "no replication"),
    ],
)
def test_refused_keys_name_the_key_and_the_reason(key: str, value: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validate({key: value})
    message = str(refused.value)
    assert message.startswith(f"{key}: ") and reason in message and "\n" not in message


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("cleanup.policy", "", "empty list"),
        ("cleanup.policy", "delete,forever", "'forever' is not delete or compact"),
        ("retention.ms", "-2", "below the minimum -1"),
        ("retention.ms", "1_000", "not an integer"),
        ("retention.ms", "ten", "not an integer"),
        ("retention.bytes", str(2**63), "above the maximum"),
        ("segment.bytes", "1000", "below the minimum"),
        ("segment.bytes", str(2**31), "above the maximum"),
        ("max.message.bytes", "-1", "below the minimum 0"),
        ("min.cleanable.dirty.ratio", "1.5", "not between 0 and 1"),
        ("min.cleanable.dirty.ratio", "half", "not a number"),
        ("message.timestamp.type", "CreateTime,LogAppendTime", "not one of"),
        ("write.caching", "yes", "not true or false"),
        ("min.insync.replicas", "0", "below the minimum 1"),
        ("preallocate", "maybe", "not true or false"),
        ("local.retention.ms", "-3", "below the minimum -2"),
        ("flush.messages", "0", "below the minimum 1"),
        ("segment.index.bytes", "4", "below the minimum 12"),
        ("max.compaction.lag.ms", "0", "below the minimum 1"),
    ],
)
def test_bad_values(key: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validate({key: value})
    assert str(refused.value).startswith(f"{key}: ") and why in str(refused.value)


def test_unknown_key_and_unset_value() -> None:
    with pytest.raises(ConfigError, match="unknown topic config 'no.such'"):
        validate({"no.such": "1"})
    assert validate({"retention.ms": None, "segment.ms": "10"}) == {"segment.ms": "10"}


def test_alter_configs_replaces_the_whole_set() -> None:
    ops = [Operation("retention.ms", OP_SET, "1000"), Operation("segment.ms", OP_SET, None)]
    assert replaced(ops) == {"retention.ms": "1000"}
    assert replaced([]) == {}
    with pytest.raises(ConfigError, match="^preallocate: "):
        replaced([Operation("preallocate", OP_SET, "true")])


def test_incremental_set_and_delete() -> None:
    explicit = {"retention.ms": "1000", "segment.ms": "60000"}
    result = altered(
        explicit,
        [Operation("retention.ms", OP_DELETE, None), Operation("write.caching", OP_SET, "true")],
    )
    assert result == {"segment.ms": "60000", "write.caching": "true"}
    assert explicit == {"retention.ms": "1000", "segment.ms": "60000"}  # not changed in place
    assert altered({}, [Operation("retention.ms", OP_DELETE, None)]) == {}


def test_incremental_append_and_subtract_on_a_list() -> None:
    # From the default ("delete"), as Kafka appends to the default value.
    assert altered({}, [Operation("cleanup.policy", OP_APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    both = {"cleanup.policy": "delete,compact"}
    assert altered(both, [Operation("cleanup.policy", OP_APPEND, "delete")]) == both
    assert altered(both, [Operation("cleanup.policy", OP_SUBTRACT, "delete")]) == {
        "cleanup.policy": "compact"
    }
    with pytest.raises(ConfigError, match="^cleanup.policy: an empty list"):
        altered({}, [Operation("cleanup.policy", OP_SUBTRACT, "delete")])


def test_append_to_a_key_that_is_not_a_list_is_invalid_config() -> None:
    with pytest.raises(ConfigError, match="^retention.ms: cannot append to a key that is not"):
        altered({}, [Operation("retention.ms", OP_APPEND, "5")])
    with pytest.raises(ConfigError, match="^segment.ms: cannot subtract from a key"):
        altered({}, [Operation("segment.ms", OP_SUBTRACT, "5")])


def test_malformed_operations_are_invalid_request() -> None:
    with pytest.raises(OperationError, match="named more than once"):
        altered(
            {}, [Operation("segment.ms", OP_SET, "5"), Operation("segment.ms", OP_DELETE, None)]
        )
    with pytest.raises(OperationError, match="named more than once"):
        replaced([Operation("segment.ms", OP_SET, "5"), Operation("segment.ms", OP_SET, "6")])
    with pytest.raises(OperationError, match="unknown operation 7"):
        altered({}, [Operation("segment.ms", 7, "5")])
    with pytest.raises(OperationError, match="null value"):
        altered({}, [Operation("segment.ms", OP_SET, None)])
    with pytest.raises(ConfigError, match="unknown topic config 'no.such'"):
        altered({}, [Operation("no.such", OP_DELETE, None)])


def test_offsets_topic_stays_compact() -> None:
    check_offsets_topic({"cleanup.policy": "compact", "retention.ms": "1000"})
    for policy in ({}, {"cleanup.policy": "delete"}, {"cleanup.policy": "compact,delete"}):
        with pytest.raises(ConfigError, match="^cleanup.policy: __consumer_offsets stays"):
            check_offsets_topic(policy)
    with pytest.raises(ConfigError, match="^min.insync.replicas: "):
        check_offsets_topic({"cleanup.policy": "compact", "min.insync.replicas": "2"})


def test_offsets_topic_takes_min_insync_replicas_up_to_a_majority_of_its_replicas() -> None:
    compact = {"cleanup.policy": "compact"}
    check_offsets_topic({**compact, "min.insync.replicas": "2"}, replication_factor=3)
    check_offsets_topic({**compact, "min.insync.replicas": "3"}, replication_factor=5)
    with pytest.raises(ConfigError, match="^min.insync.replicas: __consumer_offsets takes at "
                                          "most 2, a majority of its 3 replica"):
        check_offsets_topic({**compact, "min.insync.replicas": "3"}, replication_factor=3)


def test_min_insync_replicas() -> None:
    assert min_insync_replicas({}) == 1
    assert min_insync_replicas({"min.insync.replicas": "2"}) == 2


def test_settings_follow_the_configs() -> None:
    settings = TopicSettings.of(
        {"cleanup.policy": "compact", "min.insync.replicas": "2", "retention.bytes": "10"},
        SETTINGS,
    )
    assert (settings.compact, settings.delete) == (True, False)
    assert settings.min_insync_replicas == 2
    assert settings.retention_bytes == 10
    assert settings.retention_ms == 3_600_000  # the node's log_retention_ms
    # Kafka's 0 ("index every batch") reaches the log as 1 byte, which does the same.
    assert TopicSettings.of({"index.interval.bytes": "0"}, SETTINGS).index_interval_bytes == 1


def test_describe_sources_and_synonyms() -> None:
    entries = {e.name: e for e in config_entries({"retention.ms": "1000", "flush.ms": "5"},
                                                 SETTINGS)}
    assert set(entries) == set(DEFAULTS)

    explicit = entries["retention.ms"]
    assert (explicit.value, explicit.source, explicit.type) == ("1000", SOURCE_TOPIC,
                                                                ConfigType.LONG)
    assert explicit.synonyms == (
        Synonym("retention.ms", "1000", SOURCE_TOPIC),
        Synonym("log.retention.ms", "3600000", SOURCE_STATIC_BROKER),
        Synonym("log.retention.ms", str(7 * 24 * 3600 * 1000), SOURCE_DEFAULT),
    )
    node = entries["retention.bytes"]
    assert (node.value, node.source, node.is_default) == ("5000", SOURCE_STATIC_BROKER, False)
    assert node.synonyms[0] == Synonym("log.retention.bytes", "5000", SOURCE_STATIC_BROKER)
    assert entries["max.message.bytes"].synonyms[0].name == "message.max.bytes"
    assert entries["segment.ms"].synonyms[0].name == "log.roll.ms"

    default = entries["cleanup.policy"]
    assert (default.value, default.source, default.is_default) == ("delete", SOURCE_DEFAULT, True)
    assert default.type == ConfigType.LIST
    assert default.synonyms == (Synonym("cleanup.policy", "delete", SOURCE_DEFAULT),)
    assert entries["flush.ms"].synonyms == (
        Synonym("flush.ms", "5", SOURCE_TOPIC), Synonym("flush.ms", LONG_MAX, SOURCE_DEFAULT)
    )
    assert entries["write.caching"].type == ConfigType.BOOLEAN
    assert entries["min.cleanable.dirty.ratio"].type == ConfigType.DOUBLE
    assert entries["max.message.bytes"].type == ConfigType.INT


def test_broker_entries_are_static_and_read_only() -> None:
    entries = {e.name: e for e in broker_entries(SETTINGS)}
    assert entries["log.retention.ms"].value == "3600000"
    assert entries["log.retention.bytes"].value == "5000"
    assert entries["log.retention.check.interval.ms"].value == "10000"
    assert all(e.read_only and e.source == SOURCE_STATIC_BROKER for e in entries.values())
