"""Internal topics: exactly Kafka's two, created only by their owner, with the owner's layout.

Kafka's internal topics are `__consumer_offsets` and `__transaction_state` (Topic.isInternal),
not every name starting with "__". A Metadata request that may auto-create a missing
`__consumer_offsets` (Burrow's does, before any group exists) gets it made the way the group
coordinator makes it: `offsets_topic_partitions` partitions, compacted, as Kafka's
AutoTopicCreationManager does; never a plain 1-partition topic with `cleanup.policy=delete`.
`__transaction_state` has no owner here (no transactions) and is never created. A client's
CreateTopics of a missing internal topic is refused with INVALID_REQUEST.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from tests.support.broker import BrokerProcess
from tests.support.raw_client import RawClient, request
from wire.errors import ErrorCode
from wire.messages.create_topics import CreateTopicsRequest
from wire.messages.metadata import MetadataRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

OFFSETS = "__consumer_offsets"
TRANSACTIONS = "__transaction_state"
OFFSETS_PARTITIONS = 4  # not the default (50) nor the plain default (1): the layout shows
_WAIT_S = 30.0
_UNKNOWN_RETRIES = 50  # asking about a topic being created: 5 s at most


@pytest.fixture
def node(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path / "data",
        "--offsets-topic-partitions",
        str(OFFSETS_PARTITIONS),
        "--group-initial-rebalance-delay-ms",
        "100",
    ).start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def _metadata(broker: BrokerProcess, names: list[str], *, allow: bool) -> dict[str, Any]:
    with RawClient(broker.bootstrap) as client:
        answer = client.call(
            3,
            9,
            request(
                3,
                topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                allow_auto_topic_creation=allow,
            ),
        )
    return {t.name: t for t in answer.topics}


def _topic_names(broker: BrokerProcess) -> set[str]:
    with RawClient(broker.bootstrap) as client:
        answer = client.call(3, 9, request(3, topics=None))
    return {t.name for t in answer.topics}


def _cleanup_policy(broker: BrokerProcess, topic: str) -> str:
    """The topic's cleanup.policy. A topic its owner is still creating may be known to one
    shard and not yet to the one this connection lands on (each shard takes the new table
    in turn; CreateTopics answers once all have it): ask again while it is unknown."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    for _ in range(_UNKNOWN_RETRIES):
        try:
            entries = admin.describe_configs([resource], request_timeout=10)[resource].result(
                timeout=15)
            return str(entries["cleanup.policy"].value)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            time.sleep(0.1)
    raise AssertionError(f"{topic} unknown to DescribeConfigs after {_UNKNOWN_RETRIES} tries")


def _assert_owner_layout(broker: BrokerProcess) -> None:
    for _ in range(_UNKNOWN_RETRIES):  # see _cleanup_policy: a shard may not have it yet
        offsets = _metadata(broker, [OFFSETS], allow=False)[OFFSETS]
        if offsets.error_code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            break
        time.sleep(0.1)
    assert offsets.error_code == ErrorCode.NONE
    assert offsets.is_internal
    assert len(offsets.partitions) == OFFSETS_PARTITIONS
    assert _cleanup_policy(broker, OFFSETS) == "compact"


def test_metadata_names_offsets_topic_before_any_group(node: BrokerProcess) -> None:
    answer = _metadata(node, [OFFSETS], allow=True)[OFFSETS]
    # The answer waits for the coordinator, as for any auto-created topic here.
    assert answer.error_code == ErrorCode.NONE
    assert answer.is_internal
    assert len(answer.partitions) == OFFSETS_PARTITIONS
    _assert_owner_layout(node)


def test_confluent_list_topics_gets_owner_layout(node: BrokerProcess) -> None:
    """librdkafka's producer-type handles (AdminClient too) allow auto-creation by default."""
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    listed = admin.list_topics(OFFSETS, timeout=10).topics[OFFSETS]
    assert listed.error is None
    assert len(listed.partitions) == OFFSETS_PARTITIONS
    _assert_owner_layout(node)


def test_kafka_python_metadata_gets_owner_layout(node: BrokerProcess) -> None:
    """kafka-python names the topic with auto-creation allowed, as sarama (Burrow) does."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=node.bootstrap, max_block_ms=10000)
    try:
        partitions = producer.partitions_for(OFFSETS)
    finally:
        producer.close(timeout=5)
    assert partitions == set(range(OFFSETS_PARTITIONS))
    _assert_owner_layout(node)


def test_no_creation_without_auto_creation_then_a_commit_creates_it(node: BrokerProcess) -> None:
    unknown = _metadata(node, [OFFSETS, TRANSACTIONS], allow=False)
    for name in (OFFSETS, TRANSACTIONS):
        assert unknown[name].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert unknown[name].is_internal, name
    # A consumer's metadata (librdkafka: allow.auto.create.topics=false) creates nothing either.
    # But a consumer with a group.id also asks FindCoordinator at once, which does make the
    # topic (as in Kafka), racing the metadata request: either the topic is unknown, or it
    # exists as its owner made it, never as an ordinary topic the metadata made.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g-commit"})
    try:
        listed = consumer.list_topics(OFFSETS, timeout=10).topics[OFFSETS]
        if listed.error is not None:
            assert listed.error.code() == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            _assert_owner_layout(node)

        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        topic = f"t-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=15)
        consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=_WAIT_S)
    finally:
        consumer.close()
    assert committed[0].offset == 5
    _assert_owner_layout(node)


def test_transaction_state_is_never_auto_created(node: BrokerProcess) -> None:
    answer = _metadata(node, [TRANSACTIONS], allow=True)[TRANSACTIONS]
    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert answer.is_internal
    assert TRANSACTIONS not in _topic_names(node)


def _create(broker: BrokerProcess, names: list[str], *, validate_only: bool = False) -> Any:
    with RawClient(broker.bootstrap) as client:
        return client.call(
            19,
            5,
            request(
                19,
                topics=[
                    CreateTopicsRequest.CreatableTopic(
                        name=n, num_partitions=1, replication_factor=1
                    )
                    for n in names
                ],
                timeout_ms=5000,
                validate_only=validate_only,
            ),
        ).topics


def test_client_cannot_create_internal_topics(node: BrokerProcess) -> None:
    user = f"__user-{uuid.uuid4().hex[:8]}"  # starts with "__" but is no internal topic
    for validate_only in (True, False):
        results = _create(node, [OFFSETS, user, TRANSACTIONS], validate_only=validate_only)
        assert [r.name for r in results] == [OFFSETS, user, TRANSACTIONS]
        for refused in (results[0], results[2]):
            assert refused.error_code == ErrorCode.INVALID_REQUEST, refused
            assert "Creation of internal topic" in refused.error_message
        assert results[1].error_code == ErrorCode.NONE
    assert OFFSETS not in _topic_names(node) and TRANSACTIONS not in _topic_names(node)

    mine = _metadata(node, [user], allow=False)[user]
    assert mine.error_code == ErrorCode.NONE and not mine.is_internal

    _metadata(node, [OFFSETS], allow=True)  # now its owner made it
    (exists,) = _create(node, [OFFSETS])
    assert exists.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    _assert_owner_layout(node)
