"""The reader client: a ZeroMQ DEALER that asks one node's reader endpoint, with a timeout.

Used by the Spark driver (metadata, offsets) and by each executor task (fetches). A client is
made inside `read()`, never pickled: sockets do not survive pickling. Every request waits at
most `timeout_s`; a dead or stuck node raises `ReaderTimeout` and fails the task instead of
hanging it. After a timeout the socket is replaced, so a late reply can never be taken for
the answer to a later request (correlation ids check that too).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import zmq

from wire.spark import protocol
from wire.spark.protocol import ReaderError

__all__ = ["ReaderClient", "ReaderTimeout", "FetchResult", "Metadata", "parse_address"]

# Time a request may take before the task fails: fetches are served from the page cache in
# milliseconds, so this only ever fires when the node is gone.
request_timeout_s_default = 30.0


class ReaderTimeout(Exception):
    """The node did not answer in time."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    log_start: int
    high_watermark: int
    records: memoryview  # whole batches; empty at the high watermark


@dataclass(frozen=True, slots=True)
class Metadata:
    node: int
    nodes: dict[int, str]  # node id -> reader address "host:port"
    topics: dict[str, list[int]]  # topic -> leader node id of each partition


def parse_address(address: str) -> str:
    """'host:port' (or a comma list, first wins; kafka.bootstrap.servers style) -> tcp URL."""
    first = address.split(",")[0].strip()
    if first.startswith("tcp://"):
        return first
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"reader address {address!r} is not host:port")
    return f"tcp://{host}:{port}"


class ReaderClient:
    def __init__(self, address: str, timeout_s: float = request_timeout_s_default) -> None:
        self.address = address
        self._url = parse_address(address)
        self._timeout_ms = int(timeout_s * 1000)
        self._context = zmq.Context(io_threads=1)
        self._socket: zmq.Socket[Any] | None = None
        self._ids = itertools.count(1)

    def __enter__(self) -> ReaderClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        self._context.term()

    # Requests -----------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None) -> Metadata:
        reply, _ = self._call(protocol.metadata_request(next(self._ids), topics))
        nodes = {int(k): v for k, v in reply["nodes"].items()}
        return Metadata(reply["node"], nodes, reply["topics"])

    def offsets(self, queries: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
        """(error, offset) per (topic, partition, timestamp) query; -2 earliest, -1 latest."""
        results: list[tuple[int, int]] = []
        step = protocol.offset_queries_max
        for start in range(0, len(queries), step):
            chunk = queries[start : start + step]
            reply, _ = self._call(protocol.offsets_request(next(self._ids), chunk))
            results += [(int(e), int(o)) for e, o in reply["results"]]
        return results

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = protocol.fetch_bytes_max
    ) -> FetchResult:
        """Whole batches from the one holding `offset`; ReaderError (code 1, with log_start
        and high_watermark on it) when the offset is out of range."""
        request = protocol.fetch_request(next(self._ids), topic, partition, offset, max_bytes)
        reply, frames = self._call(request)
        records = frames[0] if frames else memoryview(b"")
        return FetchResult(reply["log_start"], reply["high_watermark"], records)

    # Transport ----------------------------------------------------------------------------

    def _connect(self) -> zmq.Socket[Any]:
        if self._socket is None:
            socket = self._context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 16)
            socket.connect(self._url)
            self._socket = socket
        return self._socket

    def _call(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[memoryview]]:
        socket = self._connect()
        correlation = request["id"]
        socket.send(protocol.pack(request))
        deadline_ms = self._timeout_ms
        while True:
            if not socket.poll(deadline_ms, zmq.POLLIN):
                socket.close(linger=0)
                self._socket = None
                raise ReaderTimeout(
                    f"reader {self.address} did not answer {request['op']} in "
                    f"{self._timeout_ms / 1000:g}s")
            frames = socket.recv_multipart(copy=False)
            reply = protocol.unpack(frames[0].buffer)
            if reply.get("id") != correlation:
                continue  # a late answer to a request that timed out earlier
            error = reply.get("error", protocol.ERROR_NONE)
            if error != protocol.ERROR_NONE:
                raise ReaderError(error, str(reply.get("message", "")), reply)
            return reply, [frame.buffer for frame in frames[1:]]
