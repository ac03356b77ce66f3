"""Kafka's primitive wire types: a bounds-checked Reader, a chunking Writer, and the base
classes of the generated message structs.

Two layers live here. The module-level `read_*`/`write_*` functions take `(buf, pos)` and
return `(value, pos)`, or append to a `bytearray`; the generated codecs in `wire.messages`
call them from straight-line code with `pos` kept in a local, which is what keeps a decode
in the tens of microseconds. `Reader` and `Writer` wrap the same functions for hand-written
code (frame headers, quirks). Every read past the end or over a `wire.limits` maximum raises
`DecodeError`; `struct.error` and `IndexError` from inlined reads are turned into
`DecodeError` once, at the outermost `decode()`, not per field.

A `records` value may be a "file region": any object that is not bytes-like and has an
integer `length` attribute. The Writer emits its length prefix and keeps the region as a
separate chunk, so the connection can `sendfile` log bytes without copying them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Self

from wire import limits
from wire.errors import DecodeError

__all__ = [
    "Reader",
    "Writer",
    "Struct",
    "Message",
    "is_region",
]

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
F64 = struct.Struct(">d")

ZERO_UUID = bytes(16)


class _FreshList:
    """Default of an array parameter: the constructor replaces it with a new empty list."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "[]"


FRESH_LIST: Any = _FreshList()
_BYTES_LIKE = (bytes, bytearray, memoryview)

_string_bytes_max = limits.string_bytes_max
_bytes_field_bytes_max = limits.bytes_field_bytes_max

# Decode errors that inlined struct/index reads can raise; the outer decode converts them.
LOW_LEVEL_ERRORS = (struct.error, IndexError)


def is_region(value: object) -> bool:
    """True for a file region: not bytes-like, with an integer `length`."""
    return not isinstance(value, _BYTES_LIKE) and isinstance(getattr(value, "length", None), int)


# Varints ----------------------------------------------------------------------------------


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned LEB128, at most 5 bytes (a uint32)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 28:
            raise DecodeError(f"unsigned varint longer than 5 bytes at offset {pos}")


def _read_uvarlong(buf: memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise DecodeError(f"varlong longer than 10 bytes at offset {pos}")


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Zigzag-encoded signed 32-bit varint."""
    u, pos = read_uvarint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def read_varlong(buf: memoryview, pos: int) -> tuple[int, int]:
    """Zigzag-encoded signed 64-bit varint."""
    u, pos = _read_uvarlong(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0x80:
        if value < 0:
            raise ValueError(f"unsigned varint cannot hold {value}")
        out.append(value)
        return
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(out: bytearray, value: int) -> None:
    write_uvarint(out, ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def write_varlong(out: bytearray, value: int) -> None:
    write_uvarint(out, ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


# Strings -------------------------------------------------------------------------------


def _str_body(buf: memoryview, pos: int, n: int) -> tuple[str, int]:
    end = pos + n
    if n > _string_bytes_max or end > len(buf):
        raise _length_error("string", n, pos, _string_bytes_max, "string_bytes_max")
    try:
        return str(buf[pos:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise DecodeError(f"string at offset {pos} is not UTF-8: {e.reason}") from None


def _length_error(what: str, n: int, pos: int, limit: int, limit_name: str) -> DecodeError:
    if n > limit:
        return DecodeError(f"{what} of {n} bytes over {limit_name} at offset {pos}")
    return DecodeError(f"{what} of {n} bytes runs past the end at offset {pos}")


def read_string(buf: memoryview, pos: int) -> tuple[str, int]:
    (n,) = I16.unpack_from(buf, pos)
    if n < 0:
        raise DecodeError(f"null or negative length {n} for a non-nullable string at {pos}")
    return _str_body(buf, pos + 2, n)


def read_nullable_string(buf: memoryview, pos: int) -> tuple[str | None, int]:
    (n,) = I16.unpack_from(buf, pos)
    if n < 0:
        if n == -1:
            return None, pos + 2
        raise DecodeError(f"negative string length {n} at offset {pos}")
    return _str_body(buf, pos + 2, n)


def read_compact_string(buf: memoryview, pos: int) -> tuple[str, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise DecodeError(f"null for a non-nullable compact string at offset {pos}")
    return _str_body(buf, pos, n - 1)


def read_compact_nullable_string(buf: memoryview, pos: int) -> tuple[str | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    return _str_body(buf, pos, n - 1)


def _encode_str(value: str | None) -> bytes:
    if value is None:
        raise ValueError("None for a non-nullable string")
    data = value.encode()
    if len(data) > limits.string_bytes_max:
        raise ValueError(f"string of {len(data)} bytes over string_bytes_max")
    return data


def write_string(out: bytearray, value: str | None) -> None:
    data = _encode_str(value)
    out += I16.pack(len(data))
    out += data


def write_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += b"\xff\xff"
    else:
        write_string(out, value)


def write_compact_string(out: bytearray, value: str | None) -> None:
    data = _encode_str(value)
    write_uvarint(out, len(data) + 1)
    out += data


def write_compact_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
    else:
        write_compact_string(out, value)


# Bytes ---------------------------------------------------------------------------------


def _bytes_body(buf: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    end = pos + n
    if n > _bytes_field_bytes_max or end > len(buf):
        raise _length_error("bytes field", n, pos, _bytes_field_bytes_max, "bytes_field_bytes_max")
    return buf[pos:end], end


def read_bytes(buf: memoryview, pos: int) -> tuple[memoryview, int]:
    (n,) = I32.unpack_from(buf, pos)
    if n < 0:
        raise DecodeError(f"null or negative length {n} for non-nullable bytes at {pos}")
    return _bytes_body(buf, pos + 4, n)


def read_nullable_bytes(buf: memoryview, pos: int) -> tuple[memoryview | None, int]:
    (n,) = I32.unpack_from(buf, pos)
    if n < 0:
        if n == -1:
            return None, pos + 4
        raise DecodeError(f"negative bytes length {n} at offset {pos}")
    return _bytes_body(buf, pos + 4, n)


def read_compact_bytes(buf: memoryview, pos: int) -> tuple[memoryview, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise DecodeError(f"null for non-nullable compact bytes at offset {pos}")
    return _bytes_body(buf, pos, n - 1)


def read_compact_nullable_bytes(buf: memoryview, pos: int) -> tuple[memoryview | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    n -= 1
    end = pos + n
    if n > _bytes_field_bytes_max or end > len(buf):
        raise _length_error("bytes field", n, pos, _bytes_field_bytes_max, "bytes_field_bytes_max")
    return buf[pos:end], end


def write_bytes(out: bytearray, value: Any) -> None:
    if value is None:
        raise ValueError("None for a non-nullable bytes field")
    out += I32.pack(len(value))
    out += value


def write_nullable_bytes(out: bytearray, value: Any) -> None:
    if value is None:
        out += b"\xff\xff\xff\xff"
    else:
        out += I32.pack(len(value))
        out += value


def write_compact_bytes(out: bytearray, value: Any) -> None:
    if value is None:
        raise ValueError("None for a non-nullable bytes field")
    write_uvarint(out, len(value) + 1)
    out += value


def write_compact_nullable_bytes(out: bytearray, value: Any) -> None:
    if value is None:
        out.append(0)
    else:
        write_uvarint(out, len(value) + 1)
        out += value


# UUIDs, arrays, tagged fields ------------------------------------------------------------


def read_uuid(buf: memoryview, pos: int) -> tuple[bytes, int]:
    end = pos + 16
    if end > len(buf):
        raise DecodeError(f"uuid runs past the end at offset {pos}")
    return bytes(buf[pos:end]), end


def write_uuid(out: bytearray, value: bytes) -> None:
    if len(value) != 16:
        raise ValueError(f"uuid must be 16 bytes, got {len(value)}")
    out += value


def _check_array_length(n: int, pos: int) -> int:
    if n > limits.array_length_max:
        raise DecodeError(f"array of {n} elements over array_length_max at offset {pos}")
    if n < -1:
        raise DecodeError(f"negative array length {n} at offset {pos}")
    return n


def read_array_length(buf: memoryview, pos: int) -> tuple[int, int]:
    """int32 element count; -1 means null."""
    (n,) = I32.unpack_from(buf, pos)
    return _check_array_length(n, pos), pos + 4


def read_compact_array_length(buf: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned varint count+1; returns -1 for null."""
    n = buf[pos]
    if n < 0x80:
        return n - 1, pos + 1  # under 127 elements: within every limit
    n, end = read_uvarint(buf, pos)
    return _check_array_length(n - 1, pos), end


def null_array(field: str, pos: int) -> DecodeError:
    return DecodeError(f"null array for non-nullable field {field} at offset {pos}")


def write_array_length(out: bytearray, value: list[Any] | None) -> None:
    out += I32.pack(-1 if value is None else len(value))


def write_compact_array_length(out: bytearray, value: list[Any] | None) -> None:
    write_uvarint(out, 0 if value is None else len(value) + 1)


def read_primitive_array(
    buf: memoryview, pos: int, n: int, code: str, size: int
) -> tuple[list[Any], int]:
    """n fixed-size big-endian values in one unpack (`code` is a struct format letter)."""
    end = pos + n * size
    if end > len(buf):
        raise DecodeError(f"array of {n} x {size} bytes runs past the end at offset {pos}")
    return list(struct.unpack_from(f">{n}{code}", buf, pos)), end


def write_primitive_array(out: bytearray, values: list[Any], code: str) -> None:
    out += struct.pack(f">{len(values)}{code}", *values)


def read_tagged_count(buf: memoryview, pos: int) -> tuple[int, int]:
    n, end = read_uvarint(buf, pos)
    if n > limits.tagged_fields_max:
        raise DecodeError(f"{n} tagged fields over tagged_fields_max at offset {pos}")
    return n, end


def read_tag(buf: memoryview, pos: int) -> tuple[int, int, int]:
    """One tagged field's header: returns (tag, start, end) of its body."""
    tag, pos = read_uvarint(buf, pos)
    size, pos = read_uvarint(buf, pos)
    if size > limits.tagged_field_bytes_max:
        raise DecodeError(f"tagged field {tag} of {size} bytes over tagged_field_bytes_max")
    end = pos + size
    if end > len(buf):
        raise DecodeError(f"tagged field {tag} of {size} bytes runs past the end at {pos}")
    return tag, pos, end


def tag_overrun(tag: int, end: int, pos: int) -> DecodeError:
    return DecodeError(f"tagged field {tag} decoded to offset {pos}, past its end {end}")


def skip_tagged_fields(buf: memoryview, pos: int) -> int:
    """Skip a tagged-field section whose tags are all unknown; returns the new position."""
    n, pos = read_tagged_count(buf, pos)
    for _ in range(n):
        _tag, _start, pos = read_tag(buf, pos)
    return pos


def write_tagged_fields(out: bytearray, fields: Sequence[tuple[int, bytes | bytearray]]) -> None:
    """`fields` are (tag, encoded body) in ascending tag order."""
    write_uvarint(out, len(fields))
    for tag, body in fields:
        write_uvarint(out, tag)
        write_uvarint(out, len(body))
        out += body


# Reader --------------------------------------------------------------------------------


class Reader:
    """A cursor over one frame. Every method raises `DecodeError` on bad or short input."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.buf = buf if isinstance(buf, memoryview) else memoryview(buf)
        self.pos = pos

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def _fixed(self, s: struct.Struct) -> Any:
        pos = self.pos
        try:
            (v,) = s.unpack_from(self.buf, pos)
        except struct.error:
            raise DecodeError(f"{s.size}-byte value runs past the end at offset {pos}") from None
        self.pos = pos + s.size
        return v

    def _call(self, fn: Any) -> Any:
        try:
            v, self.pos = fn(self.buf, self.pos)
        except LOW_LEVEL_ERRORS:
            raise DecodeError(f"{fn.__name__}: input ends at offset {len(self.buf)}") from None
        return v

    def int8(self) -> int:
        return self._fixed(I8)  # type: ignore[no-any-return]

    def int16(self) -> int:
        return self._fixed(I16)  # type: ignore[no-any-return]

    def int32(self) -> int:
        return self._fixed(I32)  # type: ignore[no-any-return]

    def int64(self) -> int:
        return self._fixed(I64)  # type: ignore[no-any-return]

    def uint16(self) -> int:
        return self._fixed(U16)  # type: ignore[no-any-return]

    def uint32(self) -> int:
        return self._fixed(U32)  # type: ignore[no-any-return]

    def float64(self) -> float:
        return self._fixed(F64)  # type: ignore[no-any-return]

    def boolean(self) -> bool:
        return self._fixed(I8) != 0

    def uuid(self) -> bytes:
        return self._call(read_uuid)  # type: ignore[no-any-return]

    def unsigned_varint(self) -> int:
        return self._call(read_uvarint)  # type: ignore[no-any-return]

    def varint(self) -> int:
        return self._call(read_varint)  # type: ignore[no-any-return]

    def varlong(self) -> int:
        return self._call(read_varlong)  # type: ignore[no-any-return]

    def string(self) -> str:
        return self._call(read_string)  # type: ignore[no-any-return]

    def nullable_string(self) -> str | None:
        return self._call(read_nullable_string)  # type: ignore[no-any-return]

    def compact_string(self) -> str:
        return self._call(read_compact_string)  # type: ignore[no-any-return]

    def compact_nullable_string(self) -> str | None:
        return self._call(read_compact_nullable_string)  # type: ignore[no-any-return]

    def bytes_(self) -> memoryview:
        return self._call(read_bytes)  # type: ignore[no-any-return]

    def nullable_bytes(self) -> memoryview | None:
        return self._call(read_nullable_bytes)  # type: ignore[no-any-return]

    def compact_bytes(self) -> memoryview:
        return self._call(read_compact_bytes)  # type: ignore[no-any-return]

    def compact_nullable_bytes(self) -> memoryview | None:
        return self._call(read_compact_nullable_bytes)  # type: ignore[no-any-return]

    def array_length(self) -> int:
        return self._call(read_array_length)  # type: ignore[no-any-return]

    def compact_array_length(self) -> int:
        return self._call(read_compact_array_length)  # type: ignore[no-any-return]

    def tagged_fields(self) -> dict[int, memoryview]:
        """Read a tagged-field section; returns each tag's raw body (zero copy)."""
        buf = self.buf
        try:
            n, pos = read_tagged_count(buf, self.pos)
            fields = {}
            for _ in range(n):
                tag, start, pos = read_tag(buf, pos)
                fields[tag] = buf[start:pos]
        except LOW_LEVEL_ERRORS:
            raise DecodeError(f"tagged fields: input ends at offset {len(buf)}") from None
        self.pos = pos
        return fields

    def skip_tagged_fields(self) -> None:
        self._call(lambda buf, pos: (None, skip_tagged_fields(buf, pos)))


# Writer --------------------------------------------------------------------------------


class Writer:
    """Accumulates an encoding in one bytearray; file regions are kept aside by offset."""

    __slots__ = ("buf", "_regions")

    def __init__(self) -> None:
        self.buf = bytearray()
        # (offset into buf where the region goes, region), in offset order.
        self._regions: list[tuple[int, Any]] = []

    @property
    def size(self) -> int:
        return len(self.buf) + sum(region.length for _, region in self._regions)

    def chunks(self) -> list[Any]:
        """Bytes chunks and regions in wire order; consecutive bytes are one chunk."""
        if not self._regions:
            return [bytes(self.buf)] if self.buf else []
        view = memoryview(self.buf)
        out: list[Any] = []
        start = 0
        for offset, region in self._regions:
            if offset > start:
                out.append(view[start:offset])
            out.append(region)
            start = offset
        if start < len(self.buf):
            out.append(view[start:])
        return out

    def getvalue(self) -> bytes:
        assert not self._regions, "getvalue() on a Writer holding file regions; use chunks()"
        return bytes(self.buf)

    def reserve_int32(self) -> int:
        """Append a placeholder int32 (e.g. a frame length); returns its offset."""
        pos = len(self.buf)
        self.buf += b"\x00\x00\x00\x00"
        return pos

    def patch_int32(self, pos: int, value: int) -> None:
        assert not any(offset <= pos for offset, _ in self._regions), "patch after a region"
        I32.pack_into(self.buf, pos, value)

    def int8(self, value: int) -> None:
        self.buf += I8.pack(value)

    def int16(self, value: int) -> None:
        self.buf += I16.pack(value)

    def int32(self, value: int) -> None:
        self.buf += I32.pack(value)

    def int64(self, value: int) -> None:
        self.buf += I64.pack(value)

    def uint16(self, value: int) -> None:
        self.buf += U16.pack(value)

    def uint32(self, value: int) -> None:
        self.buf += U32.pack(value)

    def float64(self, value: float) -> None:
        self.buf += F64.pack(value)

    def boolean(self, value: bool) -> None:
        self.buf.append(1 if value else 0)

    def uuid(self, value: bytes) -> None:
        write_uuid(self.buf, value)

    def unsigned_varint(self, value: int) -> None:
        write_uvarint(self.buf, value)

    def varint(self, value: int) -> None:
        write_varint(self.buf, value)

    def varlong(self, value: int) -> None:
        write_varlong(self.buf, value)

    def string(self, value: str) -> None:
        write_string(self.buf, value)

    def nullable_string(self, value: str | None) -> None:
        write_nullable_string(self.buf, value)

    def compact_string(self, value: str) -> None:
        write_compact_string(self.buf, value)

    def compact_nullable_string(self, value: str | None) -> None:
        write_compact_nullable_string(self.buf, value)

    def bytes_(self, value: bytes | bytearray | memoryview) -> None:
        write_bytes(self.buf, value)

    def nullable_bytes(self, value: bytes | bytearray | memoryview | None) -> None:
        write_nullable_bytes(self.buf, value)

    def compact_bytes(self, value: bytes | bytearray | memoryview) -> None:
        write_compact_bytes(self.buf, value)

    def compact_nullable_bytes(self, value: bytes | bytearray | memoryview | None) -> None:
        write_compact_nullable_bytes(self.buf, value)

    def array_length(self, n: int) -> None:
        """int32 count; pass -1 for a null array."""
        self.buf += I32.pack(n)

    def compact_array_length(self, n: int) -> None:
        """Unsigned varint count+1; pass -1 for a null array."""
        write_uvarint(self.buf, n + 1)

    def empty_tagged_fields(self) -> None:
        self.buf.append(0)

    def records(self, value: Any) -> None:
        """A nullable `records` field, classic form: int32 length (-1 = null) then data."""
        if value is None:
            self.buf += b"\xff\xff\xff\xff"
        elif isinstance(value, _BYTES_LIKE):
            self.buf += I32.pack(len(value))
            self.buf += value
        else:
            self.buf += I32.pack(value.length)
            self._add_region(value)

    def compact_records(self, value: Any) -> None:
        """A nullable `records` field, compact form: uvarint length+1 (0 = null) then data."""
        if value is None:
            self.buf.append(0)
        elif isinstance(value, _BYTES_LIKE):
            write_uvarint(self.buf, len(value) + 1)
            self.buf += value
        else:
            write_uvarint(self.buf, value.length + 1)
            self._add_region(value)

    def _add_region(self, region: Any) -> None:
        assert is_region(region), f"records value {type(region).__name__} is not a region"
        if region.length:
            self._regions.append((len(self.buf), region))


# Base classes of generated structs -------------------------------------------------------


class Struct:
    """Field-wise equality and repr over `__slots__`; `decode()` wraps the generated
    `_decode(buf, pos, version) -> (value, pos)` so only `DecodeError` escapes."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # mutable records

    @classmethod
    def _decode(cls, buf: memoryview, pos: int, version: int) -> tuple[Self, int]:
        raise NotImplementedError

    def encode(self, w: Writer, version: int) -> None:
        raise NotImplementedError

    @classmethod
    def decode(cls, r: Reader, version: int) -> Self:
        try:
            value, r.pos = cls._decode(r.buf, r.pos, version)
        except LOW_LEVEL_ERRORS:
            raise DecodeError(
                f"{cls.__qualname__} v{version}: input ends or is malformed "
                f"(frame of {len(r.buf)} bytes from offset {r.pos})"
            ) from None
        return value

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, version: int) -> Self:
        """Decode a whole body; trailing bytes are an error."""
        r = Reader(data)
        value = cls.decode(r, version)
        if r.remaining():
            raise DecodeError(f"{cls.__qualname__} v{version}: {r.remaining()} trailing bytes")
        return value

    def to_bytes(self, version: int) -> bytes:
        w = Writer()
        self.encode(w, version)
        return w.getvalue()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        names: tuple[str, ...] = self.__slots__
        return all(getattr(self, n) == getattr(other, n) for n in names)

    def __repr__(self) -> str:
        names: tuple[str, ...] = self.__slots__
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{type(self).__qualname__}({fields})"


class Message(Struct):
    """A top-level spec message: decode/encode check the version against VALID_VERSIONS."""

    __slots__ = ()
    API_KEY: int | None = None
    VALID_VERSIONS: tuple[int, int] = (0, 0)
    FLEXIBLE_MIN: int | None = None

    @classmethod
    def decode(cls, r: Reader, version: int) -> Self:
        lo, hi = cls.VALID_VERSIONS
        if not lo <= version <= hi:
            raise DecodeError(f"{cls.__name__} has no version {version} (valid {lo}-{hi})")
        return super().decode(r, version)
