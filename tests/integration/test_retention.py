"""Retention and DeleteRecords on a real node (2 shards) with real clients.

Retention deletes whole closed segments by age (`retention.ms`, against each segment's
largest timestamp) and by partition size (`retention.bytes`); the log start moves, ListOffsets
earliest follows it, a fetch below it gets OFFSET_OUT_OF_RANGE and a consumer there is reset
by `auto.offset.reset`. DeleteRecords moves the log start to any offset up to the high
watermark, durably. The node looks every `--log-cleanup-interval-ms` (200 ms here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonPartition
from kafka.errors import PolicyViolationError

from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import admin_client, create_topic
from tests.support.raw_client import RawClient
from wire.errors import ErrorCode
from wire.messages.delete_records import DeleteRecordsRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CLEANUP_INTERVAL_MS = 200
SEGMENT_BYTES = 64 * 1024  # the smallest segment.bytes Kafka accepts is 14 bytes; ours 1 MiB
VALUE = b"v" * 1000


@pytest.fixture
def node(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(
        tmp_path / "data", "--log-cleanup-interval-ms", str(CLEANUP_INTERVAL_MS)
    ).start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def produce(broker: BrokerProcess, topic: str, partition: int, count: int,
            timestamp_ms: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "linger.ms": 5, "batch.size": 16 * 1024})
    errors: list[KafkaError] = []
    for i in range(count):
        producer.produce(topic, value=VALUE, key=str(i).encode(), partition=partition,
                         timestamp=timestamp_ms or 0,
                         on_delivery=lambda err, _m: err and errors.append(err))
    assert producer.flush(30) == 0 and not errors, errors


def watermarks(broker: BrokerProcess, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        consumer.close()


def segment_files(broker: BrokerProcess, topic: str, partition: int) -> list[str]:
    return sorted(os.listdir(broker.data_dir / f"{topic}-{partition}"))


def read_from(broker: BrokerProcess, topic: str, partition: int, offset: int,
              reset: str = "earliest", expect: int = 1) -> list[int]:
    """Offsets a consumer assigned at `offset` reads (at most `expect`, within 15 s)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader",
                         "auto.offset.reset": reset, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        got: list[int] = []
        deadline = time.monotonic() + 15
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.offset())
        return got
    finally:
        consumer.close()


def test_retention_bytes_keeps_the_newest_segments(node: BrokerProcess) -> None:
    create_topic(node, "by-size", 2, **{"segment.bytes": str(1024 * 1024),
                                        "retention.bytes": str(3 * 1024 * 1024),
                                        "file.delete.delay.ms": "0"})
    for partition in (0, 1):
        produce(node, "by-size", partition, 6000)  # ~6 MiB: 6 segments and an active one

    def kept(partition: int) -> tuple[int, list[str], list[int]]:
        low = watermarks(node, "by-size", partition)[0]
        logs = [f for f in segment_files(node, "by-size", partition) if f.endswith(".log")]
        sizes = [(node.data_dir / f"by-size-{partition}" / f).stat().st_size for f in logs]
        return low, logs, sizes

    def settled(partition: int) -> bool:
        # A pass that ran while the produce was still going removed what was over the limit
        # then; the next one removes the rest.
        try:
            low, _, sizes = kept(partition)
        except FileNotFoundError:  # a segment removed between the listing and its stat
            return False
        return low > 0 and sum(sizes) - sizes[0] < 3 * 1024 * 1024

    for partition in (0, 1):
        wait_for(lambda p=partition: settled(p), 15,
                 f"retention.bytes moved partition {partition}'s log start")
        low, logs, sizes = kept(partition)
        assert watermarks(node, "by-size", partition)[1] == 6000
        # Kept: the newest segments that make up at least retention.bytes.
        assert int(logs[0].split(".")[0]) == low
        assert sum(sizes) >= 3 * 1024 * 1024 > sum(sizes) - sizes[0]
        wait_for(lambda p=partition: not any(
            f.endswith(".deleted") for f in segment_files(node, "by-size", p)), 15,
            "removed segments' files deleted")
        # A consumer whose position was deleted under it starts over at the log start.
        assert read_from(node, "by-size", partition, 0, reset="earliest") == [low]
        assert read_from(node, "by-size", partition, 0, reset="latest") == []
    samples = node.metrics()
    starts = {dict(labels)["partition"]: value for (name, labels), value in samples.items()
              if name == "krill_partition_log_start_offset" and dict(labels)["topic"] == "by-size"}
    assert starts == {str(p): watermarks(node, "by-size", p)[0] for p in (0, 1)}
    removed = sum(value for (name, _), value in samples.items()
                  if name == "krill_storage_segments_removed_total")
    assert removed >= 2  # at least one segment of each partition


def deleted_files_open(broker: BrokerProcess, topic: str) -> list[str]:
    """Files of `topic` that some shard process still holds open though they were deleted."""
    held = []
    for pid in broker.shard_pids():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:
                continue
            if f"/{topic}-" in target and target.endswith("(deleted)"):
                held.append(target)
    return held


def test_removed_segments_are_let_go_by_every_shard(node: BrokerProcess) -> None:
    # Both partitions read in full first: one is another shard's, whose files the reading
    # connection's shard keeps open for sendfile. Retention then removes most of them: no
    # shard may keep a removed file open (its disk space would stay taken).
    create_topic(node, "let-go", 2, **{"segment.bytes": str(1024 * 1024),
                                        "file.delete.delay.ms": "0"})
    for partition in (0, 1):
        produce(node, "let-go", partition, 4000)
        assert read_from(node, "let-go", partition, 0, expect=4000) == list(range(4000))
    admin = admin_client(node)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "let-go", incremental_configs=[
        ConfigEntry("retention.bytes", str(1024 * 1024),
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)
    for partition in (0, 1):
        wait_for(lambda p=partition: watermarks(node, "let-go", p)[0] > 0, 15,
                 f"retention moved partition {partition}'s start")
    wait_for(lambda: not deleted_files_open(node, "let-go"), 15,
             "every shard let go of the removed segment files")


def test_retention_ms_by_largest_timestamp(node: BrokerProcess) -> None:
    hour_ms = 3_600_000
    now_ms = int(time.time() * 1000)
    create_topic(node, "by-time", 1, **{"segment.bytes": str(1024 * 1024),
                                        "retention.ms": str(hour_ms)})
    produce(node, "by-time", 0, 2500, timestamp_ms=now_ms - 3 * hour_ms)  # old segments
    produce(node, "by-time", 0, 1500, timestamp_ms=now_ms)  # rolls: the old ones close
    wait_for(lambda: watermarks(node, "by-time", 0)[0] > 0, 15, "old segments deleted")
    low, high = watermarks(node, "by-time", 0)
    assert high == 4000
    # Every segment that holds a fresh record stays: the start is at or below offset 2500.
    assert 0 < low <= 2500
    offsets = read_from(node, "by-time", 0, low, expect=high - low)
    assert offsets == list(range(low, high))


def test_no_retention_with_minus_one(node: BrokerProcess) -> None:
    create_topic(node, "forever", 1, **{"segment.bytes": str(1024 * 1024),
                                        "retention.ms": "-1", "retention.bytes": "-1"})
    produce(node, "forever", 0, 3000, timestamp_ms=1_000)  # 1970: past any retention.ms
    time.sleep(5 * CLEANUP_INTERVAL_MS / 1000)
    assert watermarks(node, "forever", 0) == (0, 3000)


def test_segment_ms_rolls_on_the_next_append(node: BrokerProcess) -> None:
    create_topic(node, "rolling", 1, **{"segment.ms": "500"})
    produce(node, "rolling", 0, 3)
    time.sleep(0.7)
    produce(node, "rolling", 0, 3)
    logs = [f for f in segment_files(node, "rolling", 0) if f.endswith(".log")]
    assert logs == [f"{0:020d}.log", f"{3:020d}.log"]


def test_delete_records_from_two_clients_and_a_restart(node: BrokerProcess) -> None:
    create_topic(node, "trimmed", 2, **{"segment.bytes": str(1024 * 1024)})
    for partition in (0, 1):
        produce(node, "trimmed", partition, 3000)

    # confluent-kafka: partition 0 to offset 1500 (inside the second segment).
    admin = admin_client(node)
    futures = admin.delete_records([TopicPartition("trimmed", 0, 1500)])
    assert [f.result(15).low_watermark for f in futures.values()] == [1500]
    assert watermarks(node, "trimmed", 0) == (1500, 3000)
    assert read_from(node, "trimmed", 0, 1499, reset="earliest") == [1500]
    # The first segment (0..~1000) is wholly below the start: removed.
    wait_for(lambda: f"{0:020d}.log" not in segment_files(node, "trimmed", 0), 15,
             "the segment below the new start removed")

    # kafka-python: partition 1 to its high watermark (-1).
    client = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=15_000)
    try:
        result = client.delete_records({KafkaPythonPartition("trimmed", 1): -1})
        assert result[KafkaPythonPartition("trimmed", 1)]["low_watermark"] == 3000
    finally:
        client.close()
    assert watermarks(node, "trimmed", 1) == (3000, 3000)

    # Durable: a kill -9 right after keeps both starts.
    node.kill9()
    node.restart()
    assert watermarks(node, "trimmed", 0) == (1500, 3000)
    assert watermarks(node, "trimmed", 1) == (3000, 3000)
    assert read_from(node, "trimmed", 0, 0, reset="earliest") == [1500]


def test_delete_records_refusals(node: BrokerProcess) -> None:
    create_topic(node, "short", 1)
    create_topic(node, "keyed", 1, **{"cleanup.policy": "compact"})
    produce(node, "short", 0, 10)
    admin = admin_client(node)

    def error_of(topic: str, offset: int) -> KafkaError:
        future = admin.delete_records([TopicPartition(topic, 0, offset)])
        with pytest.raises(KafkaException) as raised:
            next(iter(future.values())).result(15)
        return raised.value.args[0]

    assert error_of("short", 11).code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert error_of("keyed", 0).code() == KafkaError.POLICY_VIOLATION
    # Clients check these two before sending: ask on the wire.
    Request = DeleteRecordsRequest
    request = Request(timeout_ms=5000, topics=[
        Request.DeleteRecordsTopic(name=name, partitions=[
            Request.DeleteRecordsPartition(partition_index=0, offset=0)])
        for name in ("missing", "__consumer_offsets")])
    with RawClient(node.bootstrap) as client:
        response = client.call(21, 2, request)
    assert {t.name: t.partitions[0].error_code for t in response.topics} == {
        "missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "__consumer_offsets": ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
    # Nothing moved.
    assert watermarks(node, "short", 0) == (0, 10)
    client = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=15_000)
    try:
        with pytest.raises(PolicyViolationError):
            client.delete_records({KafkaPythonPartition("keyed", 0): 0})
    finally:
        client.close()
