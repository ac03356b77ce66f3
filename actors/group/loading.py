"""Loading `__consumer_offsets` partitions: each read from its log start through its Partition
actor and replayed into the groups and offsets it describes, kept apart until the load is
whole and then handed to the coordinator.

Replay (`PartitionLoad.replay`) of groups, offsets and transactional ids: the last value per
key wins and a null value (a tombstone) deletes the key, as compaction would. A transactional
batch's offsets (TxnOffsetCommit) are pending for its producer (actors/group/txn_offsets.py)
until that producer's COMMIT control batch, which makes them committed, or its ABORT, which
drops them; a group's tombstone drops its pending ones too. Other control batches (a Raft
leader's LEADER_CHANGE) hold nothing for the coordinator. What is still pending at the end
stays pending: its marker comes later, and the Partition tells the coordinator (a marker that
lands while the load runs, past its target, is kept in `late_markers` and applied once the
replay is whole). A load is done once it has replayed up to its `target`, the log end the
partition had when the load began. On a new Raft leader that end includes entries not yet
committed; they are committed (by the leader's first entry of its term) before its high
watermark passes them, so a load reads only up to the high watermark and waits for it to reach
the target. What a load replays never touches the groups being served: a load cut short
(leadership moved again) is dropped whole.

    loader.start(p)  --PartitionInfo-->  target = next_offset
                     --Read(log start)-->  replay ... --Read(next)-->  replay
                     (high watermark short of the target: watch it, then read on)
                     offset >= target: done(load)      an error: failed(load, error, offset)

The `PartitionLoader` does the I/O for the coordinator actor: its answers come back to the
coordinator as messages (`LOADER_MESSAGES`), which the coordinator hands to `receive`; an
answer for a load that has since ended is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pykka import ActorDeadError

from actors.group import OFFSETS_TOPIC, limits
from actors.group.events import GroupSnapshot
from actors.group.log_records import (
    GroupKey,
    OffsetKey,
    OffsetValue,
    TransactionKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
    decode_transaction_value,
)
from actors.group.transactions import TxnMetadata
from actors.group.txn_offsets import PendingTxnOffsets
from actors.partition_messages import FetchBudget, PartitionInfo, Read, ReadResult
from actors.services import Services, now_ms
from actors.txn_state import COMMIT, marker_type
from actors.watermarks import Waiter
from storage import FileSlice
from wire.errors import DecodeError, ErrorCode
from wire.record_batch import batch_length_at
from wire.records import decode_batch

__all__ = ["LOADER_MESSAGES", "PartitionLoad", "PartitionLoader"]

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], OffsetValue]


class _LoadTarget(NamedTuple):
    """The Partition's PartitionInfo at the start of a load (None: it could not be asked)."""

    partition: int
    load_id: int
    info: dict[str, Any] | None


class _Loaded(NamedTuple):
    partition: int
    load_id: int
    offset: int
    result: ReadResult


class _Resume(NamedTuple):
    """The high watermark a load waits for has moved: read on at `offset`."""

    partition: int
    load_id: int
    offset: int


LOADER_MESSAGES = (_LoadTarget, _Loaded, _Resume)


@dataclass(slots=True)
class PartitionLoad:
    partition: int
    load_id: int  # answers that name an older load of the same partition are ignored
    started_ms: int
    target: int | None = None  # the log end to replay up to; None until the partition says
    offsets: dict[str, Offsets] = field(default_factory=dict)  # group id -> committed
    restored: dict[str, GroupSnapshot] = field(default_factory=dict)  # last metadata
    transactions: dict[str, TxnMetadata] = field(default_factory=dict)  # transactional ids
    pending: PendingTxnOffsets = field(default_factory=PendingTxnOffsets)  # TxnOffsetCommits
    # (producer id, commit) of markers that landed past the target while loading, in order.
    late_markers: list[tuple[int, bool]] = field(default_factory=list)
    # The epoch transaction markers carry while this load is served: the partition's leader
    # epoch as the load starts (its Raft term; 0 for a partition of one replica), as Kafka's
    # coordinator epoch is. A partition fences markers of an older one (producer_state.py).
    coordinator_epoch: int = 0
    waiter: Waiter | None = None  # set while it waits for the high watermark to move

    def cancel(self) -> None:
        if self.waiter is not None:
            self.waiter.cancel()
            self.waiter = None

    def replay(self, data: bytes, offset: int) -> int:
        """Apply the whole batches in `data` (read at `offset`); return the offset after the
        last one."""
        position = 0
        while True:
            size = batch_length_at(data, position)
            if size is None or position + size > len(data):
                return offset
            try:
                header, records = decode_batch(data[position : position + size])
            except DecodeError as e:
                log.error("%s-%d: bad batch at offset %d: %s; skipped", OFFSETS_TOPIC,
                          self.partition, offset, e)
                return offset
            if header.is_control:
                if header.producer_id >= 0 and header.next_offset > offset:
                    kind = marker_type(data[position : position + size])
                    if kind is not None:
                        self.end_transaction(header.producer_id, kind == COMMIT)
            else:
                producer_id = header.producer_id if header.is_transactional else -1
                for record in records:
                    if record.offset >= offset and record.key is not None:
                        self._replay_record(record.key, record.value, producer_id)
            offset = max(offset, header.next_offset)
            position += size

    def end_transaction(self, producer_id: int, commit: bool) -> None:
        """The producer's marker: its pending offsets become committed, or go."""
        ended = self.pending.end(producer_id, lambda _group: True, commit)
        for group_id, offsets in ended.items():
            self.offsets.setdefault(group_id, {}).update(offsets)

    def _replay_record(self, key_bytes: bytes, value: bytes | None, producer_id: int) -> None:
        """`producer_id`: the transactional batch's producer, else -1."""
        try:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetKey) and producer_id >= 0 and value is not None:
                tp = (key.topic, key.partition)
                self.pending.add(key.group_id, producer_id, [(tp, decode_offset_value(value))])
            elif isinstance(key, OffsetKey):
                offsets = self.offsets.setdefault(key.group_id, {})
                if value is None:
                    offsets.pop((key.topic, key.partition), None)
                else:
                    offsets[(key.topic, key.partition)] = decode_offset_value(value)
            elif isinstance(key, TransactionKey):
                if value is not None:
                    self.transactions[key.transactional_id] = decode_transaction_value(value)
                else:
                    self.transactions.pop(key.transactional_id, None)
            elif isinstance(key, GroupKey):
                if value is not None:
                    self.restored[key.group_id] = decode_group_value(value)
                else:
                    self.restored.pop(key.group_id, None)
                    self.pending.drop_group(key.group_id)
        except DecodeError as e:
            log.error("%s-%d: record does not decode: %s; skipped", OFFSETS_TOPIC,
                      self.partition, e)


class PartitionLoader:
    """The loads in progress of one coordinator, and their reads; see the module docstring."""

    def __init__(
        self,
        services: Services,
        coordinator: Any,
        done: Callable[[PartitionLoad], None],
        failed: Callable[[PartitionLoad, ErrorCode, int], None],
    ) -> None:
        """`coordinator`: the ActorRef the answers go to. `done(load)` and `failed(load,
        error, offset)` run in the coordinator once the load has left `loads`."""
        self.services = services
        self.loads: dict[int, PartitionLoad] = {}  # partition -> its load in progress
        self._coordinator = coordinator
        self._done = done
        self._failed = failed
        self._load_ids = 0

    def start(self, partition: int) -> None:
        assert partition not in self.loads, f"{OFFSETS_TOPIC}-{partition} loads twice"
        self._load_ids += 1
        load = PartitionLoad(partition, self._load_ids, now_ms())
        self.loads[partition] = load
        me, load_id = self._coordinator, load.load_id

        def answer(info: dict[str, Any] | None) -> None:
            _tell(me, _LoadTarget(partition, load_id, info))

        ref = self.services.partition(OFFSETS_TOPIC, partition)
        if ref is None or not _tell(ref, PartitionInfo(answer)):
            answer(None)

    def cancel(self, partition: int) -> bool:
        """Stop loading `partition`; False if it was not loading."""
        load = self.loads.pop(partition, None)
        if load is None:
            return False
        load.cancel()
        return True

    def cancel_all(self) -> None:
        for partition in list(self.loads):
            self.cancel(partition)

    def receive(self, message: Any) -> None:
        """One of `LOADER_MESSAGES`, come back to the coordinator."""
        if isinstance(message, _LoadTarget):
            self._on_target(message)
        elif isinstance(message, _Loaded):
            self._on_read(message)
        else:
            self._on_resume(message)

    def _on_target(self, m: _LoadTarget) -> None:
        load = self._current(m.partition, m.load_id)
        if load is None:
            return
        if m.info is None:
            self._fail(load, ErrorCode.NOT_LEADER_OR_FOLLOWER, 0)
            return
        load.target = int(m.info["next_offset"])
        load.coordinator_epoch = int(m.info["leader_epoch"])
        self._read(load, int(m.info["log_start_offset"]))

    def _on_read(self, m: _Loaded) -> None:
        load = self._current(m.partition, m.load_id)
        if load is None:
            return
        result = m.result
        if result.error == ErrorCode.OFFSET_OUT_OF_RANGE and m.offset < result.log_start_offset:
            self._read(load, result.log_start_offset)  # the log start moved meanwhile
            return
        if result.error != ErrorCode.NONE:
            self._fail(load, result.error, m.offset)
            return
        next_offset = m.offset
        if result.records is not None:
            records = result.records
            data = records.read() if isinstance(records, FileSlice) else bytes(records)
            next_offset = load.replay(data, m.offset)
        assert load.target is not None, "a read before the load's target was known"
        if next_offset >= load.target:
            self._finish(load)
        elif next_offset > m.offset:
            self._read(load, next_offset)
        elif result.high_watermark < load.target:
            self._await_watermark(load, next_offset, result.high_watermark)
        else:
            log.warning("%s-%d: load stopped at %d, short of %d", OFFSETS_TOPIC,
                        load.partition, next_offset, load.target)
            self._finish(load)

    def _on_resume(self, m: _Resume) -> None:
        load = self._current(m.partition, m.load_id)
        if load is not None:
            load.waiter = None
            self._read(load, m.offset)

    def _current(self, partition: int, load_id: int) -> PartitionLoad | None:
        load = self.loads.get(partition)
        return load if load is not None and load.load_id == load_id else None

    def _read(self, load: PartitionLoad, offset: int) -> None:
        me, partition, load_id = self._coordinator, load.partition, load.load_id
        size = limits.load_read_bytes_max

        def reply(result: ReadResult) -> None:
            _tell(me, _Loaded(partition, load_id, offset, result))

        ref = self.services.partition(OFFSETS_TOPIC, partition)
        if ref is None or not _tell(ref, Read(offset, size, -1, FetchBudget(size), reply)):
            reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _await_watermark(self, load: PartitionLoad, offset: int, seen: int) -> None:
        """The rest up to the target is not committed yet (a new leader's first entry of
        its term is on its way to a quorum): read on once the high watermark moves."""
        me, resume = self._coordinator, _Resume(load.partition, load.load_id, offset)

        def wake() -> None:
            _tell(me, resume)

        load.waiter = Waiter(wake)
        key = (OFFSETS_TOPIC, load.partition)
        if not self.services.long_polls.watch(key, seen, load.waiter):
            load.waiter = None
            self._read(load, offset)  # it moved already

    def marker(self, partition: int, producer_id: int, commit: bool, offset: int) -> None:
        """A transaction marker at `offset` landed on `partition` while it loads: one below
        the target is replayed anyway; one past it is applied once the replay is whole (the
        offsets it ends may not be replayed yet). If the last read went past the target and
        replayed it too, applying it again ends nothing: the producer's next offsets on this
        partition wait for the load. Too many: the load starts again."""
        load = self.loads.get(partition)
        if load is None or load.target is not None and offset < load.target:
            return
        if len(load.late_markers) >= limits.load_late_markers_max:
            log.warning("%s-%d: %d markers while loading; the load starts again",
                        OFFSETS_TOPIC, partition, len(load.late_markers))
            self.cancel(partition)
            self.start(partition)
            return
        load.late_markers.append((producer_id, commit))

    def _finish(self, load: PartitionLoad) -> None:
        del self.loads[load.partition]
        for producer_id, commit in load.late_markers:
            load.end_transaction(producer_id, commit)
        load.late_markers.clear()
        self._done(load)

    def _fail(self, load: PartitionLoad, error: ErrorCode, offset: int) -> None:
        del self.loads[load.partition]
        load.cancel()
        self._failed(load, error, offset)


def _tell(ref: Any, message: Any) -> bool:
    try:
        ref.tell(message)
    except ActorDeadError:
        return False
    return True
