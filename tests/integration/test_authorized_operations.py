"""Authorized operations (KIP-430) in Metadata and DescribeGroups, from real clients and raw
requests.

A broker without an authorizer allows every operation a resource type supports, and Kafka
reports them as a bit field (bit n set for AclOperation code n): a topic's eight operations,
the cluster's seven, a group's three (Kafka's AuthHelper.authorizedOperations over
AclEntry.supportedOperations). A field that was not asked for holds INT32_MIN. Metadata asks
for topic operations from v8 and for cluster operations only in v8-10 (v11 moved them to
DescribeCluster); librdkafka caps Metadata at v10 for that reason when asked for them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

from tests.support.broker import BrokerProcess
from tests.support.raw_client import RawClient, request
from wire.errors import ErrorCode
from wire.messages.metadata import MetadataRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NOT_REQUESTED = -(2**31)
TOPIC_OPERATIONS = {
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}
CLUSTER_OPERATIONS = {
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
}
GROUP_OPERATIONS = {AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE}


def _bits(operations: set[AclOperation]) -> int:
    return sum(1 << op.value for op in operations)


@pytest.fixture(scope="module")
def topic(shared_broker: BrokerProcess) -> Iterator[str]:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=15)
    yield name


def _metadata(
    broker: BrokerProcess, version: int, names: list[str], *, topic_ops: bool, cluster_ops: bool
) -> object:
    with RawClient(broker.bootstrap) as client:
        return client.call(
            3,
            version,
            request(
                3,
                topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=topic_ops,
                include_cluster_authorized_operations=cluster_ops,
            ),
        )


@pytest.mark.parametrize("version", [8, 9, 10])
def test_metadata_v8_to_v10_answers_topic_and_cluster_operations(
    shared_broker: BrokerProcess, topic: str, version: int
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    asked = _metadata(shared_broker, version, [topic, missing], topic_ops=True, cluster_ops=True)
    by_name = {t.name: t for t in asked.topics}  # type: ignore[attr-defined]
    assert by_name[topic].error_code == ErrorCode.NONE
    assert by_name[topic].topic_authorized_operations == _bits(TOPIC_OPERATIONS)
    # Kafka describes a missing topic's operations too: they are the operations on its name.
    assert by_name[missing].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert by_name[missing].topic_authorized_operations == _bits(TOPIC_OPERATIONS)
    assert asked.cluster_authorized_operations == _bits(CLUSTER_OPERATIONS)  # type: ignore[attr-defined]

    plain = _metadata(shared_broker, version, [topic], topic_ops=False, cluster_ops=False)
    assert plain.topics[0].topic_authorized_operations == NOT_REQUESTED  # type: ignore[attr-defined]
    assert plain.cluster_authorized_operations == NOT_REQUESTED  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [11, 12])
def test_metadata_v11_plus_answers_topic_operations_only(
    shared_broker: BrokerProcess, topic: str, version: int
) -> None:
    asked = _metadata(shared_broker, version, [topic], topic_ops=True, cluster_ops=True)
    assert asked.topics[0].topic_authorized_operations == _bits(TOPIC_OPERATIONS)  # type: ignore[attr-defined]
    # v11+ has no cluster field on the wire: the decoder's default is what the client sees.
    assert asked.cluster_authorized_operations == NOT_REQUESTED  # type: ignore[attr-defined]


def test_confluent_describe_topics_and_cluster_with_operations(
    shared_broker: BrokerProcess, topic: str
) -> None:
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    described = admin.describe_topics(
        TopicCollection([topic]), request_timeout=10, include_authorized_operations=True
    )[topic].result(timeout=15)
    assert set(described.authorized_operations) == TOPIC_OPERATIONS
    assert len(described.partitions) == 2

    cluster = admin.describe_cluster(request_timeout=10, include_authorized_operations=True)
    assert set(cluster.result(timeout=15).authorized_operations) == CLUSTER_OPERATIONS

    # Not asked: librdkafka reports no operations (None) rather than an empty set.
    unasked = admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic]
    assert unasked.result(timeout=15).authorized_operations is None


def test_confluent_describe_groups_with_operations(shared_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    group = f"ops-group-{uuid.uuid4().hex[:8]}"
    described = admin.describe_consumer_groups(
        [group], request_timeout=10, include_authorized_operations=True
    )[group].result(timeout=30)
    assert set(described.authorized_operations) == GROUP_OPERATIONS


def test_kafka_python_describe_topics_reports_operations(
    shared_broker: BrokerProcess, topic: str
) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=10000)
    try:
        (described,) = admin.describe_topics([topic])
    finally:
        admin.close()
    assert described["error_code"] == ErrorCode.NONE
    # kafka-python turns the bit field into operation names (None when it is INT32_MIN).
    assert set(described["authorized_operations"]) == {op.name for op in TOPIC_OPERATIONS}
