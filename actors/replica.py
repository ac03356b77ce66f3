"""One partition's Raft group, seen from the partition that hosts a replica of it: the I/O
its pure machine (actors/raft/) asks for, done in the order Raft needs (DESIGN.md §7).

The `Partition` actor keeps its log and its ack window; a `Replica` sits beside them (as
actors/log_lifecycle.py does) and is driven by the partition's messages. Inputs go to the
machine at once; what the machine asks in return is taken once a loop turn, as one Ready, so
the appends of every produce of a turn leave for each follower as one message:

    tick(lost)        the shard's Raft ticker           machine.tick() (wake() first if
                                                        quiet and out of touch)
    receive(m)        a peer's message (shards/calls)   machine.step(m)
    propose(n)        the leader appended n offsets     machine.propose(n) -> its range
    flushed(o, t)     an fdatasync covered o (term t)   machine.flushed(o, t)
    unreachable(p)    the transport gave up on p        machine.report_unreachable(p)
          |
    end of turn: while machine.has_ready(): rd = machine.ready()
          1. rd.log_writes, in order, on the log now: a follower's batches (append_replicated),
             a divergent tail cut (truncate_to), a restart at the leader's log start (reset),
             the leader's log start taken (`host.advance_log_start`), a new leader's
             LEADER_CHANGE control batch. The host is told what to flush (`host.appended`);
             a flush's end comes back as `flushed`.
          2. rd.hard_state: saved in the shard's table (actors/hard_state.py).
          3. rd.messages: sent only once every hard state saved so far is durable (persist
             before send); an append to a follower carries its batches' bytes, read from the
             log (the leader's own appends: still in the page cache).
          4. rd.committed: the high watermark, committed + 1 (`host.committed`).
          5. rd.soft_state: who leads now (`host.role_changed`).
          machine.advance()

An append's bytes are read from the log with `nowait`, as fetches are: near the log's end (a
follower keeping up) they are in the page cache; a follower far behind makes the leader read
cold ranges, which the shard's read pool brings in first (storage/page_cache.py), the loop
never waiting on the disk. (The machine's batch reader, `log_batch_reader`, reads batch
headers of the same ranges just before: a header read of a cold range can still wait.)

A cut (truncate or reset) must be durable before the log takes another append
(storage/replica.py): its ticket runs on the I/O pool, and the log writes behind it wait in
order until it has. Messages never wait for log writes: the machine only ever acknowledges
what `flushed` reported.
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from actors import limits
from actors.hard_state import HardStateStore
from actors.raft import (
    LEADER_CHANGE,
    AdvanceStart,
    Append,
    InstallStart,
    LogWrite,
    Message,
    MsgType,
    RaftMachine,
    Role,
    SoftState,
    TruncateAfter,
)
from storage.log import Log
from storage.page_cache import NotCached, warm
from storage.replica import CutTicket
from wire.record_batch import BatchHeader, iter_batches
from wire.records import build_batch

__all__ = ["Replica", "ReplicaHost", "leader_change_batch", "log_batch_reader", "read_range"]

log = logging.getLogger(__name__)

# Kafka's control record types (ControlRecordType): 2 is LEADER_CHANGE, as KRaft writes.
_CONTROL_KEY = struct.Struct(">hh")
LEADER_CHANGE_TYPE = 2


def leader_change_batch(leader: int, voters: list[int], timestamp_ms: int) -> bytearray:
    """A one-record control batch: key (version 0, LEADER_CHANGE), value Kafka's
    LeaderChangeMessage v0 (flexible: compact arrays, empty tagged fields). Every client skips
    control batches; the offset it takes is what lets a new leader commit its predecessor's
    tail (actors/raft/machine.py)."""
    def voter_array(ids: list[int]) -> bytes:
        return bytes([len(ids) + 1]) + b"".join(struct.pack(">i", i) + b"\0" for i in ids)

    value = (struct.pack(">hi", 0, leader) + voter_array(voters) + voter_array([leader])
             + b"\0")
    return build_batch([(_CONTROL_KEY.pack(0, LEADER_CHANGE_TYPE), value, [])], control=True,
                       base_timestamp=timestamp_ms)


def log_batch_reader(log_: Log) -> Callable[[int, int, int], tuple[int, int]]:
    """The machine's BatchReader over a log: the last offset of the longest run of whole
    batches from `first` that ends at or before `last` and fits `bytes_max` (at least one
    batch), and its size. (Batch headers are read from the segments: near the log's end,
    where followers are, they are in the page cache.)"""
    def read(first: int, last: int, bytes_max: int) -> tuple[int, int]:
        end, size = first - 1, 0
        for header in log_.iter_batch_headers(first):
            if header.last_offset > last or (size and size + header.size > bytes_max):
                break
            size += header.size
            end = header.last_offset
        return end, size

    return read


def read_range(log_: Log, first: int, last: int, nowait: bool = False) -> bytes:
    """The bytes of the whole batches `first..last` (a read stops at a segment's end, so
    one read per segment the range spans). With `nowait`, NotCached (storage/page_cache.py)
    when a part is not in the page cache."""
    parts: list[bytes] = []
    offset = first
    while offset <= last:
        data = log_.read_bytes(offset, 1 << 62, last + 1, nowait)
        if not data:
            break
        parts.append(data)
        offset = iter_batches(bytearray(data), check_crc=False)[-1].last_offset + 1
    return b"".join(parts)


class ReplicaHost(Protocol):
    """What a Replica asks of the partition hosting it."""

    def replica_log(self) -> Log: ...
    def appended(self, last_offset: int, headers: list[BatchHeader],
                 data: bytes | bytearray | memoryview) -> None:
        """A follower's batches `headers` (or the leader's no-op) were written up to
        `last_offset`: flush them (the partition's flush path reports back with
        `Replica.flushed`). `data` holds them, at their headers' positions (a transaction
        marker's type is in its record)."""
    def log_rewritten(self) -> None:
        """A cut or a reset changed what the log holds: rebuild what was derived from it
        (producer state, the ack window's written offset)."""
    def advance_log_start(self, offset: int) -> None:
        """The leader's log start came with its appends: move ours up to `offset` (a
        follower's, within its log), as DeleteRecords does, and make it durable."""
    def cut_complete(self) -> None:
        """A cut is durable and the writes behind it are in the log: flush what waits."""
    def committed(self, high_watermark: int) -> None: ...
    def role_changed(self, soft: SoftState, term: int) -> None: ...
    def send(self, messages: list[Message]) -> None: ...
    def run_io(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
               ) -> None: ...
    def read_io(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
                ) -> None:
        """Run `fn` on the shard's read pool (cold reads), `done` back on the loop."""
    def now_ms(self) -> int: ...
    def leader_change_ids(self) -> tuple[int, list[int]]:
        """This node's id and the replicas' node ids, for a LEADER_CHANGE record."""


class Replica:
    def __init__(
        self,
        group: str,
        machine: RaftMachine,
        host: ReplicaHost,
        store: HardStateStore,
        schedule: Callable[[Callable[[], None]], Any],
    ) -> None:
        self.group = group
        self.machine = machine
        self._host = host
        self._store = store
        self._schedule = schedule
        self._scheduled = False
        self._saving = 0  # hard-state saves not yet durable
        self._held: list[Message] = []  # messages waiting for those saves
        self._writes: collections.deque[LogWrite] = collections.deque()  # behind a cut
        self._cutting = False
        self.closed = False

    # Inputs -----------------------------------------------------------------------------

    def tick(self, lost: AbstractSet[Any] = frozenset()) -> None:
        """`lost`: the peers the host has not heard from for an election timeout. A quiesced
        machine is woken when its leader, or (leading) a quorum of its followers, is among
        them (actors/raft/machine.py, quiescence)."""
        machine = self.machine
        if machine.quiesced:
            if not lost:
                return
            if machine.role == Role.Leader:
                if 1 + sum(p not in lost for p in machine.peers) >= machine.quorum:
                    return
            elif machine.leader is not None and machine.leader not in lost:
                return
            machine.wake(lost_touch=True)
        machine.tick()
        if machine.has_ready():  # most ticks of most groups ask nothing
            self._soon()

    def receive(self, message: Message) -> None:
        self.machine.step(message)
        self._soon()

    def before_append(self) -> None:
        """The leader is about to append a produce: first write what the machine already
        placed in the log (a new leader's no-op), so the produce takes the next offset."""
        if self.machine.has_ready():
            self._process()

    def propose(self, records: int) -> Any:
        """The leader appended `records` offsets to its log (before this call); their range,
        or None if this replica may not append (not the leader, a transfer under way)."""
        proposed = self.machine.propose(records)
        if proposed is not None:
            self._soon()
        return proposed

    def flushed(self, offset: int, term: int) -> None:
        self.machine.flushed(offset, term)
        self._soon()

    def campaign(self) -> None:
        """Ask for votes now (a preferred leader starting), not after an election timeout."""
        self.machine.campaign()
        self._soon()

    def unreachable(self, peer: Any) -> None:
        self.machine.report_unreachable(peer)
        self._soon()

    def transfer_leadership(self, to: Any) -> None:
        self.machine.transfer_leader(to)
        self._soon()

    def close(self) -> None:
        self.closed = True

    # The Ready, once a loop turn ------------------------------------------------------------

    def _soon(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self._schedule(self._process)

    def _process(self) -> None:
        self._scheduled = False
        machine = self.machine
        while not self.closed and machine.has_ready():
            rd = machine.ready()
            for write in rd.log_writes:
                self._log_write(write)
            if rd.hard_state is not None:
                self._saving += 1
                self._store.save(self.group, rd.hard_state, self._saved)
            if rd.messages:
                self._send(list(rd.messages))
            if rd.committed is not None:
                self._host.committed(rd.committed + 1)
            if rd.soft_state is not None:
                self._host.role_changed(rd.soft_state, machine.term)
            machine.advance()

    def _saved(self, error: BaseException | None) -> None:
        self._saving -= 1
        if error is not None:
            # Not durable: what waited on it must not leave (Raft takes lost messages).
            log.error("%s: term and vote not saved (%s): %d messages dropped", self.group,
                      error, len(self._held))
            self._held.clear()
            self._store.retry()
            return
        if self._saving == 0 and self._held:
            held, self._held = self._held, []
            self._host.send(held)

    def _send(self, messages: list[Message], attempts: int = 0) -> None:
        nowait = attempts < limits.cold_read_attempts_max
        try:
            messages = [self._with_payload(m, nowait) for m in messages]
        except NotCached as miss:
            self._warm_and_send(miss, messages, attempts)
            return
        if self._saving:
            self._held.extend(messages)
        else:
            self._host.send(messages)

    def _with_payload(self, m: Message, nowait: bool) -> Message:
        """An append to a follower carries the bytes of its ranges, read from the log."""
        if m.type != MsgType.MsgApp or not m.ranges or m.payload is not None:
            return m
        data = read_range(self._host.replica_log(), m.ranges[0].base, m.ranges[-1].last,
                          nowait)
        return m._replace(payload=data)

    def _warm_and_send(self, miss: NotCached, messages: list[Message], attempts: int) -> None:
        """A follower far behind needs batches the page cache no longer has: the shard's read
        pool brings them in (the loop never waits on the disk), then this turn's messages
        leave, in their order. One that misses that many times reads from the disk."""
        def warmed(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.debug("%s: warming %s failed: %r", self.group, miss, error)
            if not self.closed:
                self._send(messages, attempts + 1)

        self._host.read_io(lambda: warm(miss.fd, miss.position, miss.length), warmed)

    # Log writes -------------------------------------------------------------------------

    def _log_write(self, write: LogWrite) -> None:
        if self._cutting:
            self._writes.append(write)
            return
        log_ = self._host.replica_log()
        if isinstance(write, Append):
            self._append(log_, write)
        elif isinstance(write, TruncateAfter):
            self._cut(log_.truncate_to(write.offset + 1))
        elif isinstance(write, InstallStart):
            self._cut(log_.reset(write.log_start, write.prev_term))
        elif isinstance(write, AdvanceStart):
            self._host.advance_log_start(write.offset)

    def _append(self, log_: Log, write: Append) -> None:
        host = self._host
        if write.payload is None:
            return  # the leader's own batch: written before it was proposed
        if write.payload is LEADER_CHANGE:
            me, voters = host.leader_change_ids()
            batch = leader_change_batch(me, voters, host.now_ms())
            headers = iter_batches(batch, check_crc=False)
            result = log_.append(batch, headers, write.ranges[0].term, host.now_ms())
            assert result.base_offset == write.ranges[0].base, (result, write)
            data = batch
        else:
            data = bytearray(write.payload)
            headers = iter_batches(data, check_crc=False)
            # The message's batches from the first the machine asks for (it names only what
            # continues our log: a retransmission's head is already here).
            start = max(write.ranges[0].base, log_.next_offset)
            headers = [h for h in headers if h.base_offset >= start]
            if not headers:
                return
            log_.append_replicated(data, headers, host.now_ms())
        host.appended(log_.next_offset - 1, headers, data)

    def _cut(self, ticket: CutTicket) -> None:
        self._cutting = True
        self._host.log_rewritten()

        def done(_result: Any, error: BaseException | None) -> None:
            if self.closed:
                return
            if error is not None:
                log.error("%s: a cut of the log was not made durable: %r", self.group, error)
                return  # the log refuses appends from here; the partition goes offline
            self._host.replica_log().cut_complete(ticket)
            self._cutting = False
            while self._writes and not self._cutting:
                self._log_write(self._writes.popleft())
            if not self._cutting:
                self._host.cut_complete()

        self._host.run_io(ticket.run, done)
