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
          1. rd.hard_state: saved in the shard's table (actors/hard_state.py).
          2. rd.log_writes, in order, on the log now: a follower's batches (append_replicated),
             a divergent tail cut (truncate_to), a restart at the leader's log start (reset),
             the leader's log start taken (`host.advance_log_start`), a new leader's
             LEADER_CHANGE control batch, a membership change's control batch (its file
             first: actors/replica_memberships.py). The host is told what to flush
             (`host.appended`); a flush's end comes back as `flushed`.
          3. rd.messages: sent only once every hard state saved so far is durable (persist
             before send); an append to a follower carries its batches' bytes: the batches
             proposed since the last Ready from the produce's own bytes (a copy `propose`
             keeps until the Ready is taken), older ones read from the log.
          4. rd.committed: the high watermark, committed + 1 (`host.committed`).
          5. rd.soft_state: who leads now (`host.role_changed`).
          machine.advance(), whatever happened above

An append of older batches (a follower catching up, a retransmission) reads them from the
log with `nowait`, as fetches do: near the log's end they are in the page cache; a follower
far behind makes the leader read cold ranges, which the shard's read pool brings in first
(storage/page_cache.py), the loop never waiting on the disk. (The machine's batch reader,
`log_batch_reader`, reads batch headers of the same ranges just before: a header read of a
cold range can still wait.) An append whose batches the log does not hold whole, as its
ranges name them, is not sent (a new leader's no-op still waiting behind a cut): the
follower is probed again. Its first batch may start before its first offset: a follower
whose log start DeleteRecords put inside a batch (an install at the leader's start, which
may be anywhere) asks from there, and its empty log takes that batch whole, restarting at
its base offset, its start staying (storage/replica.py). Offsets between batches may be
missing: compaction drops emptied batches (storage/compaction.py). A follower writes an
empty batch in each such gap (Kafka's kind, that compaction keeps), so its own log goes on
batch after batch, as its segments must for recovery.

A cut (truncate or reset) must be durable before the log takes another append
(storage/replica.py): its ticket runs on the I/O pool, and the log writes behind it wait in
order until it has; so do they behind a write of the memberships file. While they wait the
log does not end where the machine's does, and a leader takes no produce (`writes_waiting`,
then `host.writes_resumed`). Messages never wait for log writes: the machine only ever acknowledges
what `flushed` reported. A cut that fails leaves the log's contents unknown: the replica
stops (no answers, no votes) until a restart recovers the log.

Term and vote before messages: every message waits while a hard state of the group is not
durable, a failed write of it too; it is saved again at the next tick, and the messages leave
once a write that holds it succeeded (at most `replica_held_messages_max` of them, the
oldest dropped).

A log write that cannot be made (a disk error; batches that do not continue the log or do
not match the ranges the machine named) is not retried here. The log stays a prefix of what
the machine believes, and once every write asked for is made or refused the machine learns
where it really ends (`log_write_failed`): a follower answers its leader with a rejection
that makes it probe back, a leader steps down. The machine is never left between `ready()`
and `advance()`.
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
    ConfChange,
    HardState,
    InstallStart,
    LogWrite,
    Membership,
    Message,
    MsgType,
    RaftMachine,
    Range,
    Ready,
    Role,
    SoftState,
    TruncateAfter,
)
from actors.replica_memberships import MEMBERSHIP_FILE, Confs, confs_to_file, membership_batch
from storage.log import Log, OffsetOutOfRange
from storage.page_cache import NotCached
from storage.replica import CutTicket, NotContiguous
from wire.record_batch import BatchHeader, iter_batches, read_header
from wire.records import build_batch, rebuild_batch

__all__ = ["Replica", "ReplicaHost", "leader_change_batch", "log_batch_reader", "read_append",
           "read_range"]

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
    where followers are, they are in the page cache.) Offsets the log does not hold yet (a
    new leader's writes still waiting behind a cut) are named whole, unsized, as the machine
    names a Ready's own writes."""
    def read(first: int, last: int, bytes_max: int) -> tuple[int, int]:
        end, size = first - 1, 0
        for header in log_.iter_batch_headers(first):
            if header.last_offset > last or (size and size + header.size > bytes_max):
                break
            size += header.size
            end = header.last_offset
        return (end, size) if end >= first else (last, 0)

    return read


def read_range(log_: Log, first: int, last: int, nowait: bool = False) -> bytes:
    """The bytes of the whole batches `first..last` (a read stops at a segment's end, so
    one read per segment the range spans). With `nowait`, NotCached (storage/page_cache.py)
    when a part is not in the page cache."""
    return _read_batches(log_, first, last, nowait)[0]


def read_append(log_: Log, first: int, last: int, nowait: bool = False) -> bytes | None:
    """The bytes of an append naming `first..last`, or None when the log does not hold them
    whole: the last batch must end at `last`. The first may start before `first`: a
    follower's log start that DeleteRecords put inside a batch (ours, or a former leader's
    that installed it there) is where it asks from, and it takes the batch holding it whole
    (`Replica._append`). The offsets between may be gaps that compaction left."""
    data, base, end = _read_batches(log_, first, last, nowait)
    return None if base is None or end != last + 1 else data


def _read_batches(log_: Log, first: int, last: int, nowait: bool) -> tuple[bytes, int | None,
                                                                            int]:
    """read_range's bytes, the first batch's base offset (None: no batch) and the offset
    after the last batch."""
    parts: list[bytes] = []
    base = None
    offset = first
    while offset <= last:
        data = log_.read_bytes(offset, 1 << 62, last + 1, nowait)
        if not data:
            break
        headers = iter_batches(data, check_crc=False)
        if base is None:
            base = headers[0].base_offset
        parts.append(data)
        offset = headers[-1].last_offset + 1
    return b"".join(parts), base, offset


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
    def writes_resumed(self) -> None:
        """Log writes that waited (behind a cut, a segment made ahead, the memberships file)
        go on: a leader's produces held meanwhile may go on too."""
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
        confs_saved: bool = True,
    ) -> None:
        """`confs_saved`: the memberships file says what the machine's log holds (False: it
        says more, and is written again before the next append)."""
        self.group = group
        self.machine = machine
        self._host = host
        self._store = store
        self._schedule = schedule
        self._scheduled = False
        # Term and vote: saves handed to the store, numbered; the last one a write completed
        # (writes complete in order, each holding every save before it).
        self._saves = 0
        self._durable = 0
        self._hard_state: HardState | None = None  # the last one handed to the store
        self._save_failed = False  # its write failed: saved again at the next tick
        self._held: collections.deque[Message] = collections.deque()  # waiting for _durable
        self._dropped = 0  # held messages dropped for the bound, this time
        # Behind a cut, or a segment made off the loop (`_roll_first`).
        self._writes: collections.deque[LogWrite] = collections.deque()
        self._cutting = False
        self._rolling = False
        # The memberships the log holds, the anchor first, and what the file says (None: not
        # that, written before the next append); `_saving`: a write of it is out
        # (actors/replica_memberships.py). No file: the group's first membership, its
        # Config's, is the anchor.
        self._confs: Confs = list(machine.log.confs())
        self._saved_confs: Confs | None = list(self._confs) if confs_saved else None
        self._saving = False
        self._lost = False  # a log write was not made: the machine is told where the log ends
        # The leader's batches proposed since its last Ready, (first, last, bytes): this
        # turn's appends to followers carry them without reading the log back.
        self._fresh: list[tuple[int, int, bytes]] = []
        self._write_failing = False  # for the log: said once until a write succeeds again
        self.closed = False

    # Inputs -----------------------------------------------------------------------------

    def tick(self, lost: AbstractSet[Any] = frozenset()) -> None:
        """`lost`: the peers the host has not heard from for an election timeout. A quiesced
        machine is woken when its leader, or (leading) a quorum of its followers, is among
        them (actors/raft/machine.py, quiescence)."""
        if self._save_failed and self._hard_state is not None:
            self._save_failed = False
            self._save(self._hard_state)
        machine = self.machine
        if machine.quiesced:
            if not lost:
                return
            if machine.role == Role.Leader:
                if machine.membership.active([machine.id, *(p for p in machine.peers
                                                             if p not in lost)]):
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

    def propose(self, records: int, data: bytes | None = None) -> Any:
        """The leader appended `records` offsets to its log (before this call); their range,
        or None if this replica may not append (not the leader, a transfer under way).
        `data`: their batches as the log holds them, kept until this turn's Ready is sent."""
        proposed = self.machine.propose(records)
        if proposed is not None:
            if data is not None:
                self._fresh.append((proposed.base, proposed.last, data))
            self._soon()
        return proposed

    def propose_membership(self, new: Membership) -> bool:
        """The leader appends a membership change (actors/raft/machine.py says when it may);
        whether it did."""
        proposed = self.machine.propose_membership(new)
        if proposed is not None:
            self._soon()
        return proposed is not None

    @property
    def writes_waiting(self) -> bool:
        """Whether log writes the machine asked for wait (a cut, a segment made ahead, the
        memberships file): the log does not end where the machine's does, so a leader takes
        no produce until `writes_resumed`."""
        return self._deferring or bool(self._writes)

    def propose_no_op(self) -> bool:
        """The leader places a no-op (a LEADER_CHANGE batch, written when the machine's
        Ready comes) where its election placed none; whether it did (not while a transfer
        is under way)."""
        proposed = self.machine.propose(1, LEADER_CHANGE)
        if proposed is not None:
            self._soon()
        return proposed is not None

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
        self._fresh.clear()

    # The Ready, once a loop turn ------------------------------------------------------------

    def _soon(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self._schedule(self._process)

    def _process(self) -> None:
        self._scheduled = False
        try:
            self._take_ready()
        finally:
            self._fresh.clear()  # the Ready sent them (an append held back reads the log)

    def _take_ready(self) -> None:
        machine = self.machine
        while not self.closed:
            if machine.has_ready():
                self._handle(machine.ready())
            elif not self._lost or self._deferring:
                return
            if self._lost and not self._deferring:
                # Every write asked for is made or refused, none gathered since: the log
                # holds what the machine believes up to its end, and no further.
                self._lost = False
                machine.log_write_failed(self._host.replica_log().next_offset - 1)

    def _handle(self, rd: Ready) -> None:
        try:
            if rd.hard_state is not None:
                self._save(rd.hard_state)
            for write in rd.log_writes:
                self._log_write(write)
            if rd.messages:
                self._send(list(rd.messages))
            if rd.committed is not None:
                self._host.committed(rd.committed + 1)
            if rd.soft_state is not None:
                self._host.role_changed(rd.soft_state, self.machine.term)
        finally:
            self.machine.advance()

    # Term and vote before messages ----------------------------------------------------------

    def _save(self, state: HardState) -> None:
        self._saves += 1
        self._hard_state = state
        number = self._saves
        self._store.save(self.group, state, lambda error: self._saved(number, error))

    def _saved(self, number: int, error: BaseException | None) -> None:
        if error is not None:
            if number > self._durable and not self._save_failed:
                # Not durable: what waits on it stays held (a crash now would forget the
                # vote), and the next tick saves it again.
                self._save_failed = True
                log.error("%s: term and vote not saved (%s): %d messages held until they are",
                          self.group, error, len(self._held))
            return
        self._durable = max(self._durable, number)
        if self._durable < self._saves:
            return
        self._save_failed = False
        held, self._held = self._held, collections.deque()
        if self._dropped:
            log.warning("%s: %d messages dropped while term and vote were not durable",
                        self.group, self._dropped)
            self._dropped = 0
        if held and not self.closed:
            self._host.send(list(held))

    def _send(self, messages: list[Message], attempts: int = 0) -> None:
        nowait = attempts < limits.cold_read_attempts_max
        try:
            messages = [m for m in (self._with_payload(m, nowait, attempts > 0)
                                    for m in messages) if m is not None]
        except NotCached as miss:
            self._warm_and_send(miss, messages, attempts)
            return
        if not messages:
            return
        if self._durable < self._saves:
            self._hold(messages)
        else:
            self._host.send(messages)

    def _hold(self, messages: list[Message]) -> None:
        held = self._held
        held.extend(messages)
        while len(held) > limits.replica_held_messages_max:
            held.popleft()
            self._dropped += 1

    def _with_payload(self, m: Message, nowait: bool, late: bool) -> Message | None:
        """An append to a follower carries the bytes of its ranges, read from the log; None
        when the log does not hold them (yet, or any more): the follower is probed again.
        `late`: read after the Ready (a cold read), when only a leader still leading in the
        append's term is sure its log holds what the ranges named."""
        if m.type != MsgType.MsgApp or not m.ranges or m.payload is not None:
            return m
        machine = self.machine
        if late and (machine.role != Role.Leader or machine.term != m.term):
            return None
        first, last = m.ranges[0].base, m.ranges[-1].last
        data = self._fresh_bytes(first, last)
        if data is None:
            try:
                data = read_append(self._host.replica_log(), first, last, nowait)
            except OffsetOutOfRange:
                data = None
        if data is None:
            log.debug("%s: an append of %d..%d to %s not sent: the log does not hold it",
                      self.group, first, last, m.to)
            return None
        return m._replace(payload=data)

    def _fresh_bytes(self, first: int, last: int) -> bytes | None:
        """`first..last` from this turn's own batches, if they hold it whole, batch for
        batch (a follower keeping up); else None: read from the log."""
        parts: list[bytes] = []
        expected = first
        for base, end, data in self._fresh:
            if end < expected:
                continue
            if base != expected or end > last:
                return None
            parts.append(data)
            expected = end + 1
            if end == last:
                return parts[0] if len(parts) == 1 else b"".join(parts)
        return None

    def _warm_and_send(self, miss: NotCached, messages: list[Message], attempts: int) -> None:
        """A follower far behind needs batches the page cache no longer has: the shard's read
        pool brings them in (the loop never waits on the disk), then this turn's messages
        leave, in their order. One that misses that many times reads from the disk."""
        def warmed(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.debug("%s: warming %s failed: %r", self.group, miss, error)
            if not self.closed:
                self._send(messages, attempts + 1)

        self._host.read_io(miss.warm, warmed)

    # Log writes -------------------------------------------------------------------------

    @property
    def _deferring(self) -> bool:
        """Whether log writes wait (in order, in `_writes`): a cut, a roll or a write of
        the memberships file is out."""
        return self._cutting or self._rolling or self._saving

    def _log_write(self, write: LogWrite) -> None:
        if self._deferring:
            self._writes.append(write)
            return
        log_ = self._host.replica_log()
        if isinstance(write, Append):
            if self._confs_first(log_, write) or self._roll_first(log_, write):
                return
            try:
                self._append(log_, write)
            except Exception as e:  # whatever the reason, the machine must hear of it
                self._append_failed(write, e)
            else:
                self._write_failing = False
            return
        try:
            if isinstance(write, TruncateAfter):
                self._truncate(log_, write.offset + 1)
            elif isinstance(write, InstallStart):
                self._confs = [(write.log_start - 1, write.membership)]
                self._saved_confs = None  # the install's anchor: written after the reset
                self._cut(log_.reset(write.log_start, write.prev_term))
            elif isinstance(write, AdvanceStart):
                self._host.advance_log_start(write.offset)
        except Exception:
            log.critical("%s: %s failed", self.group, write, exc_info=True)
            self._stop()

    def _append_failed(self, write: Append, error: Exception) -> None:
        """Nothing of `write` is in the log (storage undoes a part-written append)."""
        self._lost = True
        level = logging.DEBUG if self._write_failing else logging.ERROR
        self._write_failing = True
        log.log(level, "%s: offsets %d..%d not written (%r): the machine learns where the log "
                "ends", self.group, write.ranges[0].base, write.ranges[-1].last, error)

    def _append(self, log_: Log, write: Append) -> None:
        host = self._host
        if write.payload is None:
            return  # the leader's own batch: written before it was proposed
        first = write.ranges[0].base
        if write.payload is LEADER_CHANGE or isinstance(write.payload, ConfChange):
            if log_.next_offset != first:
                raise NotContiguous(f"a control batch at {first} where the log continues at "
                                    f"{log_.next_offset}")
            if isinstance(write.payload, ConfChange):
                batch = membership_batch(write.payload.membership, host.now_ms())
            else:
                me, voters = host.leader_change_ids()
                batch = leader_change_batch(me, voters, host.now_ms())
            headers = iter_batches(batch, check_crc=False)
            log_.append(batch, headers, write.ranges[0].term, host.now_ms())
            data = batch
        else:
            if first < log_.next_offset:
                # The log holds offsets the machine does not (never in Raft's order of
                # things): they are not its; cut them, then write.
                self._truncate(log_, first)
                self._log_write(write)
                return
            if first > log_.next_offset:
                raise NotContiguous(f"offsets from {first} where the log continues at "
                                    f"{log_.next_offset}")
            data = bytearray(write.payload)
            # The message's batches from the first the machine asks for (it names only what
            # continues our log: a retransmission's head is already here).
            headers = [h for h in iter_batches(data, check_crc=False) if h.last_offset >= first]
            _check_matches(headers, write, first == log_.log_start_offset)
            data, headers = _fill_gaps(data, headers, write.ranges)
            log_.append_replicated(data, headers, host.now_ms())
        host.appended(log_.next_offset - 1, headers, data)

    def _truncate(self, log_: Log, cut: int) -> None:
        """Cut the log from `cut`, which is past the machine's commit."""
        if cut >= log_.next_offset:
            return  # it ends there already: a write before this one was not made
        header = next(log_.iter_batch_headers(cut))
        if header.base_offset < cut:
            # Inside a batch: this log and the leader's differ where the machine believes
            # they match (two incarnations of a topic under one group name). Cut the whole
            # batch.
            log.error("%s: a cut at %d falls inside the batch %d..%d: cut from %d", self.group,
                      cut, header.base_offset, header.last_offset, header.base_offset)
        self._cut(log_.truncate_to(header.base_offset))  # in a gap: from the batch after it
        if log_.next_offset < cut:
            self._lost = True  # the machine learns where the log now ends

    def _cut(self, ticket: CutTicket) -> None:
        self._cutting = True
        self._host.log_rewritten()

        def done(_result: Any, error: BaseException | None) -> None:
            if self.closed:
                return
            if error is not None:
                log.critical("%s: a cut of the log was not made durable: %r", self.group,
                             error)
                self._stop()
                return
            self._host.replica_log().cut_complete(ticket)
            self._cutting = False
            self._save_confs()  # a change cut away, an install's anchor
            self._write_deferred()
            if not self._cutting:
                self._host.cut_complete()

        self._host.run_io(ticket.run, done)

    def _roll_first(self, log_: Log, write: Append) -> bool:
        """A follower's batches that would roll the log before their first: the new
        segment's files are made on the I/O pool (storage/log.py, rolling ahead) and this
        write and those after it wait for them. Whether it waits."""
        payload = write.payload
        if payload is None or payload is LEADER_CHANGE or isinstance(payload, ConfChange):
            return False  # the leader's own batch (written), or a control batch of one record
        first = write.ranges[0].base
        if first != log_.next_offset:
            return False  # a retransmission's head, or a gap: `_append` sorts it out
        header = read_header(payload, 0)
        if header.base_offset != first:
            return False
        job = log_.roll_ahead(first, write.ranges[-1].last, len(payload),
                              header.partition_leader_epoch, self._host.now_ms())
        if job is None:
            return False
        self._rolling = True
        self._writes.appendleft(write)

        def done(segment: Any, error: BaseException | None) -> None:
            if self.closed:
                if segment is not None:
                    segment.close()
                return
            self._rolling = False
            if error is not None:  # the append rolls the usual way, and says what fails
                log.error("%s: a segment could not be made ahead: %r", self.group, error)
            else:
                self._host.replica_log().install_segment(segment)
            self._write_deferred()

        self._host.run_io(job, done)
        return True

    def _write_deferred(self) -> None:
        """The cut, roll or file write they waited for is done: the writes behind it, in
        order, until one waits again."""
        while self._writes and not self._deferring:
            self._log_write(self._writes.popleft())
        if not self._deferring:
            if self._lost:
                self._soon()
            self._host.writes_resumed()

    # Memberships (actors/replica_memberships.py) ---------------------------------------------

    def _confs_first(self, log_: Log, write: Append) -> bool:
        """Before an append from offset `first`: the memberships the log will hold are those
        before `first` and those the append carries; if the file does not say so (a change
        carried, one cut away or never written, an install's anchor), it is written first
        and this write and those behind it wait. Whether it waits."""
        first = write.ranges[0].base
        if first < log_.next_offset:
            return False  # a retransmission's head: `_append` cuts, then comes back here
        confs = self._confs
        if write.confs or confs[-1][0] >= first:
            self._confs = [c for c in confs if c[0] < first]
            self._confs.extend(write.confs)
        if self._confs == self._saved_confs:
            return False
        self._writes.appendleft(write)
        self._save_confs()
        return True

    def _save_confs(self) -> None:
        """Write the memberships file as `_confs` says, if it says otherwise; log writes wait
        until it is durable (`_deferring`). Only the last change below the log start is
        kept: the anchor."""
        confs = self._confs
        start = self._host.replica_log().log_start_offset
        below = sum(1 for offset, _ in confs if offset < start)
        if below > 1:
            confs = self._confs = confs[below - 1:]
        if confs == self._saved_confs:
            return
        self._saving = True
        saving = list(confs)

        def done(_result: Any, error: BaseException | None) -> None:
            if self.closed:
                return
            if error is not None:
                log.critical("%s: the memberships file was not written: %r", self.group, error)
                self._stop()
                return
            self._saving = False
            self._saved_confs = saving
            self._write_deferred()

        self._host.run_io(self._host.replica_log().state_writer(
            MEMBERSHIP_FILE, confs_to_file(saving)), done)

    def _stop(self) -> None:
        """What the log holds is unknown (a cut failed): the log refuses appends, and this
        replica answers and votes no more, lest it lead on a log it does not have, until a
        restart reopens the log and recovers it."""
        log.critical("%s: replica stopped until a restart", self.group)
        self._writes.clear()
        self.closed = True


def _check_matches(headers: list[BatchHeader], write: Append, at_start: bool) -> None:
    """The batches are what the machine's ranges name: none starts before the first range
    (one that does means this log ends inside a batch of the leader's) but where the log
    continues at its start (`at_start`: an install put it inside a batch; the log takes that
    batch whole, storage/replica.py), each has the term of its range, and the last ends
    where the ranges end. Else NotContiguous, nothing written."""
    ranges = write.ranges
    if not headers or (headers[0].base_offset < ranges[0].base and not at_start) or (
            headers[-1].last_offset != ranges[-1].last):
        span = f"{headers[0].base_offset}..{headers[-1].last_offset}" if headers else "none"
        raise NotContiguous(f"batches {span} for offsets {ranges[0].base}..{ranges[-1].last}")
    i = 0
    for h in headers:
        while ranges[i].last < h.base_offset:
            i += 1
        if h.last_offset > ranges[i].last or h.partition_leader_epoch != ranges[i].term:
            raise NotContiguous(f"batch {h.base_offset}..{h.last_offset} of epoch "
                                f"{h.partition_leader_epoch} against {ranges[i]}")


def _fill_gaps(data: bytearray, headers: list[BatchHeader],
               ranges: tuple[Range, ...]) -> tuple[bytearray, list[BatchHeader]]:
    """The batches, the offsets of the ranges that compaction left out of the leader's log
    filled with one empty batch per gap, Kafka's kind that compaction keeps, in the term the
    ranges give those offsets. A follower's log goes on batch after batch: its segments roll
    where the leader's did not, and recovery needs each to start where the one before ends
    (storage/recovery.py)."""
    start = min(ranges[0].base, headers[0].base_offset)  # a batch holding the log start
    expected = start
    gaps = False
    for h in headers:
        gaps = gaps or h.base_offset != expected
        expected = h.next_offset
    if not gaps:
        return data, headers
    out = bytearray()
    expected = start
    for h in headers:
        if h.base_offset > expected:
            out += gap_batch(expected, h.base_offset - 1, _term_at(ranges, expected))
        out += data[h.position:h.position + h.size]
        expected = h.next_offset
    return out, iter_batches(out, check_crc=False)


def gap_batch(base_offset: int, last_offset: int, epoch: int) -> bytearray:
    """An empty batch standing for `base_offset..last_offset`: no records, no producer, no
    timestamp (clients skip it, as they skip the empty batches compaction keeps)."""
    header = BatchHeader(0, base_offset, 0, epoch, 2, 0, 0, last_offset - base_offset, -1, -1,
                         -1, -1, -1, 0)
    return rebuild_batch(header, [])


def _term_at(ranges: tuple[Range, ...], offset: int) -> int:
    return next(r.term for r in ranges if offset <= r.last)
