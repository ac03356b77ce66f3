"""The simulated pipe mesh between shards: FIFO per pipe, with faults and held messages.

It stands where `shards.pipes.ZmqPipeMesh` stands in a shard (the `PipeMesh` protocol): a
header is packed with msgpack on send and unpacked on delivery, as ZeroMQ would carry it, and
payloads under ZeroMQ's copy threshold are copied on send (the sender may reuse its buffer),
larger ones referenced. Delivery happens on the virtual loop, in order, each message at the
simulated time the pipe gives it:

- `delay`: a message arrives later; messages behind it wait for it (a pipe is FIFO).
- `drop`: a message is lost (never delivered; its request is never answered).
- `hold`: messages stay in the pipe until `deliver` lets some or all of them go on (or
  `discard` loses them); while a pipe holds, everything sent on it is held, in order.

Faults come from a script (`drop_next`, `delay_next`, `hold`) or from the seeded rates in
`PipeFaults`; every decision is drawn from the run's random stream, so one seed gives one
schedule.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = ["PipeFaults", "SimPipeNetwork"]

# ZeroMQ copies frames under this size at send (its ZMQ_COPY_THRESHOLD default, 64 KiB).
COPY_THRESHOLD_BYTES = 65536

OnMessage = Callable[[int, Any, list[Any]], None]


@dataclass(slots=True)
class PipeFaults:
    drop_rate: float = 0.0  # of each message
    delay_rate: float = 0.0  # of each message
    delay_s: tuple[float, float] = (0.0, 0.0)  # a delayed message's delay, uniform


class _Pipe:
    """One source->target pipe."""

    def __init__(self, network: SimPipeNetwork, source: int, target: int) -> None:
        self.network = network
        self.source = source
        self.target = target
        self.sent = 0
        self.dropped = 0
        self.delivered = 0
        self.held: collections.deque[tuple[bytes, list[Any]]] = collections.deque()
        self.holding = False
        self.drop_next = 0
        self.delay_next: list[float] = []  # delays for the next messages, in order
        self._last_arrival = 0.0  # FIFO: nothing arrives before the message ahead of it
        self.closed = False
        self.epoch = 0  # moved on by a crash at either end: what was in flight is lost
        # (arrival time, header, payloads, epoch), in the order sent
        self._in_flight: collections.deque[tuple[float, bytes, list[Any], int]]
        self._in_flight = collections.deque()
        self._delivery_pending = False

    # PipeWriter ---------------------------------------------------------------------------

    def send(self, header: Any, payloads: Sequence[Any] = ()) -> None:
        if self.closed:  # its shard crashed; what it still sends goes nowhere
            self._drop()
            return
        packed = msgpack.packb(header, use_bin_type=True)
        frames = [bytes(p) if _nbytes(p) < COPY_THRESHOLD_BYTES else memoryview(p)
                  for p in payloads]
        self.sent += 1
        network = self.network
        faults = network.faults
        rng = network.rng
        if self.drop_next > 0:
            self.drop_next -= 1
            self._drop()
            return
        if faults.drop_rate and rng.random() < faults.drop_rate:
            self._drop()
            return
        if self.holding:
            self.held.append((packed, frames))
            return
        delay = 0.0
        if self.delay_next:
            delay = self.delay_next.pop(0)
        elif faults.delay_rate and rng.random() < faults.delay_rate:
            delay = rng.uniform(*faults.delay_s)
        self._schedule(packed, frames, delay)

    @property
    def backlog_bytes(self) -> int:
        return 0  # never full: the pipe's capacity is not what a simulation looks at

    @property
    def backlog_messages(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    # Faults -------------------------------------------------------------------------------

    def _drop(self) -> None:
        self.dropped += 1
        self.network.dropped += 1

    def _schedule(self, packed: bytes, frames: list[Any], delay: float) -> None:
        """Queue a message to arrive `delay` from now, never before the one ahead of it."""
        loop = self.network.loop
        arrival = max(loop.time() + delay, self._last_arrival)
        self._last_arrival = arrival
        self._in_flight.append((arrival, packed, frames, self.epoch))
        if not self._delivery_pending:
            self._delivery_pending = True
            self._wake_at(arrival)

    def _wake_at(self, arrival: float) -> None:
        loop = self.network.loop
        if arrival <= loop.time():
            loop.call_soon(self._deliver_due)
        else:
            loop.call_at(arrival, self._deliver_due)

    def _deliver_due(self) -> None:
        """Deliver, in order, every message whose time has come (timers of equal time do not
        keep their order in asyncio's heap, so one timer per pipe serves its queue)."""
        loop = self.network.loop
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= loop.time():
            _, packed, frames, epoch = in_flight.popleft()
            self._deliver(packed, frames, epoch)
        if in_flight:
            self._wake_at(in_flight[0][0])
        else:
            self._delivery_pending = False

    def _deliver(self, packed: bytes, frames: list[Any], epoch: int) -> None:
        mesh = self.network.meshes.get(self.target)
        if epoch != self.epoch or mesh is None:
            self._drop()  # the target (or this source) crashed: lost with it
            return
        self.delivered += 1
        header = msgpack.unpackb(packed, raw=False, strict_map_key=False)
        mesh.on_message(self.source, header, [memoryview(f) for f in frames])

    def release(self, count: int | None) -> int:
        """Let the first `count` held messages (None: all, and stop holding) go on."""
        n = len(self.held) if count is None else min(count, len(self.held))
        for _ in range(n):
            packed, frames = self.held.popleft()
            self._schedule(packed, frames, 0.0)
        if count is None:
            self.holding = False
        return n

    def discard(self, count: int | None) -> int:
        n = len(self.held) if count is None else min(count, len(self.held))
        for _ in range(n):
            self.held.popleft()
            self._drop()
        return n


class _Mesh:
    """One shard's ends of the network (`PipeMesh`)."""

    def __init__(self, network: SimPipeNetwork, shard_id: int, on_message: OnMessage) -> None:
        self.network = network
        self.shard_id = shard_id
        self.on_message = on_message
        self._writers = {
            target: _Pipe(network, shard_id, target)
            for target in range(network.shards) if target != shard_id
        }
        network.pipes.update({(shard_id, t): w for t, w in self._writers.items()})

    def writer(self, target: int) -> _Pipe:
        return self._writers[target]

    def pause_reading(self) -> None:
        pass  # a simulated pipe is never full, so its reader is never asked to wait

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self.network.meshes.pop(self.shard_id, None)


class SimPipeNetwork:
    """The pipes of `shards` shards on the virtual loop; `rng` draws the seeded faults."""

    def __init__(self, shards: int, loop: Any, rng: random.Random, faults: PipeFaults) -> None:
        self.shards = shards
        self.loop = loop
        self.rng = rng
        self.faults = faults
        self.meshes: dict[int, _Mesh] = {}
        self.pipes: dict[tuple[int, int], _Pipe] = {}
        self.dropped = 0

    def mesh(self, shard_id: int, on_message: OnMessage) -> _Mesh:
        assert shard_id not in self.meshes, f"shard {shard_id} already has its mesh"
        mesh = _Mesh(self, shard_id, on_message)
        self.meshes[shard_id] = mesh
        return mesh

    def pipe(self, source: int, target: int) -> _Pipe:
        pipe = self.pipes.get((source, target))
        if pipe is None:
            raise KeyError(f"no pipe from shard {source} to shard {target}")
        return pipe

    def crash(self, shard: int) -> None:
        """What was in flight to or from `shard` dies with it."""
        for (source, target), pipe in self.pipes.items():
            if shard in (source, target):
                pipe.epoch += 1
                pipe.held.clear()
        mesh = self.meshes.get(shard)
        if mesh is not None:
            mesh.close()

    def counts(self) -> dict[str, int]:
        return {
            "pipe_messages": sum(p.sent for p in self.pipes.values()),
            "pipe_dropped": self.dropped,
            "pipe_held": sum(len(p.held) for p in self.pipes.values()),
        }


def _nbytes(buffer: Any) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
