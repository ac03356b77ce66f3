"""The idempotent-producer table, transition by transition."""

from __future__ import annotations

import pytest

from actors.producer_state import ProducerStateTable, SequenceCheck
from wire.errors import ErrorCode

pytestmark = pytest.mark.timeout(10)

INT32_MAX = 2**31 - 1


def test_unknown_producer_accepts_any_sequence() -> None:
    table = ProducerStateTable()
    assert table.check(7, 0, 42, 4) == (None, None)


@pytest.mark.parametrize(
    ("epoch", "sequence", "delta", "expected"),
    [
        (0, 5, 4, (None, None)),  # next in order
        (0, 0, 4, "duplicate-first"),  # retry of the first batch
        (0, 6, 4, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # gap
        (0, 3, 1, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # overlaps, not a known batch
        (1, 0, 4, (None, None)),  # new epoch from 0
        (1, 5, 4, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # new epoch must restart at 0
    ],
)
def test_check_after_one_batch(epoch: int, sequence: int, delta: int, expected: object) -> None:
    table = ProducerStateTable()
    table.record(7, 0, 0, 100, 104)  # sequences 0..4 at offsets 100..104
    result = table.check(7, epoch, sequence, delta)
    if expected == "duplicate-first":
        assert result.duplicate is not None and result.duplicate.first_offset == 100
    elif isinstance(expected, ErrorCode):
        assert result.error == expected
    else:
        assert result == expected


def test_older_epoch_is_fenced() -> None:
    table = ProducerStateTable()
    table.record(7, 3, 0, 0, 0)
    assert table.check(7, 2, 1, 0).error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_only_the_last_five_batches_are_remembered() -> None:
    table = ProducerStateTable()
    for i in range(7):
        table.record(1, 0, i * 2, i * 2, i * 2 + 1)
    assert table.check(1, 0, 12, 1).duplicate is not None  # the last
    assert table.check(1, 0, 4, 1).duplicate is not None  # the fifth from last
    assert table.check(1, 0, 2, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # forgotten


def test_sequence_wraps_at_int32_max() -> None:
    table = ProducerStateTable()
    table.record(1, 0, INT32_MAX - 1, 10, 11)  # sequences INT32_MAX-1, INT32_MAX
    assert table.check(1, 0, 0, 2) == (None, None)


def test_forget_from_drops_truncated_batches() -> None:
    table = ProducerStateTable()
    table.record(1, 0, 0, 0, 4)
    table.record(1, 0, 5, 5, 9)
    table.forget_from(5)
    assert table.check(1, 0, 5, 4) == (None, None)
    assert table.check(1, 0, 0, 4).duplicate is not None


def test_forget_from_every_batch_expects_the_first_sequence_cut() -> None:
    # A failed fdatasync cut every batch of producer 1: its retries must come in order,
    # and a later batch that overtakes the first retry is out of order, not taken.
    table = ProducerStateTable()
    table.record(1, 0, 10, 20, 24)  # sequences 10..14
    table.record(1, 0, 15, 25, 29)  # sequences 15..19
    table.forget_from(20)
    assert table.check(1, 0, 15, 4).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert table.check(1, 0, 10, 4) == (None, None)
    table.record(1, 0, 10, 20, 24)
    assert table.check(1, 0, 15, 4) == (None, None)
    assert table.check(1, 1, 0, 4) == (None, None)  # a new epoch starts over at 0


def test_the_table_forgets_the_producer_that_wrote_least_recently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from actors import limits

    monkeypatch.setattr(limits, "producer_ids_per_partition_max", 3)
    table = ProducerStateTable()
    for producer_id in (1, 2, 3):
        table.record(producer_id, 0, 0, producer_id * 10, producer_id * 10)
    table.record(1, 0, 1, 40, 40)  # 1 wrote again: 2 is now the least recent
    table.record(4, 0, 0, 50, 50)
    assert len(table) == 3
    # 2 is forgotten: any sequence is accepted from it, as from a new producer...
    assert table.check(2, 0, 7, 0) == SequenceCheck()
    # ...while the others still are checked.
    assert table.check(1, 0, 7, 0).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert table.check(3, 0, 0, 0).duplicate is not None
