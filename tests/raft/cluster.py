"""A model orchestrator for Raft machines: what the Partition actor will do, in memory.

Each `Node` holds a machine and a model log of batches (`written`: what the machine's writes
made of it; `durable`: what the last completed sync saw). It handles a Ready the way the
contract says (hard state synced first, then the writes, then the messages with the batches
of their ranges attached), syncs in two steps (`flush_begin` captures what is written,
`flush_end` makes it durable and reports it), and crashes (everything not durable is lost,
the machine restarts from the durable log and hard state). The script runner and the random
simulation both drive nodes through this module.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from typing import Any, NamedTuple

from actors.raft import (
    LEADER_CHANGE,
    AdvanceStart,
    Append,
    Config,
    HardState,
    InstallStart,
    LogState,
    Message,
    MsgType,
    RaftMachine,
    Ready,
    TruncateAfter,
)

BATCH_RECORD_BYTES = 100  # a model batch's size: records x this


class Batch(NamedTuple):
    base: int
    last: int
    term: int
    ident: Any  # what was proposed ("p7"), or ("LC", term) for a leader's no-op


class ModelLog:
    """A log of whole batches starting at `start`; the entry before it had `prev_term`."""

    __slots__ = ("start", "prev_term", "batches", "bases")

    def __init__(self, start: int = 0, prev_term: int = 0,
                 batches: list[Batch] | None = None) -> None:
        self.start = start
        self.prev_term = prev_term
        self.batches = list(batches or [])
        self.bases = [b.base for b in self.batches]

    def copy(self) -> ModelLog:
        return ModelLog(self.start, self.prev_term, self.batches)

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last if self.batches else self.start - 1

    @property
    def last_term(self) -> int:
        return self.batches[-1].term if self.batches else self.prev_term

    def index_of(self, offset: int) -> int:
        """The position of the batch holding `offset` (which must be in the log)."""
        i = bisect_right(self.bases, offset) - 1
        assert i >= 0 and self.batches[i].last >= offset, (offset, self.batches[i:i + 1])
        return i

    def batch_at(self, offset: int) -> Batch | None:
        i = bisect_right(self.bases, offset) - 1
        if i < 0 or self.batches[i].last < offset:
            return None
        return self.batches[i]

    def term_at(self, offset: int) -> int | None:
        if offset == self.start - 1:
            return self.prev_term
        b = self.batch_at(offset)
        return b.term if b else None

    def between(self, first: int, last: int) -> tuple[Batch, ...]:
        i = self.index_of(first)
        assert self.batches[i].base == first, (first, self.batches[i])
        j = self.index_of(last)
        assert self.batches[j].last == last, (last, self.batches[j])
        return tuple(self.batches[i:j + 1])

    def append(self, b: Batch) -> None:
        assert b.base == self.last_offset + 1, (b, self.last_offset)
        self.batches.append(b)
        self.bases.append(b.base)

    def truncate_after(self, offset: int) -> None:
        i = bisect_right(self.bases, offset)
        assert i == 0 or self.batches[i - 1].last == offset or offset == self.start - 1, offset
        del self.batches[i:], self.bases[i:]

    def set_start(self, offset: int) -> None:
        """Drop the batches below `offset` (a batch boundary)."""
        i = bisect_right(self.bases, offset - 1)
        if i:
            assert self.batches[i - 1].last == offset - 1, (offset, self.batches[i - 1])
            self.prev_term = self.batches[i - 1].term
            del self.batches[:i], self.bases[:i]
        self.start = offset

    def retain_from(self, offset: int) -> None:
        """Retention as it reaches an older image of the log (a sync not yet complete, what
        is on disk): drop what is below `offset`, unless `offset` is no batch boundary there
        (a divergent tail since replaced: its deletion waits for the sync)."""
        if offset <= self.start:
            return
        offset = min(offset, self.last_offset + 1)
        b = self.batch_at(offset - 1)
        if b is None or b.last == offset - 1:
            self.set_start(offset)

    def runs(self) -> tuple[tuple[int, int], ...]:
        out: list[tuple[int, int]] = []
        term = self.prev_term
        for b in self.batches:
            if b.term != term:
                out.append((b.base, b.term))
                term = b.term
        return tuple(out)

    def state(self) -> LogState:
        return LogState(self.start, self.prev_term, self.runs(), self.last_offset)


class Node:
    """One replica: its machine, its model disk, its pending syncs."""

    def __init__(self, config: Config, seed: int, log: ModelLog | None = None,
                 hard_state: HardState | None = None, committed: int = -1,
                 use_reader: bool = True) -> None:
        self.config = config
        self.id = config.id
        self.rng = random.Random(seed)
        self.use_reader = use_reader
        self.written = log.copy() if log else ModelLog()
        self.durable = self.written.copy()
        self.durable_hard = hard_state or HardState(0, None)
        self.flushing: list[tuple[ModelLog, int, int]] = []  # (image, offset, term), in order
        self.up = True
        self.commit = committed
        self.machine = self._new_machine(committed)

    def _new_machine(self, committed: int) -> RaftMachine:
        return RaftMachine(self.config, self.rng, hard_state=self.durable_hard,
                           log=self.written.state(), committed=committed,
                           batch_reader=self.read_batches if self.use_reader else None)

    def read_batches(self, first: int, last: int, bytes_max: int) -> tuple[int, int]:
        """The machine's BatchReader over the written log."""
        i = self.written.index_of(first)
        batches = self.written.batches
        assert batches[i].base == first, (first, batches[i])
        size = 0
        end = first - 1
        while i < len(batches) and batches[i].last <= last:
            b = batches[i]
            b_size = (b.last - b.base + 1) * BATCH_RECORD_BYTES
            if size and size + b_size > bytes_max:
                break
            size += b_size
            end = b.last
            i += 1
        return end, size

    # ------------------------------------------------------------------ a Ready

    def handle_ready(self, rd: Ready, fail_appends: bool = False) -> list[Message]:
        """Do what `rd` asks (sync the hard state, write, attach payloads) and advance; the
        messages to send. `fail_appends`: the disk refuses the Ready's appends (nothing of
        them written; an append whose batches the log lacks is not sent), and the machine
        then learns where the log ends, as actors/replica.py tells it."""
        if rd.hard_state is not None:
            self.durable_hard = rd.hard_state  # written atomically and synced, first
        for w in rd.log_writes:
            if not fail_appends:
                self.apply_write(w)
            elif isinstance(w, TruncateAfter):
                if w.offset < self.written.last_offset:
                    self.apply_write(w)
            elif not isinstance(w, Append):
                self.apply_write(w)
        if rd.committed is not None:
            self.commit = rd.committed
        out = []
        for m in rd.messages:
            if m.type == MsgType.MsgApp and m.ranges:
                if m.ranges[-1].last > self.written.last_offset:
                    continue
                m = m._replace(payload=self.written.between(m.ranges[0].base,
                                                            m.ranges[-1].last))
            out.append(m)
        self.machine.advance()
        if fail_appends:
            self.machine.log_write_failed(self.written.last_offset)
        return out

    def apply_write(self, w: Append | TruncateAfter | InstallStart | AdvanceStart) -> None:
        log = self.written
        if isinstance(w, TruncateAfter):
            log.truncate_after(w.offset)
        elif isinstance(w, InstallStart):
            self.written = ModelLog(w.log_start, w.prev_term)
        elif isinstance(w, AdvanceStart):  # durable with the next sync (a checkpoint)
            log.set_start(w.offset)
        elif isinstance(w.payload, tuple):  # a follower's: the batches of a MsgApp
            first, last = w.ranges[0].base, w.ranges[-1].last
            batches = [b for b in w.payload if first <= b.base and b.last <= last]
            assert batches and batches[0].base == first and batches[-1].last == last, (w,)
            for b in batches:
                log.append(b)
        else:  # the leader's own proposal or no-op: one batch
            (r,) = w.ranges
            ident = ("LC", r.term) if w.payload is LEADER_CHANGE else w.payload
            log.append(Batch(r.base, r.last, r.term, ident))

    # ------------------------------------------------------------------ syncs and crashes

    def unflushed(self) -> bool:
        target = self.flushing[-1][0] if self.flushing else self.durable
        w = self.written
        return (target.start, target.last_offset, target.last_term) != (
            w.start, w.last_offset, w.last_term) or target.batches[-1:] != w.batches[-1:]

    def flush_begin(self, upto: int | None = None) -> tuple[int, int]:
        """Start a sync of what is written (up to `upto`, a batch end, if given)."""
        image = self.written.copy()
        if upto is not None:
            image.truncate_after(upto)
        item = (image, image.last_offset, image.last_term)
        self.flushing.append(item)
        return item[1], item[2]

    def flush_end(self) -> tuple[int, int]:
        image, offset, term = self.flushing.pop(0)
        self.durable = image
        self.machine.flushed(offset, term)
        return offset, term

    def flush(self, upto: int | None = None) -> tuple[int, int]:
        self.flush_begin(upto)
        while len(self.flushing) > 1:
            self.flush_end()
        return self.flush_end()

    def crash(self) -> None:
        self.up = False
        self.flushing.clear()
        self.written = self.durable.copy()

    def restart(self) -> None:
        """Start again from the durable log and hard state; the commit offset checkpoint is
        lost (the machine restarts knowing only the log start)."""
        assert not self.up
        self.up = True
        self.written = self.durable.copy()
        self.commit = self.written.start - 1
        self.machine = self._new_machine(self.commit)

    def check_view(self) -> None:
        """The machine's view of the log is the model log."""
        view, w = self.machine.log, self.written
        assert (view.log_start, view.last_offset) == (w.start, w.last_offset), (
            self.id, view.state(), w.state())
        assert view.state() == w.state(), (self.id, view.state(), w.state())


def make_config(node_id: int, n: int, **kw: Any) -> Config:
    return Config(node_id, tuple(range(1, n + 1)), **kw)
