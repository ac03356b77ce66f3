"""Kafka frame reader: turns a byte stream into size-prefixed frames, sans-I/O.

Every Kafka request and response is an int32 size followed by that many bytes. The reader
hands out a writable buffer to `recv_into`, then `advance(n)` returns the frames completed by
those n bytes. Small frames are cut out of a scratch buffer (one copy, which leaves each frame
in its own mutable `bytearray`: the produce path patches batch headers in place); a large frame
gets its own buffer as soon as its size is known and later reads land in it directly, so its
bytes are never copied twice.

    reader = FrameReader(frame_bytes_max=1 << 20)
    n = sock.recv_into(reader.buffer())
    for frame in reader.advance(n): ...

A negative size or one over `frame_bytes_max` raises DecodeError; the caller closes the
connection, as Kafka does.
"""

from __future__ import annotations

import struct

from wire import limits
from wire.errors import DecodeError

__all__ = ["FrameReader", "SIZE_PREFIX_BYTES"]

SIZE_PREFIX_BYTES = 4
_SIZE = struct.Struct(">i")
# Scratch space for small frames; a recv fills at most this much at once.
_SCRATCH_BYTES = 256 * 1024


class FrameReader:
    def __init__(self, frame_bytes_max: int = limits.frame_bytes_max) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # one past the last received byte in scratch
        self._big: bytearray | None = None  # a large frame being filled in place
        self._big_filled = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames."""
        return (self._end - self._start) + self._big_filled

    def buffer(self) -> memoryview:
        """Writable space for the next `recv_into`; never empty."""
        if self._big is not None:
            return memoryview(self._big)[self._big_filled :]
        if self._end == len(self._scratch):
            self._compact()
        return self._scratch_view[self._end :]

    def advance(self, nbytes: int) -> list[bytearray]:
        """Account for `nbytes` just received into `buffer()`; return the frames completed."""
        frames: list[bytearray] = []
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled < len(self._big):
                return frames
            frames.append(self._big)
            self._big = None
            self._big_filled = 0
            return frames
        self._end += nbytes
        self._cut_frames(frames)
        return frames

    def feed(self, data: bytes) -> list[bytearray]:
        """Convenience for tests and tools: copy `data` in and return the completed frames."""
        frames: list[bytearray] = []
        view = memoryview(data)
        while view:
            target = self.buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            frames.extend(self.advance(n))
        return frames

    def _cut_frames(self, frames: list[bytearray]) -> None:
        scratch = self._scratch
        while self._end - self._start >= SIZE_PREFIX_BYTES:
            (size,) = _SIZE.unpack_from(scratch, self._start)
            if size < 0 or size > self.frame_bytes_max:
                raise DecodeError(f"frame size {size} outside 0..{self.frame_bytes_max}")
            body_start = self._start + SIZE_PREFIX_BYTES
            available = self._end - body_start
            if available >= size:
                frames.append(scratch[body_start : body_start + size])
                self._start = body_start + size
                continue
            if size + SIZE_PREFIX_BYTES > len(scratch):
                # Too big for scratch: give the frame its own buffer and fill it in place.
                big = bytearray(size)
                big[:available] = scratch[body_start : self._end]
                self._big = big
                self._big_filled = available
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _compact(self) -> None:
        pending = self._end - self._start
        self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start, self._end = 0, pending
