"""Exactly-once consume-transform-produce with real clients against a real node: a
transactional producer commits a consumer group's offsets in its transaction
(AddOffsetsToTxn, key 25, to the transaction coordinator; TxnOffsetCommit, key 28, to the
group's coordinator, pending until the COMMIT marker lands on the group's offsets partition).

confluent-kafka's `send_offsets_to_transaction` in a read_committed consume-transform-produce
loop (each input once in the output, the group's offsets at the positions); an aborted
transaction leaves the offsets where they were; OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT while the offsets are pending; a node killed with -9 before the commit
(the new producer's InitProducerId aborts the transaction, the offsets stay) and right after
it (the offsets are committed once the node is back). kafka-python's and aiokafka's
`send_offsets_to_transaction` too.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import create_topic, produce
from tests.support.raw_client import RawClient, request
from wire.errors import ErrorCode
from wire.messages.offset_fetch import OffsetFetchRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_CLIENT_TIMEOUT_S = 30
_POLL_LIMIT_S = 30.0
_OFFSET_FETCH_VERSION = 7  # the first with RequireStable


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _producer(broker: BrokerProcess, transactional_id: str) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id,
                     "linger.ms": 5})


def _consumer(broker: BrokerProcess, group_id: str) -> Consumer:
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group_id,
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "auto.offset.reset": "earliest"})


def _offsets(broker: BrokerProcess, group_id: str, topic: str, partitions: int,
             require_stable: bool = True) -> list[tuple[int, int]]:
    """(error, committed offset) per partition, from OffsetFetch v7."""
    wanted = [OffsetFetchRequest.OffsetFetchRequestTopic(
        name=topic, partition_indexes=list(range(partitions)))]
    with RawClient(broker.bootstrap) as client:
        answer = client.call(9, _OFFSET_FETCH_VERSION, request(
            9, group_id=group_id, topics=wanted, require_stable=require_stable))
    assert answer.error_code == ErrorCode.NONE
    found = {p.partition_index: (p.error_code, p.committed_offset)
             for t in answer.topics for p in t.partitions}
    return [found[p] for p in range(partitions)]


def _stable(broker: BrokerProcess, group_id: str, topic: str, partitions: int) -> list[int]:
    """The committed offsets once no transaction holds them pending."""
    seen: list[tuple[int, int]] = []

    def stable() -> bool:
        seen[:] = _offsets(broker, group_id, topic, partitions)
        return all(error == ErrorCode.NONE for error, _ in seen)

    wait_for(stable, 20, f"stable offsets of {group_id}")
    return [offset for _, offset in seen]


def _values(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list[bytes]:
    """`count` values of `topic`, read_committed; then nothing more for a moment."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": _name("reader"),
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + _POLL_LIMIT_S
        quiet_until = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error() and msg.value() is not None:
                got.append(msg.value())
                continue
            if len(got) >= count:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() >= quiet_until:
                    break
        return got
    finally:
        consumer.close()


def _send_offsets(producer: Producer, consumer: Consumer, group_id: str, topic: str,
                  offsets: list[int]) -> None:
    positions = [TopicPartition(topic, p, o) for p, o in enumerate(offsets)]
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(),
                                         _CLIENT_TIMEOUT_S)


def test_apis_are_advertised(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as client:
        answer = client.call(18, 3, request(18, client_software_name="t",
                                            client_software_version="1"))
    ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert ranges[25] == (0, 3) and ranges[28] == (0, 3)


def test_consume_transform_produce(broker: BrokerProcess) -> None:
    source, sink, group_id = _name("in"), _name("out"), _name("ctp")
    create_topic(broker, source, partitions=2)
    create_topic(broker, sink, partitions=2)
    inputs = [(b"k%d" % i, b"v%d" % i, i % 2) for i in range(40)]
    produce(broker, source, [(k, v, [], p) for k, v, p in inputs])
    consumer = _consumer(broker, group_id)
    producer = _producer(broker, _name("tx"))
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    try:
        consumer.subscribe([source])
        done = 0
        deadline = time.monotonic() + _POLL_LIMIT_S
        while done < len(inputs) and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(10, 0.5) if not m.error()]
            if not batch:
                continue
            producer.begin_transaction()
            for msg in batch:
                producer.produce(sink, msg.value().upper(), msg.key(), partition=msg.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(),
                                                 _CLIENT_TIMEOUT_S)
            producer.commit_transaction(_CLIENT_TIMEOUT_S)
            done += len(batch)
        assert done == len(inputs)
        positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
    finally:
        consumer.close()
    out = _values(broker, sink, 2, len(inputs))
    assert sorted(out) == sorted(v.upper() for _, v, _ in inputs)
    assert _stable(broker, group_id, source, 2) == [positions[0], positions[1]] == [20, 20]


def test_abort_leaves_offsets_and_require_stable(broker: BrokerProcess) -> None:
    topic, group_id = _name("in"), _name("grp")
    create_topic(broker, topic, partitions=2)
    consumer = _consumer(broker, group_id)  # standalone: no member, no generation
    producer = _producer(broker, _name("tx"))
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    try:
        producer.begin_transaction()
        _send_offsets(producer, consumer, group_id, topic, [3, 4])
        assert _offsets(broker, group_id, topic, 2) == [
            (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1)] * 2
        assert _offsets(broker, group_id, topic, 2, require_stable=False) == [
            (ErrorCode.NONE, -1)] * 2
        producer.commit_transaction(_CLIENT_TIMEOUT_S)
        assert _stable(broker, group_id, topic, 2) == [3, 4]

        producer.begin_transaction()
        _send_offsets(producer, consumer, group_id, topic, [7, 9])
        assert _offsets(broker, group_id, topic, 2)[0][0] == (
            ErrorCode.UNSTABLE_OFFSET_COMMIT)
        producer.abort_transaction(_CLIENT_TIMEOUT_S)
        assert _stable(broker, group_id, topic, 2) == [3, 4]
    finally:
        consumer.close()


def test_kill9_before_commit_aborts_the_offsets(broker: BrokerProcess) -> None:
    topic, group_id, transactional_id = _name("in"), _name("grp"), _name("tx")
    create_topic(broker, topic, partitions=2)
    consumer = _consumer(broker, group_id)
    producer = _producer(broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    _send_offsets(producer, consumer, group_id, topic, [1, 2])
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    _send_offsets(producer, consumer, group_id, topic, [5, 6])
    consumer.close()
    broker.kill9()
    broker.restart()
    assert _offsets(broker, group_id, topic, 2)[0][0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
    again = _producer(broker, transactional_id)
    again.init_transactions(_CLIENT_TIMEOUT_S)  # aborts the open transaction
    assert _stable(broker, group_id, topic, 2) == [1, 2]


def test_kill9_after_commit_commits_the_offsets(broker: BrokerProcess) -> None:
    topic, group_id = _name("in"), _name("grp")
    create_topic(broker, topic, partitions=2)
    consumer = _consumer(broker, group_id)
    producer = _producer(broker, _name("tx"))
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    _send_offsets(producer, consumer, group_id, topic, [8, 11])
    producer.commit_transaction(_CLIENT_TIMEOUT_S)  # answered once PrepareCommit is persisted
    consumer.close()
    broker.kill9()
    broker.restart()
    assert _stable(broker, group_id, topic, 2) == [8, 11]


# kafka-python and aiokafka ------------------------------------------------------------------


def test_kafka_python_send_offsets(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KafkaTopicPartition

    topic, group_id = _name("in"), _name("grp")
    create_topic(broker, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap,
                             transactional_id=_name("tx"), max_block_ms=_CLIENT_TIMEOUT_S * 1000)
    try:
        producer.init_transactions()
        for offsets, commit in (((4, 5), True), ((6, 7), False)):
            producer.begin_transaction()
            producer.send_offsets_to_transaction(
                {KafkaTopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                 for p, o in enumerate(offsets)}, group_id)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    assert _stable(broker, group_id, topic, 2) == [4, 5]


def test_aiokafka_send_offsets(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    topic, group_id = _name("in"), _name("grp")
    create_topic(broker, topic, partitions=2)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                    transactional_id=_name("tx"))
        await asyncio.wait_for(producer.start(), _CLIENT_TIMEOUT_S)
        try:
            async with producer.transaction():
                await producer.send_offsets_to_transaction(
                    {AioTopicPartition(topic, 0): 12, AioTopicPartition(topic, 1): 13}, group_id)
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction({AioTopicPartition(topic, 0): 20},
                                                       group_id)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    assert _stable(broker, group_id, topic, 2) == [12, 13]
