"""What a replicated log adds to the partition log: a leader's batches, cuts, and their tickets.

Raft replicates the partition log as it is (DESIGN.md §7): a batch's partitionLeaderEpoch is
its term, Kafka offsets are Raft indexes. A follower writes the leader's batches as they come
(`append_replicated`: offsets and epochs set by the leader, checked here to continue the log),
cuts a divergent tail (`truncate_to`, at a batch boundary), and, when it has fallen behind the
leader's log start, drops its whole log to start again there (`reset`). Both cuts return a
`CutTicket` the caller runs on its I/O pool, as it runs a flush ticket:

    ticket = log.truncate_to(120)    # loop: batches 120.. gone from memory and the files
    ticket.run()                     # I/O thread: fdatasync of the cut file, fsync of the dir
    log.cut_complete(ticket)         # loop: the cut is durable; the log takes appends again

DeleteRecords moves a leader's log start to any offset, inside a batch too, and a reset
follower's log then starts there, empty; the leader can only send it the whole batch that
holds that start. A log that holds no batch takes a first batch that holds its start: its
segment restarts at the batch's base offset, the log start staying where it is, so reads
below it are still refused (Kafka's follower does the same, truncateFullyAndStartAt the
batch's base). The log is then as a leader's is after that DeleteRecords:

    reset(25, 3)                      start 25, next 25, one empty segment at 25
    append_replicated([20..29 @3])    start 25, next 30, one segment at 20; epochs [(3, 25)]

That restart needs no ticket: its segment is new, written and synced by the next flush
ticket (with the directory), and nothing in it counts as flushed until then. A crash before
that may leave the old empty segment beside the new one; it does not start where the new
one ends, so recovery drops it. If the batch itself did not survive, the log reopens empty
at the batch's base, below the start it had: nothing of it was acknowledged, and the
leader's next install moves the start up again.

Once `run` returns, no crash brings a cut batch back: the cut file's new size and the
directory without the dropped segment files are on disk. A crash before that leaves the log
as it was before the cut, or a prefix of it, never a mix of old and new: recovery drops a
segment that overlaps its predecessor or leaves a gap after it. That is why no append is taken
while a cut ticket is out (and only one is out at a time): a new batch written over the cut
region before the cut was on disk could, after a crash, be followed by an old batch that was
cut, wherever the sizes happened to line up, and Raft's log matching would no longer hold.

A reset's ticket persists it in two steps: an fsync of the directory (the old segment files
unlinked, the new empty one created), then the log start file, written atomically with the
epoch before the start; so no old segment can come back once that file is there. A crash
between the two steps leaves an empty log at the new start whose `epoch_before_start` is
unknown. A crash before the first leaves what is left of the old segments from the first one
to the first gap (the old log or a piece of it), or none and an empty log at 0. Raft loses
nothing by that: a leader resets a follower only when their logs match nowhere at or above the
leader's log start, so nothing the follower holds from there on is committed, and everything
below it is committed and gone from the leader's log too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from storage import probes
from storage.epochs import EpochCache
from storage.metadata_file import write_atomic_at
from storage.segment import BatchInfo, OpenFile
from wire.record_batch import BatchHeader

__all__ = ["CutTicket", "NotBatchBoundary", "NotContiguous", "ReplicaAccounting",
           "replicated_batches"]


class NotContiguous(ValueError):
    """Replicated batches that do not continue the log: the first does not start at its next
    offset, one does not start where the previous ended, or an epoch goes down."""


class NotBatchBoundary(ValueError):
    """A truncation point inside a batch (a log is cut between whole batches only)."""


class CutTicket:
    """Makes a `truncate_to` or `reset` durable; `run` blocks (I/O pool) and touches only
    duplicates of the fds it needs, closed when the ticket goes."""

    __slots__ = ("offset", "_files", "_directory", "_state")

    def __init__(self, offset: int, files: list[int], directory: int | None = None,
                 state: tuple[str, bytes] | None = None) -> None:
        self.offset = offset  # the log's next offset after the cut
        self._files = [OpenFile(os.dup(fd)) for fd in files]
        self._directory = None if directory is None else OpenFile(os.dup(directory))
        self._state = state  # (file name, bytes) written atomically in the directory last

    def run(self) -> None:
        for file in self._files:
            probes.fdatasync(file.fd)
        if self._directory is not None:
            probes.fdatasync(self._directory.fd)  # unlinks and creations before the state
            if self._state is not None:
                write_atomic_at(self._directory.fd, *self._state)

    def __repr__(self) -> str:
        return f"CutTicket(offset={self.offset}, files={len(self._files)})"


def replicated_batches(
    headers: list[BatchHeader], next_offset: int, last_epoch: int | None
) -> list[BatchInfo]:
    """The leader's batches as the log stores them, checked to continue a log that ends at
    `next_offset` with a batch of `last_epoch`; raises NotContiguous. The batches must lie
    back to back in their buffer."""
    assert headers, "append of no batches"
    batches: list[BatchInfo] = []
    position = headers[0].position
    expected, floor = next_offset, last_epoch
    for header in headers:
        assert header.position == position, (header, position)
        if header.base_offset != expected:
            raise NotContiguous(f"batch at offset {header.base_offset} where the log "
                                f"continues at {expected}")
        epoch = header.partition_leader_epoch
        if floor is not None and epoch < floor:
            raise NotContiguous(f"batch at offset {header.base_offset} has epoch {epoch}, "
                                f"after epoch {floor}")
        batches.append(BatchInfo(header.base_offset, header.last_offset, header.max_timestamp,
                                 header.size, epoch))
        expected, floor = header.next_offset, epoch
        position += header.size
    return batches


class ReplicaAccounting:
    """The epoch cache and the cut ticket, shared by DiskLog and MemoryLog."""

    _epochs: EpochCache
    _cut: CutTicket | None
    log_start_offset: int
    next_offset: int

    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        raise NotImplementedError

    def _holds_no_batch(self) -> bool:
        raise NotImplementedError

    def _replicated_base(self, first: BatchHeader) -> int:
        """Where a follower's batches must start: at the log's next offset; or, on a log that
        holds no batch, at the base offset of a first batch that holds its start (the module
        docstring)."""
        if (first.base_offset < self.log_start_offset == self.next_offset <= first.last_offset
                and self._holds_no_batch()):
            return first.base_offset
        return self.next_offset

    # The epoch cache (storage/epochs.py) -----------------------------------------------------

    def epochs(self) -> list[tuple[int, int]]:
        """`(epoch, start_offset)` where each epoch begins, ascending, from the log start."""
        return self._epochs.epochs()

    @property
    def last_epoch(self) -> int | None:
        return self._epochs.last_epoch

    @property
    def epoch_before_start(self) -> int | None:
        return self._epochs.epoch_before_start

    def term_at(self, offset: int) -> int | None:
        """The epoch of the batch holding `offset`; None below the log start or at its end."""
        return self._epochs.term_at(offset, self.next_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= `epoch`, the offset where it ends)."""
        return self._epochs.end_offset_for_epoch(epoch, self.next_offset)

    # Cuts ------------------------------------------------------------------------------------

    @property
    def cut_pending(self) -> bool:
        """A cut ticket is out: no append until `cut_complete`."""
        return self._cut is not None

    def cut_complete(self, ticket: CutTicket) -> None:
        """The ticket's `run` returned: the cut is durable. A run that raised leaves the log
        refusing appends (what the disk holds is unknown): the partition goes offline and a
        reopen recovers."""
        assert ticket is self._cut, (ticket, self._cut)
        self._cut = None

    def _check_no_cut(self) -> None:
        assert self._cut is None, f"{self}: append while {self._cut} is out"

    def _check_cut_point(self, offset: int) -> None:
        """`offset` must be a batch boundary between the log start and the log end."""
        assert self._cut is None, f"{self}: a cut while {self._cut} is out"
        if not self.log_start_offset <= offset <= self.next_offset:
            raise NotBatchBoundary(f"cut at {offset} outside the log, "
                                   f"{self.log_start_offset}..{self.next_offset}")
        if offset == self.next_offset:
            return
        first = next(self.iter_batch_headers(offset))
        if first.base_offset != offset:
            raise NotBatchBoundary(f"cut at {offset}, inside the batch "
                                   f"{first.base_offset}..{first.last_offset}")
