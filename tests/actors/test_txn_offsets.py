"""Transactional offset commits waiting for their marker: the pure table
(actors/group/txn_offsets.py), a load's replay of interleaved transactions
(actors/group/loading.py), and the partition's epoch-only check of the coordinator's batches
(actors/producer_state.py)."""

from __future__ import annotations

from actors.group.loading import PartitionLoad
from actors.group.log_records import (
    OffsetValue,
    encode_group_key,
    encode_offset_key,
    encode_offset_value,
)
from actors.group.txn_offsets import PendingTxnOffsets
from actors.producer_state import ProducerStateTable
from actors.txn_state import marker_batch
from wire.errors import ErrorCode
from wire.records import build_batch


def _value(offset: int) -> OffsetValue:
    return OffsetValue(offset, -1, "", 1000)


def _everywhere(_group: str) -> bool:
    return True


# The table ----------------------------------------------------------------------------------


def test_commit_returns_the_pending_offsets_and_forgets_them() -> None:
    table = PendingTxnOffsets()
    table.add("g", 7, [(("t", 0), _value(3)), (("t", 1), _value(4))])
    table.add("g", 7, [(("t", 0), _value(5))])  # a later commit in the same transaction
    assert table.has_pending("g", ("t", 0)) and not table.has_pending("g", ("t", 2))
    assert table.pending_count(7) == 2
    assert table.end(7, _everywhere, commit=True) == {
        "g": {("t", 0): _value(5), ("t", 1): _value(4)}}
    assert len(table) == 0 and not table.has_group("g")
    assert table.end(7, _everywhere, commit=True) == {}  # a marker written twice


def test_abort_drops_them() -> None:
    table = PendingTxnOffsets()
    table.add("g", 7, [(("t", 0), _value(3))])
    table.add("g", 8, [(("t", 0), _value(9))])
    assert table.end(7, _everywhere, commit=False) == {}
    assert table.has_pending("g", ("t", 0))  # producer 8's still
    assert table.end(8, _everywhere, commit=True) == {"g": {("t", 0): _value(9)}}


def test_a_marker_ends_only_its_partitions_groups() -> None:
    table = PendingTxnOffsets()
    table.add("a", 7, [(("t", 0), _value(1))])
    table.add("b", 7, [(("t", 0), _value(2))])
    assert table.end(7, lambda g: g == "a", commit=True) == {"a": {("t", 0): _value(1)}}
    assert table.pending_count(7) == 1 and table.has_group("b")
    table.forget(lambda g: g == "b")
    assert len(table) == 0


def test_dropping_a_group_drops_its_pending_offsets() -> None:
    table = PendingTxnOffsets()
    table.add("g", 7, [(("t", 0), _value(1))])
    table.add("h", 7, [(("t", 0), _value(2))])
    table.drop_group("g")
    assert table.end(7, _everywhere, commit=True) == {"h": {("t", 0): _value(2)}}


def test_limits() -> None:
    table = PendingTxnOffsets(per_producer_max=2, producers_max=1)
    assert table.admits("g", 7, [("t", 0), ("t", 1)]) == ErrorCode.NONE
    table.add("g", 7, [(("t", 0), _value(1)), (("t", 1), _value(1))])
    assert table.admits("g", 7, [("t", 1)]) == ErrorCode.NONE  # replaces one: no growth
    assert table.admits("g", 7, [("t", 2)]) == ErrorCode.INVALID_REQUEST
    assert table.admits("g", 8, [("t", 0)]) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    table.end(7, _everywhere, commit=False)
    assert table.admits("g", 8, [("t", 0)]) == ErrorCode.NONE


def test_absorb_takes_a_loads_pending_offsets() -> None:
    served, loaded = PendingTxnOffsets(), PendingTxnOffsets()
    served.add("a", 7, [(("t", 0), _value(1))])
    loaded.add("b", 7, [(("t", 1), _value(2))])
    served.absorb(loaded)
    assert served.pending_count(7) == 2
    assert served.end(7, _everywhere, commit=True) == {
        "a": {("t", 0): _value(1)}, "b": {("t", 1): _value(2)}}


# Replay -------------------------------------------------------------------------------------


class _Log:
    """Batches of an offsets partition, laid end to end as a load reads them."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.next_offset = 0

    def offsets(self, group: str, offsets: dict[int, int], producer_id: int = -1) -> None:
        records = [(encode_offset_key(group, "t", p), encode_offset_value(_value(o)), ())
                   for p, o in offsets.items()]
        self._add(build_batch(records, base_offset=self.next_offset, base_timestamp=1000,
                              producer_id=producer_id, producer_epoch=0 if producer_id >= 0
                              else -1, transactional=producer_id >= 0), len(records))

    def tombstone(self, group: str) -> None:
        self._add(build_batch([(encode_group_key(group), None, ())],
                              base_offset=self.next_offset, base_timestamp=1000), 1)

    def marker(self, producer_id: int, commit: bool) -> None:
        batch = marker_batch(producer_id, 0, commit, 0, 1000)
        batch[0:8] = self.next_offset.to_bytes(8, "big")  # its base offset
        self._add(batch, 1)

    def _add(self, batch: bytearray, count: int) -> None:
        self.data += batch
        self.next_offset += count


def _replayed(log: _Log) -> PartitionLoad:
    load = PartitionLoad(0, 1, 0)
    assert load.replay(bytes(log.data), 0) == log.next_offset
    return load


def test_replay_commits_on_commit_markers_and_drops_on_aborts() -> None:
    log = _Log()
    log.offsets("g", {0: 1, 1: 1})  # plain commits
    log.offsets("g", {0: 10}, producer_id=7)
    log.offsets("g", {1: 20}, producer_id=8)
    log.offsets("g", {0: 11}, producer_id=7)
    log.marker(8, commit=False)
    log.offsets("h", {0: 30}, producer_id=9)
    log.marker(7, commit=True)
    log.offsets("g", {1: 21}, producer_id=8)  # producer 8's next transaction: still open
    load = _replayed(log)
    assert {tp: v.offset for tp, v in load.offsets["g"].items()} == {("t", 0): 11, ("t", 1): 1}
    assert "h" not in load.offsets
    assert load.pending.has_pending("g", ("t", 1)) and load.pending.has_pending("h", ("t", 0))
    assert load.pending.pending_count(7) == 0


def test_replay_group_tombstone_drops_pending_offsets() -> None:
    log = _Log()
    log.offsets("g", {0: 10}, producer_id=7)
    log.tombstone("g")
    log.marker(7, commit=True)
    load = _replayed(log)
    assert not load.offsets.get("g") and len(load.pending) == 0


def test_late_markers_apply_after_the_replay() -> None:
    log = _Log()
    log.offsets("g", {0: 10}, producer_id=7)
    load = _replayed(log)
    load.late_markers.append((7, True))
    for producer_id, commit in load.late_markers:
        load.end_transaction(producer_id, commit)
    assert load.offsets["g"][("t", 0)].offset == 10


# The partition's check of the coordinator's batches -----------------------------------------


def test_a_batch_with_no_sequence_is_checked_for_its_epoch_only() -> None:
    table = ProducerStateTable()
    assert table.check_epoch(7, 0) is None  # unknown here
    table.no_sequence(7, 1)
    assert table.epoch_of(7) == 1
    assert table.check_epoch(7, 1) is None
    assert table.check_epoch(7, 0) == ErrorCode.INVALID_PRODUCER_EPOCH
    table.no_sequence(7, 1)  # the same epoch again: still fine
    assert table.check_epoch(7, 2) is None
