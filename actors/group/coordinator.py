"""The GroupCoordinator actor: one per shard, owner of the groups whose offsets partition
(`offsets_partition(group_id, N)` of `__consumer_offsets`) that shard owns.

It keeps every such group's state machine (`actors.group.state.Group`) and committed offsets,
runs the state machines' effects — replies, timers on the shard loop, and metadata appended to
`__consumer_offsets` — and persists before it answers: an OffsetCommit, a completed SyncGroup
or a DeleteGroups is answered only once the Partition actor says the records are produced
(acks=-1). Records use Kafka's byte layouts (`log_records`).

Start-up: if `__consumer_offsets` exists, each of this shard's partitions of it is read from
its start through the Partition actor and replayed (last value per key wins; null deletes) to
rebuild groups and offsets. Otherwise the topic is created through the Controller on the first
group request. Requests that arrive before that is done wait in a bounded queue and are served
in arrival order.

Handlers find the coordinator with `Services.group_coordinator(group_id)`; the messages below
carry plain values and a reply callback, so on another shard only the ActorRef differs.
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
from actors.group.log_records import (
    GroupKey,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from actors.group.messages import (
    CommitOffsets,
    DeleteGroups,
    DeleteOffsets,
    DescribeGroups,
    EnsureReady,
    FetchedOffset,
    FetchOffsets,
    GroupDescription,
    GroupListing,
    ListGroups,
)
from actors.group.state import (
    Group,
    GroupSnapshot,
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
from actors.partition import FetchBudget, Produce, ProduceResult, Read, ReadResult
from actors.runtime import LoopActor
from actors.services import Services, now_ms
from storage import FileSlice
from wire.errors import DecodeError, ErrorCode
from wire.record_batch import batch_length_at, iter_batches
from wire.records import build_batch, decode_batch

__all__ = ["GroupCoordinator"]  # its messages are in actors.group.messages

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_TYPE = "consumer"


# Messages -----------------------------------------------------------------------------------


class _Created(NamedTuple):
    results: list[TopicResult]


class _Loaded(NamedTuple):
    partition: int
    offset: int
    result: ReadResult


class _Appended(NamedTuple):
    done: Callable[[ErrorCode], None]
    error: ErrorCode


class _Phase(enum.Enum):
    NEW = "new"  # nothing loaded; the topic may not exist yet
    CREATING = "creating"
    LOADING = "loading"
    READY = "ready"


_RETRIABLE_APPEND_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


def _commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka maps append failures to coordinator errors the client knows how to retry."""
    if error == ErrorCode.NONE:
        return error
    return _RETRIABLE_APPEND_ERRORS.get(error, ErrorCode.COORDINATOR_NOT_AVAILABLE)


# The actor ------------------------------------------------------------------------------------


class GroupCoordinator(LoopActor):
    def __init__(self, services: Services, owns: Callable[[int], bool]) -> None:
        """`owns(p)`: is partition p of `__consumer_offsets` this shard's to load?"""
        super().__init__()
        self.services = services
        self._owns = owns
        self._initial_delay_ms = services.settings.group_initial_rebalance_delay_ms
        self._groups: dict[str, Group] = {}
        self._offsets: dict[str, dict[tuple[str, int], OffsetValue]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._phase = _Phase.NEW
        self._waiting: collections.deque[Any] = collections.deque()
        self._loads_left = 0
        self._load_started_ms = 0
        self._restored: dict[str, GroupSnapshot] = {}  # group metadata seen while loading
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiring: set[str] = set()  # groups whose expiry tombstones are being appended
        self._handlers: dict[type, Callable[[Any], None]] = {
            Join: self._group_event,
            Sync: self._group_event,
            Heartbeat: self._group_event,
            Leave: self._group_event,
            EnsureReady: self._ensure_ready,
            CommitOffsets: self._commit,
            FetchOffsets: self._fetch,
            DescribeGroups: self._describe,
            ListGroups: self._list,
            DeleteGroups: self._delete_groups,
            DeleteOffsets: self._delete_offsets,
        }

    def __str__(self) -> str:
        return "GroupCoordinator"

    # Lifecycle --------------------------------------------------------------------------------

    def on_start(self) -> None:
        if self.services.metrics is not None:
            self.services.metrics.register("groups", self._groups_snapshot)
        if OFFSETS_TOPIC in self.services.topics().topics:
            self._begin_load()

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
        self._waiting.clear()

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is _Appended:
            message.done(message.error)
            return None
        if kind is _Loaded:
            return self._loaded(message)
        if kind is _Created:
            return self._created(message)
        handler = self._handlers.get(kind)
        if handler is None:
            return super().on_receive(message)
        if self._phase != _Phase.READY:
            self._wait(message)
            return None
        return handler(message)

    def _wait(self, message: Any) -> None:
        if len(self._waiting) >= limits.requests_waiting_for_load_max:
            self._answer_unready(message, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            return
        self._waiting.append(message)
        self._begin_load()

    # Creating and loading `__consumer_offsets` ------------------------------------------------

    def _begin_load(self) -> None:
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
        self._phase = _Phase.LOADING
        info = table.topics[OFFSETS_TOPIC]
        refs = [
            (p, self.services.partition(OFFSETS_TOPIC, p))
            for p in range(info.partitions)
            if self._owns(p)
        ]
        local = [(p, ref) for p, ref in refs if ref is not None]
        self._loads_left = len(local)
        self._load_started_ms = now_ms()
        for p, ref in local:
            self._read(p, ref, 0)
        if not local:
            self._become_ready()

    def _created(self, m: _Created) -> None:
        result = m.results[0]
        if result.error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            log.error("cannot create %s: %s %s", OFFSETS_TOPIC, result.error.name, result.message)
            self._phase = _Phase.NEW
            waiting, self._waiting = self._waiting, collections.deque()
            for message in waiting:
                self._answer_unready(message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return
        self._phase = _Phase.NEW
        self._begin_load()

    def _read(self, partition: int, ref: ActorRef[Any], offset: int) -> None:
        me = self.actor_ref
        size = limits.load_read_bytes_max

        def reply(result: ReadResult) -> None:
            me.tell(_Loaded(partition, offset, result))

        if not _tell(ref, Read(offset, size, -1, FetchBudget(size), reply)):
            reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _loaded(self, m: _Loaded) -> None:
        result = m.result
        ref = self.services.partition(OFFSETS_TOPIC, m.partition)
        if result.error == ErrorCode.OFFSET_OUT_OF_RANGE and m.offset < result.log_start_offset:
            if ref is not None:
                self._read(m.partition, ref, result.log_start_offset)
                return
        if result.error != ErrorCode.NONE:
            log.error(
                "loading %s-%d at %d: %s", OFFSETS_TOPIC, m.partition, m.offset, result.error.name
            )
            self._partition_loaded()
            return
        next_offset = m.offset
        if result.records is not None:
            records = result.records
            data = records.read() if isinstance(records, FileSlice) else bytes(records)
            next_offset = self._replay(data, m.offset)
        if next_offset >= result.high_watermark or next_offset == m.offset or ref is None:
            self._partition_loaded()
        else:
            self._read(m.partition, ref, next_offset)

    def _replay(self, data: bytes, offset: int) -> int:
        """Apply the whole batches in `data`; return the offset after the last one."""
        position = 0
        while True:
            size = batch_length_at(data, position)
            if size is None or position + size > len(data):
                return offset
            try:
                header, records = decode_batch(data[position : position + size])
            except DecodeError as e:
                log.error("%s: bad batch at offset %d: %s; skipped", OFFSETS_TOPIC, offset, e)
                return offset
            for record in records:
                if record.offset >= offset and record.key is not None:
                    self._replay_record(record.key, record.value)
            offset = max(offset, header.next_offset)
            position += size

    def _replay_record(self, key_bytes: bytes, value: bytes | None) -> None:
        try:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetKey):
                offsets = self._offsets.setdefault(key.group_id, {})
                if value is None:
                    offsets.pop((key.topic, key.partition), None)
                else:
                    offsets[(key.topic, key.partition)] = decode_offset_value(value)
            elif isinstance(key, GroupKey):
                if value is not None:
                    self._restored[key.group_id] = decode_group_value(value)
                else:
                    self._restored.pop(key.group_id, None)
        except DecodeError as e:
            log.error("%s: record does not decode: %s; skipped", OFFSETS_TOPIC, e)

    def _partition_loaded(self) -> None:
        self._loads_left -= 1
        if self._loads_left == 0:
            self._become_ready()

    def _become_ready(self) -> None:
        now = now_ms()
        restored, self._restored = self._restored, {}
        for group_id, snapshot in restored.items():
            group = self._group(group_id)
            group.restore(snapshot, now)
            self._run(group, group.tick(now))
        for group_id, offsets in self._offsets.items():
            if offsets:
                self._group(group_id)
        self._phase = _Phase.READY
        self._schedule_expiry()
        log.info(
            "group coordinator ready in %d ms: %d groups, %d with offsets",
            now - self._load_started_ms if self._load_started_ms else 0,
            len(self._groups),
            sum(1 for o in self._offsets.values() if o),
        )
        waiting, self._waiting = self._waiting, collections.deque()
        for message in waiting:
            self.on_receive(message)

    def _answer_unready(self, message: Any, error: ErrorCode) -> None:
        """Answer a request that cannot wait for the load with `error`."""
        if isinstance(message, Join):
            message.reply(JoinResult(error, member_id=message.member_id))
        elif isinstance(message, Sync):
            message.reply(SyncResult(error))
        elif isinstance(message, Heartbeat):
            message.reply(HeartbeatResult(error))
        elif isinstance(message, Leave):
            message.reply(LeaveResult(error))
        elif isinstance(message, EnsureReady):
            message.reply(error)
        elif isinstance(message, CommitOffsets):
            message.reply([error] * len(message.entries))
        elif isinstance(message, DeleteGroups):
            message.reply([error] * len(message.group_ids))
        elif isinstance(message, DeleteOffsets):
            message.reply(error, [error] * len(message.partitions))
        elif isinstance(message, FetchOffsets | DescribeGroups | ListGroups):
            message.reply([])

    # Group membership ---------------------------------------------------------------------------

    def _group(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id, self._initial_delay_ms)
        return group

    def _ensure_ready(self, m: EnsureReady) -> None:
        m.reply(ErrorCode.NONE)

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
        now = now_ms()
        errors = []
        records = []
        values: list[tuple[tuple[str, int], OffsetValue]] = []
        for entry in m.entries:
            metadata = entry.metadata or ""
            if len(metadata) > limits.offset_metadata_chars_max:
                errors.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
                continue
            errors.append(ErrorCode.NONE)
            value = OffsetValue(entry.offset, entry.leader_epoch, metadata, now)
            values.append(((entry.topic, entry.partition), value))
            records.append(
                (
                    encode_offset_key(m.group_id, entry.topic, entry.partition),
                    encode_offset_value(value),
                )
            )
        if not records:
            m.reply(errors)
            return

        def appended(error: ErrorCode) -> None:
            if error == ErrorCode.NONE:
                self._offsets.setdefault(m.group_id, {}).update(values)
                m.reply(errors)
            else:
                failed = _commit_error(error)
                m.reply([failed if e == ErrorCode.NONE else e for e in errors])

        self._append(m.group_id, records, appended)

    def _fetch(self, m: FetchOffsets) -> None:
        offsets = self._offsets.get(m.group_id, {})
        if m.partitions is None:
            m.reply([FetchedOffset(t, p, v) for (t, p), v in sorted(offsets.items())])
        else:
            m.reply([FetchedOffset(t, p, offsets.get((t, p))) for t, p in m.partitions])

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
            if group_id in self._expiring:
                continue
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
        def done(error: ErrorCode) -> None:
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
            tombstones: list[tuple[bytes, bytes | None]] = [(encode_group_key(group_id), None)]
            tombstones += [(encode_offset_key(group_id, t, p), None) for t, p in offsets]
            self._append(group_id, tombstones, _settler(settle, index))

    # Appending to `__consumer_offsets` --------------------------------------------------------

    def _append(
        self,
        group_id: str,
        records: Sequence[tuple[bytes, bytes | None]],
        done: Callable[[ErrorCode], None],
    ) -> None:
        """Append one batch to the group's offsets partition; `done(error)` runs later, in
        this actor, once it is produced (acks=-1) or has failed."""
        me = self.actor_ref
        info = self.services.topics().topics.get(OFFSETS_TOPIC)
        ref = None
        if info is not None:
            partition = offsets_partition(group_id, info.partitions)
            ref = self.services.partition(OFFSETS_TOPIC, partition)
        if ref is None:
            me.tell(_Appended(done, ErrorCode.NOT_COORDINATOR))
            return
        batch = build_batch([(key, value, ()) for key, value in records], base_timestamp=now_ms())
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

        if not _tell(ref, Produce(view, iter_batches(view), -1, produced)):
            me.tell(_Appended(done, ErrorCode.NOT_COORDINATOR))


def _settler(settle: Callable[[int, ErrorCode], None], index: int) -> Callable[[ErrorCode], None]:
    return lambda error: settle(index, _commit_error(error))


def _release(held: list[Reply]) -> Callable[[ErrorCode], None]:
    """Send replies held behind a Persist; if it failed, each says so instead."""

    def done(error: ErrorCode) -> None:
        failed = _commit_error(error)
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
