"""The rate at which a shard's Raft leaders send their learners the log they lack
(Redpanda's raft_learner_recovery_rate): a partition move copies a whole log to its new
replicas, and unbounded it takes the leader's loop and disk from the partition's own writes
(bench `cluster_move`: the producer's p99 went from 9 ms to 200 ms while 270 MB moved).

A token bucket, pure (the clock is given), shared by a shard's partitions: `wait(n)` says how
long until n bytes may leave (0: now), `take(n)` takes them. Tokens never pass `burst`.

    throttle = RecoveryThrottle(rate=32 MiB, burst=1 MiB, now=loop.time)
    throttle.wait(MiB) -> 0.0; throttle.take(MiB)
    throttle.wait(MiB) -> 0.03125      the next MiB may leave in 1/32 s

The leader queues its appends to each learner (actors/partition_replication.py) and sends
them as `wait` allows, charging each when it leaves: an append that Raft sends again (a
learner probed back after a rejection resends from where it matched) replaces the queued ones
it covers, and one the learner has acknowledged meanwhile is dropped unsent, so the budget
pays for what the learner needs, once.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["RecoveryThrottle"]


class RecoveryThrottle:
    def __init__(self, rate: float, burst: float, now: Callable[[], float]) -> None:
        assert rate > 0 and burst > 0, (rate, burst)
        self.rate, self.burst, self._now = rate, burst, now
        self._tokens = burst
        self._at = now()
        self.taken = 0  # bytes taken

    def _refill(self) -> None:
        now = self._now()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self, nbytes: int) -> float:
        """Seconds until `nbytes` may leave (0: now). More than the burst may leave once the
        bucket is full: an append larger than it is not held for ever."""
        self._refill()
        need = min(nbytes, self.burst)
        return 0.0 if self._tokens >= need else (need - self._tokens) / self.rate

    def take(self, nbytes: int) -> None:
        self._refill()
        self._tokens -= nbytes
        self.taken += nbytes
