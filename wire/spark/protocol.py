"""The reader protocol: what the Spark data source and a node's reader endpoint say to each other.

One request, one reply, over ZeroMQ (client DEALER, node ROUTER). Frame 0 of every message is
a msgpack map carrying the protocol version `v` and the client's correlation id `id`; a fetch
reply adds one raw frame holding whole RecordBatch v2 bytes exactly as the segment file has
them. Shapes (PROTOCOL.md next to this file is the one-page description):

    metadata  {v, id, op: "metadata", topics: [name] | None}
          ->  {v, id, error: 0, node: id, nodes: {id: "host:port"},
               topics: {name: [leader node id of partition 0, 1, ...]},   (-1: none known)
               isr: {name: [[in-sync node ids of partition 0], ...]}}     (optional)
    offsets   {v, id, op: "offsets", queries: [[topic, partition, timestamp]], any_replica?,
               read_committed?}
          ->  {v, id, error: 0, results: [[error, offset]]}       (one per query, in order)
              timestamp -2: earliest (log start), -1: latest (high watermark; with
              read_committed the last stable offset), >= 0: the first offset whose timestamp
              is at least that (-1 when there is none)
    fetch     {v, id, op: "fetch", topic, partition, offset, max_bytes, any_replica?,
               read_committed?}
          ->  {v, id, error, log_start, high_watermark, last_stable_offset, bytes,
               aborted?} + [records frame if bytes > 0]
              read_committed: only whole batches below the last stable offset, and
              `aborted`: [[producer id, first offset]] of the aborted transactions that
              overlap what could be read (Kafka's Fetch AbortedTransactions)

A node answers for the partitions it has a replica of. Without `any_replica` only their
leader answers (others: NOT_LEADER_OR_FOLLOWER); with it, any replica answers fetches and
earliest/latest offsets up to the high watermark it knows (timestamp queries stay the
leader's). Fields added to version 1 are optional both ways: an older node ignores
`any_replica` and `read_committed` and leaves out `isr`, `last_stable_offset` and `aborted`.

An error reply to anything: {v, id, error: code != 0, message}. Codes are Kafka's error codes
(OFFSET_OUT_OF_RANGE 1, UNKNOWN_TOPIC_OR_PARTITION 3, ...) plus the reader's own below.
This module is sans-I/O: it packs and checks messages, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "VERSION",
    "ProtocolError",
    "ReaderError",
    "ERROR_NONE",
    "ERROR_OFFSET_OUT_OF_RANGE",
    "ERROR_UNKNOWN_TOPIC_OR_PARTITION",
    "ERROR_NOT_LEADER_OR_FOLLOWER",
    "ERROR_MALFORMED",
    "ERROR_VERSION",
    "ERROR_BUSY",
    "EARLIEST",
    "LATEST",
    "request_bytes_max",
    "reply_header_bytes_max",
    "fetch_bytes_max",
    "offset_queries_max",
    "pack",
    "unpack",
    "metadata_request",
    "offsets_request",
    "fetch_request",
    "FetchRequest",
    "OffsetsRequest",
    "parse_request",
    "error_reply",
    "reply",
]

VERSION = 1

ERROR_NONE = 0
ERROR_OFFSET_OUT_OF_RANGE = 1  # Kafka's code: the offset is below the log start or past the end
ERROR_UNKNOWN_TOPIC_OR_PARTITION = 3  # Kafka's code
ERROR_NOT_LEADER_OR_FOLLOWER = 6  # Kafka's code: ask the partition's leader (or any_replica)
ERROR_MALFORMED = 1000  # not msgpack, not a map, a field missing or of the wrong type
ERROR_VERSION = 1001  # the request's `v` is not one this node speaks
ERROR_BUSY = 1002  # too many requests in flight on the node: retry later

EARLIEST = -2
LATEST = -1

# Limits. A request names a few partitions at most; anything bigger is a confused client.
request_bytes_max = 64 * 1024
# A reply header holds metadata for every topic; 16 MiB is ~100k partitions.
reply_header_bytes_max = 16 * 1024 * 1024
# Record bytes per fetch reply: big enough to amortise a round trip (~120 µs) to well under
# 5% at 1 GB/s, small enough that a reply in flight never dominates a shard's memory.
fetch_bytes_max = 8 * 1024 * 1024
# Partitions one offsets request may ask about.
offset_queries_max = 4096
# Topic name length Kafka allows.
_topic_chars_max = 249


class ProtocolError(Exception):
    """A message that breaks this protocol (malformed, wrong version, over a limit)."""

    def __init__(self, message: str, code: int = ERROR_MALFORMED) -> None:
        super().__init__(message)
        self.code = code


class ReaderError(Exception):
    """A well-formed error reply from the node."""

    def __init__(self, code: int, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"reader error {code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}  # the reply's other fields (log_start, high_watermark)


def pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def unpack(frame: bytes | memoryview, limit: int = reply_header_bytes_max) -> dict[str, Any]:
    """Decode frame 0 of a message; ProtocolError unless it is a map of our version."""
    if len(frame) > limit:
        raise ProtocolError(f"message of {len(frame)} bytes over the limit of {limit}")
    try:
        message = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types; all mean "not msgpack"
        raise ProtocolError(f"message is not msgpack: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a map")
    version = message.get("v")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r}, this side speaks {VERSION}",
                            ERROR_VERSION)
    return message


# Requests ---------------------------------------------------------------------------------


def metadata_request(correlation: int, topics: list[str] | None = None) -> dict[str, Any]:
    return {"v": VERSION, "id": correlation, "op": "metadata", "topics": topics}


def offsets_request(
    correlation: int, queries: list[tuple[str, int, int]], any_replica: bool = False,
    read_committed: bool = False,
) -> dict[str, Any]:
    request: dict[str, Any] = {"v": VERSION, "id": correlation, "op": "offsets",
                               "queries": [list(q) for q in queries]}
    return _flags(request, any_replica, read_committed)


def fetch_request(
    correlation: int, topic: str, partition: int, offset: int, max_bytes: int,
    any_replica: bool = False, read_committed: bool = False,
) -> dict[str, Any]:
    request = {"v": VERSION, "id": correlation, "op": "fetch", "topic": topic,
               "partition": partition, "offset": offset, "max_bytes": max_bytes}
    return _flags(request, any_replica, read_committed)


def _flags(request: dict[str, Any], any_replica: bool, read_committed: bool) -> dict[str, Any]:
    """The optional flags, present only when set (an older node never sees them)."""
    if any_replica:
        request["any_replica"] = True
    if read_committed:
        request["read_committed"] = True
    return request


@dataclass(frozen=True, slots=True)
class OffsetsRequest:
    queries: list[tuple[str, int, int]]  # (topic, partition, timestamp)
    any_replica: bool = False
    read_committed: bool = False  # latest is the last stable offset


@dataclass(frozen=True, slots=True)
class FetchRequest:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    any_replica: bool = False
    read_committed: bool = False  # below the last stable offset, aborted listed


def parse_request(message: dict[str, Any]) -> tuple[str, Any]:
    """(op, arguments) of a request already unpacked; ProtocolError if any field is wrong.

    metadata -> list of topic names or None; offsets -> OffsetsRequest; fetch ->
    FetchRequest (max_bytes clamped to fetch_bytes_max).
    """
    op = message.get("op")
    if op == "metadata":
        topics = message.get("topics")
        if topics is not None:
            if not isinstance(topics, list) or not all(_is_topic(t) for t in topics):
                raise ProtocolError("metadata: topics must be a list of names or nil")
        return op, topics
    if op == "offsets":
        queries = message.get("queries")
        if not isinstance(queries, list) or len(queries) > offset_queries_max:
            raise ProtocolError(f"offsets: queries must be a list of at most "
                                f"{offset_queries_max}")
        parsed = []
        for query in queries:
            if not (isinstance(query, list) and len(query) == 3 and _is_topic(query[0])
                    and _is_int(query[1]) and _is_int(query[2])
                    and query[1] >= 0 and query[2] >= EARLIEST):
                raise ProtocolError(f"offsets: bad query {query!r:.80}")
            parsed.append((query[0], query[1], query[2]))
        return op, OffsetsRequest(parsed, _flag(message, "any_replica"),
                                  _flag(message, "read_committed"))
    if op == "fetch":
        topic: Any = message.get("topic")
        partition: Any = message.get("partition")
        offset: Any = message.get("offset")
        max_bytes: Any = message.get("max_bytes")
        if not (_is_topic(topic) and _is_int(partition) and _is_int(offset)
                and _is_int(max_bytes)):
            raise ProtocolError("fetch: topic, partition, offset and max_bytes are required")
        if partition < 0 or offset < 0 or max_bytes < 1:
            raise ProtocolError("fetch: partition, offset must be >= 0 and max_bytes >= 1")
        return op, FetchRequest(topic, partition, offset, min(max_bytes, fetch_bytes_max),
                                _flag(message, "any_replica"), _flag(message, "read_committed"))
    raise ProtocolError(f"unknown op {op!r:.40}")


def _flag(message: dict[str, Any], name: str) -> bool:
    value = message.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be true or false")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _is_topic(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _topic_chars_max


# Replies ----------------------------------------------------------------------------------


def error_reply(correlation: Any, code: int, message: str) -> dict[str, Any]:
    return {"v": VERSION, "id": correlation, "error": code, "message": message}


def reply(correlation: Any, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "id": correlation, "error": ERROR_NONE, **fields}
