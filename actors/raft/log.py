"""The machine's view of the partition log: offsets and terms, never bytes (an epoch cache).

The partition log is the Raft log, and a batch's `partitionLeaderEpoch` is its term, so the
machine keeps only what Raft's rules read: where the log starts and ends, how far it is
synced, and the offset at which each term begins (terms only grow along a log). That is one
entry per term change, not per batch:

    offset    ...  9 | 10 11 12 13 14 15 16 17
    term           1 |  1  1  1  3  3  3  4  4      log_start = 10, last_offset = 17
    runs   [(9, 1), (13, 3), (16, 4)]               the first run covers log_start - 1,
                                                    whose term anchors a MsgApp at prev 9

`term_at(o)` is a bisection over the runs, defined for `log_start - 1 <= o <= last_offset`.
Appends add a run when the term changes, `truncate_after` drops runs, `set_log_start`
(retention) drops the runs wholly below the new start, `restart` (a follower installing the
leader's log start) keeps one run.

`flushed_offset` is how far the log is durable: `flushed_offset <= last_offset`, lowered by a
truncation, raised only by `mark_flushed(offset, term)` when the entry at `offset` still has
`term` (a sync that raced a truncation proves nothing about the entries written since).
After `restart` it is -1: not even the new start is durable until reported.

Memberships (quorum.py) ride the log the same way: a configuration change is an entry of its
own (one batch at one offset), in force from the moment it is appended (the rule of Raft's
dissertation; etcd applies a change once it is committed, and the machine borrows that for
who may stand for election, `promotable`), gone again if a truncation removes it. The view keeps
the membership in force at `log_start - 1` (from before the log start: the configuration
the log was started with, or that an install carried) and each change since:

    confs  [(9, {1,2,3}), (14, {1,2,3,4}&&{1,2,3}), (15, {1,2,3,4})]

`membership` is the last one, `membership_at(o)` a bisection; `truncate_after` drops changes
past the cut, `set_log_start` keeps the last change below the new start as the anchor.

Conflict hints (etcd's findConflictByTerm): `find_conflict_by_term(o, t)` is the largest
offset <= o whose term is <= t. A follower rejecting prev (o, t) answers it; the leader turns
the hint back into its own log (`probe_hint`), so one round trip skips a whole divergent
term. Offsets a leader sends from must end its own batches: it knows no batch boundaries but
term changes, the log start, its last offset and what followers acknowledged, and the hint
is kept on one of those.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from actors.raft.messages import LogState, Range
from actors.raft.quorum import Membership

__all__ = ["LogView"]


class LogView:
    """Offsets and the epoch cache of one replica's log (see the module docstring)."""

    __slots__ = ("_starts", "_terms", "_conf_offsets", "_confs", "log_start", "last_offset",
                 "flushed_offset")

    def __init__(self, state: LogState | None = None,
                 membership: Membership | None = None) -> None:
        """`membership`: the one in force before any change in `state`'s log (a log that
        carries its own anchor, `state.confs`, does not need it)."""
        state = state or LogState(0, 0, (), -1)
        confs = list(state.confs)
        if not confs or confs[0][0] >= state.log_start:  # no anchor: `membership` is
            confs.insert(0, (state.log_start - 1, membership))
        anchor, first = confs[0]
        assert first is not None and anchor <= state.log_start - 1, state
        self._conf_offsets = [state.log_start - 1]
        self._confs: list[Membership] = [first]
        for offset, conf in confs[1:]:
            assert offset <= state.last_offset, (offset, state)
            if offset <= state.log_start - 1:
                self._confs[-1] = conf  # before the start: the anchor's
            else:
                assert self._conf_offsets[-1] < offset, (offset, state)
                self._conf_offsets.append(offset)
                self._confs.append(conf)
        self.log_start = state.log_start
        self.last_offset = state.last_offset
        self._starts = [state.log_start - 1]
        self._terms = [state.prev_term]
        for start, term in state.runs:
            assert state.log_start <= start <= state.last_offset, (start, state)
            assert start > self._starts[-1] and term >= self._terms[-1], (start, term, state)
            if term > self._terms[-1]:
                self._starts.append(start)
                self._terms.append(term)
        assert self.last_offset >= self.log_start - 1, state
        self.flushed_offset = self.last_offset  # a restarting machine's log was synced

    # ------------------------------------------------------------------------ reading

    @property
    def last_term(self) -> int:
        return self._terms[-1]

    def term_at(self, offset: int) -> int | None:
        """The term of the entry at `offset`; None where the log does not know it (before
        `log_start - 1` or after `last_offset`)."""
        if offset > self.last_offset or offset < self.log_start - 1:
            return None
        if offset >= self._starts[-1]:
            return self._terms[-1]
        return self._terms[bisect_right(self._starts, offset) - 1]

    def is_up_to_date(self, last_offset: int, last_term: int) -> bool:
        """Whether a log ending at (last_offset, last_term) is at least as up to date as this
        one (Raft §5.4.1: the later last term wins, then the longer log)."""
        mine = self._terms[-1]
        return last_term > mine or (last_term == mine and last_offset >= self.last_offset)

    def last_run(self) -> tuple[int, int]:
        """(start offset, term) of the log's last term."""
        return self._starts[-1], self._terms[-1]

    def runs(self) -> list[tuple[int, int]]:
        """(start offset, term) of each term in the log, the first covering log_start - 1."""
        return list(zip(self._starts, self._terms, strict=True))

    def state(self) -> LogState:
        runs = tuple((s, t) for s, t in zip(self._starts, self._terms, strict=True)
                     if s >= self.log_start)
        return LogState(self.log_start, self.term_at(self.log_start - 1) or 0, runs,
                        self.last_offset, self.confs())

    # ------------------------------------------------------------------------ memberships

    @property
    def membership(self) -> Membership:
        """The membership in force: the last change the log holds, else its anchor's."""
        return self._confs[-1]

    def membership_at(self, offset: int) -> Membership:
        """The membership in force at `offset` (from `log_start - 1` on)."""
        return self._confs[max(bisect_right(self._conf_offsets, offset) - 1, 0)]

    def last_conf_offset(self) -> int:
        """The offset of the last change the log holds; `log_start - 1` if none."""
        return self._conf_offsets[-1]

    def confs(self) -> tuple[tuple[int, Membership], ...]:
        """(offset, membership): the anchor (at log_start - 1), then each change."""
        return tuple(zip(self._conf_offsets, self._confs, strict=True))

    def confs_in(self, first: int, last: int) -> tuple[tuple[int, Membership], ...]:
        """The changes at offsets `first..last`."""
        i = bisect_right(self._conf_offsets, first - 1)
        out = []
        while i < len(self._conf_offsets) and self._conf_offsets[i] <= last:
            if i > 0:  # never the anchor
                out.append((self._conf_offsets[i], self._confs[i]))
            i += 1
        return tuple(out)

    def add_conf(self, offset: int, membership: Membership) -> None:
        """A configuration change appended at `offset` (already in the log's offsets)."""
        assert self._conf_offsets[-1] < offset <= self.last_offset, (offset, self)
        self._conf_offsets.append(offset)
        self._confs.append(membership)

    def ranges(self, first: int, last: int) -> tuple[Range, ...]:
        """The log's offsets `first..last` as one Range per term."""
        assert self.log_start <= first and last <= self.last_offset, (first, last)
        if first > last:
            return ()
        if first >= self._starts[-1]:  # the common case: all in the last term
            return (Range(first, last, self._terms[-1]),)
        out = []
        i = bisect_right(self._starts, first) - 1
        while first <= last:
            end = self._starts[i + 1] - 1 if i + 1 < len(self._starts) else self.last_offset
            end = min(end, last)
            out.append(Range(first, end, self._terms[i]))
            first = end + 1
            i += 1
        return tuple(out)

    def _run_end(self, i: int) -> int:
        return self._starts[i + 1] - 1 if i + 1 < len(self._starts) else self.last_offset

    def find_conflict_by_term(self, offset: int, term: int) -> tuple[int, int]:
        """The largest offset <= `offset` (clipped to the log's end) whose term is <= `term`,
        with that term. Below what the log knows: (that offset, 0), "unknown"."""
        offset = min(offset, self.last_offset)
        if offset < self.log_start - 1:
            return offset, 0
        i = bisect_right(self._starts, offset) - 1
        while i >= 0:
            if self._terms[i] <= term:
                return min(offset, self._run_end(i)), self._terms[i]
            i -= 1
        return self.log_start - 2, 0

    def probe_hint(self, offset: int, term: int) -> int:
        """Where a leader probes next after a follower's rejection hint (offset, term): the
        largest offset of ours <= `offset` with a term <= `term` (find_conflict_by_term),
        kept on a batch end of ours. The follower's offset ends one of its batches; when our
        entry there has the same term it is the same entry, so it ends one of ours too; when
        ours is of an older term, it may be inside a batch of ours: fall back to the end of
        our previous term (or the anchor before the log start)."""
        found, found_term = self.find_conflict_by_term(offset, term)
        if found == offset and found_term < term and found >= self.log_start:
            i = bisect_right(self._starts, found) - 1
            found = max(self._starts[i] - 1, self.log_start - 1)
        return found

    def first_mismatch(self, r: Range) -> int | None:
        """The first offset of `r` this log does not hold with `r.term`; None if it holds all
        of `r`. Log matching makes one term lookup enough: the same (offset, term) means the
        same batches up to there, so a run of `r.term` here matches `r` as far as it goes."""
        if r.base > self.last_offset:
            return r.base
        if r.base < self.log_start:
            assert r.last < self.log_start, (r, self.log_start)  # callers trim at the start
            return None
        if self.term_at(r.base) != r.term:
            return r.base
        i = bisect_right(self._starts, r.base) - 1
        end = self._run_end(i)
        return None if end >= r.last else end + 1

    # ------------------------------------------------------------------------ writing

    def append(self, r: Range) -> None:
        assert r.base == self.last_offset + 1 and r.last >= r.base, (r, self.last_offset)
        assert r.term >= self._terms[-1], (r, self._terms[-1])
        if r.term > self._terms[-1]:
            self._starts.append(r.base)
            self._terms.append(r.term)
        self.last_offset = r.last

    def truncate_after(self, offset: int) -> None:
        assert self.log_start - 1 <= offset <= self.last_offset, (offset, self.last_offset)
        while self._starts[-1] > offset:
            self._starts.pop()
            self._terms.pop()
        while self._conf_offsets[-1] > offset:
            self._conf_offsets.pop()
            self._confs.pop()
        self.last_offset = offset
        self.flushed_offset = min(self.flushed_offset, offset)

    def restart(self, log_start: int, prev_term: int,
                membership: Membership | None = None) -> None:
        """Empty again, at `log_start`: an install, which carries the membership in force
        there (None: the one in force now)."""
        self._starts = [log_start - 1]
        self._terms = [prev_term]
        self._conf_offsets = [log_start - 1]
        self._confs = [membership or self._confs[-1]]
        self.log_start = log_start
        self.last_offset = log_start - 1
        self.flushed_offset = -1

    def set_log_start(self, offset: int) -> None:
        """Retention or DeleteRecords moved the log start: entries below `offset` are gone."""
        assert self.log_start <= offset <= self.last_offset + 1, (offset, self.log_start)
        while len(self._starts) > 1 and self._starts[1] <= offset - 1:
            del self._starts[0], self._terms[0]
        while len(self._conf_offsets) > 1 and self._conf_offsets[1] <= offset - 1:
            del self._conf_offsets[0], self._confs[0]
        self._conf_offsets[0] = offset - 1
        self.log_start = offset

    def mark_flushed(self, offset: int, term: int) -> bool:
        """The orchestrator synced its log up to `offset`, whose entry had `term` when the
        sync began. Taken only if that entry is still there with that term."""
        if offset <= self.flushed_offset or self.term_at(offset) != term:
            return False
        self.flushed_offset = offset
        return True

    def iter_ranges(self) -> Iterator[Range]:
        """The whole log (from log_start) as one Range per term."""
        yield from self.ranges(self.log_start, self.last_offset)
