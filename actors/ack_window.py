"""The produce ack window of one partition: which produces to answer, when to flush, and
where the high watermark is.

A pure machine, shaped like actors/group/state.py: events in, a `Step` out, no I/O, clock or
actor inside. The `Partition` actor (actors/partition.py) appends to its log, and its
`Flushes` (actors/partition_flush.py) run each fdatasync on the I/O pool, publish the high
watermark and answer producers; what to answer, when, and when to start a flush, they ask this
window. Offsets here are end offsets (the first
offset not covered), as the log's are, and two orders hold:

    flushed_offset <= written_offset        an fdatasync made it durable / it is in the log
    committed_offset <= written_offset      the high watermark: what consumers may read

Events in, decisions out (a produce's waiter is opaque here: the Partition's reply):

    Partition                                      AckWindow
    log.append(...)        --appended(last, waiter, acks)-->  start_flush if none is out
    log.flush_prepare()    --flush_started()------------->  the end offset it covers
    fdatasync, I/O pool
    log.flush_complete(t)  --flush_done(flushed)--------->  acked, high watermark, start_flush
    log.flush_failed(t)    --flush_failed()-------------->  failed, high watermark
    Raft's Ready.committed --committed(offset)----------->  acked, high watermark (QUORUM)
    replicas' flushes      --insync(offset)-------------->  acked (QUORUM, min.insync.replicas)

Flushes coalesce. One flush is out at a time and covers everything written when it started;
what is appended meanwhile waits for the next, which starts as the first returns and covers
all of it, so a busy partition pays one fdatasync per round trip of the disk, not per produce:

    appended(9)      written 10, no flush out      -> start_flush
    flush_started()  -> 10
    appended(14)     written 15, one out           (waits)
    appended(19)     written 20                    (waits)
    flush_done(10)   flushed 10: answers what needs <= 10; 20 > 10 -> start_flush
    flush_started()  -> 20                         (one fdatasync for both)

The commit. A produce with acks=all is answered once the commit covers it (and what
min.insync.replicas asks, below), and the committed offset is the high watermark. Where the
commit comes from is the one thing replication changes, so it is named (`CommitSource`):

- LOCAL (one replica): the commit follows this replica's log, the flushed offset, or the
  written offset with `write.caching` (acknowledged once in memory and flushed in the
  background, as Redpanda's write caching is). It moves back only with a cut.
- QUORUM (Raft, DESIGN.md §7): only `committed(offset)` moves it, fed from the Raft machine
  (`Ready.committed + 1`: what a quorum has flushed); the Partition reports each offset it
  hands `flush_done` to Raft as this replica's own flushed offset.

min.insync.replicas (QUORUM). Raft's commit is what a majority has flushed; a topic may ask
more replicas than a majority to have flushed a batch before acks=all is answered (its
min.insync.replicas, Kafka's meaning on top of Raft). That is a second offset, `insync(offset)`:
the end offset that many replicas have flushed, as the leader knows from the Raft machine's
progress; acks=all is answered once both the commit and it cover the produce, and the high
watermark still moves with the commit alone. `insync(None)`, the default: nothing is asked
beyond the commit (min.insync.replicas within a majority). It is what the leader knows now, so
it may move back (a new leader has not heard from its followers yet); only answers read it.
Once the in-sync replicas are fewer than min.insync.replicas, the Partition takes every acks=all
waiter out (`fail_acks`) and answers it NOT_ENOUGH_REPLICAS_AFTER_APPEND, as Kafka does.

    committed(10)    high watermark 10          acks=all for offset 9 waits: 3 of 3 asked
    insync(10)       the third replica flushed  -> acked

A produce with acks=1 is answered once this replica's log has it (flushed; written with
write.caching) or the commit covers it, whichever comes first. Under LOCAL the two rules meet
(the commit is this log); under QUORUM acks=1 is the leader's own flush (DESIGN.md §2).

Waiters are kept per acks level, ordered by the end offset they need: an idempotent
producer's duplicate waits for its original's offset (`wait`), which may be below newer
waiters'. Every step answers in offset order, ties in arrival order.

A failed flush (actors/partition_flush.py has the rule, after fsyncgate): the Partition cuts its log
back to the flushed offset, and here the written offset goes back with it, every waiter past
it fails, and the commit is taken back to it if past it (with write.caching: the high
watermark moves back). The flush out covered nothing, and what queued behind it was cut too:
no flush is wanted after a failure until the next append.
"""

from __future__ import annotations

import collections
import enum
import heapq
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

__all__ = ["AckWindow", "Acks", "CommitSource", "Step"]

W = TypeVar("W")


class Acks(enum.IntEnum):
    """What a produce waits for, valued as Kafka's `acks` (acks=0 waits for nothing)."""

    LEADER = 1  # this replica's log has it (or the commit covers it)
    ALL = -1  # the commit covers it


class CommitSource(enum.Enum):
    """What moves the committed offset, the high watermark (the module docstring)."""

    LOCAL = "local"  # one replica: this log's flushed offset (written, with write.caching)
    QUORUM = "quorum"  # Raft: `committed(offset)` only


@dataclass(frozen=True, slots=True)
class Step(Generic[W]):
    """What the Partition does after an event, in this order: publish the high watermark if
    it moved, answer `acked` with their results, answer `failed` KAFKA_STORAGE_ERROR (their
    offsets were cut), then start a flush."""

    acked: tuple[W, ...] = ()
    failed: tuple[W, ...] = ()
    high_watermark: int | None = None  # the new one, when it moved
    start_flush: bool = False  # no flush is out and something written is not flushed


class _Waiting(NamedTuple, Generic[W]):
    end: int  # the end offset it needs covered: its last offset + 1
    arrival: int  # ties in `end` answer in arrival order
    waiter: W


def _order(waiting: _Waiting[W]) -> tuple[int, int]:
    return waiting.end, waiting.arrival


def _end(waiting: _Waiting[W]) -> int:
    return waiting.end


class AckWindow(Generic[W]):
    def __init__(
        self,
        offset: int,
        write_caching: bool = False,
        commit_source: CommitSource = CommitSource.LOCAL,
        committed_offset: int | None = None,
    ) -> None:
        """A window over a log whose every offset below `offset` is durable (a log just
        opened, its tail recovered) and committed, or, under QUORUM, committed only below
        `committed_offset` (a replica restarting knows no more until its leader says);
        the rest of the module docstring."""
        self.written_offset = self.flushed_offset = self.committed_offset = offset
        if committed_offset is not None:
            assert commit_source is CommitSource.QUORUM and committed_offset <= offset
            self.committed_offset = committed_offset
        self.write_caching = write_caching
        self.commit_source = commit_source
        self.flush_covers: int | None = None  # the end offset the flush out makes durable
        # What min.insync.replicas replicas have flushed; None: only the commit is asked.
        self.insync_offset: int | None = None
        self._waiting: dict[Acks, collections.deque[_Waiting[W]]] = {
            Acks.LEADER: collections.deque(), Acks.ALL: collections.deque()
        }
        self._arrivals = 0

    @property
    def high_watermark(self) -> int:
        return self.committed_offset

    @property
    def local_offset(self) -> int:
        """How far this replica's log counts as having a produce."""
        return self.written_offset if self.write_caching else self.flushed_offset

    @property
    def flush_in_flight(self) -> bool:
        return self.flush_covers is not None

    @property
    def flush_wanted(self) -> bool:
        """Whether something written waits for a flush the one out (if any) does not cover."""
        covered = self.flushed_offset if self.flush_covers is None else self.flush_covers
        return self.written_offset > covered

    @property
    def waiting(self) -> int:
        """How many produces wait."""
        return sum(len(queue) for queue in self._waiting.values())

    # Events ---------------------------------------------------------------------------------

    def appended(self, last_offset: int, waiter: W | None = None,
                 acks: Acks = Acks.ALL) -> Step[W]:
        """Offsets up to `last_offset` were appended and written; `waiter` (None for acks=0)
        waits until `acks` covers them."""
        assert last_offset >= self.written_offset, (last_offset, self)
        self.written_offset = last_offset + 1
        if waiter is not None:
            self._waiting[acks].append(_Waiting(last_offset + 1, self._arrival(), waiter))
        return self._settle()

    def wait(self, last_offset: int, waiter: W, acks: Acks = Acks.ALL) -> Step[W]:
        """`waiter` waits for offsets the log already holds, up to `last_offset` (a
        duplicate produce, answered with its original's offsets): at once if covered."""
        assert last_offset < self.written_offset, (last_offset, self)
        queue = self._waiting[acks]
        waiting = _Waiting(last_offset + 1, self._arrival(), waiter)
        queue.insert(bisect_right(queue, waiting.end, key=_end), waiting)
        return self._settle()

    def flush_started(self) -> int:
        """A flush of everything written so far started: the end offset it covers."""
        assert self.flush_covers is None and self.flush_wanted, self
        self.flush_covers = self.written_offset
        return self.flush_covers

    def flush_done(self, flushed_offset: int) -> Step[W]:
        """The flush out returned: the log is durable up to `flushed_offset`."""
        assert self.flush_covers is not None, self
        assert flushed_offset <= self.flush_covers, (flushed_offset, self)
        flushed_offset = max(flushed_offset, self.flushed_offset)
        self.flush_covers = None
        self.flushed_offset = flushed_offset
        return self._settle()

    def flush_failed(self) -> Step[W]:
        """The flush out failed, and the log was cut back to `flushed_offset`: every waiter
        past it fails, and the commit comes back to it if past it."""
        assert self.flush_covers is not None, self
        self.flush_covers = None
        self.written_offset = self.flushed_offset
        failed = _in_order(self._cut(queue) for queue in self._waiting.values())
        moved = None
        if self.committed_offset > self.written_offset:
            self.committed_offset = moved = self.written_offset
        self._check()
        return Step(failed=failed, high_watermark=moved)

    def committed(self, offset: int) -> Step[W]:
        """The commit source (QUORUM: Raft) has everything below `offset`."""
        assert self.commit_source is CommitSource.QUORUM, self
        assert offset <= self.written_offset, (offset, self)
        if offset <= self.committed_offset:
            return Step()
        self.committed_offset = offset
        return self._settle(moved=offset)

    def insync(self, offset: int | None) -> Step[W]:
        """Everything below `offset` is flushed on min.insync.replicas replicas (QUORUM), or
        None: acks=all asks only the commit (the module docstring). It may move back."""
        assert offset is None or self.commit_source is CommitSource.QUORUM, self
        if offset == self.insync_offset:
            return Step()
        self.insync_offset = offset
        return self._settle()

    def rewritten(self, end_offset: int) -> Step[W]:
        """Raft rewrote the log (QUORUM): a follower's divergent tail was cut, or its log
        restarted empty at the leader's log start; the log now ends at `end_offset`. Waiters
        past it fail (a leader's waiters were answered when it stepped down: none are left);
        a flush out covers no more than the log holds."""
        assert self.commit_source is CommitSource.QUORUM, self
        if end_offset > self.written_offset:  # a restart past our end: all of it is new
            self.flushed_offset = end_offset
        else:
            self.flushed_offset = min(self.flushed_offset, end_offset)
        self.written_offset = end_offset
        if self.flush_covers is not None:
            self.flush_covers = max(self.flushed_offset, min(self.flush_covers, end_offset))
        failed = _in_order(self._cut(queue) for queue in self._waiting.values())
        moved = None
        if self.committed_offset > end_offset:
            self.committed_offset = moved = end_offset
        self._check()
        return Step(failed=failed, high_watermark=moved)

    def set_write_caching(self, write_caching: bool) -> Step[W]:
        """The topic's write.caching changed: it holds from now on (turned on, what is
        written counts at once)."""
        self.write_caching = write_caching
        return self._settle()

    def fail_acks(self, acks: Acks) -> tuple[W, ...]:
        """Forget every waiter of `acks`, in order, to answer it with an error (acks=all once
        the in-sync replicas are fewer than min.insync.replicas)."""
        waiting = _in_order((self._waiting[acks],))
        self._waiting[acks].clear()
        return waiting

    def fail_all(self) -> tuple[W, ...]:
        """Forget every waiter, to answer them with an error (the partition stops, its topic
        is deleted, its log fails): in the order they would have been answered."""
        waiting = _in_order(self._waiting.values())
        for queue in self._waiting.values():
            queue.clear()
        return waiting

    # Inside ---------------------------------------------------------------------------------

    def _arrival(self) -> int:
        self._arrivals += 1
        return self._arrivals

    def _settle(self, moved: int | None = None) -> Step[W]:
        """Move the commit (LOCAL) and answer what is now covered; `moved`: the commit moved
        already."""
        if self.commit_source is CommitSource.LOCAL and self.local_offset > self.committed_offset:
            self.committed_offset = moved = self.local_offset
        acks_all = self.committed_offset
        if self.insync_offset is not None:
            acks_all = min(acks_all, self.insync_offset)
        acked = _in_order((
            _release(self._waiting[Acks.LEADER], max(self.local_offset, self.committed_offset)),
            _release(self._waiting[Acks.ALL], acks_all),
        ))
        self._check()
        return Step(acked=acked, high_watermark=moved,
                    start_flush=self.flush_covers is None and self.flush_wanted)

    def _cut(self, queue: collections.deque[_Waiting[W]]) -> list[_Waiting[W]]:
        """Take the waiters that need more than the log now holds."""
        cut: list[_Waiting[W]] = []
        while queue and queue[-1].end > self.written_offset:
            cut.append(queue.pop())
        cut.reverse()
        return cut

    def _check(self) -> None:
        assert self.flushed_offset <= self.written_offset, self
        assert self.committed_offset <= self.written_offset, self
        covers = self.flush_covers
        assert covers is None or self.flushed_offset <= covers <= self.written_offset, self

    def __repr__(self) -> str:
        return (f"AckWindow(written={self.written_offset}, flushed={self.flushed_offset}, "
                f"committed={self.committed_offset}, insync={self.insync_offset}, "
                f"flush_covers={self.flush_covers}, "
                f"waiting={self.waiting}, write_caching={self.write_caching}, "
                f"{self.commit_source.name})")


def _release(queue: collections.deque[_Waiting[W]], offset: int) -> list[_Waiting[W]]:
    """Take the waiters at the front whose offsets are all below `offset`."""
    released: list[_Waiting[W]] = []
    while queue and queue[0].end <= offset:
        released.append(queue.popleft())
    return released


def _in_order(runs: Iterable[Iterable[_Waiting[W]]]) -> tuple[W, ...]:
    """The waiters of sorted runs, merged in offset then arrival order."""
    return tuple(waiting.waiter for waiting in heapq.merge(*runs, key=_order))
