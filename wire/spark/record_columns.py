"""Record areas of RecordBatch v2 batches -> Arrow columns, one field at a time for all records.

`decode` reads the records of many batches (their record areas, decompressed, one after the
other) in a fixed number of numpy and Arrow passes: no Python statement runs per record on
the common path. wire/spark/arrow.py hands it the batches of one fetch.

Finding the records. A record is `length varint | attributes int8 | timestampDelta varlong |
...`, so where one starts depends on where the one before it ended: a walk. The walk is
replaced by a test any byte can take on its own. Kafka defines no record attribute, so
producers write attributes 0, and a record can start at p only if the varint at p is followed
by a zero byte. Each zero byte z names at most five candidate starts (the varints of 1 to 5
bytes that end at z - 1), and a candidate's length says where the next record would start.
Candidates whose next start is not a candidate (nor the end), and candidates that no other
one leads to (nor the first), are dropped, a few times over. What is left must be one chain
from the first byte to the last, through every batch's first record, one link per record:
this is checked. A false candidate (a zero inside a value, a header count of 0 after a
value's last byte) rarely leads to a true start, and when one does, nothing leads to it.
When the check fails (values whose zero bytes make long false chains, a producer that sets
attributes), the starts come from a walk over the length varints: one Python step per
record, still no field work.

Reading the fields. With every record's start known, each field is one vectorised varint
read at the positions the previous field left: timestampDelta, offsetDelta, the key's length
(its bytes skipped), the value's, the header count, then per header its key and value, in
rounds (round k reads the k-th header of every record that has one). Keys and values are not
copied out one by one: the area becomes one Arrow binary array whose elements are the spans
between consecutive field boundaries (key, gap, value, gap, ...), and `take` gathers the
keys' spans, then the values', into contiguous columns.

What the per-record decoder (wire.records, and arrow.py's copy of its loop) would reject, or
what this pass does not read — a length that overruns its record, a varint too long, a
timestamp past 64 bits, more than `header_rounds_max` headers on a record, a header key that
is not UTF-8 — makes `decode` return None: the caller decodes those batches record by record,
which accepts or raises exactly as it always did. Headers are read and checked only when
asked for, as the per-record hot path did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["HEADER_TYPE", "Area", "Columns", "decode", "area_bytes_max", "header_rounds_max"]

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# The record areas one `decode` call reads together: Arrow's binary offsets are int32.
area_bytes_max = 1 << 30
# Most headers on one record this pass reads (one round of a few numpy calls per header
# index); a record with more is decoded record by record.
header_rounds_max = 64
# Zero bytes before the areas (a varint's bytes before a zero are looked at without a bound
# check) and after them (a varint read near the end never leaves the buffer: a varlong is at
# most 10 bytes).
_PAD_BYTES = 16
_VARINT_BYTES_MAX = 5
_VARLONG_BYTES_MAX = 10
# attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount: 1 byte each
_RECORD_BODY_BYTES_MIN = 6
# Prune passes before the chain is checked; each drops both ends of every false chain.
_PRUNE_PASSES_MAX = 4
# How many candidates after a candidate its next start is looked for among.
_LINK_WINDOW = 4


@dataclass(frozen=True, slots=True)
class Area:
    """One batch's record area, decompressed, with what its records' offsets and times are
    counted from. `offset_range`: keep only records with offsets in [low, high); None: all."""

    data: bytes | memoryview
    count: int
    base_offset: int
    base_timestamp: int
    stamped_time: int | None  # LogAppendTime: every record's timestamp
    timestamp_type: int
    offset_range: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Columns:
    """The kept records of some areas, in order; timestamps in ms since the epoch."""

    keys: pa.Array
    values: pa.Array
    offsets: np.ndarray
    timestamps: np.ndarray
    timestamp_types: np.ndarray
    headers: pa.Array | None


class _Unusual(Exception):
    """Something this pass does not read: the caller decodes record by record."""


def decode(areas: Sequence[Area], include_headers: bool) -> Columns | None:
    """The records of `areas` as columns, or None if one of them needs the per-record
    decoder (see the module docstring)."""
    sizes = [len(area.data) for area in areas]
    assert sum(sizes) <= area_bytes_max, sum(sizes)
    end = _PAD_BYTES + sum(sizes)
    joined = b"".join([bytes(_PAD_BYTES), *(area.data for area in areas), bytes(_PAD_BYTES)])
    buf = np.frombuffer(joined, np.uint8)
    counts = np.array([area.count for area in areas], np.int64)
    area_starts = np.cumsum([_PAD_BYTES, *sizes[:-1]], dtype=np.int64)
    # A batch cut by the range was decoded by wire.records, which checks headers even when
    # they are not asked for; so are they here.
    check_headers = include_headers or any(a.offset_range is not None for a in areas)
    data = pa.py_buffer(joined)
    try:
        _, bodies, ends = _record_starts(buf, end, counts, area_starts)
        fields = _read_fields(buf, bodies, ends, check_headers)
        headers = _headers(buf, data, fields) if check_headers else None
    except _Unusual:
        return None
    if not include_headers:
        headers = None
    per_record = np.repeat(np.arange(len(areas)), counts)
    offsets = np.array([a.base_offset for a in areas], np.int64)[per_record] + fields.offset_deltas
    keep = _kept(areas, per_record, offsets)
    timestamps = _timestamps(areas, per_record, fields.timestamp_deltas)
    types = np.array([a.timestamp_type for a in areas], np.int32)[per_record]
    keys, values = _gather(data, fields.keys, fields.values, keep)
    if keep is not None:
        offsets, timestamps, types = offsets[keep], timestamps[keep], types[keep]
        if headers is not None:
            headers = headers.take(pa.array(keep))
    return Columns(keys, values, offsets, timestamps, types, headers)


def _kept(areas: Sequence[Area], per_record: np.ndarray, offsets: np.ndarray
          ) -> np.ndarray | None:
    """Indices of the records to keep, or None for all of them."""
    if all(area.offset_range is None for area in areas):
        return None
    low = np.full(len(areas), np.iinfo(np.int64).min, np.int64)
    high = np.full(len(areas), np.iinfo(np.int64).max, np.int64)
    for i, area in enumerate(areas):
        if area.offset_range is not None:
            low[i], high[i] = area.offset_range
    return np.flatnonzero((offsets >= low[per_record]) & (offsets < high[per_record]))


def _timestamps(areas: Sequence[Area], per_record: np.ndarray, deltas: np.ndarray
                ) -> np.ndarray:
    stamped = np.array([a.stamped_time is not None for a in areas])
    base = np.array([a.stamped_time if a.stamped_time is not None else a.base_timestamp
                     for a in areas], np.int64)[per_record]
    if not stamped.any():
        return base + deltas
    return np.where(stamped[per_record], base, base + deltas)


# Finding the records -------------------------------------------------------------------------


def _record_starts(
    buf: np.ndarray, end: int, counts: np.ndarray, area_starts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each record's start, its body's start (after the length varint) and its end."""
    if not counts.any():
        if end != _PAD_BYTES:
            raise _Unusual  # bytes after the last of 0 records
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    chain = _chain(buf, _PAD_BYTES, end)
    if chain is not None and _is_the_chain(*chain, end, counts, area_starts):
        return chain
    return _walk(buf, counts, area_starts, end)


def _chain(buf: np.ndarray, first: int, end: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The candidate starts in [first, end) left standing after pruning, sorted: (starts,
    bodies, ends)."""
    zeros = np.flatnonzero(buf[first:end] == 0)
    zeros += first
    last = buf[zeros - 1]  # the length varint's last byte
    zeros, last = zeros[last < 0x80], last[last < 0x80]
    found_starts, found_bodies, found_unsigned = [zeros - 1], [zeros], [last.astype(np.int64)]
    before = buf[zeros - 2]
    zeros = zeros[before >= 0x80]
    unsigned = (last[before >= 0x80].astype(np.int64) << 7) | (before[before >= 0x80] & 0x7F)
    for size in range(2, _VARINT_BYTES_MAX + 1):
        found_starts.append(zeros - size)
        found_bodies.append(zeros)
        found_unsigned.append(unsigned)
        before = buf[zeros - size - 1]
        if size == _VARINT_BYTES_MAX or not (before >= 0x80).any():
            break
        zeros = zeros[before >= 0x80]
        unsigned = (unsigned[before >= 0x80] << 7) | (before[before >= 0x80] & 0x7F)
    starts = np.concatenate(found_starts)
    bodies = np.concatenate(found_bodies)
    lengths = _zigzag(np.concatenate(found_unsigned))
    ends = bodies + lengths
    plausible = np.flatnonzero((lengths >= _RECORD_BODY_BYTES_MIN) & (ends <= end)
                               & (starts >= first))
    order = plausible[np.argsort(starts[plausible], kind="stable")]  # sorted runs, merged
    return _prune(starts[order], bodies[order], ends[order], first, end)


def _prune(starts: np.ndarray, bodies: np.ndarray, ends: np.ndarray, first: int, end: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Drop the candidates that point at no candidate, and those no candidate points at (a
    false one whose next start is a true one), until none is dropped or out of passes.

    A candidate's next start is looked for among the `_LINK_WINDOW` candidates after it
    (shifted compares, no lookups), then by binary search for the candidates not found so.
    """
    for _ in range(_PRUNE_PASSES_MAX):
        linked = ends == end
        reached = starts == first
        for step in range(1, min(_LINK_WINDOW, starts.size - 1) + 1):
            hit = ends[:-step] == starts[step:]
            linked[:-step] |= hit
            reached[step:] |= hit
        unlinked = np.flatnonzero(~linked)
        at = np.minimum(np.searchsorted(starts, ends[unlinked]), starts.size - 1)
        hit = starts[at] == ends[unlinked]
        linked[unlinked[hit]] = True
        reached[at[hit]] = True
        standing = linked & reached
        if standing.all():
            break
        starts, bodies, ends = starts[standing], bodies[standing], ends[standing]
        if not starts.size:
            return None
    return starts, bodies, ends


def _is_the_chain(
    starts: np.ndarray, bodies: np.ndarray, ends: np.ndarray, end: int, counts: np.ndarray,
    area_starts: np.ndarray,
) -> bool:
    """One link per record, each record ending where the next begins, from the first area's
    start to `end`, and every batch's records starting at its area."""
    if starts.size != int(counts.sum()) or starts[0] != _PAD_BYTES or ends[-1] != end:
        return False
    if not np.array_equal(ends[:-1], starts[1:]):
        return False
    firsts = np.cumsum(counts) - counts
    nonempty = counts > 0
    return bool(np.array_equal(starts[firsts[nonempty]], area_starts[nonempty]))


def _walk(
    buf: np.ndarray, counts: np.ndarray, area_starts: np.ndarray, end: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The starts by walking the length varints, each area its own count of records."""
    data = buf.tobytes()
    starts: list[int] = []
    add = starts.append
    area_ends = [*area_starts[1:].tolist(), end]
    for count, position, area_end in zip(counts.tolist(), area_starts.tolist(), area_ends,
                                         strict=True):
        for _ in range(count):
            if position >= area_end:
                raise _Unusual
            add(position)
            length, body = _one_varint(data, position)
            if length < _RECORD_BODY_BYTES_MIN:
                raise _Unusual
            position = body + length
        if position != area_end:
            raise _Unusual
    found = np.array(starts, np.int64)
    lengths, bodies = _varints(buf, found, _VARINT_BYTES_MAX)
    return found, bodies, bodies + lengths


def _one_varint(data: bytes, position: int) -> tuple[int, int]:
    unsigned, shift = 0, 0
    for size in range(_VARINT_BYTES_MAX):
        byte = data[position + size]
        unsigned |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (unsigned >> 1) ^ -(unsigned & 1), position + size + 1
        shift += 7
    raise _Unusual


# Reading the fields --------------------------------------------------------------------------

# Where a length-prefixed field's bytes are: (first byte, length); a negative length is null.
_Spans = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class _Fields:
    """Every record's fields, an array per field; positions are into the joined areas."""

    ends: np.ndarray
    timestamp_deltas: np.ndarray
    offset_deltas: np.ndarray
    keys: _Spans
    values: _Spans
    header_counts: np.ndarray | None  # None: headers not read
    headers_at: np.ndarray | None  # where each record's first header starts


def _read_fields(buf: np.ndarray, bodies: np.ndarray, ends: np.ndarray, read_headers: bool
                 ) -> _Fields:
    # bodies + 1: past the attributes byte, unused
    timestamp_deltas, after = _varints(buf, bodies + 1, _VARLONG_BYTES_MAX)
    offset_deltas, after = _varints(buf, after, _VARINT_BYTES_MAX)
    if (after > ends).any():
        raise _Unusual
    keys, after = _sized(buf, after, ends)
    values, after = _sized(buf, after, ends)
    header_counts = None
    if read_headers:
        header_counts, after = _varints(buf, after, _VARINT_BYTES_MAX)
    return _Fields(ends, timestamp_deltas, offset_deltas, keys, values, header_counts, after)


def _zigzag(unsigned: np.ndarray) -> np.ndarray:
    return (unsigned >> 1) ^ -(unsigned & 1)


def _varints(buf: np.ndarray, positions: np.ndarray, bytes_max: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints at `positions`: (values, where each one ends). One pass per byte
    of the longest: records whose varints are all one byte cost one pass."""
    byte = buf[positions]
    unsigned = (byte & 0x7F).astype(np.uint64)
    after = positions + 1
    more = np.flatnonzero(byte >= 0x80)
    shift = 7
    while more.size:
        if shift >= 7 * bytes_max:
            raise _Unusual  # longer than a varint (5 bytes) or a varlong (10) can be
        byte = buf[after[more]]
        if shift == 63 and (byte > 1).any():
            raise _Unusual  # past 64 bits
        unsigned[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] += 1
        more = more[byte >= 0x80]
        shift += 7
    magnitude = (unsigned >> np.uint64(1)).astype(np.int64)
    return magnitude ^ -(unsigned & np.uint64(1)).astype(np.int64), after


def _sized(buf: np.ndarray, positions: np.ndarray, ends: np.ndarray
           ) -> tuple[_Spans, np.ndarray]:
    """The length-prefixed fields at `positions`, and where the fields after them start."""
    lengths, firsts = _varints(buf, positions, _VARINT_BYTES_MAX)
    after = firsts + np.maximum(lengths, 0)
    if (after > ends).any():
        raise _Unusual  # wire.records: "... overruns its record"
    return (firsts, lengths), after


def _header_spans(buf: np.ndarray, fields: _Fields) -> tuple[np.ndarray, _Spans, _Spans]:
    """Each record's first header's index (and the total, last), and every header's key and
    value, in record order: round k reads the k-th header of each record that has one."""
    counts, positions = fields.header_counts, fields.headers_at
    assert counts is not None and positions is not None
    if counts.size and (counts.min() < 0 or counts.max() > header_rounds_max):
        raise _Unusual
    list_offsets = np.zeros(counts.size + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    spans = np.zeros((4, int(list_offsets[-1])), np.int64)  # key: first, length; value: same
    positions = positions.copy()
    for index in range(int(counts.max(initial=0))):
        having = np.flatnonzero(counts > index)
        ends = fields.ends[having]
        (key_firsts, key_lengths), after = _sized(buf, positions[having], ends)
        if (key_lengths < 0).any():
            raise _Unusual  # a header key is never null
        (value_firsts, value_lengths), positions[having] = _sized(buf, after, ends)
        slots = list_offsets[having] + index
        spans[:, slots] = (key_firsts, key_lengths, value_firsts, value_lengths)
    if not np.array_equal(positions, fields.ends):
        raise _Unusual  # bytes left in a record after its headers
    return list_offsets, (spans[0], spans[1]), (spans[2], spans[3])


def _headers(buf: np.ndarray, data: pa.Buffer, fields: _Fields) -> pa.Array:
    """The headers column: list<struct<key string, value binary>>, a list per record."""
    list_offsets, keys, values = _header_spans(buf, fields)
    names, header_values = _gather(data, keys, values, None)
    try:
        names = names.cast(pa.string())  # checks UTF-8, as bytes.decode() does
    except pa.ArrowInvalid:
        raise _Unusual from None
    items = pa.StructArray.from_arrays([names, header_values],
                                       fields=list(HEADER_TYPE.value_type))
    return pa.ListArray.from_arrays(pa.array(list_offsets), items, type=HEADER_TYPE)


def _gather(data: pa.Buffer, first: _Spans, second: _Spans, keep: np.ndarray | None
            ) -> tuple[pa.Array, pa.Array]:
    """Two binary columns whose values lie in `data` interleaved, first then second of each
    row (a record's key and value, a header's key and value); `keep`: the rows to keep.

    `data` becomes one binary array of the spans between consecutive boundaries (first,
    gap, second, gap, ... of every row: the boundaries never go back), and `take` copies
    the firsts, then the seconds, into contiguous columns.
    """
    count = first[0].size
    bounds = np.empty(4 * count + 1, np.int32)
    for column, (firsts, lengths) in enumerate((first, second)):
        bounds[2 * column : -1 : 4] = firsts
        bounds[2 * column + 1 : -1 : 4] = firsts + np.maximum(lengths, 0)
    bounds[-1] = bounds[-2] if count else 0
    spans = pa.Array.from_buffers(pa.binary(), 4 * count, [None, pa.py_buffer(bounds), data])
    columns = []
    for column, (_, lengths) in enumerate((first, second)):
        rows = np.arange(2 * column, 4 * count, 4, dtype=np.int64)
        if keep is not None:
            rows, lengths = rows[keep], lengths[keep]
        taken = spans.take(pa.array(rows))
        nulls = lengths < 0
        if nulls.any():
            validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
            taken = pa.Array.from_buffers(pa.binary(), len(taken),
                                          [validity, *taken.buffers()[1:]])
        columns.append(taken)
    return columns[0], columns[1]
