"""The Connection actor: one per client socket. It frames, dispatches, and answers in order.

Bytes come in with non-blocking `recv_into` straight into the frame reader's buffer (no asyncio
streams: DESIGN.md §11). Each frame's header picks the handler for its API key; the handler
decodes the body and sends messages to the actors that own the state (partitions, the
controller). Requests are dispatched in arrival order and may complete out of order; responses
are written strictly in request order, because every Kafka client matches them to requests by
position (CLIENTS.md gotcha 4). Produce with acks=0 gets no response at all (gotcha 3).

Responses go out with `sendmsg` for bytes and `os.sendfile` for log regions (zero copy). When
too many requests are pending, or too many response bytes are queued because the client reads
slowly, the connection stops reading its socket until that drains: memory stays bounded.

Bad input never hurts the shard: an oversize or negative frame length, an unknown API key, an
unsupported version (other than ApiVersions, which answers UNSUPPORTED_VERSION) or a body that
does not decode closes this connection with a log line, as Kafka does.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import struct
import time
from typing import Any

from actors import limits
from actors.handlers import HANDLERS, Handler, unsupported_api_versions_response
from actors.runtime import LoopActor, current_loop
from actors.services import Services
from actors.trace import ProduceTrace, sampled
from wire.errors import DecodeError
from wire.frame import FrameReader
from wire.messages import request_header_version, response_header_version
from wire.messages.request_header import RequestHeader
from wire.primitives import Reader, Writer, is_region

__all__ = ["Connection", "RequestContext"]

log = logging.getLogger(__name__)

_API_KEY_AND_VERSION = struct.Struct(">hhi")
_API_VERSIONS_KEY = 18
_PRODUCE_KEY = 0
# sendmsg takes at most this many buffers per call (IOV_MAX is 1024 on Linux).
_IOV_MAX = 512


class _Slot:
    """One request awaiting its response, in the connection's request order."""

    __slots__ = (
        "correlation_id", "api_key", "version", "charged_bytes", "response", "done", "abort",
        "started", "trace",
    )

    def __init__(
        self, correlation_id: int, api_key: int, version: int, charged_bytes: int = 0,
        trace: ProduceTrace | None = None,
    ) -> None:
        self.started = time.monotonic()  # request latency: from dispatch to answer
        self.trace = trace  # a sampled produce's stage times (actors/trace.py)
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.version = version
        self.charged_bytes = charged_bytes  # request bytes held against the shard's budget
        self.response: Any = None
        self.done = False
        # Releases what the request holds (a long poll's watches) if the connection closes
        # before it is answered.
        self.abort: Any = None


class RequestContext:
    """What a handler sees of the request it serves, and how it answers."""

    __slots__ = (
        "connection", "services", "api_key", "version", "client_id", "frame_buffer", "_slot",
        "trace",
    )

    @property
    def memo(self) -> Any:
        """What this API's handler kept on this connection from its last request (one value
        per API key, dropped with the connection), or None."""
        return self.connection.memos.get(self.api_key)

    @memo.setter
    def memo(self, value: Any) -> None:
        self.connection.memos[self.api_key] = value

    def __init__(
        self,
        connection: Connection,
        services: Services,
        api_key: int,
        version: int,
        client_id: str | None,
        slot: _Slot | None,
        frame_buffer: Any = None,
        trace: ProduceTrace | None = None,
    ) -> None:
        self.connection = connection
        self.services = services
        self.api_key = api_key
        self.version = version
        self.client_id = client_id
        # The arena region the request was received into (shards/arena.py), or None. A
        # handler that keeps the frame's bytes past `handle()` retains it, and releases it
        # once done with them (produce: at each partition's phase one).
        self.frame_buffer = frame_buffer
        self._slot = slot
        self.trace = trace  # this produce request is sampled (actors/trace.py)

    def on_abort(self, abort: Any) -> None:
        """Call `abort()` if the connection closes before this request is answered."""
        if self._slot is not None:
            self._slot.abort = abort

    def respond(self, response: Any) -> None:
        """Complete this request; written as soon as every earlier response is out."""
        slot = self._slot
        if slot is None:  # acks=0 produce: the client expects nothing
            return
        self._slot = None
        self.connection.complete(slot, response)


class Connection(LoopActor):
    def __init__(self, sock: socket.socket, services: Services) -> None:
        super().__init__()
        self._sock = sock
        self._fd = sock.fileno()
        self._services = services
        self._peer = _peer_name(sock)
        self._frames = FrameReader(buffers=services.frame_buffer, scratch=services.frame_scratch)
        # Idle consumers ask the same thing every few ms: a handler may answer with the very
        # same response object again (`ctx.memo` keeps what it needs to know that), and then
        # its bytes are not encoded again: (response, version, body bytes).
        self._encoded: tuple[Any, int, bytes] | None = None
        self.memos: dict[int, Any] = {}
        self._pending: collections.deque[_Slot] = collections.deque()
        self._out: collections.deque[Any] = collections.deque()  # memoryviews and file regions
        self._out_head_sent = 0  # bytes of _out[0] already sent
        self._out_bytes = 0
        self._reading = False
        self._writing = False
        self._waiting_for_memory = False
        self._closed = False
        self._trace_every = services.settings.trace_produce_every

    def __str__(self) -> str:
        return f"Connection({self._peer})"

    # Lifecycle ----------------------------------------------------------------------------

    def on_start(self) -> None:
        metrics = self._services.metrics
        if metrics is not None:
            metrics.connections += 1
            metrics.connections_accepted += 1
        self._sock.setblocking(False)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (a unix socket in a test)
        self._resume_reading()

    def on_stop(self) -> None:
        self._close_socket()

    def close(self, reason: str) -> None:
        if not self._closed:
            log.info("%s: closing: %s", self, reason)
            self._close_socket()
            self.stop_now()

    def _close_socket(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._services.metrics is not None:
            self._services.metrics.connections -= 1
        self._services.connection_closed()
        loop = current_loop()
        if self._reading:
            loop.remove_reader(self._fd)
        if self._writing:
            loop.remove_writer(self._fd)
        self._reading = self._writing = False
        memory = self._services.memory
        pending, self._pending = self._pending, collections.deque()
        for slot in pending:
            memory.release(slot.charged_bytes)
            if slot.abort is not None and not slot.done:
                slot.abort()
        self._out.clear()
        self._encoded = None
        self.memos.clear()
        self._frames.close()
        self._sock.close()

    # Reading ------------------------------------------------------------------------------

    def _resume_reading(self) -> None:
        if self._services.memory.over():
            # The shard has too many bytes in flight: read again once some are released.
            if not self._waiting_for_memory:
                self._waiting_for_memory = True
                self._services.memory.when_under(self._memory_available)
            return
        if not self._reading and not self._closed:
            self._reading = True
            current_loop().add_reader(self._fd, self._on_readable)

    def _memory_available(self) -> None:
        self._waiting_for_memory = False
        if not self._closed and self._can_read():
            self._resume_reading()

    def _can_read(self) -> bool:
        return (
            len(self._pending) < limits.connection_inflight_requests_max
            and self._out_bytes < limits.connection_send_queue_bytes_max
        )

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            current_loop().remove_reader(self._fd)

    def _on_readable(self) -> None:
        try:
            self._read_and_dispatch()
        except Exception:
            # Our bug, not the client's: log it, drop this connection, keep the shard.
            log.exception("%s: reading failed", self)
            self.close("internal error")

    def _read_and_dispatch(self) -> None:
        buffer = self._frames.buffer()
        try:
            nbytes = self._sock.recv_into(
                buffer, min(len(buffer), limits.connection_recv_bytes_max)
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close(_disconnect_reason("receive", e))
            return
        if nbytes == 0:
            self.close("closed by the client")
            return
        try:
            frames = self._frames.advance(nbytes)
        except DecodeError as e:
            log.warning("%s: bad frame: %s", self, e)
            self.close("bad frame")
            return
        lent = self._frames.take_buffer()  # a large produce frame's arena region, if any
        read_at = ProduceTrace.now() if self._trace_every else 0.0
        for frame in frames:
            if self._closed:
                if lent is not None:
                    lent.release()
                return
            self._handle_frame(frame, lent, read_at)
        if not self._can_read() or self._services.memory.over():
            self._pause_reading()
            self._resume_reading()  # waits for memory if that is what is short

    def _handle_frame(self, frame: bytearray | memoryview, lent: Any = None,
                      read_at: float = 0.0) -> None:
        try:
            self._dispatch_frame(frame, lent, read_at)
        finally:
            if lent is not None:
                lent.release()  # handlers that keep the bytes retained it

    def _dispatch_frame(self, frame: bytearray | memoryview, lent: Any, read_at: float) -> None:
        try:
            api_key, version, correlation_id = _API_KEY_AND_VERSION.unpack_from(frame)
        except struct.error:
            log.warning("%s: frame of %d bytes is too short for a request header", self, len(frame))
            self.close("short request header")
            return
        handler = HANDLERS.get(api_key)
        if handler is None:
            log.warning("%s: unknown API key %d (version %d)", self, api_key, version)
            self.close(f"unknown API key {api_key}")
            return
        if not handler.MIN_VERSION <= version <= handler.MAX_VERSION:
            self._unsupported_version(handler, api_key, version, correlation_id)
            return
        reader = Reader(frame)
        try:
            header = RequestHeader.decode(reader, request_header_version(api_key, version))
            request = handler.REQUEST.decode(reader, version)
        except DecodeError as e:
            log.warning("%s: %s v%d does not decode: %s", self, handler.NAME, version, e)
            self.close("malformed request")
            return
        trace = None
        if api_key == _PRODUCE_KEY and self._trace_every and sampled(self._trace_every):
            trace = ProduceTrace(read_at)
            trace.decoded = trace.now()
        slot = None
        if handler.expects_response(request):
            slot = _Slot(correlation_id, api_key, version, len(frame), trace)
            self._services.memory.acquire(len(frame))
            self._pending.append(slot)
        context = RequestContext(
            self, self._services, api_key, version, header.client_id, slot, lent, trace
        )
        try:
            handler.handle(context, request)
        except Exception:
            log.exception("%s: %s v%d handler failed", self, handler.NAME, version)
            self.close("internal error")

    def _unsupported_version(
        self, handler: Handler, api_key: int, version: int, correlation_id: int
    ) -> None:
        if api_key != _API_VERSIONS_KEY:
            # Kafka closes the connection for any other API at an unsupported version.
            log.warning("%s: %s v%d is not supported", self, handler.NAME, version)
            self.close(f"unsupported version {version} of {handler.NAME}")
            return
        # KIP-511: answer with a v0 body listing our versions; the client retries lower.
        slot = _Slot(correlation_id, api_key, 0)
        self._pending.append(slot)
        self.complete(slot, unsupported_api_versions_response())

    # Writing ------------------------------------------------------------------------------

    def complete(self, slot: _Slot, response: Any) -> None:
        if self._closed:
            return
        assert not slot.done, "a request answered twice"
        slot.response = response
        slot.done = True
        metrics = self._services.metrics
        if metrics is not None:
            metrics.request(slot.api_key, time.monotonic() - slot.started)
        pending = self._pending
        if pending[0] is not slot:
            return
        memory = self._services.memory
        traced: list[ProduceTrace] | None = None  # a list only when a traced one is done
        while pending and pending[0].done:
            done = pending.popleft()
            self._encode(done)
            memory.release(done.charged_bytes)
            if done.trace is not None:
                traced = traced or []
                traced.append(done.trace)
        self._send()
        for trace in traced or ():  # after the send: a trace's last stage ends at the socket
            trace.finish(None if metrics is None else metrics.produce_stages)
        if self._can_read():
            self._resume_reading()

    def _encode(self, slot: _Slot) -> None:
        """Frame a response: its header, then its body, encoded once if a handler answers
        with the very same response object again (a memo: an idle long poll's answer)."""
        response, version = slot.response, slot.version
        encoded = self._encoded
        if encoded is not None and encoded[0] is response and encoded[1] == version:
            chunks: list[Any] = [encoded[2]]
            size = len(encoded[2])
        else:
            body = Writer()
            response.encode(body, version)
            chunks, size = body.chunks(), body.size
            if len(chunks) == 1 and not is_region(chunks[0]):  # bytes only: may be kept
                keep = size <= limits.connection_memo_bytes_max
                self._encoded = (response, version, chunks[0]) if keep else None
        head = Writer()
        size_at = head.reserve_int32()
        head.int32(slot.correlation_id)
        if response_header_version(slot.api_key, version) >= 1:
            head.unsigned_varint(0)  # empty tagged-field section
        head.patch_int32(size_at, head.size - 4 + size)
        out = self._out
        out.append(head.getvalue())
        self._out_bytes += head.size
        for chunk in chunks:
            out.append(chunk)
            self._out_bytes += chunk.length if is_region(chunk) else len(chunk)

    def _send(self) -> None:
        out = self._out
        try:
            while out:
                head = out[0]
                if is_region(head):
                    sent = self._send_region(head)
                    if sent is None:
                        break
                else:
                    sent = self._send_bytes()
                    if sent is None:
                        break
        except OSError as e:
            self.close(_disconnect_reason("send", e))
            return
        if out and not self._writing:
            self._writing = True
            current_loop().add_writer(self._fd, self._on_writable)
        elif not out and self._writing:
            self._writing = False
            current_loop().remove_writer(self._fd)

    def _on_writable(self) -> None:
        self._send()
        if not self._closed and self._can_read():
            self._resume_reading()

    def _send_region(self, region: Any) -> int | None:
        """sendfile the head region; None when the socket is full."""
        done = self._out_head_sent
        try:
            sent = os.sendfile(self._fd, region.fd, region.position + done, region.length - done)
        except (BlockingIOError, InterruptedError):
            return None
        if sent == 0:
            raise OSError(f"log file ended inside a region being sent ({region})")
        self._consumed(sent)
        return sent

    def _send_bytes(self) -> int | None:
        """sendmsg the leading bytes chunks; None when the socket is full."""
        buffers = []
        for index, chunk in enumerate(self._out):
            if is_region(chunk) or index == _IOV_MAX:
                break
            buffers.append(chunk)
        if self._out_head_sent:
            buffers[0] = memoryview(buffers[0])[self._out_head_sent :]
        try:
            sent = self._sock.sendmsg(buffers)
        except (BlockingIOError, InterruptedError):
            return None
        self._consumed(sent)
        return sent

    def _consumed(self, sent: int) -> None:
        out = self._out
        self._out_bytes -= sent
        sent += self._out_head_sent
        while out:
            head = out[0]
            size = head.length if is_region(head) else len(head)
            if sent < size:
                break
            sent -= size
            out.popleft()
        self._out_head_sent = sent


def _disconnect_reason(operation: str, error: OSError) -> str:
    """A client that hangs up mid-response is a normal close, not a failure."""
    if isinstance(error, BrokenPipeError | ConnectionResetError):
        return "closed by the client"
    return f"{operation} failed: {error}"


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError):
        return "unknown peer"
