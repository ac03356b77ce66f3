"""Idempotent produce at the protocol level: duplicates, gaps, fencing, and restarts."""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerProcess
from tests.support.raw_client import RawClient, fetch_request, produce_request, request
from wire.errors import ErrorCode
from wire.messages.create_topics import CreateTopicsRequest
from wire.records import build_batch, iter_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _produce(client: RawClient, topic: str, batch: bytes, acks: int = -1):  # type: ignore[no-untyped-def]
    response = client.call(0, 9, produce_request(topic, batch, acks=acks))
    return response.responses[0].partition_responses[0]


def _batch(pid: int, epoch: int, sequence: int, count: int = 3) -> bytearray:
    records = [(None, f"{sequence + i}".encode(), []) for i in range(count)]
    return build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)


def _setup(client: RawClient, topic: str) -> tuple[int, int]:
    created = client.call(
        19,
        5,
        request(
            19,
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=topic, num_partitions=1, replication_factor=1
                )
            ],
            timeout_ms=5000,
        ),
    )
    assert created.topics[0].error_code == ErrorCode.NONE
    init = client.call(
        22,
        4,
        request(
            22,
            transactional_id=None,
            transaction_timeout_ms=60000,
            producer_id=-1,
            producer_epoch=-1,
        ),
    )
    assert init.error_code == ErrorCode.NONE
    return init.producer_id, init.producer_epoch


def test_sequences_duplicates_gaps_and_epochs(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as client:
        pid, epoch = _setup(client, "idem")
        first = _produce(client, "idem", _batch(pid, epoch, 0))
        assert (first.error_code, first.base_offset) == (ErrorCode.NONE, 0)
        second = _produce(client, "idem", _batch(pid, epoch, 3))
        assert (second.error_code, second.base_offset) == (ErrorCode.NONE, 3)
        # A retry of an appended batch: success with the original offset, nothing appended.
        again = _produce(client, "idem", _batch(pid, epoch, 0))
        assert (again.error_code, again.base_offset) == (ErrorCode.NONE, 0)
        # A gap in the sequence.
        gap = _produce(client, "idem", _batch(pid, epoch, 10))
        assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # A bumped epoch must restart at sequence 0; an older epoch is fenced.
        assert _produce(client, "idem", _batch(pid, epoch + 1, 5)).error_code == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        )
        bumped = _produce(client, "idem", _batch(pid, epoch + 1, 0))
        assert (bumped.error_code, bumped.base_offset) == (ErrorCode.NONE, 6)
        assert (
            _produce(client, "idem", _batch(pid, epoch, 6)).error_code
            == ErrorCode.INVALID_PRODUCER_EPOCH
        )
        # Epoch bump through InitProducerId v3+ (KIP-360) keeps the id.
        bump = client.call(
            22,
            4,
            request(
                22,
                transactional_id=None,
                transaction_timeout_ms=1,
                producer_id=pid,
                producer_epoch=epoch + 1,
            ),
        )
        assert (bump.producer_id, bump.producer_epoch) == (pid, epoch + 2)

    # Producer state is rebuilt from the log: a retry after a restart is still a duplicate.
    broker.restart()
    with RawClient(broker.bootstrap) as client:
        retry = _produce(client, "idem", _batch(pid, epoch + 1, 0))
        assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 6)
        following = _produce(client, "idem", _batch(pid, epoch + 1, 3))
        assert (following.error_code, following.base_offset) == (ErrorCode.NONE, 9)
        # Producer ids are never handed out twice, even across restarts.
        fresh = client.call(22, 0, request(22, transactional_id=None, transaction_timeout_ms=1))
        assert fresh.producer_id > pid
        values = [r.value for r in iter_records(_read_all(client, "idem"))]
        assert values == [f"{i}".encode() for i in (0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5)]


def _read_all(client: RawClient, topic: str) -> bytes:
    response = client.call(1, 12, fetch_request(topic, min_bytes=0))
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.NONE
    return bytes(partition.records)


def test_corrupt_batch_is_refused(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        batch = build_batch([(None, b"abc", [])])
        batch[-1] ^= 0x55
        client.call(
            19,
            5,
            request(
                19,
                topics=[
                    CreateTopicsRequest.CreatableTopic(
                        name="crc-topic", num_partitions=1, replication_factor=1
                    )
                ],
                timeout_ms=5000,
            ),
        )
        bad = _produce(client, "crc-topic", bytes(batch))
        assert bad.error_code == ErrorCode.CORRUPT_MESSAGE
        # A transactional batch needs a producer id (transactions: tests/integration/
        # test_txn_partition.py).
        transactional = build_batch([(None, b"t", [])], transactional=True)
        assert (
            _produce(client, "crc-topic", bytes(transactional)).error_code
            == ErrorCode.INVALID_RECORD
        )
        control = build_batch([(b"\x00\x00\x00\x01", b"", [])], control=True)
        assert _produce(client, "crc-topic", bytes(control)).error_code == ErrorCode.INVALID_RECORD
        acks2 = _produce(client, "crc-topic", bytes(build_batch([(None, b"x", [])])), acks=2)
        assert acks2.error_code == ErrorCode.INVALID_REQUIRED_ACKS
