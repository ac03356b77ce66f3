"""The epoch cache: where each leader epoch (Raft term) begins in a partition log.

A batch's `partitionLeaderEpoch` is the Raft term it was written in, and terms only grow along
a Raft log, so the log is a few runs of one epoch each. The cache keeps one entry per run,
`(epoch, start_offset)`, not one per batch; the log rolls a segment on every epoch change, so
on open the entries come from the segments' first batch headers:

    offset     10 11 12 | 13 14 15 16 | 17 18        log start 10, log end 19
    epoch       1  1  1 |  3  3  3  3 |  4  4
    entries  [(1, 10), (3, 13), (4, 17)]            last_epoch 4

    term_at(14) = 3                        None below the log start or at/after its end
    end_offset_for_epoch(3) = (3, 17)      the start of the next higher epoch
    end_offset_for_epoch(2) = (1, 13)      the largest epoch <= 2, ending where 3 begins
    end_offset_for_epoch(4) = (4, 19)      the latest epoch ends at the log end
    end_offset_for_epoch(5) = (-1, -1)     above every epoch: UNDEFINED
    end_offset_for_epoch(0) = (0, 10)      below every epoch: the first start (Kafka's answer)

How the log keeps it: an append adds an entry when a batch's epoch differs from the last one;
a truncation to a new end drops the entries that start at or after it; a log start moved up
(retention, DeleteRecords) drops the entries wholly below it and clamps the first one to it;
a reset (a follower taking the leader's log start) leaves no entry at all. These are Kafka's
LeaderEpochFileCache operations (assign, truncateFromEnd, truncateFromStart, clear), and
`end_offset_for_epoch` answers OffsetForLeaderEpoch as its `endOffsetFor` does.

Besides the entries the cache keeps `epoch_before_start`, the epoch of the offset just below
the log start when the log knows it: a reset sets it (the leader's term there), a start move
takes it from the entry it passes. Raft's log matching anchors on it (a follower whose log
starts at 100 must still tell whether prev (99, term) matches), and `last_epoch` falls back on
it when no batch is left. None means unknown: a log that starts at 0, or one reopened at a
start whose epoch its log-start checkpoint does not say (written by a version that did not
record it when retention moved the start).

A log whose epochs go down (written before Raft, or by tests that pick epochs at random) still
gets one entry per change; `end_offset_for_epoch` then answers from the last entry at or
below the requested epoch, the end of the last offset of an epoch <= the requested one.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

__all__ = ["UNDEFINED_EPOCH_OFFSET", "EpochCache"]

# OffsetForLeaderEpoch's answer for an epoch the log cannot place: (UNDEFINED_EPOCH,
# UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH_OFFSET = (-1, -1)


class EpochCache:
    """`(epoch, start_offset)` of each run of one epoch in a log, ascending by offset. The log
    owns its ends: methods that need the log end take it (`end_offset`, exclusive)."""

    __slots__ = ("_starts", "_epochs", "epoch_before_start")

    def __init__(self, entries: Iterable[tuple[int, int]] = (),
                 epoch_before_start: int | None = None) -> None:
        self._starts: list[int] = []
        self._epochs: list[int] = []
        self.epoch_before_start = epoch_before_start
        for epoch, start in entries:
            self.append(epoch, start)

    def __repr__(self) -> str:
        return f"EpochCache({self.epochs()}, before_start={self.epoch_before_start})"

    def __len__(self) -> int:
        return len(self._starts)

    # Reading -------------------------------------------------------------------------------

    def epochs(self) -> list[tuple[int, int]]:
        """`(epoch, start_offset)` of each run, ascending; the first starts at the log start."""
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the log's last batch; with no batch, the epoch before the start."""
        return self._epochs[-1] if self._epochs else self.epoch_before_start

    def term_at(self, offset: int, end_offset: int) -> int | None:
        """The epoch of the batch holding `offset`; None below the first entry (the log start)
        or at or past `end_offset`."""
        if not self._starts or offset < self._starts[0] or offset >= end_offset:
            return None
        return self._epochs[bisect_right(self._starts, offset) - 1]

    def end_offset_for_epoch(self, epoch: int, end_offset: int) -> tuple[int, int]:
        """(the largest epoch <= `epoch`, the offset where it ends: the start of the next
        entry, or `end_offset` for the last one). An epoch below every entry gets (epoch,
        first start); a negative epoch, one above the last, or an empty cache (-1, -1). An
        empty log after a reset answers for `epoch_before_start` as if it were its entry."""
        starts, epochs = self._starts, self._epochs
        if not starts and self.epoch_before_start is not None:
            starts, epochs = [end_offset], [self.epoch_before_start]
        if epoch < 0 or not starts or epoch > epochs[-1]:
            return UNDEFINED_EPOCH_OFFSET
        if epoch == epochs[-1]:
            return epoch, end_offset
        for i in range(len(epochs) - 2, -1, -1):  # O(entries), usually a step or two
            if epochs[i] <= epoch:
                return epochs[i], starts[i + 1]
        return epoch, starts[0]

    # Writing -------------------------------------------------------------------------------

    def append(self, epoch: int, base_offset: int) -> None:
        """A batch of `epoch` at `base_offset` joins the log's end."""
        if self._epochs and self._epochs[-1] == epoch:
            return
        assert not self._starts or base_offset > self._starts[-1], (self, epoch, base_offset)
        self._starts.append(base_offset)
        self._epochs.append(epoch)

    def truncate(self, end_offset: int) -> None:
        """The log now ends at `end_offset` (a batch boundary): entries starting there or
        later go. Cut down to the log start, the log's last epoch is the one before it."""
        while self._starts and self._starts[-1] >= end_offset:
            self._starts.pop()
            self._epochs.pop()

    def advance_start(self, start_offset: int, end_offset: int) -> None:
        """The log start moved up to `start_offset`: entries wholly below it go, the one
        holding it starts there (Kafka's truncateFromStart); `epoch_before_start` becomes the
        epoch of `start_offset - 1`."""
        if not self._starts or start_offset <= self._starts[0]:
            return
        self.epoch_before_start = self._epochs[bisect_right(self._starts, start_offset - 1) - 1]
        if start_offset >= end_offset:  # no batch left at or after the start
            self._starts.clear()
            self._epochs.clear()
            return
        first = bisect_right(self._starts, start_offset) - 1
        del self._starts[:first], self._epochs[:first]
        self._starts[0] = start_offset

    def reset(self, epoch_before_start: int | None) -> None:
        """The log was emptied to start afresh; the offset before its start had this epoch."""
        self._starts.clear()
        self._epochs.clear()
        self.epoch_before_start = epoch_before_start
