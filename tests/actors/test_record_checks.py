"""The per-record checks of a produce to a compacted topic (KIP-467): keyless records named by
their index in their batch, the first batch with one refusing the record set, markers let
through, and the list bounded."""

from __future__ import annotations

import pytest

from actors import limits
from actors.partition_messages import ProduceResult
from actors.record_checks import keyless_records
from actors.txn_state import marker_batch
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch


def checked(*batches: bytes | bytearray) -> ProduceResult | None:
    records = memoryview(bytearray(b"".join(batches)))
    # The CRC was the handler's to check: a batch here may be made up to fail its decode.
    return keyless_records(records, iter_batches(records, check_crc=False), "t-0")


def refused(*batches: bytes | bytearray) -> ProduceResult:
    result = checked(*batches)
    assert result is not None and result.error == ErrorCode.INVALID_RECORD
    return result


def batch(keys: list[bytes | None], codec: int = 0) -> bytearray:
    return build_batch([(key, b"v", []) for key in keys], codec=codec)


@pytest.mark.parametrize("codec", [0, 1, 4])  # none, gzip, zstd
def test_keyed_records_pass_and_keyless_ones_are_named_by_index(codec: int) -> None:
    assert checked(batch([b"a", b"b"], codec)) is None
    result = refused(batch([b"a", None, b"c", None], codec))
    assert [e.batch_index for e in result.record_errors] == [1, 3]
    assert "t-0" in result.record_errors[0].message
    assert result.message is not None and "2 record errors" in result.message


def test_the_first_batch_with_a_keyless_record_counts_from_its_own_start() -> None:
    result = refused(batch([b"a", b"b"]), batch([None, b"c"]), batch([b"d", None]))
    assert [e.batch_index for e in result.record_errors] == [0]


def test_a_transaction_marker_is_not_a_keyless_record() -> None:
    assert checked(marker_batch(7, 0, True, 0, 1_000)) is None


def test_records_that_do_not_decode_refuse_the_set_without_record_errors() -> None:
    data = batch([b"a", b"b"])
    data[-3:] = b"\xff\xff\xff"  # the last record's varints run past the batch
    assert refused(data).record_errors == ()


def test_the_list_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "record_errors_max", 3)
    result = refused(batch([None] * 5))
    assert [e.batch_index for e in result.record_errors] == [0, 1, 2]
    assert result.message is not None and "5 record errors" in result.message
