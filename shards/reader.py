"""The reader endpoint: a ZeroMQ ROUTER serving the Spark data source (DESIGN.md §8).

Shard 0 binds it on the node's reader address (default 127.0.0.1:9093). Requests and replies
are msgpack maps in the shapes of `wire.spark.protocol` (PROTOCOL.md): metadata from the
shard's topic table, each partition's leader and in-sync replicas as this node last heard
(`Services.partition_leader()`) and every registered node's reader address; offsets by
ListOffset, fetches by Read to the partition's actor — local, or on another shard through
`Services.partition()` like any Kafka handler. A node answers only for the partitions it has
a replica of, as their leader, or (a request's `any_replica`) as any replica, up to the high
watermark it knows: a fetch by `Read.any_replica`, earliest and latest offsets by a Read
past the end, which answers with the replica's log start and high watermark and reads
nothing (ListOffset is the leader's). `read_committed` (Kafka's isolation level) is the
partition's `Read.committed` and `ListOffset.committed`: reads stop at the last stable offset
and list the aborted transactions, latest is the last stable offset. A fetch answers with
the segment bytes as one raw frame, read with pread (on the I/O pool when large) and handed to
ZeroMQ without a copy: the reader never decodes records.

The socket is served on the shard's loop thread (shards/loop_router.py). Its address is bound
by the supervisor, which refuses to start the node when it is taken (shards/ports.py), and
handed over as a listening fd (`ZMQ_USE_FD`). A client's mistake (not msgpack, wrong version,
a field missing, over a limit) gets an error reply and a log line; nothing a client sends can
stop the shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from actors.partition_messages import FetchBudget, ListOffset, ListOffsetResult, Read, ReadResult
from actors.services import BrokerSettings, TopicTable
from shards import limits
from shards.loop_router import LoopRouter
from storage import FileSlice
from wire.errors import ErrorCode
from wire.spark import protocol
from wire.spark.protocol import ProtocolError

__all__ = ["ReaderEndpoint"]

log = logging.getLogger(__name__)

# A Read past any log's end: a replica answers OFFSET_OUT_OF_RANGE with its log start and high
# watermark, and reads nothing (earliest and latest offsets from any replica).
_PROBE_OFFSET = 2**62


class _Node(Protocol):
    """What the endpoint needs of its shard: the part of actors.services.Services it uses."""

    settings: BrokerSettings

    def topics(self) -> TopicTable: ...

    def partition(self, topic: str, index: int) -> Any: ...

    def partition_leader(
        self, topic: str, index: int
    ) -> tuple[int, int, list[int], list[int]] | None: ...

    def read_blocking(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None: ...


class ReaderEndpoint:
    """The ROUTER socket and the requests in flight on it. Loop thread only."""

    def __init__(
        self,
        services: _Node,
        loop: asyncio.AbstractEventLoop,
        address: tuple[str, int],
        advertised: str,
        *,
        context: zmq.Context[Any] | None = None,
        listening_fd: int | None = None,
    ) -> None:
        """Serve on `address`; with `listening_fd`, on that socket, already bound to it."""
        self._services = services
        self._advertised = advertised
        self._own_context = context is None
        self._context = zmq.Context(io_threads=1) if context is None else context
        socket = self._context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.SNDHWM, limits.reader_high_water_mark_messages)
        socket.setsockopt(zmq.RCVHWM, limits.reader_high_water_mark_messages)
        socket.setsockopt(zmq.MAXMSGSIZE, protocol.request_bytes_max)
        socket.setsockopt(zmq.LINGER, 0)
        host, port = address
        if ":" in host:
            socket.setsockopt(zmq.IPV6, 1)
            host = f"[{host}]"
        if listening_fd is not None:
            socket.setsockopt(zmq.USE_FD, listening_fd)
        socket.bind(f"tcp://{host}:{port}")
        self._in_flight = 0
        self.requests = 0  # served, for tests and stats
        self.errors = 0
        self._router = LoopRouter(
            loop, socket, self._handle, limits.reader_requests_per_turn_max, "reader"
        )

    def close(self) -> None:
        if self._router.closed:
            return
        self._router.close()
        if self._own_context:
            self._context.term()

    # Receiving ----------------------------------------------------------------------------

    def _handle(self, identity: bytes, frames: list[Any]) -> None:
        correlation: Any = None
        try:
            if len(frames) != 1:
                raise ProtocolError(f"request of {len(frames)} frames, expected 1")
            message = protocol.unpack(frames[0].buffer, protocol.request_bytes_max)
            correlation = message.get("id")
            op, arguments = protocol.parse_request(message)
        except ProtocolError as exc:
            self.errors += 1
            log.info("reader: bad request: %s", exc)
            self._send(identity, protocol.error_reply(correlation, exc.code, str(exc)))
            return
        self.requests += 1
        if self._in_flight >= limits.reader_requests_in_flight_max:
            self._send(
                identity,
                protocol.error_reply(
                    correlation, protocol.ERROR_BUSY, "too many requests in flight, retry"
                ),
            )
            return
        if op == "metadata":
            self._metadata(identity, correlation, arguments)
        elif op == "offsets":
            self._offsets(identity, correlation, arguments)
        else:
            self._fetch(identity, correlation, arguments)

    # Requests -----------------------------------------------------------------------------

    def _metadata(self, identity: bytes, correlation: Any, names: list[str] | None) -> None:
        table = self._services.topics().topics
        node_id = self._services.settings.node_id
        if names is None:
            names = [name for name, info in table.items() if not info.internal]
        topics: dict[str, list[int]] = {}
        isr: dict[str, list[list[int]]] = {}
        for name in names:
            info = table.get(name)
            if info is None:
                continue
            leaders = topics[name] = []
            in_sync = isr[name] = []
            for index in range(info.partitions):
                found = self._services.partition_leader(name, index)
                if found is None:  # a node of its own leads everything
                    leaders.append(node_id)
                    in_sync.append([node_id])
                else:
                    leaders.append(found[0])
                    in_sync.append(list(found[3]))
        self._send(
            identity,
            protocol.reply(correlation, node=node_id, nodes=self._reader_addresses(),
                           topics=topics, isr=isr),
        )

    def _reader_addresses(self) -> dict[int, str]:
        """Every registered node's reader address, this node's as it advertises it."""
        registered = getattr(self._services, "reader_addresses", None)
        nodes = dict(registered()) if registered is not None else {}
        nodes[self._services.settings.node_id] = self._advertised
        return nodes

    def _offsets(self, identity: bytes, correlation: Any, request: protocol.OffsetsRequest) -> None:
        queries = request.queries
        results: list[list[int]] = [[protocol.ERROR_UNKNOWN_TOPIC_OR_PARTITION, -1]] * len(queries)
        waiting = 0

        def release() -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0:
                self._in_flight -= 1
                self._send(identity, protocol.reply(correlation, results=results))

        def answered(index: int, error: int, offset: int) -> None:
            results[index] = [error, offset]
            release()

        def on_listed(index: int) -> Callable[[ListOffsetResult], None]:
            return lambda result: answered(index, int(result.error), result.offset)

        def on_probed(index: int, timestamp: int) -> Callable[[ReadResult], None]:
            def done(result: ReadResult) -> None:
                if result.error not in (ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE):
                    answered(index, int(result.error), -1)
                elif timestamp == protocol.EARLIEST:
                    answered(index, protocol.ERROR_NONE, result.log_start_offset)
                elif request.read_committed:
                    answered(index, protocol.ERROR_NONE, result.last_stable_offset)
                else:
                    answered(index, protocol.ERROR_NONE, result.high_watermark)

            return done

        refs = [self._services.partition(topic, index) for topic, index, _ in queries]
        waiting = sum(ref is not None for ref in refs) + 1  # +1: released below
        self._in_flight += 1
        for i, (ref, (_, _, timestamp)) in enumerate(zip(refs, queries, strict=True)):
            if ref is None:
                continue
            if request.any_replica and timestamp in (protocol.EARLIEST, protocol.LATEST):
                ref.tell(Read(_PROBE_OFFSET, 1, -1, FetchBudget(1), on_probed(i, timestamp),
                              True))
            else:
                ref.tell(ListOffset(timestamp, -1, on_listed(i), request.read_committed))
        release()

    def _fetch(self, identity: bytes, correlation: Any, request: protocol.FetchRequest) -> None:
        ref = self._services.partition(request.topic, request.partition)
        if ref is None:
            self._send(
                identity,
                protocol.error_reply(
                    correlation,
                    protocol.ERROR_UNKNOWN_TOPIC_OR_PARTITION,
                    f"no partition {request.topic}-{request.partition}",
                ),
            )
            return
        self._in_flight += 1

        def on_read(result: ReadResult) -> None:
            if result.error != ErrorCode.NONE:
                self._in_flight -= 1
                header = protocol.error_reply(
                    correlation,
                    int(result.error),
                    f"{result.error.name} reading {request.topic}-{request.partition} at "
                    f"{request.offset}",
                )
                header["log_start"] = result.log_start_offset
                header["high_watermark"] = result.high_watermark
                self._send(identity, header)
                return
            self._send_records(identity, correlation, result)

        max_bytes = request.max_bytes
        ref.tell(Read(request.offset, max_bytes, -1, FetchBudget(max_bytes), on_read,
                      request.any_replica, request.read_committed))

    def _send_records(self, identity: bytes, correlation: Any, result: ReadResult) -> None:
        def send(data: Any) -> None:
            self._in_flight -= 1
            header = protocol.reply(
                correlation,
                log_start=result.log_start_offset,
                high_watermark=result.high_watermark,
                last_stable_offset=result.last_stable_offset,
                bytes=len(data),
            )
            if result.aborted_transactions is not None:  # read_committed
                header["aborted"] = [list(a) for a in result.aborted_transactions]
            self._send(identity, header, data)

        records = result.records
        if records is None:
            send(b"")
        elif not isinstance(records, FileSlice):
            send(records)
        elif records.length <= limits.reader_inline_read_bytes_max:
            try:
                data = records.read()
            except OSError as exc:
                self._read_failed(identity, correlation, exc)
                return
            send(data)
        else:

            def done(data: Any, error: BaseException | None) -> None:
                if error is not None:
                    self._read_failed(identity, correlation, error)
                else:
                    send(data)

            self._services.read_blocking(records.read, done)

    def _read_failed(self, identity: bytes, correlation: Any, error: BaseException) -> None:
        self._in_flight -= 1
        log.warning("reader: segment read failed: %s", error)
        self._send(
            identity,
            protocol.error_reply(
                correlation, int(ErrorCode.UNKNOWN_SERVER_ERROR), f"segment read failed: {error}"
            ),
        )

    # Sending ------------------------------------------------------------------------------

    def _send(self, identity: bytes, header: dict[str, Any], data: Any = b"") -> None:
        packed = protocol.pack(header)
        self._router.send(identity, [packed, data] if len(data) else [packed])
