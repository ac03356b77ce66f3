"""The records the coordinator keeps in `__consumer_offsets`, in Kafka's own byte layouts.

Hand-written (the key and value schemas live in Kafka's `core/.../group/*.json`, not among the
client message specs the codec is generated from). Kafka's tools can read a Krill offsets
log, and the other way round. Keys carry a version that says what they are:

    OffsetCommitKey    v1: version int16 | group string | topic string | partition int32
    GroupMetadataKey   v2: version int16 | group string
    OffsetCommitValue  v3: version int16 | offset int64 | leader_epoch int32
                           | metadata string | commit_timestamp int64
                       (read also v0/v2: no epoch; v1: + expire_timestamp int64)
    GroupMetadataValue v3: version int16 | protocol_type string | generation int32
                           | protocol nullable string | leader nullable string
                           | current_state_timestamp int64 (v2+)
                           | members [member_id string | group_instance_id nullable string (v3+)
                                     | client_id string | client_host string
                                     | rebalance_timeout int32 (v1+) | session_timeout int32
                                     | subscription bytes | assignment bytes]

    TransactionKey  v32000 (Krill's own; Kafka keeps transactions in `__transaction_state`,
                    and its offsets-topic key versions stop far below): version int16
                    | transactional_id string
    TransactionValue v0: version int16 | producer_id int64 | producer_epoch int16
                    | last_producer_epoch int16 | timeout_ms int32 | state int8
                    | start_ms int64 | last_update_ms int64
                    | topics [topic string | partitions [int32]]
                    (state: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort,
                    4 CompleteCommit, 5 CompleteAbort, 6 Dead)

Strings are int16-length UTF-8 (-1 for null), bytes int32-length, arrays int32-count. A record
whose value is null (a tombstone) deletes its key: compaction keeps only the last per key.
Kafka's tools skip the transaction records (a key version they do not know).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from actors.group.events import GroupSnapshot, MemberSnapshot
from actors.group.transactions import TxnMetadata, TxnState
from wire.errors import DecodeError

__all__ = [
    "OffsetKey",
    "GroupKey",
    "OffsetValue",
    "encode_offset_key",
    "encode_group_key",
    "encode_offset_value",
    "encode_group_value",
    "decode_key",
    "decode_offset_value",
    "decode_group_value",
    "TransactionKey",
    "encode_transaction_key",
    "encode_transaction_value",
    "decode_transaction_value",
]

_OFFSET_KEY_VERSION = 1
_GROUP_KEY_VERSION = 2
_OFFSET_VALUE_VERSION = 3
_GROUP_VALUE_VERSION = 3
_TRANSACTION_KEY_VERSION = 32000
_TRANSACTION_VALUE_VERSION = 0
_TXN_STATES = list(TxnState)  # their persisted codes are their order

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class TransactionKey:
    transactional_id: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int  # -1: unknown
    metadata: str
    commit_timestamp_ms: int


# Writing ----------------------------------------------------------------------------------


def _string(out: bytearray, text: str | None) -> None:
    if text is None:
        out += _I16.pack(-1)
        return
    data = text.encode()
    out += _I16.pack(len(data))
    out += data


def _bytes(out: bytearray, data: bytes) -> None:
    out += _I32.pack(len(data))
    out += data


def encode_offset_key(group_id: str, topic: str, partition: int) -> bytes:
    out = bytearray(_I16.pack(_OFFSET_KEY_VERSION))
    _string(out, group_id)
    _string(out, topic)
    out += _I32.pack(partition)
    return bytes(out)


def encode_group_key(group_id: str) -> bytes:
    out = bytearray(_I16.pack(_GROUP_KEY_VERSION))
    _string(out, group_id)
    return bytes(out)


def encode_offset_value(value: OffsetValue) -> bytes:
    out = bytearray(_I16.pack(_OFFSET_VALUE_VERSION))
    out += _I64.pack(value.offset)
    out += _I32.pack(value.leader_epoch)
    _string(out, value.metadata)
    out += _I64.pack(value.commit_timestamp_ms)
    return bytes(out)


def encode_group_value(snapshot: GroupSnapshot) -> bytes:
    out = bytearray(_I16.pack(_GROUP_VALUE_VERSION))
    _string(out, snapshot.protocol_type)
    out += _I32.pack(snapshot.generation_id)
    _string(out, snapshot.protocol_name)
    _string(out, snapshot.leader_id)
    out += _I64.pack(snapshot.state_timestamp_ms)
    out += _I32.pack(len(snapshot.members))
    for m in snapshot.members:
        _string(out, m.member_id)
        _string(out, m.group_instance_id)
        _string(out, m.client_id)
        _string(out, m.client_host)
        out += _I32.pack(m.rebalance_timeout_ms)
        out += _I32.pack(m.session_timeout_ms)
        _bytes(out, m.subscription)
        _bytes(out, m.assignment)
    return bytes(out)


def encode_transaction_key(transactional_id: str) -> bytes:
    out = bytearray(_I16.pack(_TRANSACTION_KEY_VERSION))
    _string(out, transactional_id)
    return bytes(out)


def encode_transaction_value(meta: TxnMetadata) -> bytes:
    out = bytearray(_I16.pack(_TRANSACTION_VALUE_VERSION))
    out += _I64.pack(meta.producer_id)
    out += _I16.pack(meta.producer_epoch)
    out += _I16.pack(meta.last_producer_epoch)
    out += _I32.pack(meta.timeout_ms)
    out.append(_TXN_STATES.index(meta.state))
    out += _I64.pack(meta.start_ms)
    out += _I64.pack(meta.last_update_ms)
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        topics.setdefault(topic, []).append(partition)
    out += _I32.pack(len(topics))
    for topic, partitions in topics.items():
        _string(out, topic)
        out += _I32.pack(len(partitions))
        for partition in partitions:
            out += _I32.pack(partition)
    return bytes(out)


# Reading ----------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise DecodeError(f"offsets record truncated at byte {self.pos}")
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def int8(self) -> int:
        return self._take(1)[0]

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError as e:
            raise DecodeError(f"offsets record string is not UTF-8: {e}") from None

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise DecodeError("offsets record has a null where a string must be")
        return text

    def bytes_(self) -> bytes:
        n = self.int32()
        return b"" if n == -1 else self._take(n)


def decode_key(data: bytes) -> OffsetKey | GroupKey | TransactionKey | None:
    """The key of one record; None for a key version this broker does not keep (Kafka's
    transaction markers and future kinds are skipped, not fatal)."""
    r = _Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetKey(r.string(), r.string(), r.int32())
    if version == _GROUP_KEY_VERSION:
        return GroupKey(r.string())
    if version == _TRANSACTION_KEY_VERSION:
        return TransactionKey(r.string())
    return None


def decode_offset_value(data: bytes) -> OffsetValue:
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= _OFFSET_VALUE_VERSION:
        raise DecodeError(f"OffsetCommitValue version {version} is not 0-3")
    offset = r.int64()
    epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    timestamp = r.int64()
    return OffsetValue(offset, epoch, metadata, timestamp)


def decode_group_value(data: bytes) -> GroupSnapshot:
    r = _Reader(data)
    version = r.int16()
    if not 0 <= version <= _GROUP_VALUE_VERSION:
        raise DecodeError(f"GroupMetadataValue version {version} is not 0-3")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.int32()):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        if rebalance_timeout < 0:
            rebalance_timeout = session_timeout
        members.append(
            MemberSnapshot(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                r.bytes_(),
                r.bytes_(),
            )
        )
    return GroupSnapshot(protocol_type, generation, protocol, leader, timestamp, tuple(members))


def decode_transaction_value(data: bytes) -> TxnMetadata:
    r = _Reader(data)
    version = r.int16()
    if version != _TRANSACTION_VALUE_VERSION:
        raise DecodeError(f"TransactionValue version {version} is not 0")
    producer_id = r.int64()
    epoch = r.int16()
    last_epoch = r.int16()
    timeout_ms = r.int32()
    code = r.int8()
    if code >= len(_TXN_STATES):
        raise DecodeError(f"TransactionValue state {code} is unknown")
    start_ms = r.int64()
    last_update_ms = r.int64()
    partitions = set()
    topics = r.int32()
    if topics < 0:
        raise DecodeError("TransactionValue has a negative topic count")
    for _ in range(topics):
        topic = r.string()
        count = r.int32()
        if count < 0 or count > len(r.buf):
            raise DecodeError("TransactionValue has a bad partition count")
        for _ in range(count):
            partitions.add((topic, r.int32()))
    return TxnMetadata(producer_id, epoch, last_epoch, timeout_ms, _TXN_STATES[code],
                       frozenset(partitions), start_ms, last_update_ms)
