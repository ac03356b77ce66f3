"""What a leader knows of each follower, after etcd-io/raft's tracker.Progress.

A follower is in one of two states:

    probe      one append in flight at a time (then `paused` until an answer or a heartbeat
               answer): the leader is looking for where the logs match. `next` walks back on
               each rejection, a whole term at a time thanks to the conflict hint.
    replicate  appends stream: `next` moves past what was sent without waiting, bounded by
               the in-flight window (messages and bytes); an answer frees the window up to
               what it acknowledges.

                   answer that matches                 rejection, or reported unreachable
        probe  ---------------------------->  replicate  ------------------------------> probe

    match = -1 ........ match ....... next - 1 ......... last_offset (leader)
            acked: flushed by the follower | in flight | not yet sent

A follower behind the leader's log start gets an install message (MsgSnap: restart your log
at my log start) instead of an append, and is probed from the log start on; it is one small
message, so no separate snapshot state is needed.

`match` only ever counts what the follower has flushed: it answers appends after its own
sync. The commit offset is the quorum offset of the matches (the leader's own is its flushed
offset), see `Membership.committed` (quorum.py).
"""

from __future__ import annotations

import enum
from collections import deque

__all__ = ["Inflights", "Progress", "ProgressState"]


class ProgressState(enum.IntEnum):
    Probe = 0
    Replicate = 1

    def __str__(self) -> str:
        return self.name


class Inflights:
    """The append messages in flight to one follower: (last offset, bytes) each, in order."""

    __slots__ = ("_sent", "bytes", "messages_max", "bytes_max")

    def __init__(self, messages_max: int, bytes_max: int) -> None:
        assert messages_max > 0 and bytes_max > 0
        self._sent: deque[tuple[int, int]] = deque()
        self.bytes = 0
        self.messages_max = messages_max
        self.bytes_max = bytes_max

    def __len__(self) -> int:
        return len(self._sent)

    def add(self, last_offset: int, size_bytes: int) -> None:
        assert not self._sent or last_offset > self._sent[-1][0], (last_offset, self._sent)
        self._sent.append((last_offset, size_bytes))
        self.bytes += size_bytes

    def free_upto(self, offset: int) -> None:
        sent = self._sent
        while sent and sent[0][0] <= offset:
            self.bytes -= sent.popleft()[1]

    def full(self) -> bool:
        return len(self._sent) >= self.messages_max or self.bytes >= self.bytes_max

    def reset(self) -> None:
        self._sent.clear()
        self.bytes = 0


class Progress:
    """One follower as its leader tracks it."""

    __slots__ = ("match", "next", "state", "paused", "recent_active", "sent_commit",
                 "inflights", "probe_last", "probe_bytes", "log_start")

    def __init__(self, next_offset: int, messages_max: int, bytes_max: int) -> None:
        self.match = -1  # acknowledged: the follower flushed the leader's log up to here
        self.next = next_offset  # the next offset to send
        self.state = ProgressState.Probe
        self.paused = False  # probe: an append is out; replicate: the window is full
        self.recent_active = True  # heard from since the last check-quorum round
        self.sent_commit = -1  # the highest commit offset sent to it
        self.inflights = Inflights(messages_max, bytes_max)
        self.probe_last: int | None = None  # the last offset the outstanding probe named
        self.probe_bytes = 0
        self.log_start = -1  # where the follower's log starts, as its last answer said

    def become_probe(self) -> None:
        self.state = ProgressState.Probe
        self.paused = False
        self.next = self.match + 1
        self.inflights.reset()
        self.probe_last = None

    def become_replicate(self, probe_accepted: bool) -> None:
        """An answer matched. `probe_accepted`: it reached the outstanding probe's prev, so
        the follower took the probe: what the probe named counts as in flight (its answer,
        after the follower's sync, acknowledges it) instead of being sent again. Were the
        answer from an older append and the probe lost, the next append is rejected and the
        follower probed again: a round trip, never a wrong match."""
        self.state = ProgressState.Replicate
        self.paused = False
        self.next = self.match + 1
        self.inflights.reset()
        if probe_accepted and self.probe_last is not None and self.probe_last > self.match:
            self.inflights.add(self.probe_last, self.probe_bytes)
            self.next = self.probe_last + 1
        self.probe_last = None

    def sent_install(self, log_start: int) -> None:
        """An install (restart at `log_start`) went out: probe from there, paused."""
        self.state = ProgressState.Probe
        self.inflights.reset()
        self.next = log_start
        self.paused = True
        self.probe_last = None

    def sent_append(self, last_offset: int | None, size_bytes: int) -> None:
        """An append went out naming offsets up to `last_offset` (None: it named none)."""
        if self.state == ProgressState.Replicate:
            if last_offset is not None:
                self.next = last_offset + 1
                self.inflights.add(last_offset, size_bytes)
            self.paused = self.inflights.full()
        else:
            self.paused = True  # one probe at a time
            self.probe_last = last_offset
            self.probe_bytes = size_bytes

    def maybe_update(self, offset: int) -> bool:
        """An answer acknowledged `offset`; False if it told nothing new."""
        if offset <= self.match:
            return False
        self.match = offset
        self.next = max(self.next, offset + 1)
        self.paused = False
        return True

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        """A rejection of the append whose prev offset was `rejected`; `hint` is the leader's
        offset where the logs may match. False when the rejection is stale."""
        if self.state == ProgressState.Replicate:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:  # probes go one at a time: another one is newer
            return False
        self.next = max(min(rejected, hint + 1), self.match + 1)
        self.paused = False
        return True

    def describe(self) -> str:
        s = f"{self.state} match={self.match} next={self.next}"
        if self.paused:
            s += " paused"
        if not self.recent_active:
            s += " inactive"
        if self.inflights:
            s += f" inflight={len(self.inflights)}"
            if self.inflights.full():
                s += "[full]"
        return s
