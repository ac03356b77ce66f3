"""The frame reader: size-prefixed frames out of a byte stream, large ones filled in place."""

from __future__ import annotations

import struct

import pytest

from wire.errors import DecodeError
from wire.frame import SCRATCH_BYTES, FrameReader

pytestmark = pytest.mark.timeout(30)


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


class Lender:
    """Lends buffers like a shard's arena, and counts what is given back."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.lent: list[Lent] = []

    def __call__(self, nbytes: int) -> Lent | None:
        if nbytes > self.room:
            return None
        lent = Lent(nbytes)
        self.lent.append(lent)
        return lent


class Lent:
    def __init__(self, nbytes: int) -> None:
        self.view = memoryview(bytearray(nbytes))
        self.released = 0

    def release(self) -> None:
        self.released += 1


def receive(reader: FrameReader, data: bytes, chunk: int) -> list[bytes]:
    """Feed `data` as recv_into would, `chunk` bytes at most per call."""
    frames = []
    view = memoryview(data)
    while view:
        target = reader.buffer()
        n = min(len(target), len(view), chunk)
        target[:n] = view[:n]
        view = view[n:]
        frames.extend(bytes(f) for f in reader.advance(n))
    return frames


def test_readers_sharing_one_scratch_interleave_without_mixing() -> None:
    """The connections of a shard share one receive buffer: each keeps only its partial
    frame between reads, whatever the others wrote into the scratch meanwhile."""
    scratch = bytearray(SCRATCH_BYTES)
    streams = [
        b"".join(framed(bytes([r * 16 + i % 16]) * (i * 53 + r)) for i in range(1, 60))
        for r in range(3)
    ]
    readers = [FrameReader(scratch=scratch) for _ in streams]
    for chunk in (1, 5, 300, 70_000):
        for reader in readers:
            reader.close()
        got: list[list[bytes]] = [[] for _ in streams]
        positions = [0] * len(streams)
        while any(p < len(s) for p, s in zip(positions, streams, strict=True)):
            for r, (reader, stream) in enumerate(zip(readers, streams, strict=True)):
                if positions[r] == len(stream):
                    continue
                target = reader.buffer()
                n = min(len(target), chunk, len(stream) - positions[r])
                target[:n] = stream[positions[r] : positions[r] + n]
                positions[r] += n
                got[r].extend(bytes(f) for f in reader.advance(n))
        for r in range(len(streams)):
            assert got[r] == [bytes([r * 16 + i % 16]) * (i * 53 + r) for i in range(1, 60)]
            assert readers[r].buffered_bytes == 0


def test_an_idle_reader_on_a_shared_scratch_holds_only_its_partial_frame() -> None:
    scratch = bytearray(SCRATCH_BYTES)
    reader = FrameReader(scratch=scratch)
    data = framed(b"x" * 1000)
    target = reader.buffer()
    target[:600] = data[:600]
    assert reader.advance(600) == []
    assert reader.buffered_bytes == 600 and reader._carry == data[:600]
    scratch[:] = bytes(len(scratch))  # another connection's read overwrites the scratch
    target = reader.buffer()
    target[: len(data) - 600] = data[600:]
    assert [bytes(f) for f in reader.advance(len(data) - 600)] == [b"x" * 1000]
    assert reader.buffered_bytes == 0 and reader._carry == b""


def test_small_frames_split_anywhere_come_out_whole() -> None:
    bodies = [bytes([i]) * (i * 37) for i in range(1, 40)]
    stream = b"".join(framed(b) for b in bodies)
    for chunk in (1, 7, 4096, len(stream)):
        assert receive(FrameReader(), stream, chunk) == bodies


def test_a_large_frame_is_filled_in_its_own_buffer() -> None:
    big = b"\x00\x03" + b"m" * 600_000  # not a produce (API key 3)
    lender = Lender(1 << 30)
    reader = FrameReader(buffers=lender)
    assert receive(reader, framed(b"a") + framed(big) + framed(b"z"), 65536) == [b"a", big, b"z"]
    assert lender.lent == [] and reader.take_buffer() is None  # only produce frames borrow


def test_a_large_produce_frame_is_received_into_a_lent_buffer() -> None:
    big = b"\x00\x00" + b"p" * 600_000
    lender = Lender(1 << 30)
    reader = FrameReader(buffers=lender)
    target = reader.buffer()
    first = framed(big)[: len(target)]
    target[: len(first)] = first
    assert reader.advance(len(first)) == []
    assert len(lender.lent) == 1  # asked for as soon as the size and the key were known
    frames = reader.feed(framed(big)[len(first) :])
    assert [bytes(f) for f in frames] == [big]
    lent = reader.take_buffer()
    assert lent is lender.lent[0] and frames[0] is lent.view
    assert reader.take_buffer() is None  # handed over once
    assert lent.released == 0  # the caller releases it when done with the frame


def test_no_room_to_lend_means_a_fresh_buffer() -> None:
    big = b"\x00\x00" + b"p" * 600_000
    reader = FrameReader(buffers=Lender(1000))
    assert receive(reader, framed(big), 65536) == [big]
    assert reader.take_buffer() is None


def test_closing_mid_frame_gives_the_buffer_back() -> None:
    big = b"\x00\x00" + b"p" * 600_000
    lender = Lender(1 << 30)
    reader = FrameReader(buffers=lender)
    receive(reader, framed(big)[:300_000], 65536)
    assert len(lender.lent) == 1 and lender.lent[0].released == 0
    reader.close()
    assert lender.lent[0].released == 1


@pytest.mark.parametrize("size", [-1, 1 << 20])
def test_a_size_out_of_range_is_refused(size: int) -> None:
    reader = FrameReader(frame_bytes_max=1000)
    with pytest.raises(DecodeError):
        receive(reader, struct.pack(">i", size) + b"x" * 10, 100)
