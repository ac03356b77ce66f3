"""AlterConfigs and IncrementalAlterConfigs against a real node, with real clients.

A change goes through the Controller on shard 0, is written, reaches every shard's
partitions without a restart and survives one; refused keys, broker resources and
malformed requests get Kafka's error codes with a message naming the key; DescribeConfigs
says where each value comes from; min.insync.replicas is enforced on acks=all produces.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from shards.shard_table import shard_of
from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import admin_client, create_topic
from tests.support.raw_client import RawClient
from wire.errors import ErrorCode
from wire.messages.alter_configs import AlterConfigsRequest
from wire.messages.describe_configs import DescribeConfigsRequest
from wire.messages.incremental_alter_configs import IncrementalAlterConfigsRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OFFSETS = "__consumer_offsets"
SHARDS = 2
NODE_RETENTION_BYTES = 7_000_000  # the node's retention.bytes, so its source is visible
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44
DESCRIBE_CONFIGS = 32
BIG_VALUE_BYTES = 20_000  # one record whose batch is over the lowered max.message.bytes
LOWERED_MAX_MESSAGE_BYTES = 10_000
SHARD_TRIES_MAX = 60  # fresh connections until each shard has served an alteration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("alter") / "data",
        "--retention-bytes", str(NODE_RETENTION_BYTES),
        "--offsets-topic-partitions", "2",
        smp=SHARDS,
    )  # fmt: skip
    broker.start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def new_topic(broker: BrokerProcess, partitions: int = 1, **configs: str) -> str:
    name = f"alter-{uuid.uuid4().hex[:8]}"
    create_topic(broker, name, partitions, **configs)
    return name


def incremental(
    broker: BrokerProcess,
    topic: str,
    *ops: tuple[str, AlterConfigOpType, str | None],
    validate_only: bool = False,
    resource_type: ResourceType = ResourceType.TOPIC,
) -> None:
    admin = admin_client(broker)
    entries = [ConfigEntry(key, value, incremental_operation=op) for key, op, value in ops]
    resource = ConfigResource(resource_type, topic, incremental_configs=entries)
    futures = admin.incremental_alter_configs(
        [resource], validate_only=validate_only, request_timeout=10
    )
    futures[resource].result(timeout=15)


def replace_all(
    broker: BrokerProcess, topic: str, configs: dict[str, str], validate_only: bool = False
) -> None:
    """The legacy AlterConfigs (confluent-kafka's deprecated `alter_configs`)."""
    admin = admin_client(broker)
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config=configs)
    with pytest.warns(DeprecationWarning):
        futures = admin.alter_configs([resource], validate_only=validate_only, request_timeout=10)
    futures[resource].result(timeout=15)


def describe(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    admin = admin_client(broker)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([resource], request_timeout=10)[resource].result(15))


def refused(call: Any) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        call()
    error = caught.value.args[0]
    assert isinstance(error, KafkaError)
    return error


SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
APPEND, SUBTRACT = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT


# Round trips -------------------------------------------------------------------------------


def test_incremental_round_trip(node: BrokerProcess) -> None:
    topic = new_topic(node)
    incremental(
        node, topic, ("retention.ms", SET, "3600000"), ("cleanup.policy", APPEND, "compact")
    )
    configs = describe(node, topic)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete,compact"

    incremental(node, topic, ("retention.ms", DELETE, None), ("cleanup.policy", SUBTRACT, "delete"))
    configs = describe(node, topic)
    assert configs["retention.ms"].value == str(7 * 24 * 3600 * 1000)  # the node's setting
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_alter_configs_replaces_the_whole_set(node: BrokerProcess) -> None:
    topic = new_topic(node, **{"retention.ms": "1000", "write.caching": "true"})
    replace_all(node, topic, {"segment.ms": "60000"})
    configs = describe(node, topic)
    assert configs["segment.ms"].value == "60000"
    assert configs["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # Left out, so back to their defaults, as Kafka's AlterConfigs does.
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["write.caching"].value == "false"
    assert configs["write.caching"].source == ConfigSource.DEFAULT_CONFIG.value


def test_validate_only_changes_nothing(node: BrokerProcess) -> None:
    topic = new_topic(node, **{"retention.ms": "1000"})
    before = {k: (e.value, e.source) for k, e in describe(node, topic).items()}
    incremental(node, topic, ("segment.ms", SET, "60000"), validate_only=True)
    replace_all(node, topic, {"segment.ms": "60000"}, validate_only=True)
    # A bad change is refused as it would be for real.
    error = refused(lambda: incremental(
        node, topic, ("preallocate", SET, "true"), validate_only=True))
    assert error.code() == KafkaError.INVALID_CONFIG
    after = {k: (e.value, e.source) for k, e in describe(node, topic).items()}
    assert after == before


REFUSED = [
    ("compression.type", "gzip"),
    ("preallocate", "true"),
    ("unclean.leader.election.enable", "true"),
    ("message.timestamp.difference.max.ms", "1000"),
    ("message.timestamp.before.max.ms", "1000"),
    ("message.timestamp.after.max.ms", "1000"),
    ("local.retention.ms", "1000"),
    ("local.retention.bytes", "1000"),
    ("remote.storage.enable", "true"),
    ("follower.replication.throttled.replicas", "*"),
    ("leader.replication.throttled.replicas", "0:0"),
    ("no.such.key", "1"),
    ("retention.ms", "soon"),
]


@pytest.fixture(scope="module")
def plain_topic(node: BrokerProcess) -> str:
    return new_topic(node)


@pytest.mark.parametrize("key, value", REFUSED)
def test_refused_keys_get_invalid_config_naming_the_key(
    node: BrokerProcess, plain_topic: str, key: str, value: str
) -> None:
    error = refused(lambda: incremental(node, plain_topic, (key, SET, value)))
    assert error.code() == KafkaError.INVALID_CONFIG
    assert key in error.str() and "\n" not in error.str()
    explicit = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert key not in {k for k, e in describe(node, plain_topic).items() if e.source == explicit}


def test_refused_at_creation_too(node: BrokerProcess) -> None:
    error = refused(lambda: new_topic(node, **{"compression.type": "lz4"}))
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "compression.type" in error.str() and "never recompresses" in error.str()


def test_append_to_a_key_that_is_not_a_list(node: BrokerProcess, plain_topic: str) -> None:
    error = refused(lambda: incremental(node, plain_topic, ("retention.ms", APPEND, "5")))
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in error.str()


def test_unknown_topic(node: BrokerProcess) -> None:
    error = refused(lambda: incremental(node, "no-such-topic", ("retention.ms", SET, "5")))
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_broker_resource_is_refused_not_ignored(node: BrokerProcess) -> None:
    error = refused(lambda: incremental(
        node, "0", ("log.retention.ms", SET, "5"), resource_type=ResourceType.BROKER))
    assert error.code() == KafkaError.INVALID_REQUEST
    assert "dynamic broker configs are not supported" in error.str()
    admin = admin_client(node)
    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([resource], request_timeout=10)[resource].result(15)
    assert configs["log.retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert configs["log.retention.ms"].is_read_only
    assert configs["log.retention.bytes"].value == str(NODE_RETENTION_BYTES)
    assert configs["log.retention.check.interval.ms"].value == "10000"
    # Deleting broker keys (what kafka-reassign-partitions.sh --verify does to replication
    # throttles) is nothing to do: no dynamic broker config is ever set.
    incremental(node, "0", ("leader.replication.throttled.rate", DELETE, None),
                ("follower.replication.throttled.rate", DELETE, None),
                resource_type=ResourceType.BROKER)


def test_every_version_on_the_wire(node: BrokerProcess, plain_topic: str) -> None:
    """AlterConfigs 0-2 and IncrementalAlterConfigs 0-1, including what clients never send:
    a resource named twice, an unknown operation, a null value to set, an unknown type."""
    with RawClient(node.bootstrap) as client:
        for version in range(3):
            answer = client.call(ALTER_CONFIGS, version, _alter(plain_topic, f"{version + 1}000"))
            assert [r.error_code for r in answer.responses] == [ErrorCode.NONE]
            assert describe(node, plain_topic)["segment.ms"].value == f"{version + 1}000"
        for version in range(2):
            answer = client.call(INCREMENTAL_ALTER_CONFIGS, version, _incremental(
                (2, plain_topic, [("segment.ms", 0, f"{version + 5}000")]),
                (2, plain_topic, [("segment.ms", 1, None)]),
                (2, "x", [("segment.ms", 9, "1")]),
                (2, "y", [("segment.ms", 0, None)]),
                (8, "0", []),
            ))
            assert [(r.resource_name, r.error_code) for r in answer.responses] == [
                (plain_topic, ErrorCode.INVALID_REQUEST),
                (plain_topic, ErrorCode.INVALID_REQUEST),
                ("x", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("y", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("0", ErrorCode.INVALID_REQUEST),
            ]
            answer = client.call(INCREMENTAL_ALTER_CONFIGS, version, _incremental(
                (2, plain_topic, [("segment.ms", 9, "1")]),
            ))
            assert answer.responses[0].error_code == ErrorCode.INVALID_REQUEST
            assert "unknown operation 9" in answer.responses[0].error_message
            answer = client.call(INCREMENTAL_ALTER_CONFIGS, version, _incremental(
                (2, plain_topic, [("segment.ms", 0, None)]),
            ))
            assert answer.responses[0].error_code == ErrorCode.INVALID_REQUEST
            assert "null value" in answer.responses[0].error_message
    # AlterConfigs replaced the set with segment.ms alone; nothing after changed it.
    assert describe(node, plain_topic)["segment.ms"].value == "3000"


def _alter(topic: str, segment_ms: str) -> AlterConfigsRequest:
    resource = AlterConfigsRequest.AlterConfigsResource
    config = AlterConfigsRequest.AlterableConfig
    return AlterConfigsRequest(
        resources=[resource(resource_type=2, resource_name=topic,
                            configs=[config(name="segment.ms", value=segment_ms)])],
        validate_only=False,
    )


def _incremental(
    *resources: tuple[int, str, list[tuple[str, int, str | None]]]
) -> IncrementalAlterConfigsRequest:
    cls = IncrementalAlterConfigsRequest
    return cls(
        resources=[
            cls.AlterConfigsResource(
                resource_type=kind,
                resource_name=name,
                configs=[cls.AlterableConfig(name=k, config_operation=op, value=v)
                         for k, op, v in ops],
            )
            for kind, name, ops in resources
        ],
        validate_only=False,
    )


# DescribeConfigs ------------------------------------------------------------------------


def test_describe_sources_synonyms_and_types(node: BrokerProcess) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KafkaConfigResource
    from kafka.admin import ConfigResourceType

    topic = new_topic(node, **{"retention.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10000)
    try:
        answer = admin.describe_configs(
            [KafkaConfigResource(ConfigResourceType.TOPIC, topic)], include_synonyms=True,
            config_filter="all",
        )
    finally:
        admin.close()
    configs = answer["topic"][topic]
    explicit = configs["retention.ms"]
    assert explicit["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert explicit["config_type"] == "LONG"
    assert [(s["name"], s["value"], s["source"]) for s in explicit["synonyms"]] == [
        ("retention.ms", "1000", "DYNAMIC_TOPIC_CONFIG"),
        ("log.retention.ms", str(7 * 24 * 3600 * 1000), "STATIC_BROKER_CONFIG"),
        ("log.retention.ms", str(7 * 24 * 3600 * 1000), "DEFAULT_CONFIG"),
    ]
    node_value = configs["retention.bytes"]
    assert node_value["value"] == str(NODE_RETENTION_BYTES)
    assert node_value["config_source"] == "STATIC_BROKER_CONFIG"
    assert [(s["name"], s["value"], s["source"]) for s in node_value["synonyms"]] == [
        ("log.retention.bytes", str(NODE_RETENTION_BYTES), "STATIC_BROKER_CONFIG"),
        ("log.retention.bytes", "-1", "DEFAULT_CONFIG"),
    ]
    default = configs["cleanup.policy"]
    assert default["config_source"] == "DEFAULT_CONFIG" and default["config_type"] == "LIST"
    assert configs["min.cleanable.dirty.ratio"]["config_type"] == "DOUBLE"
    assert configs["write.caching"]["config_type"] == "BOOLEAN"


def test_describe_v0_reports_is_default(node: BrokerProcess) -> None:
    topic = new_topic(node, **{"retention.ms": "1000"})
    resource = DescribeConfigsRequest.DescribeConfigsResource
    with RawClient(node.bootstrap) as client:
        answer = client.call(DESCRIBE_CONFIGS, 0, DescribeConfigsRequest(
            resources=[resource(resource_type=2, resource_name=topic, configuration_keys=None)],
        ))
    configs = {c.name: c for c in answer.results[0].configs}
    assert not configs["retention.ms"].is_default
    assert not configs["retention.bytes"].is_default  # the node's setting
    assert configs["cleanup.policy"].is_default


# Taking effect ------------------------------------------------------------------------------


def _produce_one(broker: BrokerProcess, topic: str, partition: int, size: int,
                 acks: str = "all") -> KafkaError | None:
    producer = Producer({
        "bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 0, "retries": 0,
        "message.max.bytes": 1_000_000, "compression.type": "none",
        "message.timeout.ms": 10_000,
    })  # fmt: skip
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value=b"v" * size, partition=partition,
                     on_delivery=lambda error, _message: outcome.append(error))
    assert producer.flush(15) == 0
    return outcome[0]


def _partition_per_shard(topic: str, partitions: int) -> dict[int, int]:
    owners: dict[int, int] = {}
    for index in range(partitions):
        owners.setdefault(shard_of(topic, index, SHARDS), index)
    assert len(owners) == SHARDS, "every shard owns a partition"
    return owners


def test_max_message_bytes_lowered_takes_effect_on_every_shard(node: BrokerProcess) -> None:
    topic = new_topic(node, partitions=4)
    owners = _partition_per_shard(topic, 4)
    for partition in owners.values():
        assert _produce_one(node, topic, partition, BIG_VALUE_BYTES) is None
    incremental(node, topic, ("max.message.bytes", SET, str(LOWERED_MAX_MESSAGE_BYTES)))
    for partition in owners.values():
        error = _produce_one(node, topic, partition, BIG_VALUE_BYTES)
        assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE, error
        assert _produce_one(node, topic, partition, BIG_VALUE_BYTES // 4) is None
    incremental(node, topic, ("max.message.bytes", DELETE, None))
    for partition in owners.values():
        assert _produce_one(node, topic, partition, BIG_VALUE_BYTES) is None


def _served(broker: BrokerProcess) -> dict[str, float]:
    """IncrementalAlterConfigs requests each shard has answered."""
    name = "krill_kafka_request_latency_seconds_count"
    return {
        labels["shard"]: value
        for (metric, pairs), value in broker.metrics().items()
        if metric == name and (labels := dict(pairs)).get("api") == "IncrementalAlterConfigs"
    }


def test_alterations_from_either_shard_reach_the_controller(node: BrokerProcess) -> None:
    """The Controller runs on shard 0: an alteration a connection on shard 1 receives
    crosses the pipe to it, and every shard's table has the answer's value."""
    topic = new_topic(node)
    before = _served(node)
    for attempt in itertools.count():
        assert attempt < SHARD_TRIES_MAX, "no connection landed on each shard"
        with RawClient(node.bootstrap) as client:
            answer = client.call(INCREMENTAL_ALTER_CONFIGS, 1, _incremental(
                (2, topic, [("retention.ms", 0, str(1000 + attempt))])))
        assert answer.responses[0].error_code == ErrorCode.NONE
        served = _served(node)
        if all(served.get(str(s), 0) > before.get(str(s), 0) for s in range(SHARDS)):
            break
    for _ in range(4):  # fresh connections, whichever shard they land on
        assert describe(node, topic)["retention.ms"].value == str(1000 + attempt)


def test_min_insync_replicas_is_enforced_on_acks_all(node: BrokerProcess) -> None:
    topic = new_topic(node, **{"min.insync.replicas": "2"})
    error = _produce_one(node, topic, 0, 10, acks="all")
    assert error is not None and error.code() == KafkaError.NOT_ENOUGH_REPLICAS, error
    assert _produce_one(node, topic, 0, 10, acks="1") is None
    incremental(node, topic, ("min.insync.replicas", DELETE, None))
    assert _produce_one(node, topic, 0, 10, acks="all") is None


def test_offsets_topic_stays_compact(node: BrokerProcess) -> None:
    admin = admin_client(node)
    admin.list_topics(OFFSETS, timeout=10)  # made by its owner, the group coordinator

    def exists() -> bool:
        try:
            return describe(node, OFFSETS)["cleanup.policy"].value == "compact"
        except KafkaException:
            return False

    wait_for(exists, 30, f"{OFFSETS} created")
    for change in (("cleanup.policy", SET, "delete"), ("cleanup.policy", APPEND, "delete"),
                   ("cleanup.policy", DELETE, None), ("min.insync.replicas", SET, "2")):
        error = refused(lambda change=change: incremental(node, OFFSETS, change))
        assert error.code() == KafkaError.INVALID_CONFIG and change[0] in error.str()
    incremental(node, OFFSETS, ("segment.ms", SET, "3600000"))
    configs = describe(node, OFFSETS)
    assert configs["segment.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "compact"


def test_kafka_python_alter_configs(node: BrokerProcess) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KafkaConfigResource
    from kafka.admin import ConfigResourceType

    topic = new_topic(node, **{"retention.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10000)
    try:
        resource = KafkaConfigResource(ConfigResourceType.TOPIC, topic,
                                       configs={"segment.ms": "120000"})
        assert admin.alter_configs([resource], incremental=False) == {"topic": {topic: "OK"}}
        configs = describe(node, topic)
        assert configs["segment.ms"].value == "120000"
        # kafka-python's AlterConfigs sends the topic's other explicit keys along (it knows
        # that the request replaces the whole set), so retention.ms stays.
        assert configs["retention.ms"].value == "1000"
        assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

        resource = KafkaConfigResource(ConfigResourceType.TOPIC, topic,
                                       configs={"retention.ms": "5000"})
        assert admin.alter_configs([resource], incremental=True) == {"topic": {topic: "OK"}}
        configs = describe(node, topic)
        assert configs["retention.ms"].value == "5000"
        assert configs["segment.ms"].value == "120000"
    finally:
        admin.close()


# Across a restart -------------------------------------------------------------------------


def test_a_change_survives_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", smp=SHARDS).start()
    try:
        topic = new_topic(broker, partitions=2)
        incremental(broker, topic,
                    ("max.message.bytes", SET, str(LOWERED_MAX_MESSAGE_BYTES)),
                    ("cleanup.policy", SET, "compact,delete"))
        assert broker.stop() == 0
        broker.start()
        configs = describe(broker, topic)
        assert configs["max.message.bytes"].value == str(LOWERED_MAX_MESSAGE_BYTES)
        assert configs["cleanup.policy"].value == "compact,delete"
        for partition in range(2):
            error = _produce_one(broker, topic, partition, BIG_VALUE_BYTES)
            assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE, error
    finally:
        broker.kill9() if broker.alive() else broker.stop()
