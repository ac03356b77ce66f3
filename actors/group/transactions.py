"""The transaction coordinator's state machine: every transactional id this coordinator owns,
its producer id and epoch, and where its transaction stands. Pure: requests and the clock go
in, effects come out (persist a record, answer a client, write markers, get a producer id),
and the coordinator's glue (actors/group/txn_coordinator.py) carries them out.

A transactional id's coordinator is the owner of `offsets_partition(transactional_id, N)` of
`__consumer_offsets`, as for a group id; its state is kept there too, one record per id (a
Krill key version, actors/group/log_records.py), last value wins, a tombstone forgets it.

    Empty ──AddPartitions──> Ongoing ──EndTxn(commit)──> PrepareCommit ──markers──> CompleteCommit
      ^                        │  ├─────EndTxn(abort)──> PrepareAbort ──markers──> CompleteAbort
      │                        │  ├─ timed out / fenced by InitProducerId (epoch + 1) ─┘
      └── InitProducerId (epoch + 1) from Empty, CompleteCommit, CompleteAbort
          idle past transactional.id.expiration.ms, or the oldest completed when the table
          is full ──> Dead (tombstoned, then forgotten)

Persist before answering: a transition is `pending` from the moment its record goes out until
`persisted` says how the append went; only then does the state change (Kafka's pendingState),
and a request meeting a pending transition is answered CONCURRENT_TRANSACTIONS (the client
retries). EndTxn is answered once PrepareCommit/PrepareAbort is persisted (the outcome is then
decided); the markers follow, then CompleteX. A coordinator that loads an id found in a
Prepare state writes its markers again and completes it (`resume`).

Epochs: each InitProducerId bumps the epoch, which fences an older producer of the same id
(its requests get PRODUCER_FENCED); an Ongoing transaction met by InitProducerId, or past its
timeout, is aborted with the epoch bumped first, so a zombie's late writes are refused by the
partitions. An epoch that cannot be bumped twice more takes a new producer id (epoch 0).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from actors.group import limits
from wire.errors import ErrorCode

__all__ = [
    "TxnState",
    "TxnMetadata",
    "Persist",
    "Reply",
    "WriteMarkers",
    "NeedProducerId",
    "TransactionTable",
    "EPOCH_MAX",
]

EPOCH_MAX = 32767  # Short.MaxValue: an epoch is an int16
TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    """Kafka's TransactionState names, exactly as DescribeTransactions and ListTransactions
    report them (clients compare the strings)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"


_COMPLETED = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
_PREPARED = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """One transactional id's persisted state (the value of its record)."""

    producer_id: int
    producer_epoch: int
    last_producer_epoch: int  # the epoch before the last InitProducerId bump; -1: none
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int  # when the transaction went Ongoing; -1 when none is
    last_update_ms: int

    @property
    def commit(self) -> bool:
        return self.state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)


# Effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Persist:
    """Append the id's record (None: a tombstone), then call `persisted(id, error)`."""

    transactional_id: str
    metadata: TxnMetadata | None


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer a client: `to(*args)`."""

    to: Callable[..., None]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    """Write a COMMIT or ABORT marker to each partition, then call `markers_written(id)`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class NeedProducerId:
    """Allocate a producer id, then call `init_producer_id` again with it."""

    transactional_id: str


@dataclass(slots=True)
class _Pending:
    target: TxnMetadata | None  # what the record in flight says (None: a tombstone)
    reply: Reply | None = None  # the client answer that waits for it
    follow: list[Any] = field(default_factory=list)  # effects once it is persisted


# The table --------------------------------------------------------------------------------


class TransactionTable:
    """Every transactional id of the loaded partitions of one coordinator."""

    def __init__(self, max_timeout_ms: int, expiration_ms: int,
                 ids_max: int = limits.transactional_ids_max) -> None:
        self.max_timeout_ms = max_timeout_ms
        self.expiration_ms = expiration_ms
        self.ids_max = ids_max
        self.entries: dict[str, TxnMetadata] = {}
        self._pending: dict[str, _Pending] = {}
        self._marking: set[str] = set()  # ids whose markers are being written
        # The earliest deadline `tick` has to meet, kept as entries change so that a request
        # never scans the table (only `tick` does); None: none known.
        self._deadline_ms: int | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def busy(self, transactional_id: str) -> bool:
        """A record or markers in flight: requests get CONCURRENT_TRANSACTIONS."""
        return transactional_id in self._pending or transactional_id in self._marking

    # Client requests ------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected_id: int,
                         expected_epoch: int, now_ms: int, reply: Callable[..., None],
                         fresh_id: int | None = None) -> list[Any]:
        """InitProducerId with a transactional id; `reply(error, producer_id, epoch)`.
        `expected_*` (v3+, KIP-360): the producer's current id and epoch, or -1."""

        def refuse(error: ErrorCode) -> list[Any]:
            return [Reply(reply, (error, -1, -1))]

        if not 0 < timeout_ms <= self.max_timeout_ms:
            return refuse(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        if self.busy(transactional_id):
            return refuse(ErrorCode.CONCURRENT_TRANSACTIONS)
        meta = self.entries.get(transactional_id)
        if meta is None:
            if fresh_id is None:
                return [NeedProducerId(transactional_id)]
            room = self._make_room(now_ms)
            if room is None:
                return refuse(ErrorCode.COORDINATOR_NOT_AVAILABLE)  # full of live ones
            target = TxnMetadata(fresh_id, 0, -1, timeout_ms, TxnState.EMPTY, frozenset(),
                                 -1, now_ms)
            return room + self._persist(transactional_id, target,
                                        Reply(reply, (ErrorCode.NONE, fresh_id, 0)))
        if expected_id >= 0:
            if meta.producer_id != expected_id:
                return refuse(ErrorCode.PRODUCER_FENCED)
            if expected_epoch == meta.last_producer_epoch and meta.state in _COMPLETED:
                # A retry of the InitProducerId that made the current epoch.
                return [Reply(reply, (ErrorCode.NONE, meta.producer_id, meta.producer_epoch))]
            if expected_epoch != meta.producer_epoch:
                return refuse(ErrorCode.PRODUCER_FENCED)
        if meta.state == TxnState.ONGOING:
            # A zombie's transaction: abort it with the epoch bumped (it is fenced); the
            # new producer retries until the abort has completed.
            return self._abort(transactional_id, meta, now_ms) + refuse(
                ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state in _PREPARED:
            return refuse(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.producer_epoch >= EPOCH_MAX - 1:  # exhausted: a new id, epoch 0
            if fresh_id is None:
                return [NeedProducerId(transactional_id)]
            producer_id, epoch, last = fresh_id, 0, -1
        else:
            producer_id, epoch = meta.producer_id, meta.producer_epoch + 1
            # Only the producer's own bump may be retried (KIP-360): a new producer's clears
            # the last epoch, so the fenced one cannot claim the new epoch as its retry.
            last = meta.producer_epoch if expected_id >= 0 else -1
        target = replace(meta, producer_id=producer_id, producer_epoch=epoch,
                         last_producer_epoch=last, timeout_ms=timeout_ms, state=TxnState.EMPTY,
                         partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)
        return self._persist(transactional_id, target,
                             Reply(reply, (ErrorCode.NONE, producer_id, epoch)))

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition], now_ms: int,
                       reply: Callable[[ErrorCode], None]) -> list[Any]:
        """AddPartitionsToTxn: the transaction writes to these partitions; `reply(error)`."""
        meta = self.entries.get(transactional_id)
        error = self._check_producer(transactional_id, meta, producer_id, producer_epoch)
        if error != ErrorCode.NONE:
            return [Reply(reply, (error,))]
        assert meta is not None
        if meta.state in _PREPARED:
            return [Reply(reply, (ErrorCode.CONCURRENT_TRANSACTIONS,))]
        added = meta.partitions | frozenset(partitions)
        if meta.state == TxnState.ONGOING and added == meta.partitions:
            return [Reply(reply, (ErrorCode.NONE,))]
        if len(added) > limits.partitions_per_transaction_max:
            return [Reply(reply, (ErrorCode.INVALID_REQUEST,))]
        start_ms = meta.start_ms if meta.state == TxnState.ONGOING else now_ms
        target = replace(meta, state=TxnState.ONGOING, partitions=added, start_ms=start_ms,
                         last_update_ms=now_ms)
        return self._persist(transactional_id, target, Reply(reply, (ErrorCode.NONE,)))

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, now_ms: int, reply: Callable[[ErrorCode], None]) -> list[Any]:
        """EndTxn: commit or abort; answered once PrepareX is persisted (or at once, NONE,
        for a retry of an EndTxn that has completed)."""
        meta = self.entries.get(transactional_id)
        error = self._check_producer(transactional_id, meta, producer_id, producer_epoch)
        if error == ErrorCode.CONCURRENT_TRANSACTIONS and meta is not None:
            wanted = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if meta.state in _PREPARED and meta.state != wanted:
                error = ErrorCode.INVALID_TXN_STATE
        if error != ErrorCode.NONE:
            return [Reply(reply, (error,))]
        assert meta is not None
        state = meta.state
        if state == TxnState.ONGOING:
            target = replace(meta, state=TxnState.PREPARE_COMMIT if commit
                             else TxnState.PREPARE_ABORT, last_update_ms=now_ms)
            return self._persist(transactional_id, target, Reply(reply, (ErrorCode.NONE,)),
                                 [_markers(transactional_id, target)])
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if state == done:
            return [Reply(reply, (ErrorCode.NONE,))]
        return [Reply(reply, (ErrorCode.INVALID_TXN_STATE,))]

    def _check_producer(self, transactional_id: str, meta: TxnMetadata | None,
                        producer_id: int, producer_epoch: int) -> ErrorCode:
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if self.busy(transactional_id) or meta.state in _PREPARED:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.NONE

    # The coordinator's own transitions ------------------------------------------------------

    def tick(self, now_ms: int) -> list[Any]:
        """Abort what is Ongoing past its timeout; forget ids idle past the expiration. The
        one scan of the whole table: it also finds the next deadline. An id changing now is
        noted once its record lands; if that append fails, the glue's next periodic tick
        (at most `txn_check_interval_ms_max` away) finds it again."""
        effects: list[Any] = []
        self._deadline_ms = None
        for transactional_id, meta in list(self.entries.items()):
            if self.busy(transactional_id):
                continue
            if meta.state == TxnState.ONGOING and now_ms >= meta.start_ms + meta.timeout_ms:
                effects += self._abort(transactional_id, meta, now_ms)
            elif meta.state in _COMPLETED and (
                    now_ms >= meta.last_update_ms + self.expiration_ms):
                effects += self._persist(transactional_id, None)
            else:
                self._note(meta)
        return effects

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do (None: nothing known). It may be earlier
        than the truth (an id changed since it was noted), never later: a tick then finds
        nothing to do and notes the true one."""
        return self._deadline_ms

    def _note(self, meta: TxnMetadata) -> None:
        if meta.state in _PREPARED:
            return  # its markers are out; it completes without the clock
        if meta.state == TxnState.ONGOING:
            deadline = meta.start_ms + meta.timeout_ms
        else:
            deadline = meta.last_update_ms + self.expiration_ms
        if self._deadline_ms is None or deadline < self._deadline_ms:
            self._deadline_ms = deadline

    def resume(self, loaded: dict[str, TxnMetadata]) -> list[Any]:
        """Take over the ids of a partition just loaded: a Prepare state is completed (its
        markers written again); Ongoing ones keep their start, hence their timeout."""
        effects: list[Any] = []
        for transactional_id, meta in loaded.items():
            self.entries[transactional_id] = meta
            self._note(meta)
            if meta.state in _PREPARED:
                self._marking.add(transactional_id)
                effects.append(_markers(transactional_id, meta))
        return effects

    def forget(self, transactional_ids: Iterable[str]) -> list[Any]:
        """Their partition is no longer ours: drop them; a client waiting on a record in
        flight is answered NOT_COORDINATOR (it finds the new coordinator)."""
        effects: list[Any] = []
        for transactional_id in transactional_ids:
            self.entries.pop(transactional_id, None)
            self._marking.discard(transactional_id)
            pending = self._pending.pop(transactional_id, None)
            if pending is not None and pending.reply is not None:
                args = pending.reply.args
                effects.append(Reply(pending.reply.to,
                                     (ErrorCode.NOT_COORDINATOR,) + _blank(args[1:])))
        return effects

    def pending_in(self, chosen: Callable[[str], bool]) -> list[str]:
        """The ids with a record in flight that `chosen` picks (new ids among them)."""
        return [t for t in self._pending if chosen(t)]

    def persisted(self, transactional_id: str, error: ErrorCode, now_ms: int) -> list[Any]:
        """The record of the pending transition is appended (NONE) or is not (`error`,
        already the one the client should get)."""
        pending = self._pending.pop(transactional_id, None)
        if pending is None:
            return []  # forgotten meanwhile
        if error != ErrorCode.NONE:
            if pending.reply is None:
                return []  # the coordinator's own: `tick` or `markers_written` tries again
            first = pending.reply.args[0:1]
            assert first and first[0] == ErrorCode.NONE
            return [Reply(pending.reply.to, (error,) + _blank(pending.reply.args[1:]))]
        if pending.target is None:
            self.entries.pop(transactional_id, None)
        else:
            self.entries[transactional_id] = pending.target
            self._note(pending.target)
        effects: list[Any] = [pending.reply] if pending.reply is not None else []
        for effect in pending.follow:
            if isinstance(effect, WriteMarkers):
                self._marking.add(transactional_id)
            effects.append(effect)
        return effects

    def markers_written(self, transactional_id: str, now_ms: int) -> list[Any]:
        """Every marker of the Prepare state is in: persist CompleteCommit/CompleteAbort."""
        self._marking.discard(transactional_id)
        meta = self.entries.get(transactional_id)
        if meta is None or meta.state not in _PREPARED or transactional_id in self._pending:
            return []
        done = TxnState.COMPLETE_COMMIT if meta.commit else TxnState.COMPLETE_ABORT
        target = replace(meta, state=done, partitions=frozenset(), start_ms=-1,
                         last_update_ms=now_ms)
        return self._persist(transactional_id, target)

    # Helpers ----------------------------------------------------------------------------------

    def _abort(self, transactional_id: str, meta: TxnMetadata, now_ms: int) -> list[Any]:
        """PrepareAbort with the epoch bumped (when it can be), so the old producer is
        fenced at the partitions; the markers follow once it is persisted."""
        epoch = meta.producer_epoch + 1 if meta.producer_epoch < EPOCH_MAX - 1 else (
            meta.producer_epoch)
        target = replace(meta, producer_epoch=epoch, last_producer_epoch=-1,
                         state=TxnState.PREPARE_ABORT, last_update_ms=now_ms)
        return self._persist(transactional_id, target, None, [_markers(transactional_id, target)])

    def _make_room(self, now_ms: int) -> list[Any] | None:
        """Tombstones for the oldest completed ids when the table is full; None when it is
        full of ids that are not completed (or are already going)."""
        arriving = sum(1 for i, p in self._pending.items()
                       if i not in self.entries and p.target is not None)
        going = sum(1 for p in self._pending.values() if p.target is None)
        excess = len(self.entries) + arriving - going + 1 - self.ids_max
        if excess <= 0:
            return []
        idle = sorted(
            (meta.last_update_ms, transactional_id)
            for transactional_id, meta in self.entries.items()
            if meta.state in _COMPLETED and not self.busy(transactional_id))
        if len(idle) < excess:
            return None
        effects: list[Any] = []
        for _, transactional_id in idle[:excess]:
            effects += self._persist(transactional_id, None)
        return effects

    def _persist(self, transactional_id: str, target: TxnMetadata | None,
                 reply: Reply | None = None, follow: list[Any] | None = None) -> list[Any]:
        assert transactional_id not in self._pending, f"{transactional_id!r}: two writes"
        self._pending[transactional_id] = _Pending(target, reply, follow or [])
        return [Persist(transactional_id, target)]


def _markers(transactional_id: str, meta: TxnMetadata) -> WriteMarkers:
    return WriteMarkers(transactional_id, meta.producer_id, meta.producer_epoch, meta.commit,
                        meta.partitions)


def _blank(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """An InitProducerId refused after all: no producer id or epoch."""
    return tuple(-1 for _ in values)
