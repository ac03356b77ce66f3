"""A ZeroMQ ROUTER socket served on a shard's loop thread: requests in, replies out.

The socket lives on the loop the way the pipes do (shards/pipes.py): its edge-triggered
`zmq.FD` is watched with `loop.add_reader`, a drain stops at `zmq.Again` or after
`requests_per_turn` requests and re-checks `EVENTS` before it returns, and since a send can
consume the read edge too, every send is followed by a scheduled drain. Used by the Spark
reader endpoint (shards/reader.py) and the shard's stats endpoint (shards/stats.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq

__all__ = ["LoopRouter"]

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

# (identity, the request's frames after the identity)
OnRequest = Callable[[bytes, list[Any]], None]


class LoopRouter:
    """A bound ROUTER socket, drained on `loop`. Loop thread only."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        socket: zmq.Socket[Any],
        on_request: OnRequest,
        requests_per_turn: int,
        name: str,
    ) -> None:
        self._loop = loop
        self._socket = socket
        self._on_request = on_request
        self._requests_per_turn = requests_per_turn
        self._name = name
        self._fd = socket.fileno()
        self._drain_pending = False
        self.closed = False
        loop.add_reader(self._fd, self._drain)
        self._schedule_drain()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        self._socket.close(linger=0)

    def send(self, identity: bytes, frames: Sequence[Any]) -> None:
        """One reply; large frames go without a copy."""
        if self.closed:
            return
        socket = self._socket
        try:
            socket.send(identity, _NOBLOCK_SNDMORE)
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                socket.send(frame, _NOBLOCK_SNDMORE if i < last else _NOBLOCK, copy=False)
        except zmq.Again:
            # ROUTER without ROUTER_MANDATORY drops rather than blocks; Again cannot happen,
            # but if it does, that client's request times out, the shard carries on.
            log.warning("%s: reply dropped, client queue full", self._name)
        self._schedule_drain()  # the send may have consumed the read edge

    def _schedule_drain(self) -> None:
        if not self._drain_pending and not self.closed:
            self._drain_pending = True
            self._loop.call_soon(self._scheduled_drain)

    def _scheduled_drain(self) -> None:
        self._drain_pending = False
        self._drain()

    def _drain(self) -> None:
        if self.closed:
            return
        socket = self._socket
        more = True
        try:
            for _ in range(self._requests_per_turn):
                try:
                    frames = socket.recv_multipart(_NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._on_request(frames[0].bytes, frames[1:])
                if self.closed:
                    return
            else:
                return  # turn spent: `finally` continues next turn
            more = bool(cast(int, socket.getsockopt(_EVENTS)) & _POLLIN)
        finally:
            if more:
                self._schedule_drain()
