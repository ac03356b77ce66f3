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

A reader given `buffers` asks it for the buffer of each large Produce frame (the shard hands
out regions of its arena, reused instead of freshly allocated; see shards/arena.py). Such a
frame is a `memoryview` of the region, and `take_buffer()` right after `advance()` returns
its holder, which the caller releases when it is done with the frame.

A reader given `scratch` receives into that buffer, which many readers share: those of one
thread, each reading only between its own `buffer()` and `advance()`, as the connections of a
shard do. Frames are cut out of it as copies anyway, so between reads a reader keeps only the
bytes of a frame not yet whole (`carry`): an idle connection holds a few bytes, not the
scratch, and ten thousand of them do not hold ten thousand scratch buffers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from wire import limits
from wire.errors import DecodeError

__all__ = ["FrameBuffer", "FrameReader", "SCRATCH_BYTES", "SIZE_PREFIX_BYTES"]

SIZE_PREFIX_BYTES = 4
_SIZE = struct.Struct(">i")
# Scratch space for small frames; a recv fills at most this much at once.
SCRATCH_BYTES = 256 * 1024
_PRODUCE_KEY = b"\x00\x00"  # a request body starts with its int16 API key; Produce is 0


class FrameBuffer(Protocol):
    """A buffer lent for one frame: `view` is exactly the frame's size; `release` once."""

    view: memoryview

    def release(self) -> None: ...


class FrameReader:
    def __init__(
        self,
        frame_bytes_max: int = limits.frame_bytes_max,
        buffers: Callable[[int], FrameBuffer | None] | None = None,
        scratch: bytearray | None = None,
    ) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffers = buffers
        self._big_buffer: FrameBuffer | None = None  # the lent buffer `_big` is, if any
        self._done_buffer: FrameBuffer | None = None  # the last completed frame's
        self._shared = scratch is not None
        self._scratch = bytearray(SCRATCH_BYTES) if scratch is None else scratch
        self._scratch_view = memoryview(self._scratch)
        self._carry = b""  # with a shared scratch: a partial frame's bytes between reads
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # one past the last received byte in scratch
        self._big: bytearray | memoryview | None = None  # a large frame being filled in place
        self._big_filled = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames."""
        return (self._end - self._start) + self._big_filled + len(self._carry)

    def buffer(self) -> memoryview:
        """Writable space for the next `recv_into`; never empty."""
        if self._big is not None:
            return memoryview(self._big)[self._big_filled :]
        if self._shared:  # whatever another reader left in the scratch is not ours
            carry = self._carry
            self._scratch[: len(carry)] = carry
            self._start, self._end, self._carry = 0, len(carry), b""
        elif self._end == len(self._scratch):
            self._compact()
        return self._scratch_view[self._end :]

    def advance(self, nbytes: int) -> list[bytearray | memoryview]:
        """Account for `nbytes` just received into `buffer()`; return the frames completed."""
        frames: list[bytearray | memoryview] = []
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled < len(self._big):
                return frames
            frames.append(self._big)  # alone: a large frame is never cut with others
            self._done_buffer, self._big_buffer = self._big_buffer, None
            self._big = None
            self._big_filled = 0
            return frames
        self._end += nbytes
        self._cut_frames(frames)
        if self._shared and self._end > self._start:
            self._carry = bytes(self._scratch[self._start : self._end])
            self._start = self._end = 0
        return frames

    def take_buffer(self) -> FrameBuffer | None:
        """The lent buffer of the frame `advance` just returned, if it had one; the caller
        now owns it and releases it when done with the frame."""
        buffer, self._done_buffer = self._done_buffer, None
        return buffer

    def close(self) -> None:
        """Give back a lent buffer of a frame still being received (the connection closed),
        and everything else held for frames not yet whole."""
        if self._big_buffer is not None:
            self._big_buffer.release()
            self._big_buffer = None
        self._big = None
        self._big_filled = 0
        self._carry = b""
        self._start = self._end = 0

    def feed(self, data: bytes) -> list[bytearray | memoryview]:
        """Convenience for tests and tools: copy `data` in and return the completed frames."""
        frames: list[bytearray | memoryview] = []
        view = memoryview(data)
        while view:
            target = self.buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            frames.extend(self.advance(n))
        return frames

    def _cut_frames(self, frames: list[bytearray | memoryview]) -> None:
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
                big = self._big_frame_buffer(size, scratch[body_start : body_start + 2])
                big[:available] = scratch[body_start : self._end]
                self._big = big
                self._big_filled = available
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _big_frame_buffer(self, size: int, head: bytes | bytearray) -> bytearray | memoryview:
        if self._buffers is not None and head == _PRODUCE_KEY:
            lent = self._buffers(size)
            if lent is not None:
                self._big_buffer = lent
                return lent.view
        return bytearray(size)

    def _compact(self) -> None:
        pending = self._end - self._start
        self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start, self._end = 0, pending
