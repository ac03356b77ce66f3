"""A minimal blocking Kafka client on Krill's own codec, for tests that need exact requests.

Real client libraries cannot send malformed frames, chosen versions or duplicate batches on
purpose; this can. It speaks one request at a time unless told to pipeline.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, NamedTuple

from wire.messages import (
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from wire.messages.fetch import FetchRequest
from wire.messages.produce import ProduceRequest
from wire.messages.request_header import RequestHeader
from wire.messages.response_header import ResponseHeader
from wire.primitives import Reader, Writer
from wire.record_batch import BatchHeader, iter_batches
from wire.records import decode_batch

__all__ = ["RawClient", "TxnMarker", "fetch_request", "produce_request", "request", "txn_markers"]

_TIMEOUT_S = 10.0


class RawClient:
    def __init__(self, bootstrap: str, client_id: str = "raw-test") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=_TIMEOUT_S)
        self.client_id = client_id
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode(self, api_key: int, version: int, request: Any, correlation_id: int) -> bytes:
        writer = Writer()
        at = writer.reserve_int32()
        RequestHeader(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=correlation_id,
            client_id=self.client_id,
        ).encode(writer, request_header_version(api_key, version))
        request.encode(writer, version)
        writer.patch_int32(at, writer.size - 4)
        return writer.getvalue()

    def send(self, api_key: int, version: int, request: Any) -> int:
        self._correlation += 1
        self.sock.sendall(self.encode(api_key, version, request, self._correlation))
        return self._correlation

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive_frame(self) -> bytes | None:
        """One response frame, or None if the broker closed the connection."""
        size_bytes = self._read_exactly(4)
        if size_bytes is None:
            return None
        (size,) = struct.unpack(">i", size_bytes)
        return self._read_exactly(size)

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        frame = self.receive_frame()
        assert frame is not None, "connection closed by the broker"
        reader = Reader(frame)
        header = ResponseHeader.decode(reader, response_header_version(api_key, version))
        body = response_class(api_key).decode(reader, version)
        return header.correlation_id, body

    def call(self, api_key: int, version: int, request: Any) -> Any:
        correlation_id = self.send(api_key, version, request)
        got, body = self.receive(api_key, version)
        assert got == correlation_id
        return body

    def _read_exactly(self, n: int) -> bytes | None:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def closed_by_peer(self) -> bool:
        """True if the broker closed this connection (EOF within the timeout)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def request(api_key: int, **fields: Any) -> Any:
    return request_class(api_key)(**fields)


def produce_request(
    topic: str, records: bytes | bytearray, *, acks: int = -1, partition: int = 0
) -> ProduceRequest:
    """One record set for one partition (Produce v3+)."""
    return ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.PartitionProduceData(index=partition, records=records)
                ],
            )
        ],
    )


def fetch_request(
    topic: str,
    offset: int = 0,
    *,
    partition: int = 0,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
) -> FetchRequest:
    """A full (sessionless) fetch of one partition (Fetch v4-12)."""
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[
                    FetchRequest.FetchPartition(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        partition_max_bytes=partition_max_bytes,
                    )
                ],
            )
        ],
    )


class TxnMarker(NamedTuple):
    offset: int
    producer_id: int
    commit: bool
    coordinator_epoch: int


_MARKER_KEY = struct.Struct(">hh")  # version, type (0 ABORT, 1 COMMIT)
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def txn_markers(bootstrap: str, topic: str, partition: int = 0) -> list[TxnMarker]:
    """The COMMIT and ABORT markers of a partition up to its high watermark, read from its
    leader at `bootstrap` (read_uncommitted; one fetch per segment, as a read stops at a
    segment's end)."""
    markers: list[TxnMarker] = []
    offset, high_watermark = 0, 1
    with RawClient(bootstrap) as client:
        while offset < high_watermark:
            answer = client.call(1, 12, fetch_request(topic, offset, partition=partition))
            (fetched,) = answer.responses[0].partitions
            assert fetched.error_code == 0, fetched.error_code
            high_watermark = fetched.high_watermark
            records = bytes(fetched.records or b"")
            headers = iter_batches(records)
            if not headers:
                break
            markers += [m for h in headers if (m := _marker(records, h)) is not None]
            offset = headers[-1].next_offset
    return markers


def _marker(records: bytes, header: BatchHeader) -> TxnMarker | None:
    if not header.is_control:
        return None
    _, (record,) = decode_batch(records[header.position:header.position + header.size])
    _version, kind = _MARKER_KEY.unpack(record.key or b"")
    if kind not in (0, 1):
        return None  # a LEADER_CHANGE
    _version, epoch = _MARKER_VALUE.unpack(record.value or b"")
    return TxnMarker(header.base_offset, header.producer_id, kind == 1, epoch)
