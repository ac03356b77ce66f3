"""Transactional producers are refused at once, with an error every client treats as final.

Krill has no transaction coordinator. FindCoordinator for a transaction key answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the answer Kafka gives a principal not allowed to
DESCRIBE the transactional id: librdkafka raises a fatal error on it, the Java client and
kafka-python fail `init_transactions`, aiokafka fails `start()`. A retriable answer
(COORDINATOR_NOT_AVAILABLE) made them retry until their own timeout, or for ever (aiokafka).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from tests.support.broker import BrokerProcess
from tests.support.raw_client import RawClient, request
from wire.errors import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# A refusal is one round trip or two; a client that retries takes its full timeout (30 s).
_FAST_S = 5.0
_CLIENT_TIMEOUT_S = 30
_TRANSACTION_KEY = 1


def _transactional_id() -> str:
    return f"tx-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_find_coordinator_refuses_transaction_keys(
    shared_broker: BrokerProcess, version: int
) -> None:
    key = _transactional_id()
    batched = version >= 4
    fields = {"coordinator_keys": [key]} if batched else {"key": key}
    with RawClient(shared_broker.bootstrap) as client:
        found = client.call(10, version, request(10, key_type=_TRANSACTION_KEY, **fields))
        answer = found.coordinators[0] if batched else found
        assert answer.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert answer.node_id == -1
        assert "transactions" in (answer.error_message or "")
        # A client that asks InitProducerId anyway gets the same final answer.
        init = client.call(
            22,
            4,
            request(
                22,
                transactional_id=key,
                transaction_timeout_ms=60000,
                producer_id=-1,
                producer_epoch=-1,
            ),
        )
        assert init.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_find_coordinator_rejects_unknown_key_types(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        found = client.call(10, 3, request(10, key="k", key_type=7))
    assert found.error_code == ErrorCode.INVALID_REQUEST


def test_confluent_init_transactions_fails_fast_and_fatally(shared_broker: BrokerProcess) -> None:
    producer = Producer(
        {"bootstrap.servers": shared_broker.bootstrap, "transactional.id": _transactional_id()}
    )
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(_CLIENT_TIMEOUT_S)
    elapsed = time.monotonic() - started
    error = raised.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal() and not error.retriable(), error
    assert elapsed < _FAST_S, f"init_transactions took {elapsed:.1f}s"


def test_kafka_python_init_transactions_fails_fast(shared_broker: BrokerProcess) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TransactionalIdAuthorizationFailedError

    producer = KafkaProducer(
        bootstrap_servers=shared_broker.bootstrap,
        transactional_id=_transactional_id(),
        max_block_ms=_CLIENT_TIMEOUT_S * 1000,
    )
    try:
        started = time.monotonic()
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
        elapsed = time.monotonic() - started
    finally:
        producer.close(timeout=5)
    assert elapsed < _FAST_S, f"init_transactions took {elapsed:.1f}s"


def test_aiokafka_transactional_start_fails_fast(shared_broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    async def start() -> float:
        producer = AIOKafkaProducer(
            bootstrap_servers=shared_broker.bootstrap, transactional_id=_transactional_id()
        )
        started = time.monotonic()
        try:
            # aiokafka retries COORDINATOR_NOT_AVAILABLE without end: bound it here.
            with pytest.raises(TransactionalIdAuthorizationFailed):
                await asyncio.wait_for(producer.start(), _CLIENT_TIMEOUT_S)
            return time.monotonic() - started
        finally:
            await producer.stop()

    elapsed = asyncio.run(start())
    assert elapsed < _FAST_S, f"start() took {elapsed:.1f}s"
