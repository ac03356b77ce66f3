"""Flush tickets, and how they move `flushed_offset`: shared by DiskLog and MemoryLog.

A flush ticket captures, on the loop, the fds holding data not yet synced and the offset that
data reaches; its `run` (fdatasync of those fds only) blocks on an I/O thread while appends go
on; `flush_complete` on the loop then moves flushed_offset up, and `flush_failed` cuts the log
back to it (storage/log.py tells the whole dance and why a failed flush cuts).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from storage import probes
from storage.appender import WriteJob
from storage.metadata_file import fsync_directory
from storage.segment import Segment

__all__ = ["FlushAccounting", "FlushTicket"]


class FlushTicket:
    """Makes everything below `offset` durable; `run` blocks and touches only its own fds,
    and the directories in `parents` (opened by path: the log's first ticket syncs the entry
    of the log's own directory in its parent). In direct mode it first writes what its
    segments hold only in memory (`writes`, storage/appender.py), oldest segment first."""

    __slots__ = ("offset", "_fds", "_parents", "writes", "written")

    def __init__(self, offset: int, fds: list[int], parents: Sequence[Path] = (),
                 writes: Sequence[WriteJob] = ()) -> None:
        self.offset = offset
        self._fds = fds
        self._parents = parents
        self.writes = writes
        self.written = 0  # how many of `writes` are done (a failure stops part way)

    def run(self) -> None:
        for job in self.writes:
            job.run()
            self.written += 1
        for fd in self._fds:
            probes.fdatasync(fd)  # os.fdatasync, unless a failure probe is set
        for directory in self._parents:
            fsync_directory(directory)

    def __repr__(self) -> str:
        return f"FlushTicket(offset={self.offset}, fds={len(self._fds)})"


class FlushAccounting:
    """How a flush ticket moves `flushed_offset`, shared by DiskLog and MemoryLog.

    A ticket promises everything below its offset; a truncate while it was out caps that
    promise at the truncation point (the bytes above were cut before they were synced).
    """

    _ticket: FlushTicket | None
    _ticket_segments: set[Segment]
    _truncated_to: int | None
    flushed_offset: int
    written_offset: int
    next_offset: int

    def flush_prepare(self) -> FlushTicket | None:
        raise NotImplementedError

    def _check_offsets(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _writes_done(ticket: FlushTicket) -> None:
        """The ticket is back: its segments' writers learn what reached their files."""
        for job in ticket.writes[:ticket.written]:
            job.writer.wrote(job)

    def flush_complete(self, ticket: FlushTicket) -> None:
        assert ticket is self._ticket, (ticket, self._ticket)
        self._writes_done(ticket)
        self._ticket = None
        self._ticket_segments = set()
        durable = ticket.offset
        if self._truncated_to is not None:
            durable = min(durable, self._truncated_to)
        self.flushed_offset = max(self.flushed_offset, min(durable, self.written_offset))
        self._check_offsets()

    def flush_failed(self, ticket: FlushTicket) -> None:
        """The ticket's run raised: cut the log back to `flushed_offset` (storage/log.py's
        module docstring). Raises OSError if even the cut fails: the files cannot be trusted."""
        assert ticket is self._ticket, (ticket, self._ticket)
        self._writes_done(ticket)
        self._ticket = None
        self._ticket_failed()
        self._truncated_to = None
        self.truncate(self.flushed_offset)

    def flush_abandoned(self, ticket: FlushTicket) -> None:
        """The ticket's run raised, and the log is not to be cut back: the first ticket after
        open, whose flushed offset is only the log start (storage/log.py `_recovery_unsynced`),
        or one whose failure stops the log's owner. Nothing moves; the caller takes the log
        offline (or tries again), and the next open recovers it."""
        assert ticket is self._ticket, (ticket, self._ticket)
        self._writes_done(ticket)
        self._ticket = None
        self._ticket_failed()
        self._truncated_to = None

    def _ticket_failed(self) -> None:
        """Whatever the failed ticket was to sync is to be synced by the next one."""
        self._ticket_segments = set()

    def truncate(self, offset: int) -> None:
        raise NotImplementedError

    def _cap_flushed(self) -> None:
        """The log was cut to next_offset: nothing above it is flushed, nor will a flush
        ticket out make it so."""
        self.flushed_offset = min(self.flushed_offset, self.next_offset)
        if self._ticket is not None:
            floor = self._truncated_to if self._truncated_to is not None else self.next_offset
            self._truncated_to = min(floor, self.next_offset)
        self._check_offsets()

    def flush(self) -> None:
        """prepare + run + complete inline (tests, shutdown); a failure cuts the log back,
        as `flush_failed` does, and raises."""
        ticket = self.flush_prepare()
        if ticket is not None:
            try:
                ticket.run()
            except OSError:
                self.flush_failed(ticket)
                raise
            self.flush_complete(ticket)
