"""Bad input gets a clear answer, and the node goes on serving every other client."""

from __future__ import annotations

import random
import socket
import struct

import pytest

from tests.support.broker import BrokerProcess
from tests.support.raw_client import RawClient, fetch_request, request
from wire.errors import ErrorCode
from wire.messages.api_versions import ApiVersionsResponse
from wire.primitives import Reader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


# Seeded, so every run sends the same garbage: its header is no request the broker knows.
_GARBAGE = random.Random(20261122).randbytes(4092)


def _still_serving(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as client:
        response = client.call(
            18, 3, request(18, client_software_name="t", client_software_version="1")
        )
        assert response.error_code == ErrorCode.NONE
        assert broker.alive()


def _closed(client: RawClient) -> bool:
    client.sock.settimeout(10)
    return client.closed_by_peer()


@pytest.mark.parametrize(
    "payload",
    [
        # A whole frame of garbage. (Wholly random bytes would declare a random length, and
        # one in 4093..100 MiB, 2% of them, is a valid frame still arriving: no close.)
        pytest.param(struct.pack(">i", 4092) + _GARBAGE, id="random-bytes"),
        pytest.param(struct.pack(">i", 2**31 - 1) + b"x" * 100, id="oversize-length"),
        pytest.param(struct.pack(">i", -5), id="negative-length"),
        pytest.param(struct.pack(">ihhi", 6, 3, 5, 1), id="short-header"),
        pytest.param(struct.pack(">ihhih", 12, 3, 5, 1, 200) + b"ab", id="truncated-client-id"),
        pytest.param(struct.pack(">ihhih", 10, 999, 0, 1, -1), id="unknown-api-key"),
        pytest.param(struct.pack(">ihhih", 10, 3, 99, 1, -1), id="unsupported-version"),
        pytest.param(struct.pack(">ihhih", 14, 0, 7, 1, -1) + b"\xff\xff\xff\xff", id="bad-body"),
    ],
)
def test_bad_frame_closes_only_that_connection(
    shared_broker: BrokerProcess, payload: bytes
) -> None:
    bystander = RawClient(shared_broker.bootstrap)
    try:
        with RawClient(shared_broker.bootstrap) as client:
            client.send_raw(payload)
            assert _closed(client)
        # The other connection, opened before, still works, and so do new ones.
        response = bystander.call(18, 0, request(18))
        assert response.error_code == ErrorCode.NONE
        _still_serving(shared_broker)
    finally:
        bystander.close()


def test_truncated_frame_then_disconnect(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 1000) + b"\x00\x03" + b"\x00" * 20)
    _still_serving(shared_broker)


def test_api_versions_above_max_answers_v0_body(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        client.send_raw(
            client.encode(
                18, 3, request(18, client_software_name="x", client_software_version="1"), 7
            ).replace(b"\x00\x12\x00\x03", b"\x00\x12\x00\x09", 1)
        )
        frame = client.receive_frame()
        assert frame is not None
        reader = Reader(frame)
        assert reader.int32() == 7  # response header v0: correlation id, no tags
        body = ApiVersionsResponse.decode(reader, 0)
        assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
        versions = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert versions[18] == (0, 3)
        assert versions[0] == (3, 9)
        # The connection stays open: the client retries at a version we know.
        assert client.call(18, 2, request(18)).error_code == ErrorCode.NONE


def test_pipelined_requests_answered_in_order(shared_broker: BrokerProcess) -> None:
    """Many requests in flight on one connection, mixing fast and slow APIs."""
    with RawClient(shared_broker.bootstrap) as client:
        client.call(3, 9, request(3, topics=None, allow_auto_topic_creation=False))
        created = client.call(19, 5, request(19, topics=[_new_topic("pipelined")], timeout_ms=5000))
        assert created.topics[0].error_code == ErrorCode.NONE
        sent = []
        for i in range(60):
            if i % 3 == 0:
                sent.append((18, 2, client.send(18, 2, request(18))))
            elif i % 3 == 1:
                sent.append((3, 1, client.send(3, 1, request(3, topics=[]))))
            else:
                fetch = fetch_request("pipelined", max_wait_ms=50 if i % 2 else 0)
                sent.append((1, 11, client.send(1, 11, fetch)))
        for api_key, version, correlation_id in sent:
            got, _ = client.receive(api_key, version)
            assert got == correlation_id


def test_unknown_topic_and_partition_errors(shared_broker: BrokerProcess) -> None:
    with RawClient(shared_broker.bootstrap) as client:
        response = client.call(
            3, 4, request(3, topics=[_meta_topic("no-such")], allow_auto_topic_creation=False)
        )
        assert response.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        response = client.call(
            3, 4, request(3, topics=[_meta_topic("bad/name")], allow_auto_topic_creation=True)
        )
        assert response.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        fetch = client.call(1, 11, fetch_request("no-such"))
        assert fetch.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _meta_topic(name: str):  # type: ignore[no-untyped-def]
    from wire.messages.metadata import MetadataRequest

    return MetadataRequest.MetadataRequestTopic(name=name)


def _new_topic(name: str):  # type: ignore[no-untyped-def]
    from wire.messages.create_topics import CreateTopicsRequest

    return CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)


def test_connection_storm_leaves_node_serving(shared_broker: BrokerProcess) -> None:
    sockets = [
        socket.create_connection(("127.0.0.1", shared_broker.port), timeout=5) for _ in range(50)
    ]
    for s in sockets:
        s.close()
    _still_serving(shared_broker)
