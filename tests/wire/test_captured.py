"""Bytes from real clients, and hand-built known frames, decode to the expected values.

A raw TCP listener on 127.0.0.1 records the first request frame of each connection; the
clients (kafka-python, librdkafka via confluent_kafka) are pointed at it and give up after
short timeouts because nothing ever answers.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from wire.errors import DecodeError
from wire.messages import (
    VALID_VERSIONS,
    request_class,
    request_header_version,
    response_header_version,
)
from wire.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from wire.messages.metadata import MetadataRequest
from wire.messages.request_header import RequestHeader
from wire.messages.response_header import ResponseHeader
from wire.primitives import Reader, Writer

pytestmark = pytest.mark.timeout(60)


def decode_request(frame: bytes) -> tuple[RequestHeader, Any]:
    """Header by the key/version rule; the body only where the specs know the version."""
    api_key, version = struct.unpack_from(">hh", frame)
    r = Reader(frame)
    header = RequestHeader.decode(r, request_header_version(api_key, version))
    lo, hi = VALID_VERSIONS[api_key]
    if not lo <= version <= hi:
        return header, None
    body = request_class(api_key).decode(r, version)
    if r.remaining():
        raise DecodeError(f"{r.remaining()} trailing bytes")
    return header, body


class FirstFrameListener:
    """Accepts connections for a bounded time and keeps each one's first request frame."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="first-frame-listener")

    def __enter__(self) -> FirstFrameListener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        assert not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    (size,) = struct.unpack(">i", self._read(conn, 4))
                    self.frames.append(self._read(conn, size))
                except (OSError, struct.error):
                    pass

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("peer closed")
            data += chunk
        return data


@pytest.fixture
def listener() -> Iterator[FirstFrameListener]:
    with FirstFrameListener() as listening:
        yield listening


def test_kafka_python_api_versions_v4(listener: FirstFrameListener) -> None:
    kafka = pytest.importorskip("kafka")
    errors = pytest.importorskip("kafka.errors")
    client = None
    try:
        client = kafka.KafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{listener.port}",
            client_id="krill-kp",
            bootstrap_timeout_ms=1500,
            request_timeout_ms=1000,
            reconnect_backoff_max_ms=200,
        )
    except errors.KafkaError:
        pass  # NoBrokersAvailable: our listener never answers
    finally:
        if client is not None:
            client.close()
    assert listener.frames, "kafka-python sent nothing"
    header, body = decode_request(listener.frames[0])
    assert (header.request_api_key, header.client_id) == (18, "krill-kp")
    assert header.request_api_version == 4  # above the specs' 0-3: header only
    assert body is None
    # v4 adds nothing on the wire, so the v3 layout reads the rest (what a broker may try).
    r = Reader(listener.frames[0])
    RequestHeader.decode(r, 2)
    assert ApiVersionsRequest.decode(r, 3).client_software_name == "kafka-python"


def test_librdkafka_api_versions_v3(listener: FirstFrameListener) -> None:
    ck = pytest.importorskip("confluent_kafka")
    admin_module = pytest.importorskip("confluent_kafka.admin")
    admin = admin_module.AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{listener.port}",
            "client.id": "krill-ck",
            "socket.timeout.ms": 1000,
            "reconnect.backoff.max.ms": 200,
        }
    )
    try:
        with pytest.raises(ck.KafkaException):
            admin.list_topics(timeout=1.5)
    finally:
        del admin  # librdkafka handles close when collected
    assert listener.frames, "librdkafka sent nothing"
    header, body = decode_request(listener.frames[0])
    assert (header.request_api_key, header.request_api_version) == (18, 3)
    assert header.client_id == "krill-ck"
    assert isinstance(body, ApiVersionsRequest)
    assert body.client_software_name.startswith(("confluent-kafka-python", "librdkafka"))
    assert body.client_software_version


# Hand-built frames -----------------------------------------------------------------------

METADATA_V1 = bytes.fromhex(
    "0003"
    "0001"
    "00000007"
    "0005"
    + b"krill".hex()  # header v1: key, version, corr, client
    + "00000002"
    "0006" + b"orders".hex() + "0008" + b"payments".hex()  # topics
)

API_VERSIONS_V3 = bytes.fromhex(
    "0012"
    "0003"
    "0000002a"
    "0002"
    + b"ck".hex()
    + "00"  # header v2: classic client id, tags
    + "06"
    + b"krill".hex()
    + "04"
    + b"1.0".hex()
    + "00"  # compact strings, no tags
)


def test_metadata_v1_known_bytes() -> None:
    header, body = decode_request(METADATA_V1)
    assert header == RequestHeader(
        request_api_key=3, request_api_version=1, correlation_id=7, client_id="krill"
    )
    assert body == MetadataRequest(
        topics=[
            MetadataRequest.MetadataRequestTopic(name="orders"),
            MetadataRequest.MetadataRequestTopic(name="payments"),
        ],
        allow_auto_topic_creation=True,  # absent in v1: the spec default
    )
    w = Writer()
    header.encode(w, 1)
    body.encode(w, 1)
    assert w.getvalue() == METADATA_V1


def test_api_versions_v3_known_bytes() -> None:
    header, body = decode_request(API_VERSIONS_V3)
    assert (header.correlation_id, header.client_id) == (42, "ck")
    assert body == ApiVersionsRequest(client_software_name="krill", client_software_version="1.0")
    w = Writer()
    header.encode(w, 2)
    body.encode(w, 3)
    assert w.getvalue() == API_VERSIONS_V3


def test_api_versions_response_uses_header_v0_and_tagged_fields() -> None:
    assert response_header_version(18, 3) == 0
    assert response_header_version(3, 12) == 1 and response_header_version(3, 8) == 0
    assert request_header_version(7, 0) == 0 and request_header_version(18, 3) == 2
    response = ApiVersionsResponse(
        api_keys=[ApiVersionsResponse.ApiVersion(api_key=0, min_version=3, max_version=11)],
        finalized_features_epoch=5,  # tag 1
    )
    w = Writer()
    ResponseHeader(correlation_id=42).encode(w, 0)
    response.encode(w, 3)
    expected = bytes.fromhex(
        "0000002a"  # correlation id, header v0
        "0000"
        "02"
        "0000"
        "0003"
        "000b"
        "00"
        "00000000"  # error, api_keys, throttle
        "01"
        "01"
        "08"
        "0000000000000005"  # one tagged field: tag 1, 8 bytes
    )
    assert w.getvalue() == expected
    r = Reader(expected)
    assert ResponseHeader.decode(r, 0).correlation_id == 42
    assert ApiVersionsResponse.decode(r, 3) == response
