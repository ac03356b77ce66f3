"""ListOffsets v0, answer for answer as Kafka gives it (Burrow and other Sarama tools ask v0).

Records come from confluent-kafka; the lookups are raw v0 requests, so the version on the
wire is the one under test. Kafka's rule (UnifiedLog.legacyFetchOffsetsBefore): the log is
its segments' (base offset, last-modified) points plus (log end, now); a log of one segment
answers -1 with [high watermark, log start][:max_num_offsets], -2 with [log start], a time T
with the points at or before T, newest first.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from actors.handlers.k02_list_offsets import offsets_before
from tests.support.broker import BrokerProcess
from tests.support.kafka import create_topic
from tests.support.raw_client import RawClient
from wire.errors import ErrorCode
from wire.messages.list_offsets import ListOffsetsRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LATEST, EARLIEST = -1, -2
TOPIC = "legacy-offsets"
RECORDS = {0: 7, 1: 3, 2: 0}  # partition -> records produced (partition 2 stays empty)
FIRST_TIMESTAMP_MS = 1_000  # CreateTime of the first record; each next one is 1 ms later
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def topic(shared_broker: BrokerProcess) -> str:
    """Partition p holds RECORDS[p] records stamped FIRST_TIMESTAMP_MS, +1 ms, ... (CreateTime)."""
    create_topic(shared_broker, TOPIC, partitions=len(RECORDS))
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap, "acks": "all"})
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for partition, count in RECORDS.items():
        for i in range(count):
            producer.produce(
                TOPIC,
                value=f"{partition}-{i}".encode(),
                partition=partition,
                timestamp=FIRST_TIMESTAMP_MS + i,
                on_delivery=on_delivery,
            )
    assert producer.flush(30) == 0 and not failed, failed
    return TOPIC


def _v0(
    broker: BrokerProcess, lookups: dict[str, list[tuple[int, int, int]]]
) -> dict[tuple[str, int], tuple[int, list[int]]]:
    """{topic: [(partition, timestamp, max_num_offsets)]} -> {(topic, partition): (error,
    old_style_offsets)}, from one v0 request on a fresh connection."""
    request = ListOffsetsRequest(
        replica_id=-1,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=name,
                partitions=[
                    ListOffsetsRequest.ListOffsetsPartition(
                        partition_index=p, timestamp=ts, max_num_offsets=n
                    )
                    for p, ts, n in parts
                ],
            )
            for name, parts in lookups.items()
        ],
    )
    with RawClient(broker.bootstrap) as client:
        response = client.call(2, 0, request)
    return {
        (t.name, p.partition_index): (p.error_code, list(p.old_style_offsets))
        for t in response.topics
        for p in t.partitions
    }


def _all(timestamp: int, max_num_offsets: int) -> dict[str, list[tuple[int, int, int]]]:
    return {TOPIC: [(p, timestamp, max_num_offsets) for p in RECORDS]}


def _watermarks(broker: BrokerProcess) -> dict[int, tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "v0-watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10) for p in RECORDS
        }
    finally:
        consumer.close()


def test_latest_and_earliest_match_the_watermarks(shared_broker: BrokerProcess, topic: str) -> None:
    latest = _v0(shared_broker, _all(LATEST, 1))
    earliest = _v0(shared_broker, _all(EARLIEST, 1))
    assert latest == {(topic, p): (ErrorCode.NONE, [n]) for p, n in RECORDS.items()}
    assert earliest == {(topic, p): (ErrorCode.NONE, [0]) for p in RECORDS}
    watermarks = _watermarks(shared_broker)  # confluent-kafka asks ListOffsets v1+
    assert {p: (earliest[topic, p][1][0], latest[topic, p][1][0]) for p in RECORDS} == watermarks


def test_max_num_offsets_above_one(shared_broker: BrokerProcess, topic: str) -> None:
    # One segment: the points are (log start, newest record) and (high watermark, now).
    assert _v0(shared_broker, _all(LATEST, 5)) == {
        (topic, 0): (ErrorCode.NONE, [7, 0]),
        (topic, 1): (ErrorCode.NONE, [3, 0]),
        (topic, 2): (ErrorCode.NONE, [0]),  # an empty segment has no log-end point
    }
    assert _v0(shared_broker, _all(EARLIEST, 5)) == {
        (topic, p): (ErrorCode.NONE, [0]) for p in RECORDS
    }
    assert _v0(shared_broker, _all(LATEST, 0)) == {
        (topic, p): (ErrorCode.NONE, []) for p in RECORDS
    }


def test_by_time_takes_the_points_at_or_before_it(shared_broker: BrokerProcess, topic: str) -> None:
    # The newest records: partition 0 at 1006 ms, partition 1 at 1002 ms; partition 2 empty.
    def at(timestamp: int) -> dict[int, list[int]]:
        answers = _v0(shared_broker, _all(timestamp, 5))
        assert {error for error, _ in answers.values()} == {ErrorCode.NONE}
        return {p: offsets for (_, p), (_, offsets) in answers.items()}

    assert at(int(time.time() * 1000) + HOUR_MS) == {0: [7, 0], 1: [3, 0], 2: [0]}
    assert at(FIRST_TIMESTAMP_MS + 6) == {0: [0], 1: [0], 2: [0]}
    assert at(FIRST_TIMESTAMP_MS + 5) == {0: [], 1: [0], 2: [0]}
    assert at(FIRST_TIMESTAMP_MS + 1) == {0: [], 1: [], 2: [0]}
    assert at(-3) == {0: [], 1: [], 2: []}  # MAX_TIMESTAMP is no v0 code: a time before all


def test_unknown_partition_and_topic(shared_broker: BrokerProcess, topic: str) -> None:
    answers = _v0(
        shared_broker,
        {topic: [(0, LATEST, 1), (9, LATEST, 1)], "no-such-topic": [(0, EARLIEST, 1)]},
    )
    assert answers == {
        (topic, 0): (ErrorCode.NONE, [7]),
        (topic, 9): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
        ("no-such-topic", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
    }


def test_negative_max_num_offsets_is_a_server_error(
    shared_broker: BrokerProcess, topic: str
) -> None:
    # Kafka allocates an array of that size and answers the exception's code.
    assert _v0(shared_broker, {topic: [(0, LATEST, -1)]}) == {
        (topic, 0): (ErrorCode.UNKNOWN_SERVER_ERROR, [])
    }


@pytest.mark.parametrize(
    ("timestamp", "max_num_offsets", "expected"),
    [
        (LATEST, 3, [70, 40, 0]),
        (LATEST, 2, [70, 40]),
        (EARLIEST, 3, [0]),
        (-4, 3, [0]),  # EARLIEST_LOCAL, as Kafka 3.x
        (-3, 3, []),  # MAX_TIMESTAMP means nothing to v0: no point is that old
        (999, 3, []),
        (1000, 3, [0]),
        (1500, 3, [0]),
        (2000, 5, [40, 0]),
        (5000, 5, [70, 40, 0]),
        (5000, 0, []),
    ],
)
def test_kafka_legacy_rule_on_segment_points(
    timestamp: int, max_num_offsets: int, expected: list[int]
) -> None:
    points = [(0, 1000), (40, 2000), (70, 5000)]  # three segments' (base, last modified)
    assert offsets_before(points, timestamp, max_num_offsets) == expected
