"""A msgpack codec for actor message values that cross a pipe: named tuples, frozen
dataclasses and enums of the known message modules, by type name.

The Partition and Controller messages cross with a typed header each (shards/calls/; they are
the hot path: their record bytes travel as raw frames). The group coordinator's messages are
many and small, and carry nested records (members, offsets, descriptions), so they cross
generically (shards/calls/group.py): each value is packed with its type's name and rebuilt
from the same registry on the other side. A type missing from the registry is our bug and
fails loudly.

    unpack(pack(CommitOffsets(...))) == CommitOffsets(...)   # sequences come back as tuples
"""

from __future__ import annotations

import dataclasses
import enum
from types import ModuleType
from typing import Any

import msgpack

from actors.group import events, log_records, messages
from wire import errors

__all__ = ["pack", "unpack"]

_RECORD = 1  # ext type: [type name, [field values]]
_ENUM = 2  # ext type: [type name, value]


def _registry(*modules: ModuleType) -> dict[str, type]:
    types: dict[str, type] = {}
    for module in modules:
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != module.__name__:
                continue
            if (
                hasattr(value, "_fields")
                or dataclasses.is_dataclass(value)
                or issubclass(value, enum.Enum)
            ):
                assert value.__name__ not in types, f"two message types named {value.__name__}"
                types[value.__name__] = value
    return types


_TYPES = _registry(events, messages, log_records, errors)


def _encode(value: Any) -> Any:
    """Records and enums to ext types, all the way down (msgpack alone would pack a named
    tuple as a plain array and an IntEnum as a plain int, losing their types)."""
    if isinstance(value, enum.Enum):
        return msgpack.ExtType(_ENUM, msgpack.packb([_name(value), value.value]))
    if hasattr(value, "_fields"):
        fields = [_encode(v) for v in value]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [_encode(getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    elif isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    elif isinstance(value, memoryview):
        return bytes(value)
    else:
        return value
    return msgpack.ExtType(_RECORD, msgpack.packb([_name(value), fields], use_bin_type=True))


def _name(value: Any) -> str:
    name = type(value).__name__
    assert _TYPES.get(name) is type(value), f"{name} is not a registered pipe type"
    return name


def _ext_hook(code: int, data: bytes) -> Any:
    name, payload = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, use_list=False)
    cls = _TYPES[name]
    if code == _ENUM:
        return cls(payload)
    return cls(*payload)


def pack(value: Any) -> bytes:
    return msgpack.packb(_encode(value), use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(
        data, ext_hook=_ext_hook, raw=False, use_list=False, strict_map_key=False
    )
