"""Fetch semantics: whole batches, byte limits, long polls woken by appends, append time."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from tests.support.broker import BrokerProcess
from tests.support.kafka import consume, create_topic, produce
from tests.support.raw_client import RawClient, fetch_request, produce_request
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch, iter_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _fetch(client: RawClient, topic: str, offset: int, **limits: int):  # type: ignore[no-untyped-def]
    response = client.call(1, 12, fetch_request(topic, offset, **limits))
    return response.responses[0].partitions[0]


def _produce_batch(client: RawClient, topic: str, values: list[bytes]) -> int:
    batch = build_batch([(None, v, []) for v in values])
    response = client.call(0, 9, produce_request(topic, batch))
    partition = response.responses[0].partition_responses[0]
    assert partition.error_code == ErrorCode.NONE
    return int(partition.base_offset)


def test_fetch_inside_a_batch_returns_the_whole_batch(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "whole")
    with RawClient(shared_broker.bootstrap) as client:
        _produce_batch(client, "whole", [f"{i}".encode() for i in range(10)])
        _produce_batch(client, "whole", [b"next"])
        partition = _fetch(client, "whole", 5)
        headers = iter_batches(partition.records)
        assert headers[0].base_offset == 0 and headers[0].last_offset == 9
        assert partition.high_watermark == 11
        values = [r.value for r in iter_records(partition.records, start_offset=5)]
        assert values == [b"5", b"6", b"7", b"8", b"9", b"next"]
        assert not bytes(_fetch(client, "whole", 11).records or b"")  # at the high watermark
        assert _fetch(client, "whole", 12).error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_byte_limits_keep_whole_batches(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "limits")
    with RawClient(shared_broker.bootstrap) as client:
        for i in range(3):
            _produce_batch(client, "limits", [bytes([65 + i]) * 10_000])
        one = _fetch(client, "limits", 0, max_bytes=1)  # KIP-74: the first batch still comes
        assert [h.base_offset for h in iter_batches(one.records)] == [0]
        two = _fetch(client, "limits", 0, partition_max_bytes=25_000)
        assert [h.base_offset for h in iter_batches(two.records)] == [0, 1]
        everything = _fetch(client, "limits", 0)
        assert [h.base_offset for h in iter_batches(everything.records)] == [0, 1, 2]


def test_long_poll_is_woken_by_an_append(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "poll")
    with RawClient(shared_broker.bootstrap) as reader, RawClient(shared_broker.bootstrap) as writer:
        timer = threading.Timer(0.3, lambda: _produce_batch(writer, "poll", [b"wake"]))
        started = time.monotonic()
        timer.start()
        try:
            partition = _fetch(reader, "poll", 0, max_wait_ms=20_000)
        finally:
            timer.join()
        waited = time.monotonic() - started
        assert [r.value for r in iter_records(partition.records)] == [b"wake"]
        assert 0.25 <= waited < 10, waited  # woken by the append, not by the 20 s timeout


def test_long_poll_times_out_empty(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "quiet")
    with RawClient(shared_broker.bootstrap) as client:
        started = time.monotonic()
        partition = _fetch(client, "quiet", 0, max_wait_ms=400)
        waited = time.monotonic() - started
        assert partition.error_code == ErrorCode.NONE and not bytes(partition.records or b"")
        assert waited >= 0.35


def test_log_append_time_topic(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "stamped", **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    produce(shared_broker, "stamped", [(None, b"a", None, 0)])
    got = consume(shared_broker, "stamped", 1, 1)
    kind, stamp = got[0].timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before - 1000 <= stamp <= int(time.time() * 1000) + 1000


def test_write_caching_topic_acks_before_flush(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "cached", **{"write.caching": "true"})
    delivered = produce(
        shared_broker, "cached", [(None, f"{i}".encode(), None, 0) for i in range(100)], acks="all"
    )
    assert [m.offset() for m in delivered] == list(range(100))
    assert len(consume(shared_broker, "cached", 1, 100)) == 100


def test_list_offsets_by_time_finds_the_record_inside_a_batch(shared_broker: BrokerProcess) -> None:
    create_topic(shared_broker, "timed")
    with RawClient(shared_broker.bootstrap) as client:
        batch = build_batch(
            [(None, f"{i}".encode(), []) for i in range(10)],
            timestamps=[1000 + 10 * i for i in range(10)],
        )
        response = client.call(0, 9, produce_request("timed", batch))
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        from wire.messages.list_offsets import ListOffsetsRequest

        def lookup(timestamp: int):  # type: ignore[no-untyped-def]
            answer = client.call(
                2,
                7,
                ListOffsetsRequest(
                    replica_id=-1,
                    topics=[
                        ListOffsetsRequest.ListOffsetsTopic(
                            name="timed",
                            partitions=[
                                ListOffsetsRequest.ListOffsetsPartition(
                                    partition_index=0, current_leader_epoch=-1, timestamp=timestamp
                                )
                            ],
                        )
                    ],
                ),
            )
            p = answer.topics[0].partitions[0]
            return p.offset, p.timestamp

        assert lookup(1000) == (0, 1000)
        assert lookup(1035) == (4, 1040)  # inside the batch, not the batch's first offset
        assert lookup(1090) == (9, 1090)
        assert lookup(1091) == (-1, -1)
        assert lookup(-3) == (9, 1090)  # the record with the largest timestamp
