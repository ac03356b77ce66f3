"""A real broker's partitions under transactional produces, seen by read_committed readers:
Fetch and ListOffsets with isolation_level 1 stop at the last stable offset (the first offset
of a transaction still open), the reader endpoint's `read_committed` does the same, a long
poll at the last stable offset waits, and a kill -9 and restart rebuild the open transaction
from the log. The markers that end transactions are written by the coordinator (its tests);
here, and on a real log, tests/actors/test_partition_txn.py tells them to the partition."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest
import zmq

from tests.support.broker import BrokerProcess, wait_for
from tests.support.raw_client import RawClient, fetch_request, produce_request, request
from wire.errors import ErrorCode
from wire.messages.create_topics import CreateTopicsRequest
from wire.messages.list_offsets import ListOffsetsRequest
from wire.record_batch import iter_batches
from wire.records import build_batch
from wire.spark import protocol

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "txn"
PARTITIONS = 4  # over two shards: local and cross-shard reads both
READ_COMMITTED = 1


def _create(client: RawClient) -> None:
    created = client.call(19, 5, request(19, topics=[CreateTopicsRequest.CreatableTopic(
        name=TOPIC, num_partitions=PARTITIONS, replication_factor=1)], timeout_ms=5000))
    assert created.topics[0].error_code == ErrorCode.NONE


def _producer_id(client: RawClient) -> int:
    init = client.call(22, 1, request(22, transactional_id=None, transaction_timeout_ms=60000))
    assert init.error_code == ErrorCode.NONE
    return int(init.producer_id)


def _produce(client: RawClient, partition: int, batch: bytearray) -> Any:
    answer = client.call(0, 8, produce_request(TOPIC, bytes(batch), partition=partition))
    return answer.responses[0].partition_responses[0]


def _fill(client: RawClient, pid: int, plain_pid: int) -> None:
    """Each partition: a plain batch at 0..1, then `pid`'s transactional batch at 2..3 (left
    open), then an idempotent non-transactional batch at 4."""
    for p in range(PARTITIONS):
        assert _produce(client, p, build_batch([(None, b"p0", []), (None, b"p1", [])])
                        ).base_offset == 0
        txn = build_batch([(b"k", b"t0", []), (b"k", b"t1", [])], producer_id=pid,
                          producer_epoch=0, base_sequence=0, transactional=True)
        answer = _produce(client, p, txn)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 2)
        plain = build_batch([(None, b"i", [])], producer_id=plain_pid, producer_epoch=0,
                            base_sequence=0)
        assert _produce(client, p, plain).base_offset == 4


def _fetch(client: RawClient, partition: int, offset: int, isolation: int,
           max_wait_ms: int = 0) -> Any:
    fetch = fetch_request(TOPIC, offset, partition=partition, max_wait_ms=max_wait_ms)
    fetch.isolation_level = isolation
    answer = client.call(1, 12, fetch)
    return answer.responses[0].partitions[0]


def _latest(client: RawClient, isolation: int) -> list[int]:
    lookup = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=[
            ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=-1)
            for p in range(PARTITIONS)])])
    answer = client.call(2, 5, lookup)
    parts = sorted(answer.topics[0].partitions, key=lambda p: p.partition_index)
    assert all(p.error_code == ErrorCode.NONE for p in parts)
    return [p.offset for p in parts]


def _check_open_transaction(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as client:
        for p in range(PARTITIONS):
            uncommitted = _fetch(client, p, 0, 0)
            assert uncommitted.error_code == ErrorCode.NONE
            assert (uncommitted.high_watermark, uncommitted.last_stable_offset) == (5, 2)
            assert uncommitted.aborted_transactions is None
            assert [b.base_offset for b in iter_batches(bytearray(uncommitted.records))] == [
                0, 2, 4]
            committed = _fetch(client, p, 0, READ_COMMITTED)
            assert (committed.high_watermark, committed.last_stable_offset) == (5, 2)
            assert committed.aborted_transactions == []
            assert [b.base_offset for b in iter_batches(bytearray(committed.records))] == [0]
            assert len(_fetch(client, p, 2, READ_COMMITTED).records) == 0
        assert _latest(client, READ_COMMITTED) == [2] * PARTITIONS
        assert _latest(client, 0) == [5] * PARTITIONS


def _reader_fetch(broker: BrokerProcess, partition: int, offset: int,
                  read_committed: bool) -> tuple[dict[str, Any], bytes]:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(f"tcp://{broker.reader_address}")
        socket.send(protocol.pack(protocol.fetch_request(
            1, TOPIC, partition, offset, 1 << 20, read_committed=read_committed)))
        assert socket.poll(10_000), "the reader did not answer"
        frames = socket.recv_multipart()
        return msgpack.unpackb(frames[0], raw=False), frames[1] if len(frames) > 1 else b""
    finally:
        socket.close()
        context.term()


def test_read_committed_stops_at_an_open_transaction_across_a_kill9(
        broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as client:
        _create(client)
        pid, plain_pid = _producer_id(client), _producer_id(client)
        _fill(client, pid, plain_pid)
        # A plain batch of a producer whose transaction is open is refused.
        stray = build_batch([(None, b"x", [])], producer_id=pid, producer_epoch=0,
                            base_sequence=2)
        assert _produce(client, 0, stray).error_code == ErrorCode.INVALID_TXN_STATE
        # A control batch from a client is refused: only the coordinator writes markers.
        marker = build_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])],
                             producer_id=pid, producer_epoch=0, transactional=True,
                             control=True)
        assert _produce(client, 0, marker).error_code == ErrorCode.INVALID_RECORD
        # A read_committed long poll at the last stable offset waits out its time.
        started = time.monotonic()
        waited = _fetch(client, 1, 2, READ_COMMITTED, max_wait_ms=300)
        assert len(waited.records) == 0 and time.monotonic() - started >= 0.25
    _check_open_transaction(broker)
    for p in range(PARTITIONS):
        header, data = _reader_fetch(broker, p, 0, read_committed=True)
        assert header["error"] == 0 and header["last_stable_offset"] == 2
        assert header["aborted"] == [] and header["high_watermark"] == 5
        assert [b.base_offset for b in iter_batches(bytearray(data))] == [0]
        header, data = _reader_fetch(broker, p, 0, read_committed=False)
        assert "aborted" not in header and header["last_stable_offset"] == 2
        assert [b.base_offset for b in iter_batches(bytearray(data))] == [0, 2, 4]
    broker.kill9()
    broker.restart()
    _check_open_transaction(broker)  # the open transaction was rebuilt from the log
    with RawClient(broker.bootstrap) as client:  # and its producer goes on in order
        more = build_batch([(b"k", b"t2", [])], producer_id=pid, producer_epoch=0,
                           base_sequence=2, transactional=True)
        assert _produce(client, 3, more).error_code == ErrorCode.NONE
        assert _fetch(client, 3, 0, READ_COMMITTED).last_stable_offset == 2


def test_a_real_clients_aborted_transaction_is_listed_across_a_kill9(
        broker: BrokerProcess) -> None:
    """librdkafka's transactions through the coordinator: the raw Fetch answer lists the
    aborted one (and not the committed one) with its producer id and first offset, and a
    kill -9 and restart rebuild the same aborted index from the log."""
    from confluent_kafka import Producer

    with RawClient(broker.bootstrap) as client:
        _create(client)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tp-1",
                         "linger.ms": 0})
    producer.init_transactions(30)
    for commit in (False, True, False):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(TOPIC, value=b"%d-%d" % (commit, i), partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    def answer() -> tuple[Any, list[Any]]:
        with RawClient(broker.bootstrap) as client:
            fetched = _fetch(client, 0, 0, READ_COMMITTED)
        return fetched, iter_batches(bytearray(fetched.records))

    def markers_written() -> bool:  # EndTxn answers before its markers are in the log
        return sum(h.is_control for h in answer()[1]) == 3

    wait_for(markers_written, 10, "the three transactions' markers written")
    fetched, headers = answer()
    data = [h for h in headers if not h.is_control]
    markers = [h for h in headers if h.is_control]
    assert len(markers) == 3 and all(h.is_transactional for h in data)
    pid = data[0].producer_id
    assert fetched.last_stable_offset == fetched.high_watermark == headers[-1].next_offset
    firsts = [h.base_offset for h in data]
    aborted = [(a.producer_id, a.first_offset) for a in fetched.aborted_transactions]
    # The first and third transactions: each from its first batch (the second is committed).
    assert aborted == [(pid, firsts[0]), (pid, markers[1].base_offset + 1)]
    broker.kill9()
    broker.restart()
    again, _ = answer()
    assert [(a.producer_id, a.first_offset) for a in again.aborted_transactions] == aborted
    assert again.last_stable_offset == fetched.last_stable_offset
