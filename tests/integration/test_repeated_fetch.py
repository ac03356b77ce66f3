"""An idle consumer's fetch, repeated: answered from one response, encoded once, never stale.

librdkafka sends the same Fetch every `fetch.wait.max.ms` while its partitions are idle,
starting each at another partition, and gets the same answer. The fetch handler answers a
round that read nothing with its partitions in one fixed order, the same response object
while every partition is still the one it read, and the connection then sends the bytes it
encoded before (actors/handlers/k01_fetch.py, actors/connection.py). Here the reuse is checked
against what must change: correlation ids, and everything after a partition moves.
"""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerProcess
from tests.support.kafka import create_topic
from tests.support.raw_client import RawClient, fetch_request, produce_request
from wire.messages import response_header_version
from wire.messages.fetch import FetchRequest, FetchResponse
from wire.messages.response_header import ResponseHeader
from wire.primitives import Reader
from wire.records import build_batch, iter_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOPIC = "repeated-fetch"


def fetch(client: RawClient, offset: int) -> tuple[int, int, bytes, int]:
    """(correlation id sent, high watermark, records, error) of a 50 ms long poll."""
    correlation = client.send(1, 12, fetch_request(TOPIC, offset, max_wait_ms=50))
    got, response = client.receive(1, 12)
    assert got == correlation
    part = response.responses[0].partitions[0]
    return correlation, part.high_watermark, bytes(part.records or b""), part.error_code


def test_a_repeated_idle_fetch_is_answered_the_same_until_the_partition_moves(
    shared_broker: BrokerProcess,
) -> None:
    create_topic(shared_broker, TOPIC)
    with RawClient(shared_broker.bootstrap) as client:
        client.call(0, 7, produce_request(TOPIC, build_batch([(b"k", b"first", [])])))
        answers = [fetch(client, 1) for _ in range(5)]  # at the end: idle, the same each time
        assert [a[0] for a in answers] == sorted({a[0] for a in answers})  # each its own id
        assert {a[1:] for a in answers} == {(1, b"", 0)}
        client.call(0, 7, produce_request(TOPIC, build_batch([(b"k", b"second", [])])))
        _, hwm, records, error = fetch(client, 1)  # the same request: must see the move
        assert (hwm, error) == (2, 0)
        assert [r.value for r in iter_records(records)] == [b"second"]
        again = [fetch(client, 2) for _ in range(3)]
        assert {a[1:] for a in again} == {(2, b"", 0)}
        _, hwm, records, _ = fetch(client, 0)  # another request: decoded afresh
        assert hwm == 2 and [r.value for r in iter_records(records)] == [b"first", b"second"]


def _rotated_fetch(topic: str, ends: list[int], start: int) -> FetchRequest:
    """A 50 ms long poll of every partition at its end, listed from `start` on (librdkafka
    rotates where each fetch starts)."""
    order = [(start + i) % len(ends) for i in range(len(ends))]
    return FetchRequest(
        replica_id=-1, max_wait_ms=50, min_bytes=1, max_bytes=1 << 20, session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchPartition(partition=p, current_leader_epoch=-1,
                                        fetch_offset=ends[p], partition_max_bytes=1 << 20)
            for p in order])],
    )


def test_rotated_idle_fetches_get_one_answer_in_one_order(shared_broker: BrokerProcess) -> None:
    topic = "rotated-fetch"
    create_topic(shared_broker, topic, 4)
    with RawClient(shared_broker.bootstrap) as client:
        ends = [0, 0, 0, 0]
        frames = []
        for start in range(8):
            correlation = client.send(1, 12, _rotated_fetch(topic, ends, start))
            frame = client.receive_frame()
            assert frame is not None and frame[:4] == correlation.to_bytes(4, "big")
            frames.append(frame)
        assert len({frame[4:] for frame in frames}) == 1  # past the id: the same bytes
        reader = Reader(frames[0])
        ResponseHeader.decode(reader, response_header_version(1, 12))
        response = FetchResponse.decode(reader, 12)
        partitions = [p.partition_index for p in response.responses[0].partitions]
        assert partitions == sorted(partitions) == [0, 1, 2, 3]
        client.call(0, 7, produce_request(topic, build_batch([(b"k", b"new", [])]),
                                          partition=2))
        client.send(1, 12, _rotated_fetch(topic, ends, 3))
        _, response = client.receive(1, 12)
        answered = {p.partition_index: p for p in response.responses[0].partitions}
        assert answered[2].high_watermark == 1
        assert [r.value for r in iter_records(bytes(answered[2].records))] == [b"new"]
        assert all(answered[p].high_watermark == 0 for p in (0, 1, 3))
