"""The reader client: a ZeroMQ DEALER that asks one node's reader endpoint, with timeouts.

Used by the Spark driver (metadata, offsets) and by each executor task (fetches). A client is
made inside `read()`, never pickled: sockets do not survive pickling. Every request waits at
most `timeout_s`, and a node that cannot be reached fails sooner: the socket queues a request
only on a finished connection (`ZMQ_IMMEDIATE`), so a node that is down, refusing or stuck in
the handshake raises `ReaderUnreachable` after `connect_timeout_s`; one that goes away while
a request waits raises it as soon as ZeroMQ sees the connection drop (a socket monitor). Both
are `ReaderTimeout`s: the caller asks another replica (wire/spark/replicas.py). After either,
the socket is replaced, so a late reply can never be taken for the answer to a later request
(correlation ids check that too).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from wire.spark import protocol
from wire.spark.arrow import AbortedTransaction
from wire.spark.protocol import ReaderError

__all__ = [
    "ReaderClient",
    "ReaderTimeout",
    "ReaderUnreachable",
    "FetchResult",
    "Metadata",
    "parse_address",
]

# Time a request may take before the task fails: fetches are served from the page cache in
# milliseconds, so this only ever fires when the node is stuck.
request_timeout_s_default = 30.0
# Time to reach a node (TCP and ZeroMQ's handshake): a node that is down is refused at once
# and ZeroMQ retries every 100 ms; this only bounds a host that does not answer at all.
connect_timeout_s_default = 5.0


class ReaderTimeout(Exception):
    """The node did not answer in time."""


class ReaderUnreachable(ReaderTimeout):
    """The node could not be reached, or its connection dropped while a request waited."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    log_start: int
    high_watermark: int
    records: memoryview  # whole batches; empty at the high watermark
    # Where a read_committed fetch stops (an older node: the high watermark), and the
    # aborted transactions overlapping what it returned (None: not read_committed).
    last_stable_offset: int = -1
    aborted: list[AbortedTransaction] | None = None


@dataclass(frozen=True, slots=True)
class Metadata:
    node: int
    nodes: dict[int, str]  # node id -> reader address "host:port"
    topics: dict[str, list[int]]  # topic -> leader node id of each partition (-1: none now)
    # topic -> in-sync node ids of each partition (an older node's reply: the leader alone)
    isr: dict[str, list[list[int]]] = field(default_factory=dict)


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
    def __init__(
        self,
        address: str,
        timeout_s: float = request_timeout_s_default,
        connect_timeout_s: float = connect_timeout_s_default,
    ) -> None:
        self.address = address
        self._url = parse_address(address)
        self._timeout_s = timeout_s
        self._connect_timeout_s = min(connect_timeout_s, timeout_s)
        self._context = zmq.Context(io_threads=1)
        self._socket: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._ids = itertools.count(1)

    def __enter__(self) -> ReaderClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._drop()
        self._context.term()

    # Requests -----------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None) -> Metadata:
        reply, _ = self._call(protocol.metadata_request(next(self._ids), topics))
        nodes = {int(k): v for k, v in reply["nodes"].items()}
        leaders: dict[str, list[int]] = reply["topics"]
        isr = reply.get("isr") or {}
        isr = {name: isr.get(name) or [[leader] for leader in found]
               for name, found in leaders.items()}
        return Metadata(reply["node"], nodes, leaders, isr)

    def offsets(
        self, queries: list[tuple[str, int, int]], any_replica: bool = False,
        read_committed: bool = False,
    ) -> list[tuple[int, int]]:
        """(error, offset) per (topic, partition, timestamp) query; -2 earliest, -1 latest
        (with `read_committed` the last stable offset). With `any_replica` a follower
        answers earliest and latest too."""
        results: list[tuple[int, int]] = []
        step = protocol.offset_queries_max
        for start in range(0, len(queries), step):
            chunk = queries[start : start + step]
            request = protocol.offsets_request(next(self._ids), chunk, any_replica,
                                               read_committed)
            reply, _ = self._call(request)
            results += [(int(e), int(o)) for e, o in reply["results"]]
        return results

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int = protocol.fetch_bytes_max,
        any_replica: bool = False, read_committed: bool = False,
    ) -> FetchResult:
        """Whole batches from the one holding `offset`; ReaderError (code 1, with log_start
        and high_watermark on it) when the offset is out of range. With `any_replica` a
        follower answers, up to the high watermark it knows; with `read_committed`, up to
        the last stable offset, with the aborted transactions to drop."""
        request = protocol.fetch_request(
            next(self._ids), topic, partition, offset, max_bytes, any_replica, read_committed)
        reply, frames = self._call(request)
        records = frames[0] if frames else memoryview(b"")
        high_watermark = reply["high_watermark"]
        aborted = None
        if read_committed:
            aborted = [AbortedTransaction(int(p), int(o)) for p, o in reply.get("aborted") or []]
        return FetchResult(reply["log_start"], high_watermark, records,
                           reply.get("last_stable_offset", high_watermark), aborted)

    # Transport ----------------------------------------------------------------------------

    def _connect(self) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
        if self._socket is None or self._monitor is None:
            socket = self._context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 16)
            socket.setsockopt(zmq.IMMEDIATE, 1)  # writable only once connected
            self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            socket.connect(self._url)
            self._socket = socket
        return self._socket, self._monitor

    def _drop(self) -> None:
        """Close the socket (after a timeout or a dropped connection): a new one next time."""
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close(linger=0)
            self._socket = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

    def _fail(self, error: ReaderTimeout) -> ReaderTimeout:
        self._drop()
        return error

    def _call(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[memoryview]]:
        socket, monitor = self._connect()
        correlation, op = request["id"], request["op"]
        if not socket.poll(int(self._connect_timeout_s * 1000), zmq.POLLOUT):
            raise self._fail(ReaderUnreachable(
                f"reader {self.address} not reachable in {self._connect_timeout_s:g}s"))
        while monitor.poll(0):  # a drop before this request is no news: it reconnected
            recv_monitor_message(monitor)
        try:
            socket.send(protocol.pack(request), zmq.NOBLOCK)
        except zmq.Again:  # the connection dropped since the poll
            raise self._fail(ReaderUnreachable(f"reader {self.address} went away")) from None
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        deadline = time.monotonic() + self._timeout_s
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(left_ms))
            if socket in ready:
                frames = socket.recv_multipart(copy=False)
                reply = protocol.unpack(frames[0].buffer)
                if reply.get("id") != correlation:
                    continue  # a late answer to a request that timed out earlier
                error = reply.get("error", protocol.ERROR_NONE)
                if error != protocol.ERROR_NONE:
                    raise ReaderError(error, str(reply.get("message", "")), reply)
                return reply, [frame.buffer for frame in frames[1:]]
            if monitor in ready:
                recv_monitor_message(monitor)
                raise self._fail(ReaderUnreachable(
                    f"reader {self.address} went away while answering {op}"))
            if not ready:
                raise self._fail(ReaderTimeout(
                    f"reader {self.address} did not answer {op} in {self._timeout_s:g}s"))
