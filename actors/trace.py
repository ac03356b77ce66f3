"""One produce request in `trace_produce_every` (node setting; 0, the default, traces none)
timed stage by stage, for the latency budget (bench/README.md) and `krill_produce_stage_seconds`.

A traced request carries a `ProduceTrace` from its connection to its first partition and
back; each place it passes stamps the time (`time.perf_counter`: CLOCK_MONOTONIC, one clock
for every process of the machine, so a cross-core produce is stamped on its owner shard too
and its stamps come back with its answer, shards/calls/produce.py). The stages, each from
the stamp before it:

    decode      read       the frame's last bytes received -> decoded, handed to the handler
    route       at_partition  the partition takes it (a mailbox hop; a cross-core one: the
                           pipe, the owner's loop)
    append      appended   checks, offsets, written to the log (the page cache)
    flush_wait  flush_started  the fdatasync covering it is handed to the I/O pool (behind
                           the flush already out)
    flush       flushed    back on the loop from the pool (its queue, the fdatasync, the hop)
    replicate   committed  answered by the ack window (acks=all on a cluster: the followers'
                           flushes and acks; on one node: the hop from the pool's answer
                           to the partition's mailbox)
    answer      sent       every partition of the request answered, the response encoded and
                           handed to the socket

A stamp a produce never reaches (a refused one, acks=1 on a cluster, a duplicate answered
from the window) takes the one before it: that stage is 0. With several partitions in one
request the first is traced; its `answer` includes waiting for the others.
"""

from __future__ import annotations

import logging
import time

from actors.metrics import PRODUCE_STAGES as STAGES
from actors.metrics import Histogram

__all__ = ["OWNER_STAMPS", "STAGES", "ProduceTrace", "sampled"]

log = logging.getLogger(__name__)
# The owner's stamps, in order: what crosses back with a cross-core produce's answer.
OWNER_STAMPS = ("at_partition", "appended", "flush_started", "flushed", "committed")

_produces = 0  # produce requests this shard has seen since it started (the sampling count)


def sampled(every: int) -> bool:
    """Whether the produce request arriving now is traced (one in `every`; 0: none)."""
    global _produces
    if every <= 0:
        return False
    _produces += 1
    return _produces % every == 0


class ProduceTrace:
    __slots__ = ("read", "decoded", *OWNER_STAMPS, "sent", "last_offset")

    def __init__(self, read: float = 0.0) -> None:
        self.read = read
        self.decoded = 0.0
        self.at_partition = 0.0
        self.appended = 0.0
        self.flush_started = 0.0
        self.flushed = 0.0
        self.committed = 0.0
        self.sent = 0.0
        self.last_offset = -1  # the produce's last offset once appended: which flush covers it

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def owner_stamps(self) -> list[float]:
        return [getattr(self, name) for name in OWNER_STAMPS]

    def take_owner_stamps(self, stamps: list[float]) -> None:
        for name, stamp in zip(OWNER_STAMPS, stamps, strict=True):
            setattr(self, name, stamp)

    def stages(self) -> list[float]:
        """Each stage's seconds, in `STAGES` order (a stamp not reached takes the last)."""
        stamps = [self.read, self.decoded, *self.owner_stamps(), self.sent]
        out = []
        last = stamps[0]
        for stamp in stamps[1:]:
            if stamp < last:  # not reached (0), or stamped before the one it follows
                stamp = last
            out.append(stamp - last)
            last = stamp
        return out

    def finish(self, histograms: dict[str, Histogram] | None) -> None:
        """The response is handed to the socket: observe each stage, log the whole."""
        self.sent = self.now()
        stages = self.stages()
        if histograms is not None:
            for name, seconds in zip(STAGES, stages, strict=True):
                histograms[name].observe(seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("produce trace (ms): %s", " ".join(
                f"{name}={seconds * 1000:.3f}" for name, seconds in zip(STAGES, stages,
                                                                         strict=True)))
