"""The in-sync replica set (ISR) of one partition, as its leader keeps it.

A pure piece, shaped like actors/ack_window.py: observations in, the new set out when it
changed, no clock or I/O inside. The leader's `Replication` (actors/partition_replication.py)
observes on every Raft tick, with the partition's clock, its log's end, each follower's match
from the Raft machine's progress (actors/raft/progress.py: what the follower has flushed and
acknowledged) and the peers the shard has not heard from for an election timeout; it reports
each new set as a new version of its leader report (Metadata, the admin API, the metrics),
and min.insync.replicas is counted against it (actors/partition_produce.py).

Kafka's rule (replica.lag.time.max.ms): a follower is in sync while it has caught up with the
leader's log end within the last `lag_max_ms`, and here it also leaves at once when its node
is known down. The leader is always in it.

    caught_up(f) = the latest time t at which the leader's log ended at or before match(f)
    in_sync(f)   = f not known down, and now - caught_up(f) <= lag_max_ms

Caught up is measured against the end the leader had *then*, not now: a follower that keeps
up under a steady load is always a little behind the current end (its answers are a round
trip and a flush late), yet it has everything the leader had a moment ago, as Kafka counts a
fetch that reached the end the leader had at the follower's previous fetch. So the leader's
end at past times is kept as samples (time, end), each sample's time the last at which the
log ended there, and at least `lag_max_ms / samples_max` (a span) after the sample before it:
a new end replaces the last sample while that one is younger than a span, else it is added.
`samples_max + 2` of them cover the limit, and an idle log needs one. A follower's catch-up is
thus never dated later than it was, and at most one span earlier: one lagging just under the
limit may leave a little early, never late.

    spans of 500 ms   time (ms)  0    400   700   1200   samples (0, 9) (700, 52) (1200, 75)
                      end        9    30    52    75     (400 gave way to 700, within 500 of 0)
    a match of 52 at 1200: caught up at 700; a match of 40: at 0 (it had 30 at 400)

A new leader knows nothing of its followers' logs yet (a match is known from its first
answer), so every follower not known down starts in sync and has one lag_max_ms to show it
caught up, as Kafka's new leader does for the followers of the ISR it inherits. A follower
that was known down comes back in only once it has caught up with an end the leader had after
it was last seen down (an idle partition: at once, its match is the end).

    isr = InSyncReplicas(a, (a, b, c), lag_max_ms=3000, now_ms=0, log_end=9)
    isr.observe(300, 9, {b: 9, c: 4}, down=set())     -> None: no change, c has its grace
    isr.observe(3100, 9, {b: 9, c: 4}, down=set())    -> (a, b): c has not caught up in 3 s
    isr.observe(3400, 9, {b: 9, c: 9}, down=set())    -> (a, b, c)
    isr.observe(3700, 9, {b: 9, c: 9}, down={b})      -> (a, c): b's node is down
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Mapping
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar

from actors import limits

__all__ = ["InSyncReplicas"]

R = TypeVar("R", bound=Hashable)  # a replica's name (a (node, shard) address in Krill)


def _end(sample: tuple[int, int]) -> int:
    return sample[1]


def _since(caught_up_ms: int | None, oldest_ms: int) -> bool:
    return caught_up_ms is not None and caught_up_ms >= oldest_ms


class InSyncReplicas(Generic[R]):
    def __init__(self, leader: R, replicas: tuple[R, ...], lag_max_ms: int, now_ms: int,
                 log_end: int, down: AbstractSet[R] = frozenset(),
                 samples_max: int = limits.isr_end_samples_max) -> None:
        """A new leader's set: every follower not in `down` in sync, each with `lag_max_ms`
        from `now_ms` to show it caught up (the module docstring). `log_end`: the leader's
        log's last offset."""
        assert leader in replicas and lag_max_ms > 0 and samples_max > 0, (leader, replicas)
        self.leader = leader
        self.replicas = replicas
        self.lag_max_ms = lag_max_ms
        self._spacing_ms = max(1, lag_max_ms // samples_max)
        self._samples: deque[tuple[int, int]] = deque(maxlen=samples_max + 2)  # (ms, end)
        self._samples.append((now_ms, log_end))
        # When each follower last caught up (None: not since it was seen down), and when it
        # was last seen down (only samples after that count for it).
        self._caught_up_ms: dict[R, int | None] = {}
        self._down_at_ms: dict[R, int] = {}
        for replica in replicas:
            if replica == leader:
                continue
            if replica in down:
                self._caught_up_ms[replica] = None
                self._down_at_ms[replica] = now_ms
            else:
                self._caught_up_ms[replica] = now_ms
        self.isr = self._in_sync(now_ms)

    def observe(self, now_ms: int, log_end: int, matches: Mapping[R, int],
                down: AbstractSet[R]) -> tuple[R, ...] | None:
        """The leader's log ends at `log_end` (its last offset) at `now_ms`; `matches`: each
        follower's acknowledged last offset (-1 where none is known); `down`: the replicas
        known down. The new set, in replica order, when it changed; else None. (A clock
        that steps back is taken as standing still.)"""
        now_ms = max(now_ms, self._samples[-1][0])
        self._sample(now_ms, log_end)
        caught_ups, down_at = self._caught_up_ms, self._down_at_ms
        for follower, caught_up in caught_ups.items():
            if follower in down:
                caught_ups[follower] = None
                down_at[follower] = now_ms
                continue
            match = matches.get(follower, -1)
            reached = now_ms if match >= log_end else self._sampled(match)
            if reached is None or reached < down_at.get(follower, reached):
                continue
            if caught_up is None or reached > caught_up:
                caught_ups[follower] = reached
        isr = self._in_sync(now_ms)
        if isr == self.isr:
            return None
        self.isr = isr
        return isr

    def _sample(self, now_ms: int, log_end: int) -> None:
        """Keep (now, end): the same end seen later moves the last sample's time on; a new
        end replaces the last sample while that one is within a span of the one before it
        (the one before then answers for it, at most a span earlier), else is added."""
        samples = self._samples
        last_ms, last_end = samples[-1]
        assert log_end >= last_end, (log_end, samples)  # a leader's log never shrinks
        if log_end == last_end or (len(samples) > 1
                                   and last_ms - samples[-2][0] < self._spacing_ms):
            samples[-1] = (now_ms, log_end)
        else:
            samples.append((now_ms, log_end))  # the oldest goes when full

    def _sampled(self, match: int) -> int | None:
        """The latest sample's time at which the leader's log ended at or before `match`;
        None if none did."""
        samples = self._samples
        i = bisect.bisect_right(samples, match, key=_end)
        return samples[i - 1][0] if i else None

    def _in_sync(self, now_ms: int) -> tuple[R, ...]:
        leader, caught_ups, oldest = self.leader, self._caught_up_ms, now_ms - self.lag_max_ms
        return tuple(r for r in self.replicas if r == leader or _since(caught_ups[r], oldest))

    def __repr__(self) -> str:
        return (f"InSyncReplicas(isr={self.isr}, caught_up_ms={self._caught_up_ms}, "
                f"samples={list(self._samples)})")
