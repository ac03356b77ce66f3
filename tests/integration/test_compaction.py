"""Compaction on a real node (2 shards) with real clients: the latest value of every key stays,
offsets never change, tombstones go after delete.retention.ms, an idempotent producer's state
survives a clean and a restart, a kill -9 in the middle of a clean loses nothing compaction
would have kept, and a record without a key is refused.

The node looks every 200 ms (`--log-cleanup-interval-ms`); topics use 1 MiB segments and
`min.cleanable.dirty.ratio` 0.01, so a clean follows soon after the records.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from actors.group import offsets_partition
from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import admin_client, create_topic
from tests.support.raw_client import RawClient
from wire.errors import ErrorCode
from wire.messages.produce import ProduceRequest, ProduceResponse
from wire.records import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROLL = b"x" * 900_000  # a value that fills most of a segment: the one before it closes
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": str(1024 * 1024),
             "min.cleanable.dirty.ratio": "0.01"}


@pytest.fixture
def node(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", "--log-cleanup-interval-ms", "200").start()
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def produce(broker: BrokerProcess, topic: str, records: list[tuple[bytes, bytes | None]],
            **conf: object) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "linger.ms": 5, **conf})
    errors: list[KafkaError] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, _m: err and errors.append(err))
    assert producer.flush(30) == 0 and not errors, errors


def seal(broker: BrokerProcess, topic: str) -> None:
    """Close the segment holding what was produced so far (compaction never touches the
    active one): two values that each fill most of a segment."""
    produce(broker, topic, [(b"roll", ROLL), (b"roll", ROLL)], **{"batch.size": 1_000_000})


def read_all(broker: BrokerProcess, topic: str, isolation: str = "read_committed"
             ) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from the start to the high watermark."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check",
                         "enable.auto.commit": False, "isolation.level": isolation})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 30
        while (not got or got[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.key(), msg.value()))
        return got
    finally:
        consumer.close()


def log_files(broker: BrokerProcess, topic: str) -> list[str]:
    return sorted(os.listdir(broker.data_dir / f"{topic}-0"))


def cleaned(broker: BrokerProcess, topic: str, records_at_most: int) -> bool:
    return len(read_all(broker, topic)) <= records_at_most


def test_latest_value_per_key_and_offsets_unchanged(node: BrokerProcess) -> None:
    create_topic(node, "latest", 1, **COMPACTED)
    records = [(f"k{i % 50}".encode(), f"{i}:".encode() + b"v" * 500) for i in range(8000)]
    produce(node, "latest", records)
    seal(node, "latest")
    wait_for(lambda: cleaned(node, "latest", 200), 30, "the log compacted")
    got = read_all(node, "latest")
    latest = {key: (offset, value) for offset, (key, value) in enumerate(records)}
    for offset, key, value in got:
        if key == b"roll":
            continue
        # Every record left is its key's latest, at the offset it was written at.
        assert latest[key] == (offset, value)
    assert {key for _, key, _ in got} == set(latest) | {b"roll"}
    samples = node.metrics()  # per shard: summed

    def total(name: str) -> float:
        return sum(value for (n, _), value in samples.items() if n == name)

    assert total("krill_storage_compactions_total") >= 1
    assert total("krill_storage_compaction_removed_records_total") >= 7900


def test_tombstones_stay_delete_retention_ms_then_go(node: BrokerProcess) -> None:
    create_topic(node, "tombs", 1, **COMPACTED, **{"delete.retention.ms": "8000"})
    produce(node, "tombs", [(f"k{i}".encode(), b"v" * 1000) for i in range(2000)])
    produce(node, "tombs", [(f"k{i}".encode(), None) for i in range(1000)])  # delete half
    seal(node, "tombs")
    # First clean: the deleted keys' values go; their tombstones stay (a consumer catching
    # up must see the delete).
    # (2002: the 1,000 kept values, 1,000 tombstones, a "roll" in a closed segment and one in
    # the active segment.)
    wait_for(lambda: cleaned(node, "tombs", 2002), 30, "values of deleted keys removed")
    got = read_all(node, "tombs")
    tombstones = {key for _, key, value in got if value is None}
    assert tombstones == {f"k{i}".encode() for i in range(1000)}
    # After delete.retention.ms, a later clean removes them.
    wait_for(lambda: cleaned(node, "tombs", 1002), 30, "tombstones removed past the horizon")
    got = read_all(node, "tombs")
    assert {key for _, key, _ in got} == {f"k{i}".encode() for i in range(1000, 2000)} | {
        b"roll"}


def test_an_aborted_transaction_never_replaces_a_committed_value(node: BrokerProcess) -> None:
    """Kafka's cleaner: an aborted transaction's records are left out of the key map and
    removed; a committed transaction's compact as any."""
    create_topic(node, "txns", 1, **COMPACTED)
    produce(node, "txns", [(b"a", b"1"), (b"b", b"1")])
    for name, records, commit in (("aborts", [(b"a", b"2"), (b"c", b"2")], False),
                                  ("commits", [(b"b", b"3")], True)):
        producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": name})
        producer.init_transactions(30)
        producer.begin_transaction()
        for key, value in records:
            producer.produce("txns", key=key, value=value, partition=0)
        assert producer.flush(30) == 0  # in the log before the abort
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    seal(node, "txns")

    def values(isolation: str) -> list[tuple[bytes, bytes | None]]:
        return [(k, v) for _, k, v in read_all(node, "txns", isolation) if k != b"roll"]

    wait_for(lambda: values("read_uncommitted") == [(b"a", b"1"), (b"b", b"3")], 30,
             "the aborted records and the superseded b removed")
    assert values("read_committed") == [(b"a", b"1"), (b"b", b"3")]


def test_a_record_without_a_key_is_refused(node: BrokerProcess) -> None:
    create_topic(node, "keyed", 1, **{"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all",
                         "retries": 0})
    errors: list[KafkaError] = []
    producer.produce("keyed", value=b"no key", partition=0,
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(15)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
    produce(node, "keyed", [(b"k", b"with a key")])
    assert [(k, v) for _, k, v in read_all(node, "keyed")] == [(b"k", b"with a key")]


def test_keyless_records_in_a_batch_fail_alone_with_their_batch_index(
        node: BrokerProcess) -> None:
    """KIP-467, as librdkafka's own test 0011 checks it: 100 records in one batch, every
    tenth without a key. The batch is refused; the 10 keyless records fail INVALID_RECORD and
    the other 90 with librdkafka's "an invalid record in the same batch" error."""
    create_topic(node, "keyed-batch", 1, **{"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "retries": 0,
                         "linger.ms": 1000, "batch.num.messages": 1000})
    failed: dict[int, int] = {}
    for i in range(100):
        key = None if i % 10 == 0 else f"k{i}".encode()
        producer.produce("keyed-batch", key=key, value=f"v{i}".encode(), partition=0,
                         on_delivery=lambda err, _m, i=i: failed.__setitem__(
                             i, err.code() if err else 0))
    assert producer.flush(30) == 0
    assert {i for i, code in failed.items() if code == KafkaError.INVALID_RECORD} == set(
        range(0, 100, 10))
    assert {i for i, code in failed.items() if code == KafkaError._INVALID_DIFFERENT_RECORD
            } == set(range(100)) - set(range(0, 100, 10))
    assert read_all(node, "keyed-batch") == []


def test_record_errors_name_each_keyless_record_from_produce_v8(node: BrokerProcess) -> None:
    """The partition's answer lists every keyless record's index in its batch with a message,
    and sums them up in error_message, from v8 (KIP-467); v7 has neither field."""
    create_topic(node, "keyed-raw", 1, **{"cleanup.policy": "compact"})
    records = [(None if i in (1, 4, 5) else b"k%d" % i, b"v", []) for i in range(7)]
    batch = bytes(build_batch(records))
    with RawClient(node.bootstrap) as client:
        for version in (8, 9):
            answer = raw_produce_answer(client, "keyed-raw", batch, version)
            assert answer.error_code == ErrorCode.INVALID_RECORD
            assert [e.batch_index for e in answer.record_errors] == [1, 4, 5]
            assert all("without key" in (e.batch_index_error_message or "")
                       for e in answer.record_errors)
            assert "3 record errors" in (answer.error_message or "")
        answer = raw_produce_answer(client, "keyed-raw", batch, 7)
        assert answer.error_code == ErrorCode.INVALID_RECORD
        assert answer.record_errors == [] and answer.error_message is None
        keyed = bytes(build_batch([(b"k", b"v", [])]))
        answer = raw_produce_answer(client, "keyed-raw", keyed, 9)
        assert (answer.error_code, answer.record_errors, answer.error_message) == (0, [], None)


def raw_produce_answer(client: RawClient, topic: str, batch: bytes, version: int
                       ) -> ProduceResponse.PartitionProduceResponse:
    Request = ProduceRequest
    request = Request(acks=-1, timeout_ms=10_000, topic_data=[Request.TopicProduceData(
        name=topic, partition_data=[Request.PartitionProduceData(index=0, records=batch)])])
    response = client.call(0, version, request)
    answer: ProduceResponse.PartitionProduceResponse = response.responses[0].partition_responses[0]
    return answer


def raw_produce(client: RawClient, topic: str, batch: bytes) -> tuple[int, int]:
    Request = ProduceRequest
    request = Request(acks=-1, timeout_ms=10_000, topic_data=[Request.TopicProduceData(
        name=topic, partition_data=[Request.PartitionProduceData(index=0, records=batch)])])
    response = client.call(0, 9, request)
    result = response.responses[0].partition_responses[0]
    return result.error_code, result.base_offset


def test_idempotent_producer_state_survives_a_clean_and_a_restart(node: BrokerProcess) -> None:
    create_topic(node, "idem", 1, **COMPACTED)
    producer_id, epoch = 4242, 0
    # The producer writes key "a" twice; the second write supersedes the whole first batch.
    first = build_batch([(b"a", b"1", ())], producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=0)
    last = build_batch([(b"a", b"2", ())], producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=1)
    with RawClient(node.bootstrap) as client:
        assert raw_produce(client, "idem", bytes(first)) == (ErrorCode.NONE, 0)
        assert raw_produce(client, "idem", bytes(last)) == (ErrorCode.NONE, 1)
    # Another producer supersedes "a" again: the idempotent producer's last batch is now
    # empty of live records, and is kept (empty) for its producer state.
    produce(node, "idem", [(b"a", b"3")])
    seal(node, "idem")
    wait_for(lambda: [k for _, k, _ in read_all(node, "idem")].count(b"a") == 1, 30,
             "the idempotent producer's records compacted away")
    node.kill9()
    node.restart()
    # A retry of its last batch is still known: answered as a duplicate, not appended.
    with RawClient(node.bootstrap) as client:
        assert raw_produce(client, "idem", bytes(last)) == (ErrorCode.NONE, 1)
        # And its next sequence follows on.
        following = build_batch([(b"b", b"4", ())], producer_id=producer_id,
                                producer_epoch=epoch, base_sequence=2)
        error, offset = raw_produce(client, "idem", bytes(following))
        assert error == ErrorCode.NONE and offset >= 4
    values = {k: v for _, k, v in read_all(node, "idem")}
    assert values[b"a"] == b"3" and values[b"b"] == b"4"


def test_kill_during_a_clean_keeps_every_latest_value(node: BrokerProcess) -> None:
    create_topic(node, "crash", 1, **COMPACTED)
    rng = random.Random(7)
    latest: dict[bytes, bytes] = {}
    recovered = 0  # restarts that found a clean cut short (its files finished or undone)
    for round_ in range(8):
        records = [(f"k{rng.randrange(300)}".encode(), f"{round_}-{i}-".encode() + b"v" * 800)
                   for i in range(4000)]
        produce(node, "crash", records)
        seal(node, "crash")
        latest.update(records)
        latest[b"roll"] = ROLL
        # Kill once the clean writes its files (it reads first: a kill then is trivially
        # safe), at a random moment of the writing and swapping.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(
                name.endswith((".cleaned", ".swap")) for name in log_files(node, "crash")):
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.3))
        node.kill9()
        before = node.log_path.read_text(errors="replace").count(_CUT_SHORT)
        node.start()
        recovered += node.log_path.read_text(errors="replace").count(_CUT_SHORT) > before
        got = {key: value for _, key, value in read_all(node, "crash")}
        assert got == latest, f"round {round_}: keys lost or stale after kill -9"
        if recovered >= 2:
            break
    assert recovered >= 1, "no kill landed during a clean"
    assert not any(name.endswith((".cleaned", ".swap")) for name in log_files(node, "crash"))


# What recovery logs (storage/segment_swap.py) when it finds a clean that a crash cut short.
_CUT_SHORT = " cleaned "


def test_consumer_offsets_are_compacted(node: BrokerProcess) -> None:
    create_topic(node, "t", 1)
    committer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "many-commits",
                          "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
        # Small segments, so the commits below fill several and the closed ones get cleaned.
        admin = admin_client(node)
        resource = ConfigResource(ConfigResource.Type.TOPIC, "__consumer_offsets",
                                  incremental_configs=[
                                      ConfigEntry("segment.bytes", str(1024 * 1024),
                                                  incremental_operation=AlterConfigOpType.SET),
                                      ConfigEntry("min.cleanable.dirty.ratio", "0.01",
                                                  incremental_operation=AlterConfigOpType.SET)])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(15)
        for offset in range(2, 12_001):
            committer.commit(offsets=[TopicPartition("t", 0, offset)], asynchronous=False)
    finally:
        committer.close()
    directory = node.data_dir / f"__consumer_offsets-{offsets_partition('many-commits', 50)}"
    wait_for(lambda: (directory / "cleaner-offset.json").exists(), 30,
             "the group's offsets partition cleaned")
    logs = [name for name in os.listdir(directory) if name.endswith(".log")]
    sizes = sum((directory / name).stat().st_size for name in logs)
    assert sizes < 1024 * 1024 + 200_000, "12,000 commits of one offset should compact away"
    node.restart()
    reader = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "many-commits"})
    try:
        (tp,) = reader.committed([TopicPartition("t", 0)], timeout=10)
        assert tp.offset == 12_000
    finally:
        reader.close()


def test_delete_records_is_refused_on_a_compact_only_topic(node: BrokerProcess) -> None:
    create_topic(node, "compact-only", 1, **COMPACTED)
    produce(node, "compact-only", [(b"k", b"v")])
    admin = admin_client(node)  # alive until the future resolves
    future = admin.delete_records([TopicPartition("compact-only", 0, 1)])
    with pytest.raises(KafkaException) as raised:
        next(iter(future.values())).result(15)
    assert raised.value.args[0].code() == KafkaError.POLICY_VIOLATION
