"""The GroupCoordinator actor: one per shard, owner of the groups whose offsets partition
(`offsets_partition(group_id, N)` of `__consumer_offsets`) that shard owns.

It keeps every such group's state machine (`actors.group.state.Group`) and committed offsets,
runs the state machines' effects — replies, timers on the shard loop, and metadata appended to
`__consumer_offsets` — and persists before it answers: an OffsetCommit, a completed SyncGroup
or a DeleteGroups is answered only once the Partition actor says the records are produced
(acks=-1). Records use Kafka's byte layouts (`log_records`).

The actor keeps its mailbox, the queue of requests waiting for a load, ownership, the ends of
loads and the one I/O every piece shares (`_append`); what it serves is decided by pieces it
dispatches to, each handed only the callables it needs (never this class):

    membership.py   the groups' state machines, their effects and timers; Describe/ListGroups
    offsets.py      committed and transactional offsets, OffsetDelete, DeleteGroups, expiry
    requests.py     which groups a request waits for, and how one is refused
    loading.py      reading an offsets partition back (the `PartitionLoader`)
    txn_coordinator.py   the transaction requests (below)

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

import collections
import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pykka import ActorDeadError, ActorRef

from actors.controller import CreateTopics, TopicResult, TopicSpec
from actors.group import OFFSETS_TOPIC, limits, offsets_partition
from actors.group.appends import commit_error
from actors.group.loading import LOADER_MESSAGES, PartitionLoad, PartitionLoader
from actors.group.membership import Membership
from actors.group.messages import (
    CommitOffsets,
    DeleteGroups,
    DeleteOffsets,
    DescribeGroups,
    EnsureReady,
    FetchOffsets,
    ListGroups,
    OffsetsOwnership,
    TxnCommitOffsets,
    TxnOffsetsMarker,
)
from actors.group.offsets import GroupOffsets
from actors.group.requests import group_ids_of, refuse
from actors.group.state import Heartbeat, Join, Leave, Sync
from actors.group.txn_coordinator import TXN_MESSAGES, TXN_REQUESTS, TxnCoordinator
from actors.partition_messages import Produce, ProduceResult
from actors.runtime import LoopActor
from actors.services import Services, now_ms
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

__all__ = ["GroupCoordinator"]  # its messages are in actors.group.messages

log = logging.getLogger(__name__)


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


# The actor ------------------------------------------------------------------------------------


class GroupCoordinator(LoopActor):
    def __init__(self, services: Services, owns: Callable[[int], bool]) -> None:
        """`owns(p)`: is partition p of `__consumer_offsets` this shard's? It decides until
        the first `OffsetsOwnership` arrives, which replaces it for good."""
        super().__init__()
        self.services = services
        self._owns = owns
        self._owned: frozenset[int] | None = None  # from OffsetsOwnership; None: `owns`
        self._phase = _Phase.NEW
        self._partition_count = 0  # of `__consumer_offsets`, once READY
        self._loader = PartitionLoader(services, self.actor_ref, self._load_done,
                                       self._load_failed)
        self._loads = self._loader.loads  # partitions loading (the loader's)
        self._loaded: dict[int, int] = {}  # partitions served -> the load that made them
        self._failed: set[int] = set()  # loads failed since the last OffsetsOwnership
        self._waiting: collections.deque[Any] = collections.deque()
        self._membership = Membership(services.settings.group_initial_rebalance_delay_ms,
                                      self._append, self.call_later, self.actor_stopped.is_set)
        self._offsets = GroupOffsets(services, self._membership, self._append,
                                     self._incarnation, self._serves, self.call_later)
        self._txns = TxnCoordinator(services, self, self._append, self._partition_of,
                                    self._incarnation, commit_error)
        membership, offsets = self._membership, self._offsets
        self._handlers: dict[type, Callable[[Any], None]] = {
            Join: membership.event,
            Sync: membership.event,
            Heartbeat: membership.event,
            Leave: membership.event,
            EnsureReady: self._ensure_ready,
            CommitOffsets: offsets.commit,
            TxnCommitOffsets: offsets.txn_commit,
            FetchOffsets: offsets.fetch,
            DescribeGroups: lambda m: membership.describe(m, self._serves),
            ListGroups: membership.list,
            DeleteGroups: offsets.delete_groups,
            DeleteOffsets: offsets.delete_offsets,
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
            self.services.metrics.register("groups", self._offsets.snapshot)
        if OFFSETS_TOPIC in self.services.topics().topics:
            self._find_topic()

    def on_stop(self) -> None:
        self._offsets.stop()
        self._membership.stop()
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
        group_ids = group_ids_of(message)
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
        gone = [g for g in self._membership.groups.keys() | self._offsets.offsets.keys()
                if self._partition_of(g) == partition]
        for group_id in gone:
            self._offsets.forget(group_id)
            self._membership.unload(group_id)
        self._offsets.pending_txn.forget(lambda g: self._partition_of(g) == partition)
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
        self._offsets.offsets.update(load.offsets)
        self._membership.restore(load.restored, now)
        for group_id, offsets in load.offsets.items():
            if offsets:
                self._membership.group(group_id)
        self._offsets.pending_txn.absorb(load.pending)
        self._txns.loaded(load.partition, load.coordinator_epoch, load.transactions)
        self._offsets.start_expiry()
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
        else:
            refuse(message, error)

    def _ensure_ready(self, m: EnsureReady) -> None:
        m.reply(ErrorCode.NONE)  # dispatched only once its partition (or every one) loaded

    def _txn_marker(self, m: TxnOffsetsMarker) -> None:
        """A producer's marker is committed on an offsets partition of this shard: its pending
        offsets of that partition's groups are committed now, or dropped."""
        if m.partition in self._loads:
            self._loader.marker(m.partition, m.producer_id, m.commit, m.offset)
            return
        if m.partition not in self._loaded:
            return  # not served: its next load replays the marker
        self._offsets.marker(m, lambda g: self._partition_of(g) == m.partition)

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


def _tell(ref: ActorRef[Any], message: Any) -> bool:
    try:
        ref.tell(message)
    except ActorDeadError:
        return False
    return True
