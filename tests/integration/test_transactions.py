"""Kafka transactions with real clients against a real node: the transaction coordinator
(actors/group/transactions.py, txn_coordinator.py) and the partitions' markers and
read_committed fetches.

confluent-kafka (librdkafka), kafka-python and aiokafka transactional producers commit and
abort; a read_committed consumer sees only committed records, a read_uncommitted one sees the
aborted ones too. A second producer with the same transactional.id fences the first and
aborts its open transaction; an open transaction past its timeout is aborted by the
coordinator; a node killed with -9 mid-transaction or right after a commit comes back with the
transaction where it was (a Prepare state completed on load). DescribeTransactions and
ListTransactions report Kafka's state names.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from actors.group import OFFSETS_TOPIC, offsets_partition
from tests.support.broker import BrokerProcess, wait_for
from tests.support.kafka import create_topic
from tests.support.raw_client import RawClient, request, txn_markers
from wire.errors import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_TRANSACTION_KEY = 1
_POLL_LIMIT_S = 30.0
_CLIENT_TIMEOUT_S = 30


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic(shared_broker: BrokerProcess) -> str:
    name = _name("txn")
    create_topic(shared_broker, name, partitions=2)
    return name


def _producer(broker: BrokerProcess, transactional_id: str, **conf: Any) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id,
                     "linger.ms": 5, **conf})


def _values(broker: BrokerProcess, topic: str, isolation: str, *until: bytes,
            partitions: int = 2) -> list[bytes]:
    """Every value of `topic` (both partitions) read with `isolation.level` until each of
    the values `until` has been read; fails if one is not seen in time."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": _name("reader"),
                         "enable.auto.commit": False, "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + _POLL_LIMIT_S
        while not set(until) <= set(got) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            value = None if msg is None or msg.error() else msg.value()
            if value is not None:
                got.append(value)
        assert set(until) <= set(got), f"{until!r} not read ({isolation}); read {got}"
        return got
    finally:
        consumer.close()


def _commit_marker(broker: BrokerProcess, topic: str, value: bytes) -> tuple[bytes, bytes]:
    """A committed transaction of its own, one record per partition: once a read_committed
    reader sees both, everything before them has been decided. Returns their values."""
    producer = _producer(broker, _name("marker"))
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    for partition in (0, 1):
        producer.produce(topic, value=value + b"-%d" % partition, partition=partition)
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    return value + b"-0", value + b"-1"


def _describe(broker: BrokerProcess, transactional_id: str) -> Any:
    with RawClient(broker.bootstrap) as client:
        answer = client.call(65, 0, request(65, transactional_ids=[transactional_id]))
    return answer.transaction_states[0]


def _produce_in_txn(producer: Producer, topic: str, values: list[bytes]) -> None:
    for index, value in enumerate(values):
        producer.produce(topic, value=value, partition=index % 2)
    assert producer.flush(_CLIENT_TIMEOUT_S) == 0


# The coordinator ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_find_coordinator_answers_transaction_keys(shared_broker: BrokerProcess,
                                                   version: int) -> None:
    key = _name("tx")
    batched = version >= 4
    fields = {"coordinator_keys": [key]} if batched else {"key": key}
    with RawClient(shared_broker.bootstrap) as client:
        found = client.call(10, version, request(10, key_type=_TRANSACTION_KEY, **fields))
    answer = found.coordinators[0] if batched else found
    assert answer.error_code == ErrorCode.NONE
    assert (answer.host, answer.port) == ("127.0.0.1", shared_broker.port)


def test_find_coordinator_rejects_unknown_key_types(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        found = client.call(10, 3, request(10, key="k", key_type=7))
    assert found.error_code == ErrorCode.INVALID_REQUEST


def test_init_producer_id_raw(shared_broker: BrokerProcess) -> None:
    """A new id gets a producer id at epoch 0, the next InitProducerId bumps the epoch; a
    timeout over transaction.max.timeout.ms is refused; describe and list see it Empty."""
    key = _name("tx")
    with RawClient(shared_broker.bootstrap) as client:
        assert client.call(10, 1, request(10, key=key, key_type=1)).error_code == 0

        def init(timeout_ms: int = 60_000, version: int = 4, **current: int) -> Any:
            fields = {"producer_id": -1, "producer_epoch": -1, **current}
            return client.call(22, version, request(22, transactional_id=key,
                                                    transaction_timeout_ms=timeout_ms, **fields))

        first = init()
        assert (first.error_code, first.producer_epoch) == (ErrorCode.NONE, 0)
        assert first.producer_id >= 0
        second = init(producer_id=first.producer_id, producer_epoch=0)
        assert (second.error_code, second.producer_id, second.producer_epoch) == (
            ErrorCode.NONE, first.producer_id, 1)
        stale = init(producer_id=first.producer_id, producer_epoch=7)
        assert stale.error_code == ErrorCode.PRODUCER_FENCED
        assert init(timeout_ms=16 * 60_000).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        listed = client.call(66, 1, request(66, state_filters=["Empty"], producer_id_filters=[],
                                            duration_filter=-1))
        described = client.call(65, 0, request(65, transactional_ids=[key, _name("none")]))
    assert (key, first.producer_id, "Empty") in {
        (t.transactional_id, t.producer_id, t.transaction_state)
        for t in listed.transaction_states}
    mine, unknown = described.transaction_states
    assert (mine.error_code, mine.transaction_state, mine.producer_epoch) == (0, "Empty", 1)
    assert mine.transaction_timeout_ms == 60_000
    assert unknown.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


# confluent-kafka --------------------------------------------------------------------------


def test_commit_seen_by_read_committed(shared_broker: BrokerProcess, topic: str) -> None:
    transactional_id = _name("tx")
    producer = _producer(shared_broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    values = [b"c%d" % i for i in range(10)]
    _produce_in_txn(producer, topic, values)
    described = _describe(shared_broker, transactional_id)
    assert described.transaction_state == "Ongoing"
    assert {(t.topic, tuple(sorted(t.partitions))) for t in described.topics} == {
        (topic, (0, 1))}
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    wait_for(lambda: _describe(shared_broker, transactional_id).transaction_state
             == "CompleteCommit", 10, "CompleteCommit")
    got = _values(shared_broker, topic, "read_committed", b"c8", b"c9")
    assert sorted(got) == sorted(values)


def test_markers_carry_the_offsets_partitions_leader_epoch(shared_broker: BrokerProcess,
                                                          topic: str) -> None:
    """A marker's coordinator epoch is the leader epoch of the `__consumer_offsets` partition
    its transactional id lives in (Kafka's), which fences an older coordinator's markers; on
    one node that epoch never moves."""
    transactional_id = _name("tx")
    producer = _producer(shared_broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    for commit in (True, False):
        producer.begin_transaction()
        _produce_in_txn(producer, topic, [b"e0", b"e1"])
        if commit:
            producer.commit_transaction(_CLIENT_TIMEOUT_S)
        else:
            producer.abort_transaction(_CLIENT_TIMEOUT_S)
    wait_for(lambda: _describe(shared_broker, transactional_id).transaction_state
             == "CompleteAbort", 10, "CompleteAbort")
    with RawClient(shared_broker.bootstrap) as client:
        topics = client.call(3, 12, request(3, topics=None)).topics
    (offsets,) = [t for t in topics if t.name == OFFSETS_TOPIC]
    index = offsets_partition(transactional_id, len(offsets.partitions))
    (leader_epoch,) = [p.leader_epoch for p in offsets.partitions if p.partition_index == index]
    for partition in (0, 1):
        markers = txn_markers(shared_broker.bootstrap, topic, partition)
        assert [(m.commit, m.coordinator_epoch) for m in markers] == [
            (True, leader_epoch), (False, leader_epoch)]


def test_abort_hidden_from_read_committed_only(shared_broker: BrokerProcess, topic: str) -> None:
    transactional_id = _name("tx")
    producer = _producer(shared_broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    aborted = [b"a%d" % i for i in range(6)]
    _produce_in_txn(producer, topic, aborted)
    producer.abort_transaction(_CLIENT_TIMEOUT_S)
    assert _describe(shared_broker, transactional_id).transaction_state in (
        "PrepareAbort", "CompleteAbort")
    producer.begin_transaction()
    _produce_in_txn(producer, topic, [b"kept0", b"kept1"])
    producer.commit_transaction(_CLIENT_TIMEOUT_S)
    ends = _commit_marker(shared_broker, topic, b"end")
    committed = _values(shared_broker, topic, "read_committed", *ends)
    assert not set(aborted) & set(committed), committed
    assert {b"kept0", b"kept1"} <= set(committed)
    uncommitted = _values(shared_broker, topic, "read_uncommitted", *ends)
    assert set(aborted) <= set(uncommitted)


def test_second_producer_fences_the_first(shared_broker: BrokerProcess, topic: str) -> None:
    transactional_id = _name("tx")
    first = _producer(shared_broker, transactional_id)
    first.init_transactions(_CLIENT_TIMEOUT_S)
    first.begin_transaction()
    zombie = [b"z%d" % i for i in range(4)]
    _produce_in_txn(first, topic, zombie)
    epoch_before = _describe(shared_broker, transactional_id).producer_epoch

    second = _producer(shared_broker, transactional_id)
    second.init_transactions(_CLIENT_TIMEOUT_S)  # aborts the first's transaction
    described = _describe(shared_broker, transactional_id)
    assert described.transaction_state == "Empty"
    assert described.producer_epoch == epoch_before + 2
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(_CLIENT_TIMEOUT_S)
    error = raised.value.args[0]
    assert error.code() == KafkaError._FENCED or error.fatal(), error

    second.begin_transaction()
    _produce_in_txn(second, topic, [b"s0", b"s1"])
    second.commit_transaction(_CLIENT_TIMEOUT_S)
    ends = _commit_marker(shared_broker, topic, b"fenced-end")
    committed = _values(shared_broker, topic, "read_committed", *ends)
    assert not set(zombie) & set(committed)
    assert {b"s0", b"s1"} <= set(committed)


def test_timeout_aborts_the_transaction(shared_broker: BrokerProcess, topic: str) -> None:
    transactional_id = _name("tx")
    producer = _producer(shared_broker, transactional_id, **{"transaction.timeout.ms": 2000})
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    late = [b"late0", b"late1"]
    _produce_in_txn(producer, topic, late)
    epoch = _describe(shared_broker, transactional_id).producer_epoch
    wait_for(lambda: _describe(shared_broker, transactional_id).transaction_state
             == "CompleteAbort", 15, "the coordinator's abort")
    assert _describe(shared_broker, transactional_id).producer_epoch == epoch + 1
    with pytest.raises(KafkaException):
        producer.commit_transaction(_CLIENT_TIMEOUT_S)
    ends = _commit_marker(shared_broker, topic, b"timeout-end")
    committed = _values(shared_broker, topic, "read_committed", *ends)
    assert not set(late) & set(committed)


def test_transaction_timeout_over_the_max_is_refused(shared_broker: BrokerProcess) -> None:
    producer = _producer(shared_broker, _name("tx"), **{"transaction.timeout.ms": 16 * 60_000})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(_CLIENT_TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_the_nodes_max_transaction_timeout_is_the_setting(tmp_path: Any) -> None:
    config = tmp_path / "krill.yaml"
    config.write_text("transaction_max_timeout_ms: 5000\n")
    node = BrokerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        with RawClient(node.bootstrap) as client:
            def init(timeout_ms: int) -> Any:
                return client.call(22, 4, request(
                    22, transactional_id=_name("tx"), transaction_timeout_ms=timeout_ms,
                    producer_id=-1, producer_epoch=-1))

            assert init(5001).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
            assert init(5000).error_code == ErrorCode.NONE
    finally:
        node.stop()


# Restarts -----------------------------------------------------------------------------------


def test_kill9_mid_transaction_then_a_new_producer_aborts_it(broker: BrokerProcess) -> None:
    topic = _name("txn")
    create_topic(broker, topic, partitions=2)
    transactional_id = _name("tx")
    producer = _producer(broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    open_values = [b"o%d" % i for i in range(4)]
    _produce_in_txn(producer, topic, open_values)
    before = _describe(broker, transactional_id)
    broker.kill9()
    broker.restart()
    after = _describe(broker, transactional_id)
    assert (after.transaction_state, after.producer_id, after.producer_epoch) == (
        "Ongoing", before.producer_id, before.producer_epoch)
    assert after.transaction_start_time_ms == before.transaction_start_time_ms

    again = _producer(broker, transactional_id)
    again.init_transactions(_CLIENT_TIMEOUT_S)
    again.begin_transaction()
    _produce_in_txn(again, topic, [b"n0", b"n1"])
    again.commit_transaction(_CLIENT_TIMEOUT_S)
    committed = _values(broker, topic, "read_committed", b"n0", b"n1")
    assert not set(open_values) & set(committed)


def test_kill9_after_commit_completes_on_load(broker: BrokerProcess) -> None:
    topic = _name("txn")
    create_topic(broker, topic, partitions=2)
    transactional_id = _name("tx")
    producer = _producer(broker, transactional_id)
    producer.init_transactions(_CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    values = [b"k%d" % i for i in range(6)]
    _produce_in_txn(producer, topic, values)
    producer.commit_transaction(_CLIENT_TIMEOUT_S)  # answered once PrepareCommit is persisted
    broker.kill9()
    broker.restart()
    wait_for(lambda: _describe(broker, transactional_id).transaction_state
             == "CompleteCommit", 20, "CompleteCommit after the restart")
    got = _values(broker, topic, "read_committed", b"k4", b"k5")
    assert sorted(got) == sorted(values)


# kafka-python and aiokafka ------------------------------------------------------------------


def test_kafka_python_commit_and_abort(shared_broker: BrokerProcess, topic: str) -> None:
    from kafka import KafkaProducer

    transactional_id = _name("tx")
    producer = KafkaProducer(bootstrap_servers=shared_broker.bootstrap,
                             transactional_id=transactional_id,
                             max_block_ms=_CLIENT_TIMEOUT_S * 1000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"kp-aborted", partition=0)
        producer.flush(_CLIENT_TIMEOUT_S)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"kp-committed", partition=0)
        producer.commit_transaction()
    finally:
        producer.close(timeout=5)
    assert _describe(shared_broker, transactional_id).transaction_state in (
        "PrepareCommit", "CompleteCommit")
    committed = _values(shared_broker, topic, "read_committed", b"kp-committed")
    assert b"kp-aborted" not in committed


def test_aiokafka_commit_and_abort(shared_broker: BrokerProcess, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    transactional_id = _name("tx")

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=shared_broker.bootstrap,
                                    transactional_id=transactional_id)
        await asyncio.wait_for(producer.start(), _CLIENT_TIMEOUT_S)
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"aio-committed", partition=1)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aio-aborted", partition=1)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    ends = _commit_marker(shared_broker, topic, b"aio-end")
    committed = _values(shared_broker, topic, "read_committed", *ends)
    assert b"aio-committed" in committed and b"aio-aborted" not in committed
    assert _describe(shared_broker, transactional_id).transaction_state in (
        "PrepareAbort", "CompleteAbort")
