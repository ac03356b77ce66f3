"""A simulated client's connection: real Kafka frames over a socket pair to a shard's
`Connection` actor, on the virtual loop.

The client holds one end of a `socket.socketpair()`, the shard's `Connection` actor the
other, exactly as it would hold an accepted TCP socket. Requests are encoded with the wire
codecs; responses are matched to requests in order (Kafka answers in request order) and
decoded, except a one-partition ProduceResponse, which `produce_answer` reads at its fixed
places (the simulated producers read thousands a second). A connection that closes, by
either end, answers every request still waiting with None.
"""

from __future__ import annotations

import collections
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from wire.messages import request_header_version, response_class, response_header_version
from wire.messages.request_header import RequestHeader
from wire.messages.response_header import ResponseHeader
from wire.primitives import Reader, Writer

if TYPE_CHECKING:
    from scenarios.sim.clock import VirtualLoop
    from scenarios.sim.cluster import SimNode

__all__ = ["Callback", "ClientConnection", "PRODUCE_VERSION", "ProduceAnswer", "World",
           "encode_request", "produce_answer"]

PRODUCE_VERSION = 8  # v3-8: the record set is a request's last field (SimProducer relies on it)
_SOCKET_BUFFER_BYTES = 4 << 20  # a response never waits on a full socket in a simulation
_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")  # at byte 8 of a request frame (after size, key, version)

Callback = Callable[[Any], None]  # a response body, or None: no response will come


class World(Protocol):
    """What a client connection needs of the simulation (scenarios/sim/engine.py's)."""

    loop: VirtualLoop
    node: SimNode

    def now_ns(self) -> int: ...


class ClientConnection:
    """One client socket to one shard: requests out, responses matched in order."""

    def __init__(self, sim: World, shard_id: int, client_id: str,
                 on_closed: Callable[[], None]) -> None:
        self._sim = sim
        self._on_closed = on_closed
        self.shard_id = shard_id
        self._client_id = client_id
        ours, theirs = socket.socketpair()
        for sock in (ours, theirs):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)
        ours.setblocking(False)
        self._sock = ours
        self._fd = ours.fileno()
        self._correlation = 0
        # (correlation id, api key, version, callback, sent at ns), in request order
        self._waiting: collections.deque[tuple[int, int, int, Callback, int]]
        self._waiting = collections.deque()
        self._received = bytearray()
        self._out = bytearray()
        self.closed = False
        shard = sim.node.up(shard_id)
        assert shard is not None
        shard.connect(theirs)
        sim.loop.add_reader(self._fd, self._readable)

    def oldest_sent_ns(self) -> int | None:
        """When the oldest request still waiting for its response was sent."""
        return self._waiting[0][4] if self._waiting else None

    def send(self, api_key: int, version: int, request: Any, callback: Callback) -> None:
        """Send one request; `callback(body)` with its response, or None if it never comes."""
        frame = encode_request(self._client_id, api_key, version, request)
        self.send_frame(api_key, version, [frame], callback)

    def send_frame(self, api_key: int, version: int, parts: list[bytes | bytearray],
                   callback: Callback) -> None:
        """Send the frame `parts` make up, its size and correlation id set here."""
        assert not self.closed
        self._correlation += 1
        out = self._out
        start = len(out)
        for part in parts:
            out += part
        _SIZE.pack_into(out, start, len(out) - start - 4)
        _CORRELATION.pack_into(out, start + 8, self._correlation)
        self._waiting.append((self._correlation, api_key, version, callback,
                              self._sim.now_ns()))
        self._flush()

    def _flush(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return
        del self._out[:sent]
        if self._out:
            self._sim.loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        self._sim.loop.remove_writer(self._fd)
        if not self.closed:
            self._flush()

    def _readable(self) -> None:
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        received = self._received
        received += data
        position = 0
        while len(received) - position >= 4:
            (size,) = _SIZE.unpack_from(received, position)
            if len(received) - position - 4 < size:
                break
            frame = memoryview(received)[position + 4:position + 4 + size]
            position += 4 + size
            self._response(bytes(frame))
            frame.release()
            if self.closed:
                return
        del received[:position]

    def _response(self, frame: bytes) -> None:
        correlation, api_key, version, callback, _ = self._waiting.popleft()
        if api_key == 0 and version == PRODUCE_VERSION:
            got, answer = produce_answer(frame)
            assert got == correlation, "responses out of order"
            callback(answer)
            return
        reader = Reader(frame)
        header = ResponseHeader.decode(reader, response_header_version(api_key, version))
        assert header.correlation_id == correlation, "responses out of order"
        callback(response_class(api_key).decode(reader, version))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        loop = self._sim.loop
        loop.remove_reader(self._fd)
        loop.remove_writer(self._fd)
        self._sock.close()
        waiting, self._waiting = self._waiting, collections.deque()
        for _, _, _, callback, _ in waiting:
            callback(None)
        self._on_closed()


class ProduceAnswer(NamedTuple):
    """The one partition's answer of a one-partition ProduceResponse."""

    error_code: int
    base_offset: int


_PRODUCE_HEAD = struct.Struct(">iih")  # correlation id, topics (1), topic name length
_PRODUCE_PARTITION = struct.Struct(">iihq")  # partitions (1), index, error code, base offset


def produce_answer(frame: bytes) -> tuple[int, ProduceAnswer]:
    """(correlation id, answer) of a ProduceResponse v3-8 to a one-partition request.

    The simulated producers read thousands of these a second, and the generated decoder
    builds every field of the response; this reads the two it needs, at their fixed places:
    header (correlation id), responses [name, partition_responses [index, error_code,
    base_offset, ...]]. tests/scenarios/test_sim.py checks it against the generated decoder.
    """
    correlation, topics, name_bytes = _PRODUCE_HEAD.unpack_from(frame)
    assert topics == 1, "a one-partition request has a one-partition response"
    count, _, error_code, base_offset = _PRODUCE_PARTITION.unpack_from(frame, 10 + name_bytes)
    assert count == 1
    return correlation, ProduceAnswer(error_code, base_offset)


def encode_request(client_id: str, api_key: int, version: int, request: Any) -> bytes:
    """A request frame, correlation id 0."""
    writer = Writer()
    at = writer.reserve_int32()
    RequestHeader(
        request_api_key=api_key, request_api_version=version, correlation_id=0,
        client_id=client_id,
    ).encode(writer, request_header_version(api_key, version))
    request.encode(writer, version)
    writer.patch_int32(at, writer.size - 4)
    return writer.getvalue()
