"""The GroupCoordinator actor: one per shard, owner of the groups whose offsets partition
(`offsets_partition(group_id, N)` of `__consumer_offsets`) that shard owns.

It keeps every such group's state machine (`actors.group.state.Group`) and committed offsets,
runs the state machines' effects — replies, timers on the shard loop, and metadata appended to
`__consumer_offsets` — and persists before it answers: an OffsetCommit, a completed SyncGroup
or a DeleteGroups is answered only once the Partition actor says the records are produced
(acks=-1). Records use Kafka's byte layouts (`log_records`).

Ownership is per offsets partition. On one node the shard that hosts partition p owns it
(`owns(p)`, given at start, fixed). In a cluster p moves with its Raft leader: the shard
sends `OffsetsOwnership` with the whole owned set whenever one of its offsets replicas gains
or loses leadership, and the first such message replaces `owns` for good. Per partition:

    not owned --owned--> loading --replayed up to the log end--> loaded (served)
        ^                   │ read error: failed, until a newer OffsetsOwnership names it
        └──── not owned ────┴──────────────────────────────────────┘ (groups forgotten)

Loading reads p from its log start through the Partition actor and replays it (last value per
key wins; null deletes; actors/group/loading.py) while the groups of other loaded partitions
keep being served. `__consumer_offsets` itself is created through the Controller at the first
group request if it does not exist. A request waits in one bounded queue while the topic is
being created or its group's partition is loading, and is served in arrival order once it is
loaded; a request for a partition not owned, or one that stops being owned while it waits, is
answered NOT_COORDINATOR, and the client looks its coordinator up again. Losing p forgets its
groups and offsets (their timers cancelled, their waiting joins and syncs answered
NOT_COORDINATOR); owning it again reads it again, as another replica may have written since.

Handlers find the coordinator with `Services.group_coordinator(group_id)`; the messages below
carry plain values and a reply callback, so on another shard only the ActorRef differs.

It is also the transaction coordinator of every transactional id whose offsets partition it
owns (`offsets_partition(transactional_id, N)`, as for a group id): their state is kept in the
same partitions (a Krill key version, log_records.py), so ownership, loading, replication and
compaction are the groups'. The state machine is actors/group/transactions.py; its I/O
(markers, producer ids, timeouts) is the `TxnCoordinator` helper this actor owns, as it owns
its `PartitionLoader`: here the transaction requests are only queued, dispatched and refused
like the group ones.

Transactional offset commits (TxnOffsetCommit) are served here as the group's: appended as one
transactional batch of the producer, with acks=-1, and kept pending
(actors/group/txn_offsets.py) until the Partition of the group's offsets partition says the
producer's marker is committed there (`TxnOffsetsMarker`): COMMIT makes them committed, ABORT
drops them. OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for a pending one.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pykka import ActorDeadError, ActorRef

from actors.controller import CreateTopics, TopicResult, TopicSpec
from actors.group import OFFSETS_TOPIC, limits, offsets_partition
from actors.group.expiry import expired_offsets, group_expires
from actors.group.loading import LOADER_MESSAGES, PartitionLoad, PartitionLoader
from actors.group.log_records import (
    OffsetValue,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from actors.group.messages import (
    AddTxnOffsets,
    AddTxnPartitions,
    CommitEntry,
    CommitOffsets,
    DeleteGroups,
    DeleteOffsets,
    DescribeGroups,
    DescribeTxns,
    EndTransaction,
    EnsureReady,
    FetchedOffset,
    FetchOffsets,
    GroupDescription,
    GroupListing,
    InitTransactional,
    ListGroups,
    ListTxns,
    OffsetsOwnership,
    TxnCommitOffsets,
    TxnOffsetsMarker,
)
from actors.group.state import (
    Group,
    GroupState,
    Heartbeat,
    HeartbeatResult,
    Join,
    JoinResult,
    Leave,
    LeaveResult,
    Persist,
    Reply,
    SetTimer,
    Sync,
    SyncResult,
)
from actors.group.txn_coordinator import TXN_MESSAGES, TXN_REQUESTS, TxnCoordinator
from actors.group.txn_offsets import PendingTxnOffsets
from actors.partition import Produce, ProduceResult
from actors.runtime import LoopActor
from actors.services import Services, now_ms
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

__all__ = ["GroupCoordinator"]  # its messages are in actors.group.messages

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"


# Messages -----------------------------------------------------------------------------------


class _Created(NamedTuple):
    results: list[TopicResult]


class _Appended(NamedTuple):
    done: Callable[[ErrorCode], None]
    error: ErrorCode


class _Phase(enum.Enum):
    NEW = "new"  # `__consumer_offsets` not seen yet; it may not exist
    CREATING = "creating"
    READY = "ready"  # the topic exists: partitions load, and are served, one by one


# Kafka's GroupCoordinatorService / GroupMetadataManager.appendGroupMetadataErrorToResponseError:
# an append's error as a coordinator error the client retries. REQUEST_TIMED_OUT (the new
# leader's outcome unknown) is COORDINATOR_NOT_AVAILABLE: retried, on the same coordinator.
_RETRIABLE_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


def _commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka maps append failures to coordinator errors the client knows how to retry."""
    if error == ErrorCode.NONE:
        return error
    return _RETRIABLE_APPEND_ERRORS.get(error, ErrorCode.COORDINATOR_NOT_AVAILABLE)


def _group_ids(message: Any) -> Sequence[str] | None:
    """The groups (or transactional ids) a request is about; None: every group (it waits for
    every load)."""
    if isinstance(message, ListGroups | ListTxns):
        return None
    if isinstance(message, DescribeTxns):
        return message.transactional_ids
    if isinstance(message, InitTransactional | AddTxnPartitions | AddTxnOffsets
                  | EndTransaction):
        return (message.transactional_id,)
    if isinstance(message, EnsureReady):
        return None if message.group_id is None else (message.group_id,)
    if isinstance(message, DescribeGroups | DeleteGroups):
        return message.group_ids
    return (message.group_id,)


# The actor ------------------------------------------------------------------------------------


class GroupCoordinator(LoopActor):
    def __init__(self, services: Services, owns: Callable[[int], bool]) -> None:
        """`owns(p)`: is partition p of `__consumer_offsets` this shard's? It decides until
        the first `OffsetsOwnership` arrives, which replaces it for good."""
        super().__init__()
        self.services = services
        self._owns = owns
        self._owned: frozenset[int] | None = None  # from OffsetsOwnership; None: `owns`
        self._initial_delay_ms = services.settings.group_initial_rebalance_delay_ms
        self._groups: dict[str, Group] = {}  # of loaded partitions only
        self._offsets: dict[str, dict[tuple[str, int], OffsetValue]] = {}  # the same
        self._pending_txn = PendingTxnOffsets()  # TxnOffsetCommits awaiting their marker
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._phase = _Phase.NEW
        self._partition_count = 0  # of `__consumer_offsets`, once READY
        self._loader = PartitionLoader(services, self.actor_ref, self._load_done,
                                       self._load_failed)
        self._loads = self._loader.loads  # partitions loading (the loader's)
        self._loaded: dict[int, int] = {}  # partitions served -> the load that made them
        self._failed: set[int] = set()  # loads failed since the last OffsetsOwnership
        self._waiting: collections.deque[Any] = collections.deque()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiring: set[str] = set()  # groups whose expiry tombstones are being appended
        self._txns = TxnCoordinator(services, self, self._append, self._partition_of,
                                    self._incarnation, _commit_error)
        self._handlers: dict[type, Callable[[Any], None]] = {
            Join: self._group_event,
            Sync: self._group_event,
            Heartbeat: self._group_event,
            Leave: self._group_event,
            EnsureReady: self._ensure_ready,
            CommitOffsets: self._commit,
            TxnCommitOffsets: self._txn_commit,
            FetchOffsets: self._fetch,
            DescribeGroups: self._describe,
            ListGroups: self._list,
            DeleteGroups: self._delete_groups,
            DeleteOffsets: self._delete_offsets,
        }
        self._internal: dict[type, Callable[[Any], None]] = {
            _Appended: lambda m: m.done(m.error),
            _Created: self._created,
            OffsetsOwnership: self._ownership,
            TxnOffsetsMarker: self._txn_marker,
        }
        for kind in LOADER_MESSAGES:
            self._internal[kind] = self._loader.receive
        for txn_kind in TXN_MESSAGES:
            self._internal[txn_kind] = self._txns.receive
        self._handlers.update(self._txns.handlers)

    def __str__(self) -> str:
        return "GroupCoordinator"

    # Lifecycle --------------------------------------------------------------------------------

    def on_start(self) -> None:
        if self.services.metrics is not None:
            self.services.metrics.register("groups", self._groups_snapshot)
        if OFFSETS_TOPIC in self.services.topics().topics:
            self._find_topic()

    def _groups_snapshot(self) -> dict[str, Any]:
        """For the metrics (committed offsets, members, state per group): consumer lag is
        the partitions' high watermarks less these."""
        snapshot: dict[str, Any] = {}
        for group_id in self._groups.keys() | self._offsets.keys():
            group = self._groups.get(group_id)
            offsets = self._offsets.get(group_id, {})
            snapshot[group_id] = {
                "state": group.state.value if group is not None else "Empty",
                "members": group.member_count if group is not None else 0,
                "offsets": [[topic, p, value.offset] for (topic, p), value in offsets.items()],
            }
        return snapshot

    def on_stop(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._loader.cancel_all()
        self._txns.stop()
        self._waiting.clear()

    def on_receive(self, message: Any) -> Any:
        internal = self._internal.get(type(message))
        if internal is not None:
            return internal(message)
        if type(message) not in self._handlers:
            return super().on_receive(message)
        self._dispatch(message, requeued=False)
        return None

    def _dispatch(self, message: Any, requeued: bool) -> None:
        """Serve a request, or queue it while the topic or its group's partition loads, or
        answer NOT_COORDINATOR if that partition is not ours."""
        if self._phase != _Phase.READY:
            self._wait(message, requeued)
            self._find_topic()
            return
        group_ids = _group_ids(message)
        if group_ids is None:
            if self._loads:
                self._wait(message, requeued)
                return
        else:
            partitions = {self._partition_of(g) for g in group_ids}
            if not partitions.isdisjoint(self._loads):
                self._wait(message, requeued)
                return
            # Several groups (Describe, Delete) are answered group by group.
            if len(group_ids) == 1 and not partitions <= self._loaded.keys():
                self._refuse(message, ErrorCode.NOT_COORDINATOR)
                return
        self._handlers[type(message)](message)

    def _wait(self, message: Any, requeued: bool) -> None:
        if not requeued and len(self._waiting) >= limits.requests_waiting_for_load_max:
            self._refuse(message, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            return
        self._waiting.append(message)

    def _wake(self) -> None:
        """Dispatch the waiting requests again, in order (something they wait on changed)."""
        waiting, self._waiting = self._waiting, collections.deque()
        for message in waiting:
            self._dispatch(message, requeued=True)

    def _partition_of(self, group_id: str) -> int:
        return offsets_partition(group_id, self._partition_count)

    def _serves(self, group_id: str) -> bool:
        return self._partition_of(group_id) in self._loaded

    def _incarnation(self, group_id: str) -> int | None:
        """Which load of the group's partition is served (None: none). An append's answer
        changes what is served only if this is unchanged since the append went out: else
        the partition was unloaded meanwhile (and read again since, append included)."""
        return self._loaded.get(self._partition_of(group_id))

    # Creating `__consumer_offsets` ------------------------------------------------------------

    def _find_topic(self) -> None:
        """Create the topic if it is missing; once it exists, load what this shard owns."""
        if self._phase != _Phase.NEW:
            return
        table = self.services.topics()
        if OFFSETS_TOPIC not in table.topics:
            self._phase = _Phase.CREATING
            spec = TopicSpec(
                OFFSETS_TOPIC,
                self.services.settings.offsets_topic_partitions,
                -1,
                [],
                {"cleanup.policy": "compact"},
            )
            me = self.actor_ref
            self.services.controller().tell(
                CreateTopics([spec], False, lambda results: me.tell(_Created(results)))
            )
            return
        self._phase = _Phase.READY
        self._partition_count = table.topics[OFFSETS_TOPIC].partitions
        self._reconcile()
        self._wake()

    def _created(self, m: _Created) -> None:
        result = m.results[0]
        self._phase = _Phase.NEW
        if result.error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            log.error("cannot create %s: %s %s", OFFSETS_TOPIC, result.error.name, result.message)
            waiting, self._waiting = self._waiting, collections.deque()
            for message in waiting:
                self._refuse(message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return
        self._find_topic()

    # Ownership --------------------------------------------------------------------------------

    def _ownership(self, m: OffsetsOwnership) -> None:
        self._owned = frozenset(m.partitions)
        self._failed.clear()  # named again: a failed load is tried again
        if self._phase == _Phase.NEW and OFFSETS_TOPIC in self.services.topics().topics:
            self._find_topic()
            return
        self._reconcile()
        self._wake()

    def _reconcile(self) -> None:
        """Unload what is no longer owned; load what is owned and neither loaded, loading
        nor failed."""
        if self._phase != _Phase.READY:
            return
        count = self._partition_count
        if self._owned is None:
            owned = {p for p in range(count) if self._owns(p)}
        else:
            owned = {p for p in self._owned if 0 <= p < count}
        for p in sorted((self._loads.keys() | self._loaded.keys()) - owned):
            self._unload(p)
        for p in sorted(owned - self._loads.keys() - self._loaded.keys() - self._failed):
            self._loader.start(p)

    def _unload(self, partition: int) -> None:
        """Forget p's groups and offsets; their waiting joins and syncs (and, on `_wake`,
        the requests queued for p) are answered NOT_COORDINATOR."""
        if self._loader.cancel(partition):
            log.info("%s-%d: no longer owned; its load stops", OFFSETS_TOPIC, partition)
            return
        del self._loaded[partition]
        gone = [g for g in self._groups.keys() | self._offsets.keys()
                if self._partition_of(g) == partition]
        for group_id in gone:
            group = self._groups.pop(group_id, None)
            self._offsets.pop(group_id, None)
            self._set_timer(group_id, None)
            self._expiring.discard(group_id)
            if group is not None:
                for effect in group.unload():
                    if isinstance(effect, Reply):
                        effect.to(effect.result)
        self._pending_txn.forget(lambda g: self._partition_of(g) == partition)
        self._txns.unload(partition)
        log.info("%s-%d: no longer owned; %d groups forgotten", OFFSETS_TOPIC, partition,
                 len(gone))

    # Loads ending (actors/group/loading.py) -------------------------------------------------

    def _load_failed(self, load: PartitionLoad, error: ErrorCode, offset: int) -> None:
        log.error("loading %s-%d at %d: %s", OFFSETS_TOPIC, load.partition, offset, error.name)
        if self._owned is None:
            # One node (`owns`, fixed): nothing will name the partition again; serve what
            # was read, as before ownership moved.
            self._load_done(load)
            return
        self._failed.add(load.partition)
        self._wake()  # its waiting requests: NOT_COORDINATOR

    def _load_done(self, load: PartitionLoad) -> None:
        """Serve the partition: its replayed groups and offsets join the served ones."""
        self._loaded[load.partition] = load.load_id
        now = now_ms()
        for group_id, offsets in load.offsets.items():
            self._offsets[group_id] = offsets
        for group_id, snapshot in load.restored.items():
            group = self._group(group_id)
            group.restore(snapshot, now)
            self._run(group, group.tick(now))
        for group_id, offsets in load.offsets.items():
            if offsets:
                self._group(group_id)
        self._pending_txn.absorb(load.pending)
        self._txns.loaded(load.partition, load.coordinator_epoch, load.transactions)
        if self._expiry_timer is None:
            self._schedule_expiry()
        log.info(
            "%s-%d loaded in %d ms: %d groups, %d with offsets",
            OFFSETS_TOPIC,
            load.partition,
            now - load.started_ms,
            len(load.restored.keys() | {g for g, o in load.offsets.items() if o}),
            sum(1 for o in load.offsets.values() if o),
        )
        self._wake()

    def _refuse(self, message: Any, error: ErrorCode) -> None:
        """Answer a request that cannot be served here (now) with `error`."""
        if isinstance(message, TXN_REQUESTS):
            self._txns.refuse(message, error)
        elif isinstance(message, Join):
            message.reply(JoinResult(error, member_id=message.member_id))
        elif isinstance(message, Sync):
            message.reply(SyncResult(error))
        elif isinstance(message, Heartbeat):
            message.reply(HeartbeatResult(error))
        elif isinstance(message, Leave):
            message.reply(LeaveResult(error))
        elif isinstance(message, EnsureReady):
            message.reply(error)
        elif isinstance(message, CommitOffsets | TxnCommitOffsets):
            message.reply([error] * len(message.entries))
        elif isinstance(message, DeleteGroups):
            message.reply([error] * len(message.group_ids))
        elif isinstance(message, DeleteOffsets):
            message.reply(error, [error] * len(message.partitions))
        elif isinstance(message, FetchOffsets):
            if message.with_error:
                message.reply(error, [])
            else:
                message.reply([])
        elif isinstance(message, DescribeGroups):
            message.reply([_not_described(g, error) for g in message.group_ids])
        elif isinstance(message, ListGroups):
            message.reply([])

    # Group membership ---------------------------------------------------------------------------

    def _group(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id, self._initial_delay_ms)
        return group

    def _ensure_ready(self, m: EnsureReady) -> None:
        m.reply(ErrorCode.NONE)  # dispatched only once its partition (or every one) loaded

    def _group_event(self, e: Join | Sync | Heartbeat | Leave) -> None:
        now = now_ms()
        if isinstance(e, Join):
            group = self._group(e.group_id)
            self._run(group, group.join(e, now))
            return
        existing = self._groups.get(e.group_id)
        if existing is None:
            unknown = ErrorCode.UNKNOWN_MEMBER_ID
            if isinstance(e, Sync):
                e.reply(SyncResult(unknown))
            elif isinstance(e, Heartbeat):
                e.reply(HeartbeatResult(unknown))
            else:
                e.reply(
                    LeaveResult(
                        ErrorCode.NONE, tuple((mid, iid, unknown) for mid, iid in e.members)
                    )
                )
            return
        if isinstance(e, Sync):
            self._run(existing, existing.sync(e, now))
        elif isinstance(e, Heartbeat):
            self._run(existing, existing.heartbeat(e, now))
        else:
            self._run(existing, existing.leave(e, now))

    def _run(self, group: Group, effects: list[Any]) -> None:
        """Carry out a step's effects in order; replies after a Persist wait for it."""
        held: list[Reply] | None = None
        for effect in effects:
            if isinstance(effect, Reply):
                if held is None:
                    effect.to(effect.result)
                else:
                    held.append(effect)
            elif isinstance(effect, Persist):
                held = []
                record = (encode_group_key(group.group_id), encode_group_value(effect.snapshot))
                self._append(group.group_id, [record], _release(held))
            elif isinstance(effect, SetTimer):
                self._set_timer(group.group_id, effect.deadline_ms)
            else:
                raise AssertionError(f"unknown effect {effect!r}")

    def _set_timer(self, group_id: str, deadline_ms: int | None) -> None:
        handle = self._timers.pop(group_id, None)
        if handle is not None:
            handle.cancel()
        if deadline_ms is None:
            return
        delay_s = max(0, deadline_ms - now_ms() + 1) / 1000
        self._timers[group_id] = self.call_later(delay_s, lambda: self._timer_fired(group_id))

    def _timer_fired(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        group = self._groups.get(group_id)
        if group is None or self.actor_stopped.is_set():
            return
        self._run(group, group.tick(now_ms()))

    # Offsets ----------------------------------------------------------------------------------

    def _commit(self, m: CommitOffsets) -> None:
        group = self._groups.get(m.group_id)
        if group is None and m.generation_id >= 0:
            m.reply([ErrorCode.ILLEGAL_GENERATION] * len(m.entries))
            return
        if group is None:
            group = self._group(m.group_id)
        error = group.check_commit(m.member_id, m.group_instance_id, m.generation_id)
        if error != ErrorCode.NONE:
            m.reply([error] * len(m.entries))
            return
        errors, values = _offset_values(m.entries, now_ms())
        records = [(encode_offset_key(m.group_id, t, p), encode_offset_value(v))
                   for (t, p), v in values]
        if not records:
            m.reply(errors)
            return
        incarnation = self._incarnation(m.group_id)

        def appended(error: ErrorCode) -> None:
            if error == ErrorCode.NONE:
                if self._incarnation(m.group_id) == incarnation:
                    self._offsets.setdefault(m.group_id, {}).update(values)
                m.reply(errors)
            else:
                failed = _commit_error(error)
                m.reply([failed if e == ErrorCode.NONE else e for e in errors])

        self._append(m.group_id, records, appended)

    def _fetch(self, m: FetchOffsets) -> None:
        offsets = self._offsets.get(m.group_id, {})
        if m.partitions is None:
            fetched = [FetchedOffset(t, p, v) for (t, p), v in sorted(offsets.items())]
        else:
            fetched = [FetchedOffset(t, p, offsets.get((t, p))) for t, p in m.partitions]
        if m.require_stable and self._pending_txn.has_group(m.group_id):
            unstable = ErrorCode.UNSTABLE_OFFSET_COMMIT
            fetched = [FetchedOffset(f.topic, f.partition, None, unstable)
                       if self._pending_txn.has_pending(m.group_id, (f.topic, f.partition))
                       else f for f in fetched]
        if m.with_error:
            m.reply(ErrorCode.NONE, fetched)
        else:
            m.reply(fetched)

    def _txn_commit(self, m: TxnCommitOffsets) -> None:
        """TxnOffsetCommit: append the offsets as the producer's transactional batch; once it
        is produced they are pending in its transaction (answered then)."""
        group = self._groups.get(m.group_id)
        if group is None and m.member_id:
            m.reply([ErrorCode.UNKNOWN_MEMBER_ID] * len(m.entries))
            return
        group = group if group is not None else self._group(m.group_id)
        error = group.check_txn_commit(m.member_id, m.group_instance_id, m.generation_id)
        if error == ErrorCode.NONE:
            partitions = [(e.topic, e.partition) for e in m.entries]
            error = self._pending_txn.admits(m.group_id, m.producer_id, partitions)
        if error != ErrorCode.NONE:
            m.reply([error] * len(m.entries))
            return
        errors, values = _offset_values(m.entries, now_ms())
        if not values:
            m.reply(errors)
            return
        records = [(encode_offset_key(m.group_id, t, p), encode_offset_value(v))
                   for (t, p), v in values]
        incarnation = self._incarnation(m.group_id)

        def appended(error: ErrorCode) -> None:
            if error == ErrorCode.NONE:
                if self._incarnation(m.group_id) == incarnation:
                    self._pending_txn.add(m.group_id, m.producer_id, values)
                m.reply(errors)
            else:
                failed = _txn_commit_error(error)
                m.reply([failed if e == ErrorCode.NONE else e for e in errors])

        self._append(m.group_id, records, appended, (m.producer_id, m.producer_epoch))

    def _txn_marker(self, m: TxnOffsetsMarker) -> None:
        """A producer's marker is committed on an offsets partition of this shard: its pending
        offsets of that partition's groups are committed now, or dropped."""
        if m.partition in self._loads:
            self._loader.marker(m.partition, m.producer_id, m.commit, m.offset)
            return
        if m.partition not in self._loaded:
            return  # not served: its next load replays the marker
        ended = self._pending_txn.end(
            m.producer_id, lambda g: self._partition_of(g) == m.partition, m.commit)
        for group_id, offsets in ended.items():
            self._group(group_id)
            self._offsets.setdefault(group_id, {}).update(offsets)

    def _delete_offsets(self, m: DeleteOffsets) -> None:
        group = self._groups.get(m.group_id)
        if group is None or group.state == GroupState.DEAD:
            m.reply(ErrorCode.GROUP_ID_NOT_FOUND, [])
            return
        subscribed: set[str] = set()
        if group.protocol_type == CONSUMER_PROTOCOL_TYPE and not group.is_empty():
            for metadata in group.subscriptions():
                subscribed |= _subscribed_topics(metadata)
        elif not group.is_empty():
            m.reply(ErrorCode.NON_EMPTY_GROUP, [])
            return
        offsets = self._offsets.get(m.group_id, {})
        errors = [
            ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if t in subscribed else ErrorCode.NONE
            for t, _ in m.partitions
        ]
        doomed = [
            tp
            for tp, e in zip(m.partitions, errors, strict=True)
            if e == ErrorCode.NONE and tp in offsets
        ]
        if not doomed:
            m.reply(ErrorCode.NONE, errors)
            return

        def appended(error: ErrorCode) -> None:
            if error != ErrorCode.NONE:
                m.reply(_commit_error(error), [])
                return
            for tp in doomed:
                offsets.pop(tp, None)
            m.reply(ErrorCode.NONE, errors)

        tombstones = [(encode_offset_key(m.group_id, t, p), None) for t, p in doomed]
        self._append(m.group_id, tombstones, appended)

    # Offsets retention ------------------------------------------------------------------------

    def _schedule_expiry(self) -> None:
        interval_s = self.services.settings.group_offset_retention_check_ms / 1000
        self._expiry_timer = self.call_later(interval_s, self._expire)

    def _expire(self) -> None:
        """Tombstone expired offsets, and groups left Empty with none (actors/group/expiry.py);
        memory follows once the tombstones are produced."""
        now = now_ms()
        retention_ms = self.services.settings.group_offset_retention_sec * 1000
        for group_id, group in list(self._groups.items()):
            if group_id in self._expiring or self._pending_txn.has_group(group_id):
                continue  # a transaction's offsets pending: not idle
            offsets = self._offsets.get(group_id, {})
            doomed = expired_offsets(group, offsets, now, retention_ms)
            goes = group_expires(group, len(offsets) - len(doomed))
            if not doomed and not goes:
                continue
            tombstones: list[tuple[bytes, bytes | None]] = [
                (encode_offset_key(group_id, t, p), None) for t, p in doomed]
            if goes:
                tombstones.append((encode_group_key(group_id), None))
            self._expiring.add(group_id)
            self._append(group_id, tombstones, self._expired(group_id, doomed, goes))
        self._schedule_expiry()

    def _expired(self, group_id: str, doomed: list[tuple[str, int]],
                 goes: bool) -> Callable[[ErrorCode], None]:
        incarnation = self._incarnation(group_id)

        def done(error: ErrorCode) -> None:
            if self._incarnation(group_id) != incarnation:
                return  # its partition was unloaded meanwhile (`_expiring` with it)
            self._expiring.discard(group_id)
            if error != ErrorCode.NONE:
                return  # the next pass tries again
            offsets = self._offsets.get(group_id, {})
            for tp in doomed:
                offsets.pop(tp, None)
            group = self._groups.get(group_id)
            # A member may have joined, or an offset been committed, while the tombstones
            # were out: then the group stays (its metadata is written again as it changes).
            if goes and group is not None and group_expires(group, len(offsets)):
                group.delete()
                del self._groups[group_id]
                self._offsets.pop(group_id, None)
                self._set_timer(group_id, None)
            if doomed or goes:
                log.info("group %r: %d offset(s) expired%s", group_id, len(doomed),
                         "; group removed" if goes else "")

        return done

    # Groups -----------------------------------------------------------------------------------

    def _describe(self, m: DescribeGroups) -> None:
        described = []
        for group_id in m.group_ids:
            if not self._serves(group_id):
                described.append(_not_described(group_id, ErrorCode.NOT_COORDINATOR))
                continue
            group = self._groups.get(group_id)
            if group is None:
                described.append(GroupDescription(group_id, GroupState.DEAD.value, "", "", []))
                continue
            stable = group.state == GroupState.STABLE
            described.append(
                GroupDescription(
                    group_id,
                    group.state.value,
                    group.protocol_type or "",
                    (group.protocol_name or "") if stable else "",
                    group.describe(),
                )
            )
        m.reply(described)

    def _list(self, m: ListGroups) -> None:
        m.reply(
            [
                GroupListing(group_id, group.protocol_type or "", group.state.value)
                for group_id, group in self._groups.items()
                if group.state != GroupState.DEAD
            ]
        )

    def _delete_groups(self, m: DeleteGroups) -> None:
        results: list[ErrorCode | None] = [None] * len(m.group_ids)
        left = [len(m.group_ids)]

        def settle(index: int, error: ErrorCode) -> None:
            results[index] = error
            left[0] -= 1
            if left[0] == 0:
                m.reply([r if r is not None else ErrorCode.UNKNOWN_SERVER_ERROR for r in results])

        if not m.group_ids:
            m.reply([])
        for index, group_id in enumerate(m.group_ids):
            if not self._serves(group_id):
                settle(index, ErrorCode.NOT_COORDINATOR)
                continue
            group = self._groups.get(group_id)
            if group is None:
                settle(index, ErrorCode.GROUP_ID_NOT_FOUND)
                continue
            error = group.delete()
            if error != ErrorCode.NONE:
                settle(index, error)
                continue
            del self._groups[group_id]
            self._set_timer(group_id, None)
            offsets = self._offsets.pop(group_id, {})
            self._pending_txn.drop_group(group_id)  # as the load does at the tombstone
            tombstones: list[tuple[bytes, bytes | None]] = [(encode_group_key(group_id), None)]
            tombstones += [(encode_offset_key(group_id, t, p), None) for t, p in offsets]
            self._append(group_id, tombstones, _settler(settle, index))

    # Appending to `__consumer_offsets` --------------------------------------------------------

    def _append(
        self,
        group_id: str,
        records: Sequence[tuple[bytes, bytes | None]],
        done: Callable[[ErrorCode], None],
        producer: tuple[int, int] | None = None,
    ) -> None:
        """Append one batch to the group's offsets partition; `done(error)` runs later, in
        this actor, once it is produced (acks=-1) or has failed. `producer` (id, epoch): a
        transactional batch of that producer, with no sequence (the coordinator's own)."""
        me = self.actor_ref
        ref = self.services.partition(OFFSETS_TOPIC, self._partition_of(group_id))
        if ref is None:
            me.tell(_Appended(done, ErrorCode.NOT_COORDINATOR))
            return
        producer_id, producer_epoch = producer if producer is not None else (-1, -1)
        batch = build_batch([(key, value, ()) for key, value in records], base_timestamp=now_ms(),
                            producer_id=producer_id, producer_epoch=producer_epoch,
                            transactional=producer is not None)
        view = memoryview(batch)

        def produced(result: ProduceResult) -> None:
            if result.error != ErrorCode.NONE:
                log.warning(
                    "append to %s for group %r failed: %s",
                    OFFSETS_TOPIC,
                    group_id,
                    result.error.name,
                )
            me.tell(_Appended(done, result.error))

        message = Produce(view, iter_batches(view), -1, produced,
                          from_coordinator=producer is not None)
        if not _tell(ref, message):
            me.tell(_Appended(done, ErrorCode.NOT_COORDINATOR))


def _offset_values(entries: Sequence[CommitEntry], now: int
                   ) -> tuple[list[ErrorCode], list[tuple[tuple[str, int], OffsetValue]]]:
    """A commit's error per entry (metadata too long) and the values of the others."""
    errors = []
    values: list[tuple[tuple[str, int], OffsetValue]] = []
    for entry in entries:
        metadata = entry.metadata or ""
        if len(metadata) > limits.offset_metadata_chars_max:
            errors.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
            continue
        errors.append(ErrorCode.NONE)
        values.append(((entry.topic, entry.partition),
                       OffsetValue(entry.offset, entry.leader_epoch, metadata, now)))
    return errors, values


# The partition's transactional refusals reach the producer as they are (Kafka's storeOffsets
# passes them on): an older epoch fences it; the others are retriable or its own mistake.
_TXN_APPEND_ERRORS = {
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_TXN_STATE,
    ErrorCode.CONCURRENT_TRANSACTIONS,
}


def _txn_commit_error(error: ErrorCode) -> ErrorCode:
    return error if error in _TXN_APPEND_ERRORS else _commit_error(error)


def _not_described(group_id: str, error: ErrorCode) -> GroupDescription:
    return GroupDescription(group_id, "", "", "", [], error)


def _settler(settle: Callable[[int, ErrorCode], None], index: int) -> Callable[[ErrorCode], None]:
    return lambda error: settle(index, _commit_error(error))


def _metadata_error(error: ErrorCode) -> ErrorCode:
    """As `_commit_error`, but a group's metadata too large is no commit's fault (Kafka:
    UNKNOWN_SERVER_ERROR)."""
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE):
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return _commit_error(error)


def _release(held: list[Reply]) -> Callable[[ErrorCode], None]:
    """Send replies held behind a Persist; if it failed, each says so instead."""

    def done(error: ErrorCode) -> None:
        failed = _metadata_error(error)
        for effect in held:
            result = effect.result
            if error != ErrorCode.NONE and result.error == ErrorCode.NONE:
                result = replace(result, error=failed)
            effect.to(result)

    return done


def _tell(ref: ActorRef[Any], message: Any) -> bool:
    try:
        ref.tell(message)
    except ActorDeadError:
        return False
    return True


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _subscribed_topics(metadata: bytes) -> set[str]:
    """Topics in a ConsumerProtocolSubscription (v0-3 all start: version int16, topics
    [string]); an unreadable one subscribes to nothing."""
    topics: set[str] = set()
    try:
        position = 2
        (count,) = _I32.unpack_from(metadata, position)
        position += 4
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, position)
            position += 2
            topics.add(bytes(metadata[position : position + length]).decode())
            position += length
    except (struct.error, UnicodeDecodeError):
        pass
    return topics
