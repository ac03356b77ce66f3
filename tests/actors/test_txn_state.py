"""A partition's transaction table (actors/txn_state.py), transition by transition, and a
model check: whatever the appends, commits, cuts and log-start moves, the table answers as
one rebuilt from the log that is left, and as a naive reading of that log."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import limits
from actors.producer_state import ProducerStateTable
from actors.txn_state import ABORT, COMMIT, TxnState, marker_batch, marker_type
from wire.errors import ErrorCode
from wire.records import build_batch, decode_batch

pytestmark = pytest.mark.timeout(60)


def test_a_transaction_holds_the_last_stable_offset_until_its_marker_is_committed() -> None:
    txns = TxnState()
    assert txns.last_stable_offset(10, 0) == 10
    txns.data_batch(7, 10)
    txns.data_batch(7, 12)  # the same transaction goes on
    assert txns.is_open(7)
    assert txns.last_stable_offset(14, 0) == 10
    txns.marker(7, 14, aborted=False)
    assert not txns.is_open(7)
    assert txns.last_stable_offset(14, 0) == 10  # the marker is not committed yet
    txns.committed(15)
    assert txns.last_stable_offset(15, 0) == 15
    assert txns.aborted() == []  # a commit lists nothing


def test_an_abort_is_listed_once_committed_for_reads_that_overlap_it() -> None:
    txns = TxnState()
    txns.data_batch(7, 3)
    txns.data_batch(8, 5)
    txns.marker(7, 6, aborted=True)
    txns.committed(7)
    assert txns.last_stable_offset(7, 0) == 5  # producer 8's is still open
    assert txns.aborted_between(0, 5) == [(7, 3)]
    assert txns.aborted_between(6, 7) == [(7, 3)]  # the marker itself overlaps
    assert txns.aborted_between(7, 100) == []  # ended before
    assert txns.aborted_between(0, 3) == []  # begins after
    txns.marker(8, 7, aborted=True)
    txns.committed(8)
    assert txns.aborted_between(0, 8) == [(7, 3), (8, 5)]
    assert txns.last_stable_offset(8, 0) == 8


def test_the_lso_never_passes_the_high_watermark_nor_falls_below_the_log_start() -> None:
    txns = TxnState()
    txns.data_batch(1, 20)
    assert txns.last_stable_offset(15, 0) == 15  # opened above the high watermark
    assert txns.last_stable_offset(30, 25) == 25  # DeleteRecords passed its first offset


def test_a_marker_without_an_open_transaction_lists_nothing() -> None:
    txns = TxnState()
    txns.marker(7, 4, aborted=True)
    txns.committed(5)
    assert txns.aborted() == [] and txns.last_stable_offset(5, 0) == 5


def test_the_log_start_drops_aborted_transactions_that_end_below_it() -> None:
    txns = TxnState()
    for pid, first, last in [(1, 0, 2), (2, 3, 5), (3, 6, 8)]:
        txns.data_batch(pid, first)
        txns.marker(pid, last, aborted=True)
    txns.committed(9)
    txns.log_start_moved(6)
    assert [a.producer_id for a in txns.aborted()] == [3]


def test_aborted_entries_past_the_limit_forget_the_oldest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "aborted_transactions_per_partition_max", 3)
    txns = TxnState()
    for i in range(5):
        txns.data_batch(i, 2 * i)
        txns.marker(i, 2 * i + 1, aborted=True)
    txns.committed(10)
    assert [a.producer_id for a in txns.aborted()] == [2, 3, 4]
    assert txns.aborted_forgotten == 2


def test_open_transactions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "transactions_open_per_partition_max", 2)
    txns = TxnState()
    txns.data_batch(1, 0)
    txns.data_batch(2, 1)
    assert txns.may_open(1) and txns.may_open(2)  # theirs go on
    assert not txns.may_open(3)
    txns.marker(1, 2, aborted=False)
    assert txns.may_open(3)


def test_a_cut_marker_reopens_its_transaction() -> None:
    txns = TxnState()
    txns.data_batch(7, 0)
    txns.data_batch(8, 1)
    txns.marker(7, 2, aborted=True)
    txns.committed(3)
    txns.forget_from(2)  # the marker is gone (a failed flush, a Raft cut)
    assert txns.is_open(7) and txns.aborted() == []
    assert txns.last_stable_offset(2, 0) == 0
    txns.forget_from(1)  # producer 8's first batch is gone too
    assert not txns.is_open(8) and txns.is_open(7)


@pytest.mark.parametrize("commit", [True, False])
def test_a_marker_batch_is_kafkas_end_transaction_marker(commit: bool) -> None:
    batch = marker_batch(1000, 3, commit, coordinator_epoch=9, timestamp_ms=1234)
    header, records = decode_batch(batch)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1000, 3, -1)
    assert len(records) == 1 and records[0].timestamp == 1234
    kind = COMMIT if commit else ABORT
    assert records[0].key == kind.to_bytes(4, "big")  # int16 version 0, int16 type
    assert records[0].value == b"\x00\x00" + (9).to_bytes(4, "big")  # version 0, epoch
    assert marker_type(batch) == kind


def test_other_batches_are_not_markers() -> None:
    assert marker_type(build_batch([(b"k", b"v", [])], producer_id=1, producer_epoch=0,
                                    base_sequence=0, transactional=True)) is None
    leader_change = build_batch([(b"\x00\x00\x00\x02", b"", [])], control=True)
    assert marker_type(leader_change) is None
    assert marker_type(b"not a batch") is None


def test_a_marker_of_a_newer_epoch_bumps_the_producer() -> None:
    producers = ProducerStateTable()
    producers.record(7, 0, 0, 0, 4)
    producers.marker(7, 1, 0)
    assert producers.epoch_of(7) == 1
    assert producers.check(7, 0, 5, 0).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert producers.check(7, 1, 3, 0).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert producers.check(7, 1, 0, 0) == (None, None)  # a new epoch starts at 0
    producers.marker(7, 1, 0)  # the same epoch: its sequences go on
    producers.record(7, 1, 0, 6, 6)
    assert producers.check(7, 1, 1, 0) == (None, None)


def test_a_marker_of_an_older_coordinator_is_fenced() -> None:
    """Kafka's checkCoordinatorEpoch: the coordinator epoch of a producer's last marker stays
    through its epoch bumps and the group coordinator's batches, and fences older ones."""
    producers = ProducerStateTable()
    assert producers.check_marker(7, 0, 0) is None  # unknown here
    producers.record(7, 0, 0, 0, 4)
    assert producers.check_marker(7, 0, 0) is None  # no marker yet
    producers.marker(7, 0, 3)
    assert producers.check_marker(7, 0, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert producers.check_marker(7, 0, 3) is None and producers.check_marker(7, 1, 4) is None
    producers.record(7, 1, 0, 5, 5)  # a new producer epoch
    producers.no_sequence(7, 2)  # the group coordinator's transactional offsets
    assert producers.check_marker(7, 2, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert producers.check_marker(7, 1, 9) == ErrorCode.INVALID_PRODUCER_EPOCH  # first
    producers.marker(7, 2, 1)  # replicated from a leader that took it: it is the last now
    assert producers.check_marker(7, 2, 1) is None


# The model ------------------------------------------------------------------------------


class Entry(NamedTuple):
    """One batch of the model log: data of `pid` (transactional or not) or its marker."""

    pid: int
    offset: int
    marker: bool
    aborted: bool = False


def naive(log: list[Entry], hwm: int, start: int) -> tuple[int, list[tuple[int, int]]]:
    """LSO and every aborted (pid, first offset) whose marker is below `hwm`, by reading
    the whole log from the start each time."""
    open_: dict[int, int] = {}
    ended: list[tuple[int, int, int, bool]] = []
    for e in log:
        if not e.marker:
            open_.setdefault(e.pid, e.offset)
        elif e.pid in open_:
            ended.append((e.pid, open_.pop(e.pid), e.offset, e.aborted))
    unstable = list(open_.values()) + [first for _, first, last, _ in ended if last >= hwm]
    lso = max(start, min([hwm, *unstable]))
    aborted = [(pid, first) for pid, first, last, was in ended
               if was and last < hwm and last >= start]
    return lso, aborted


operations = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(0, 3)),
        st.tuples(st.just("marker"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("commit"), st.integers(0, 3)),
        st.tuples(st.just("cut"), st.integers(0, 4)),
        st.tuples(st.just("start"), st.integers(0, 2)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_table_answers_as_a_naive_reading_of_the_log_left(ops: list[tuple]) -> None:
    txns = TxnState()
    log: list[Entry] = []
    hwm = start = 0
    for op in ops:
        end = len(log)
        if op[0] == "data":
            log.append(Entry(op[1], end, False))
            txns.data_batch(op[1], end)
        elif op[0] == "marker":
            log.append(Entry(op[1], end, True, op[2]))
            txns.marker(op[1], end, op[2])
        elif op[0] == "commit":
            hwm = min(end, hwm + op[1])
        elif op[0] == "cut":  # what is not committed may be cut (Raft, a failed fsync)
            cut = max(hwm, end - op[1])
            del log[cut:]
            txns.forget_from(cut)
        else:  # DeleteRecords up to the high watermark
            start = min(hwm, start + op[1])
            txns.log_start_moved(start)
        txns.committed(hwm)
        lso, aborted = naive(log, hwm, start)
        assert txns.last_stable_offset(hwm, start) == lso, (log, hwm, txns)
        assert txns.aborted_between(start, 1 << 62) == aborted, (log, hwm, txns)
        rebuilt = TxnState()
        for e in log:
            if e.marker:
                rebuilt.marker(e.pid, e.offset, e.aborted)
            else:
                rebuilt.data_batch(e.pid, e.offset)
        rebuilt.committed(hwm)
        rebuilt.log_start_moved(start)
        assert rebuilt.last_stable_offset(hwm, start) == lso
        assert rebuilt.aborted_between(start, 1 << 62) == aborted
