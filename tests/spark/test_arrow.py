"""Fetched batches to Arrow rows, without Spark or a broker (wire/spark/arrow.py)."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from wire import compression
from wire.record_batch import read_header
from wire.records import build_batch
from wire.spark.arrow import (
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    AbortedTransaction,
    RowBuilder,
    TransactionFilter,
)

CODECS = [
    compression.CODEC_NONE,
    compression.CODEC_GZIP,
    compression.CODEC_SNAPPY,
    compression.CODEC_LZ4,
    compression.CODEC_ZSTD,
]


def test_schema_is_what_spark_expects_for_its_kafka_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    assert to_arrow_schema(StructType(fields), timezone="UTC").equals(SCHEMA)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    fields.append(StructField("headers", ArrayType(header)))
    assert to_arrow_schema(StructType(fields), timezone="UTC").equals(SCHEMA_WITH_HEADERS)


@pytest.mark.parametrize("codec", CODECS)
def test_rows_of_every_codec_with_nulls_and_headers(codec: int) -> None:
    records = [(b"k0", b"v0", [("h", b"1")]), (None, b"v1", []), (b"k2", None, [("x", None)])]
    blob = build_batch(records, codec=codec, base_offset=0, base_timestamp=1_700_000_000_000)
    blob += build_batch(
        [(b"k3", b"v3", [])],
        codec=codec,
        base_offset=3,
        base_timestamp=1_700_000_000_005,
        log_append_time=True,
    )
    builder = RowBuilder("t", 4, 0, 4, include_headers=True)
    assert builder.add(blob) == 2 and builder.done
    table = builder.build().to_pydict()
    assert table["key"] == [b"k0", None, b"k2", b"k3"]
    assert table["value"] == [b"v0", b"v1", None, b"v3"]
    assert table["offset"] == [0, 1, 2, 3] and table["partition"] == [4] * 4
    assert table["topic"] == ["t"] * 4 and table["timestampType"] == [0, 0, 0, 1]
    assert table["headers"][0] == [{"key": "h", "value": b"1"}]
    assert table["headers"][2] == [{"key": "x", "value": None}]
    assert table["timestamp"][0].timestamp() == 1_700_000_000.0


def test_records_outside_the_range_are_dropped_and_next_offset_moves() -> None:
    blob = build_batch([(None, b"%d" % i, []) for i in range(10)], base_offset=100)
    blob += build_batch([(None, b"%d" % i, []) for i in range(10, 20)], base_offset=110)
    builder = RowBuilder("t", 0, 105, 112)
    builder.add(blob)
    assert builder.build().column("offset").to_pylist() == list(range(105, 112))
    assert builder.done and builder.next_offset == 120
    # A trailing cut-off batch is left for the next fetch.
    partial = RowBuilder("t", 0, 100, 120)
    assert partial.add(blob[: len(blob) - 5]) == 1 and partial.next_offset == 110


def _control(base_offset: int, producer_id: int, abort: bool) -> bytearray:
    key = struct.pack(">hh", 0, 0 if abort else 1)
    return build_batch(
        [(key, b"\x00\x00\x00\x00\x00\x00", [])],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0,
        transactional=True,
        control=True,
    )


def test_control_batches_skipped_and_aborted_transactions_ready() -> None:
    def txn(base: int, pid: int) -> bytearray:
        return build_batch(
            [(None, b"p%d-%d" % (pid, base), [])],
            base_offset=base,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )

    blob = txn(0, 7) + txn(1, 8) + _control(2, 7, abort=True) + _control(3, 8, abort=False)
    blob += txn(4, 7) + _control(5, 7, abort=False)
    # read_uncommitted (today): every data record, no markers.
    uncommitted = RowBuilder("t", 0, 0, 6)
    uncommitted.add(blob)
    assert uncommitted.build().column("offset").to_pylist() == [0, 1, 4]
    # read_committed, once the broker lists aborted transactions: pid 7's first is gone.
    committed = RowBuilder("t", 0, 0, 6, transactions=TransactionFilter([AbortedTransaction(7, 0)]))
    committed.add(blob)
    assert committed.build().column("offset").to_pylist() == [1, 4]


def test_empty_build_has_the_schema() -> None:
    batch = RowBuilder("t", 0, 0, 0).build()
    assert batch.num_rows == 0 and batch.schema.equals(SCHEMA)
    assert isinstance(batch, pa.RecordBatch)
    assert read_header(build_batch([(None, b"x", [])])).record_count == 1
