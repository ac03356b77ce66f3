"""Every Raft group's term and vote on one shard, in one file, written at most once a loop turn.

Raft's one rule about the disk before the network (DESIGN.md §7): a node's term and vote are
durable before any vote or append answer that depends on them leaves it, or a node that
crashed and came back could vote twice in one term. The Raft machines (actors/raft/) hand their
changes out in `Ready.hard_state`; the partitions of a shard save them here, and send that
Ready's messages only from `then`:

    loop turn n     group a: save(a, (5, n2), then_a)     pending {a, b}, waiting [then_a, then_b]
                    group b: save(b, (7, None), then_b)
    end of turn     one write: the whole table, temp file, fsync, rename, fsync of the dir
                    (I/O pool)
    written         then_a(None), then_b(None)  -> each partition sends its messages

One write covers every group that changed in the turn, and every group that changes while a
write is out rides the next one: an election storm over a thousand partitions costs a few
atomic writes, not a thousand. Writes go one at a time, in order, so an older table never
lands after a newer one. The file holds the whole table (msgpack `{group: [term, vote]}`):
terms and votes change on elections, not on appends, so rewriting it is cheap, and a crash at
any moment leaves the old file or the new one, never a mix (storage/metadata_file.py).

A write that fails (a full or failing disk) answers its waiters with the error and keeps their
groups pending, so the next save or `retry()` writes them again. The caller must not send what
waited on it; Raft takes lost messages in its stride.

Votes are node ids: any msgpack value; lists read back as tuples (a replica is `(node,
shard)`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from actors.raft import HardState
from storage.metadata_file import write_atomic_at

__all__ = ["FILE_NAME", "HardStateStore", "load_hard_states"]

log = logging.getLogger(__name__)

FILE_NAME = "raft-hard-state"

Then = Callable[[BaseException | None], None]
# The I/O pool's `run(fn, done)`: fn on a worker thread, done(result, error) on the loop.
RunIo = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]


def _vote_from_wire(vote: Any) -> Any:
    return tuple(vote) if isinstance(vote, list) else vote


def load_hard_states(directory: str | Path) -> dict[str, HardState]:
    """The table last written in `directory` (empty if none was). A leftover temp file from a
    write that a crash cut short is ignored: the rename never happened."""
    try:
        with open(Path(directory) / FILE_NAME, "rb") as f:
            raw = msgpack.unpackb(f.read(), raw=False)
    except FileNotFoundError:
        return {}
    return {group: HardState(term, _vote_from_wire(vote)) for group, (term, vote) in raw.items()}


class HardStateStore:
    """The shard's table of hard states: `save` in a loop turn, `then` once it is durable.

    `run_io` is the shard's I/O pool (`IoPool.run`), `schedule` the loop's `call_soon`: the
    write of a turn starts after every group of that turn has saved."""

    def __init__(
        self,
        directory: str | Path,
        run_io: RunIo,
        schedule: Callable[[Callable[[], None]], Any],
    ) -> None:
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._run_io = run_io
        self._schedule = schedule
        self._states: dict[str, HardState] = load_hard_states(self._directory)
        self._pending: set[str] = set()  # changed since the write out started (or the last)
        self._waiting: list[Then] = []  # answered by the next write to complete
        self._writing: list[Then] | None = None  # answered by the write out, if one is
        self._scheduled = False
        self.writes = 0  # completed writes, for tests and stats

    def get(self, group: str) -> HardState | None:
        return self._states.get(group)

    @property
    def pending(self) -> bool:
        return bool(self._pending) or self._writing is not None

    def save(self, group: str, state: HardState, then: Then) -> None:
        """Make `state` the group's durable term and vote; `then(None)` once a write that
        holds it completed, `then(error)` if that write failed."""
        self._states[group] = state
        self._pending.add(group)
        self._waiting.append(then)
        self._start_soon()

    def forget(self, group: str, then: Then) -> None:
        """A group gone (its partition deleted here): dropped from the next write."""
        if self._states.pop(group, None) is None:
            then(None)
            return
        self._pending.add(group)
        self._waiting.append(then)
        self._start_soon()

    def retry(self) -> None:
        """Write again what a failed write left pending."""
        if self._pending:
            self._start_soon()

    def _start_soon(self) -> None:
        if not self._scheduled and self._writing is None:
            self._scheduled = True
            self._schedule(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._writing is not None or not self._pending:
            return
        self._writing, self._waiting = self._waiting, []
        written = self._pending
        self._pending = set()
        data = msgpack.packb({g: [s.term, s.vote] for g, s in self._states.items()},
                             use_bin_type=True)
        directory = self._directory

        def write() -> None:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                write_atomic_at(dir_fd, FILE_NAME, data)
            finally:
                os.close(dir_fd)

        def done(_result: Any, error: BaseException | None) -> None:
            waiting, self._writing = self._writing or [], None
            if error is None:
                self.writes += 1
            else:
                log.error("raft hard state not written in %s: %s", directory, error)
                self._pending |= written  # still not durable: the next write carries them
            for then in waiting:
                then(error)
            if self._pending and self._waiting:
                self._start_soon()

        self._run_io(write, done)
