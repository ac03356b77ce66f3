"""The sink's transaction calls: DescribeTransactions and EndTxn, from the Spark driver or a task.

A transactional producer (librdkafka) opens each task's transaction and writes into it; it
cannot hand the transaction over. The sink commits on the driver, after every task of the
write is done, so it speaks two Kafka requests itself, with Krill's own codec over a plain
blocking socket:

    FindCoordinator(key_type=1, transactional id)  -> the coordinator's host:port
    DescribeTransactions([id])                     -> state, producer id and epoch
    EndTxn(id, producer id, epoch, commit|abort)   -> done, or fenced

Retriable answers (the coordinator moving, loading, or still writing the markers of the
previous transaction) are retried with a short backoff until the call's deadline; a final one
(PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, ...) raises `TransactionError`.
These are Kafka's requests: any Kafka-API broker with transactions answers them.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any, NamedTuple

from wire.errors import ErrorCode
from wire.messages import request_header_version, response_class, response_header_version
from wire.messages.describe_transactions import DescribeTransactionsRequest
from wire.messages.end_txn import EndTxnRequest
from wire.messages.find_coordinator import FindCoordinatorRequest
from wire.messages.request_header import RequestHeader
from wire.messages.response_header import ResponseHeader
from wire.primitives import Reader, Writer

__all__ = ["COMMITTED_STATES", "TransactionClient", "TransactionError", "TransactionState"]

# Kafka's transaction states in which the commit is decided (its markers may still be going out).
COMMITTED_STATES = frozenset({"PrepareCommit", "CompleteCommit"})

_FIND_COORDINATOR, _FIND_COORDINATOR_VERSION = 10, 3
_END_TXN, _END_TXN_VERSION = 26, 1
_DESCRIBE_TRANSACTIONS, _DESCRIBE_TRANSACTIONS_VERSION = 65, 0
_TRANSACTION_KEY = 1
_TRANSACTIONAL_ID_NOT_FOUND = 105  # DescribeTransactions: the coordinator has no such id

_RETRIABLE = frozenset({
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.REQUEST_TIMED_OUT,
})
_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_BACKOFF_S = 0.05
_BACKOFF_MAX_S = 1.0
_SOCKET_TIMEOUT_S = 10.0


class TransactionError(RuntimeError):
    """A final answer from the coordinator, or none before the deadline (one line)."""


class TransactionState(NamedTuple):
    """A transactional id as its coordinator describes it; state "" when it has none."""

    state: str
    producer_id: int
    producer_epoch: int


class _Connection:
    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.create_connection((host, port), timeout=_SOCKET_TIMEOUT_S)
        self._correlation = 0

    def close(self) -> None:
        self._sock.close()

    def call(self, api_key: int, version: int, request: Any) -> Any:
        self._correlation += 1
        writer = Writer()
        at = writer.reserve_int32()
        RequestHeader(request_api_key=api_key, request_api_version=version,
                      correlation_id=self._correlation, client_id="krill-spark-sink",
                      ).encode(writer, request_header_version(api_key, version))
        request.encode(writer, version)
        writer.patch_int32(at, writer.size - 4)
        self._sock.sendall(writer.getvalue())
        (size,) = struct.unpack(">i", self._read(4))
        reader = Reader(self._read(size))
        header = ResponseHeader.decode(reader, response_header_version(api_key, version))
        if header.correlation_id != self._correlation:
            raise TransactionError(f"answer {header.correlation_id} to request "
                                   f"{self._correlation}")
        return response_class(api_key).decode(reader, version)

    def _read(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self._sock.recv(n)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)


class TransactionClient:
    """Calls to the coordinators of transactional ids, through any of `bootstrap`'s brokers
    ("host:port,..."). One connection per broker, kept until `close()`; not thread-safe."""

    def __init__(self, bootstrap: str, timeout_s: float = 60.0) -> None:
        self._bootstrap = [_host_port(a) for a in bootstrap.split(",") if a.strip()]
        if not self._bootstrap:
            raise ValueError("no bootstrap address")
        self._timeout_s = timeout_s
        self._connections: dict[tuple[str, int], _Connection] = {}
        self._coordinators: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> TransactionClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def describe(self, transactional_id: str) -> TransactionState:
        def call(connection: _Connection) -> tuple[ErrorCode, TransactionState]:
            answer = connection.call(
                _DESCRIBE_TRANSACTIONS, _DESCRIBE_TRANSACTIONS_VERSION,
                DescribeTransactionsRequest(transactional_ids=[transactional_id]))
            found = answer.transaction_states[0]
            if found.error_code == _TRANSACTIONAL_ID_NOT_FOUND:
                return ErrorCode.NONE, TransactionState("", -1, -1)
            return ErrorCode(found.error_code), TransactionState(
                found.transaction_state, found.producer_id, found.producer_epoch)

        return self._with_coordinator(transactional_id, "describe", call)

    def end(self, transactional_id: str, producer_id: int, producer_epoch: int,
            commit: bool) -> None:
        """Commit or abort the transaction of (`producer_id`, `producer_epoch`); returns once
        the coordinator has decided it (its markers may still be going out)."""
        request = EndTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                producer_epoch=producer_epoch, committed=commit)

        def call(connection: _Connection) -> tuple[ErrorCode, None]:
            answer = connection.call(_END_TXN, _END_TXN_VERSION, request)
            return ErrorCode(answer.error_code), None

        self._with_coordinator(transactional_id, "commit" if commit else "abort", call)

    def _with_coordinator(self, transactional_id: str, what: str, call: Any) -> Any:
        deadline = time.monotonic() + self._timeout_s
        backoff = _BACKOFF_S
        last = "no answer"
        while True:
            try:
                connection = self._connection(self._coordinator(transactional_id))
                error, result = call(connection)
            except (OSError, ConnectionError) as exc:  # the broker went away: find it again
                self._forget(transactional_id)
                last = str(exc)
            else:
                if error == ErrorCode.NONE:
                    return result
                if error not in _RETRIABLE:
                    raise TransactionError(f"{what} of transaction {transactional_id!r}: "
                                           f"{error.name}")
                if error in _COORDINATOR_MOVED:
                    self._forget(transactional_id)
                last = error.name
            if time.monotonic() + backoff > deadline:
                raise TransactionError(f"{what} of transaction {transactional_id!r}: no answer "
                                       f"in {self._timeout_s:.0f} s (last: {last})")
            time.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _coordinator(self, transactional_id: str) -> tuple[str, int]:
        found = self._coordinators.get(transactional_id)
        if found is not None:
            return found
        request = FindCoordinatorRequest(key=transactional_id, key_type=_TRANSACTION_KEY)
        errors = []
        for address in self._bootstrap:
            try:
                answer = self._connection(address).call(
                    _FIND_COORDINATOR, _FIND_COORDINATOR_VERSION, request)
            except (OSError, ConnectionError) as exc:
                self._drop(address)
                errors.append(f"{address[0]}:{address[1]}: {exc}")
                continue
            error = ErrorCode(answer.error_code)
            if error == ErrorCode.NONE:
                found = (answer.host, answer.port)
                self._coordinators[transactional_id] = found
                return found
            if error not in _RETRIABLE:
                raise TransactionError(f"no coordinator for transaction {transactional_id!r}: "
                                       f"{error.name} {answer.error_message or ''}".rstrip())
            errors.append(error.name)
        raise ConnectionError(f"no coordinator for {transactional_id!r}: {'; '.join(errors)}")

    def _forget(self, transactional_id: str) -> None:
        address = self._coordinators.pop(transactional_id, None)
        if address is not None:
            self._drop(address)

    def _connection(self, address: tuple[str, int]) -> _Connection:
        connection = self._connections.get(address)
        if connection is None:
            connection = self._connections[address] = _Connection(*address)
        return connection

    def _drop(self, address: tuple[str, int]) -> None:
        connection = self._connections.pop(address, None)
        if connection is not None:
            connection.close()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host, int(port)
