"""A model orchestrator for Raft machines: what the Partition actor will do, in memory.

Each `Node` holds a machine and a model log of batches (`written`: what the machine's writes
made of it, the page cache; `durable`: what the last completed sync saw). It handles a Ready
the way the contract says (hard state synced first, then the writes, then the messages with
the batches of their ranges attached), syncs in two steps (`flush_begin` captures what is
written, `flush_end` makes it durable and reports it), and stops two ways: a power loss
(`crash`: what is not durable is lost) or a kill -9 (`kill`: the page cache stays, the
process's memory goes); the machine restarts from what the log then holds and the hard
state. For the simulation it also holds the writes behind a cut until the cut is durable
(`defer_cuts`, as actors/replica.py does) and applies the committed log with the cluster
controller's loop (`Applier`). The script runner and the random simulation both drive nodes
through this module.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from typing import Any, NamedTuple

from actors.raft import (
    LEADER_CHANGE,
    AdvanceStart,
    Append,
    ConfChange,
    Config,
    HardState,
    InstallStart,
    LogState,
    LogWrite,
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


def conf_of(ident: Any) -> Any:
    """The membership a batch carries, if it is a membership change: its ident is
    (incarnation, ConfChange(membership)); None for any other batch."""
    if (isinstance(ident, tuple) and len(ident) == 2 and isinstance(ident[1], ConfChange)):
        return ident[1].membership
    return None


class ModelLog:
    """A log of whole batches starting at `start`; the entry before it had `prev_term`, and
    `start_conf` was the membership in force there (None: the group's Config's). A batch
    whose ident is (incarnation, `ConfChange`) is a membership change (`conf_of`)."""

    __slots__ = ("start", "prev_term", "batches", "bases", "start_conf")

    def __init__(self, start: int = 0, prev_term: int = 0,
                 batches: list[Batch] | None = None, start_conf: Any = None) -> None:
        self.start = start
        self.prev_term = prev_term
        self.batches = list(batches or [])
        self.bases = [b.base for b in self.batches]
        self.start_conf = start_conf

    def copy(self) -> ModelLog:
        return ModelLog(self.start, self.prev_term, self.batches, self.start_conf)

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

    def same(self, other: ModelLog) -> bool:
        return (self.start, self.prev_term, self.batches, self.start_conf) == (
            other.start, other.prev_term, other.batches, other.start_conf)

    def whole(self, first: int, last: int) -> tuple[Batch, ...] | None:
        """The batches `first..last` if the log holds them whole (an append's payload)."""
        if first < self.start or last > self.last_offset:
            return None
        i = self.index_of(first)
        j = self.index_of(last)
        if self.batches[i].base != first or self.batches[j].last != last:
            return None
        return tuple(self.batches[i:j + 1])

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
            for b in self.batches[:i]:
                if conf_of(b.ident) is not None:
                    self.start_conf = conf_of(b.ident)
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

    def confs(self) -> tuple[tuple[int, Any], ...]:
        anchor = ((self.start - 1, self.start_conf),) if self.start_conf is not None else ()
        return anchor + tuple((b.base, conf_of(b.ident)) for b in self.batches
                              if conf_of(b.ident) is not None)

    def state(self) -> LogState:
        return LogState(self.start, self.prev_term, self.runs(), self.last_offset, self.confs())


class Applier:
    """The controller's apply loop (actors/cluster_controller.py `_apply_to`): committed
    batches applied in log order, up to the last commit Raft reported (the target) as far as
    the log holds them, and again whenever the log grows (an append, the writes a cut held
    back): a commit can be reported before the batches it covers are in the log, for they
    wait behind a cut (actors/replica.py). Below the log start the state is taken as a
    snapshot's (the controller's log never moves its start; a partition's applies nothing).
    `fresh` gathers what was applied since the checker last looked."""

    reapply_on_write = True  # False: no apply when the log grows (before issue 26's item 6)

    def __init__(self, log_start: int) -> None:
        self.target = log_start - 1  # the last commit reported
        self.applied = log_start - 1  # the last offset applied
        self.fresh: list[Batch] = []

    def committed(self, commit: int, log: ModelLog) -> None:
        self.target = max(self.target, commit)
        self._apply(log)

    def wrote(self, log: ModelLog) -> None:
        if self.reapply_on_write:
            self._apply(log)

    def _apply(self, log: ModelLog) -> None:
        upto = min(self.target, log.last_offset)
        if self.applied >= upto:
            return
        self.applied = max(self.applied, log.start - 1)
        i = bisect_right(log.bases, self.applied)
        while self.applied < upto:
            b = log.batches[i]
            assert b.base == self.applied + 1 and b.last <= upto, (b, self.applied, upto)
            self.fresh.append(b)
            self.applied = b.last
            i += 1


class Node:
    """One replica: its machine, its model disk, its syncs in flight, its cut in flight and
    the writes waiting behind it, its apply loop.

    Three images of the log: `written`, what the log holds (the page cache); `durable`, what
    the last completed sync saw (and a completed cut left); `view`, what the log will hold
    once the writes waiting behind a cut are made or refused (the machine's view of it, but
    for a refused write until the machine is told). With `defer_cuts` (the simulation), a
    truncation or a reset is made in `written` at once and its ticket is out (`cut`) until
    `cut_end`: the writes behind it wait, as actors/replica.py holds them, and no sync
    begins. Without (the scripts), nothing waits."""

    def __init__(self, config: Config, seed: int, log: ModelLog | None = None,
                 hard_state: HardState | None = None, committed: int = -1,
                 use_reader: bool = True, defer_cuts: bool = False,
                 incarnation: int = 0) -> None:
        self.config = config
        self.id = config.id
        self.rng = random.Random(seed)
        self.use_reader = use_reader
        self.defer_cuts = defer_cuts
        self.incarnation = incarnation  # the topic id of the group this replica is of
        self.written = log.copy() if log else ModelLog()
        self.durable = self.written.copy()
        self.view = self.written  # the same object while nothing waits behind a cut
        self.durable_hard = hard_state or HardState(0, None)
        self.flushing: list[tuple[ModelLog, int, int]] = []  # (image, offset, term), in order
        self.cut: TruncateAfter | InstallStart | None = None  # its ticket is out
        self.behind_cut: list[LogWrite] = []
        self.lost = False  # a write was refused: the machine learns where the log ends
        self.up = True
        self.commit = committed
        self.applier = Applier(self.written.start)
        self.machine = self._new_machine(committed)

    def _new_machine(self, committed: int) -> RaftMachine:
        return RaftMachine(self.config, self.rng, hard_state=self.durable_hard,
                           log=self.written.state(), committed=committed,
                           batch_reader=self.read_batches if self.use_reader else None)

    def read_batches(self, first: int, last: int, bytes_max: int) -> tuple[int, int]:
        """The machine's BatchReader over the written log. Offsets it does not hold yet (a
        leader's writes waiting behind a cut) are named whole, unsized, as
        actors/replica.py `log_batch_reader` names them."""
        b = self.written.batch_at(first)
        if b is None or b.base != first:
            assert self.cut is not None, (self.id, first, self.written.state())
            return last, 0
        i = self.written.index_of(first)
        batches = self.written.batches
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
            self.ask(w, fail_appends)
        if rd.committed is not None:
            self.commit = rd.committed
        out = []
        for m in rd.messages:
            if m.type == MsgType.MsgApp and m.ranges:
                payload = self.written.whole(m.ranges[0].base, m.ranges[-1].last)
                if payload is None:
                    continue  # not in the log (yet): the follower is probed again
                m = m._replace(payload=payload)
            out.append(m)
        self.machine.advance()
        self._tell_lost()
        if rd.committed is not None:
            self.applier.committed(rd.committed, self.written)
        return out

    def ask(self, w: LogWrite, refuse: bool = False) -> None:
        """The machine asks for `w`: made now, or once the cut out is durable; refused (a
        disk error if `refuse`, or batches that do not continue the log or do not match
        the ranges, as actors/replica.py refuses them) if it is an append."""
        if isinstance(w, Append):
            if refuse or _batches(w, self.view, self.incarnation) is None:
                self.lost = True
                return
        elif isinstance(w, TruncateAfter) and w.offset >= self.view.last_offset:
            return  # the log ends there already: a write before it was refused
        if self.cut is not None:
            self.view = apply_write(self.view, w, self.incarnation)
            self.behind_cut.append(w)
            return
        self.written = self.view = apply_write(self.written, w, self.incarnation)
        if self.defer_cuts and isinstance(w, (TruncateAfter, InstallStart)):
            self.cut = w
            self.view = self.written.copy()
        elif isinstance(w, Append):
            self.applier.wrote(self.written)

    def cut_end(self) -> None:
        """The cut out is durable: what it removed stays removed, whatever a sync begun
        before it saw; the writes behind it are made, up to the next cut among them."""
        cut, self.cut = self.cut, None
        assert cut is not None
        self.durable = _cut_image(self.durable, cut)
        self.flushing = [(_cut_image(image, cut), o, t) for image, o, t in self.flushing]
        waiting, self.behind_cut = self.behind_cut, []
        for i, w in enumerate(waiting):
            self.written = apply_write(self.written, w, self.incarnation)
            if isinstance(w, (TruncateAfter, InstallStart)):
                self.cut = w
                self.behind_cut = waiting[i + 1:]
                break
        if self.cut is None:
            assert self.view.same(self.written), (self.id, self.view.state(),
                                                  self.written.state())
            self.view = self.written
        self.applier.wrote(self.written)
        self._tell_lost()

    def _tell_lost(self) -> None:
        """Once every write asked is made or refused, the machine learns where the log
        ends (RaftMachine.log_write_failed)."""
        if self.lost and self.cut is None:
            self.lost = False
            self.machine.log_write_failed(self.written.last_offset)

    # ------------------------------------------------------------------ syncs and crashes

    def unflushed(self) -> bool:
        if self.cut is not None:
            return False  # no sync begins while a cut is out (actors/cluster_controller.py)
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

    def _stop(self) -> None:
        self.up = False
        self.flushing.clear()
        self.cut = None
        self.behind_cut.clear()
        self.lost = False

    def kill(self) -> None:
        """kill -9: the process's memory goes (the machine, the writes behind a cut, what a
        sync in flight would have reported); the page cache keeps every write made."""
        self._stop()
        self.view = self.written

    def crash(self, torn: random.Random | None = None) -> str:
        """A power loss: what was synced stays. With `torn`, what else a power loss may
        leave: a prefix of the batches written since the last sync (the kernel wrote some
        back; recovery keeps the whole ones up to the first torn one), or, with a reset's
        cut out, the reset half made: an empty log at the new start whose epoch before it
        is unknown (storage/replica.py). What it left: "synced", "tail" or "half_reset"."""
        cut = self.cut
        self._stop()
        kept = self.durable.copy()
        left = "synced"
        if torn is not None:
            if isinstance(cut, InstallStart):
                if torn.random() < 0.5:
                    kept = ModelLog(cut.log_start, 0, start_conf=cut.membership)
                    left = "half_reset"
            elif cut is None:
                tail = _unsynced_tail(self.written, kept)
                for b in tail[:torn.randrange(len(tail) + 1)]:
                    kept.append(b)
                    left = "tail"
        self.durable = kept
        self.written = self.view = kept.copy()
        return left

    def recovery_sync(self) -> None:
        """What recovery kept is synced before the machine starts (actors/partition.py)."""
        self.durable = self.written.copy()

    def restart(self) -> None:
        """Start again from what the log holds (after a kill -9, the page cache: the caller
        syncs it first, as the recovery sync does, or the machine takes it as synced) and
        the hard state; the commit offset checkpoint is lost (the machine restarts knowing
        only the log start)."""
        assert not self.up
        self.up = True
        self.view = self.written
        self.commit = self.written.start - 1
        self.applier = Applier(self.written.start)
        self.machine = self._new_machine(self.commit)

    def check_view(self) -> None:
        """The machine's view of the log is the model's (a refused write not yet told)."""
        if self.lost:
            return
        view, w = self.machine.log, self.view
        assert (view.log_start, view.last_offset) == (w.start, w.last_offset), (
            self.id, view.state(), w.state())
        mine, model = view.state(), w.state()
        if w.start_conf is None:  # the anchor is the Config's
            mine = mine._replace(confs=mine.confs[1:])
        assert mine == model, (self.id, mine, model)


def apply_write(log: ModelLog, w: LogWrite, incarnation: int = 0) -> ModelLog:
    """`log` with `w` made on it (a new log for a reset); a leader's no-op is a batch of
    the group's `incarnation`."""
    if isinstance(w, TruncateAfter):
        log.truncate_after(w.offset)
    elif isinstance(w, InstallStart):
        return ModelLog(w.log_start, w.prev_term, start_conf=w.membership)
    elif isinstance(w, AdvanceStart):  # durable with the next sync (a checkpoint)
        offset = min(w.offset, log.last_offset + 1)  # within the log (actors/log_lifecycle.py)
        if offset > log.start:
            log.set_start(offset)
    else:
        batches = _batches(w, log, incarnation)
        assert batches is not None, (w, log.state())
        for b in batches:
            log.append(b)
    return log


def _batches(w: Append, log: ModelLog, incarnation: int) -> list[Batch] | None:
    """The batches an append writes on `log`; None when they do not continue it or do not
    match the ranges (actors/replica.py `_check_matches`: whole batches from the first
    range's base to the last range's end, each of its range's term)."""
    ranges = w.ranges
    if ranges[0].base != log.last_offset + 1:
        return None
    if not (isinstance(w.payload, tuple) and isinstance(w.payload[0], Batch)):
        # The leader's own proposal or no-op: one batch.
        (r,) = ranges
        if w.payload is LEADER_CHANGE:
            ident: Any = (incarnation, "LC", r.term)
        elif isinstance(w.payload, ConfChange):
            ident = (incarnation, w.payload)
        else:
            ident = w.payload
        return [Batch(r.base, r.last, r.term, ident)]
    batches = [b for b in w.payload if b.last >= ranges[0].base]  # a follower's: a MsgApp's
    if not batches or batches[0].base != ranges[0].base or batches[-1].last != ranges[-1].last:
        return None
    i = 0
    for b in batches:
        while ranges[i].last < b.base:
            i += 1
        if b.last > ranges[i].last or b.term != ranges[i].term:
            return None
    return batches


def _cut_image(image: ModelLog, cut: TruncateAfter | InstallStart) -> ModelLog:
    """What is left of an older image of the log once `cut` is durable."""
    if isinstance(cut, InstallStart):
        return ModelLog(cut.log_start, cut.prev_term, start_conf=cut.membership)
    if image.last_offset > cut.offset:
        image = image.copy()
        while image.batches and image.batches[-1].last > cut.offset:
            image.batches.pop()
            image.bases.pop()
    return image


def _unsynced_tail(written: ModelLog, durable: ModelLog) -> list[Batch]:
    """The batches `written` holds past the end of `durable`, if it continues it."""
    if durable.batches:
        if written.batch_at(durable.last_offset) != durable.batches[-1]:
            return []
    elif (written.start, written.prev_term) != (durable.start, durable.prev_term):
        return []
    i = bisect_right(written.bases, durable.last_offset)
    return written.batches[i:]


def make_config(node_id: int, n: int, learners: int = 0, **kw: Any) -> Config:
    """Nodes 1..n: the last `learners` of them learners, the others voters."""
    voters = n - learners
    return Config(node_id, tuple(range(1, voters + 1)),
                  learners=tuple(range(voters + 1, n + 1)), **kw)
