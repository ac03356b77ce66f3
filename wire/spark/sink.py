"""The `krill` data source's sink: batch and streaming writes through Kafka's produce path.

    df.selectExpr("CAST(user AS BINARY) AS key", "to_json(struct(*)) AS value")
      .write.format("krill").mode("append").option("krill.bootstrap", "127.0.0.1:9092")
      .option("topic", "enriched").save()

(Spark 4.3 refuses a Python data source's write in its default save mode, ErrorIfExists:
`mode("append")` is what a Kafka topic means.)

The input follows Spark's Kafka sink: a `value` column (string or binary, nulls allowed),
optional `key` (string or binary), `topic` (string; required without the `topic` option,
which overrides it as in Spark), `partition` (int; null lets the producer's partitioner pick)
and `headers` (array<struct<key string, value binary>>); other columns are ignored. The
schema is checked when the write starts (`check_schema`), on the driver.

Each task (one `write()` call, in a Spark Python worker) opens its own confluent-kafka
producer, idempotent with acks=all, produces its Arrow batches a column at a time into
Python lists (one batch at a time, never the whole task), flushes, and returns a `WriteReport`:
per topic partition the records written and the first and last offset. A delivery error
fails the task after the flush, with what was delivered before it in the error, so Spark
retries it. Delivery is at least once, as Spark's Kafka sink: a retried task writes its rows
again (exactly once through transactions is issue 18's part 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

__all__ = [
    "SinkOptions",
    "SinkSchemaError",
    "SinkWriteError",
    "PartitionWrite",
    "WriteReport",
    "parse_sink_options",
    "check_schema",
    "write_batches",
    "KrillBatchWriter",
    "KrillStreamWriter",
]

log = logging.getLogger(__name__)

# Producer settings the sink's guarantees rest on; a `kafka.*` option may not change them.
_PRODUCER_FIXED = {"enable.idempotence": "true", "acks": "all"}
# Values of `kafka.acks` that mean all in-sync replicas.
_ACKS_ALL = ("all", "-1")
# The `krill.*` options the sink reads (lower case); any other is refused.
_KRILL_OPTIONS = ("krill.bootstrap",)
# How long a task waits in flush() for its last deliveries: past librdkafka's default
# delivery timeout (message.timeout.ms, 300 s), so every message is delivered or failed.
_flush_timeout_s = 330.0
# How long a producer whose queue is full is polled before the row is produced again.
_queue_full_poll_s = 0.05

_STRING_OR_BINARY = ("string", "binary")


class SinkSchemaError(ValueError):
    """The input cannot be written: a column missing or of the wrong type (one line)."""


class SinkWriteError(RuntimeError):
    """A task's produce failed; the message says what it had delivered before."""


@dataclass(frozen=True)
class SinkOptions:
    """The default topic (None: every row's `topic` column) and the producer's settings."""

    topic: str | None
    producer: dict[str, str]


def parse_sink_options(options: dict[str, str]) -> SinkOptions:
    """`topic`, `krill.bootstrap` (Kafka listeners "host:port,...", or Spark's
    `kafka.bootstrap.servers`) and `kafka.*` producer settings with the prefix removed."""
    producer: dict[str, str] = {}
    topic: str | None = None
    bootstrap: str | None = None
    for name, value in options.items():
        lowered = str(name).lower()
        if lowered == "topic":
            topic = str(value) or None
        elif lowered.startswith("kafka."):
            producer[lowered.removeprefix("kafka.")] = str(value)
        elif lowered.startswith("krill."):
            if lowered not in _KRILL_OPTIONS:
                raise ValueError(f"unknown option {name!r} for the krill sink "
                                 f"(it reads {', '.join(_KRILL_OPTIONS)})")
            if lowered == "krill.bootstrap":
                bootstrap = str(value)
    for setting, fixed in _PRODUCER_FIXED.items():
        given = producer.get(setting, fixed).lower()
        allowed = _ACKS_ALL if setting == "acks" else ("true",)
        if given not in allowed:
            raise ValueError(f"option kafka.{setting}={producer[setting]} is refused: the krill "
                             f"sink produces with {setting}={fixed}")
    if "transactional.id" in producer:
        raise ValueError("option kafka.transactional.id is refused: the krill sink does not "
                         "write in transactions yet")
    producer.update(_PRODUCER_FIXED)
    if bootstrap:
        producer["bootstrap.servers"] = bootstrap
    if not producer.get("bootstrap.servers"):
        raise ValueError("option krill.bootstrap (the Kafka listeners, host:port) is required "
                         "to write")
    return SinkOptions(topic, producer)


def check_schema(schema: Any, topic: str | None) -> None:
    """Spark's Kafka sink rules for the input columns; SinkSchemaError names the first broken."""
    types = {field.name.lower(): field.dataType.simpleString() for field in schema.fields}
    if "value" not in types:
        raise SinkSchemaError(
            "krill sink: required column 'value' (string or binary) not found in "
            f"[{', '.join(types)}]; select one, e.g. to_json(struct(*)) AS value")
    for name in ("value", "key"):
        if name in types and types[name] not in _STRING_OR_BINARY:
            raise SinkSchemaError(f"krill sink: column '{name}' must be string or binary, "
                                  f"not {types[name]}")
    if topic is None and "topic" not in types:
        raise SinkSchemaError("krill sink: no 'topic' column and no topic option; set the "
                              "topic option or add a string column 'topic'")
    expected = {"topic": "string", "partition": "int",
                "headers": "array<struct<key:string,value:binary>>"}
    for name, wanted in expected.items():
        if name in types and types[name] != wanted:
            raise SinkSchemaError(f"krill sink: column '{name}' must be {wanted}, "
                                  f"not {types[name]}")


@dataclass(frozen=True)
class PartitionWrite:
    """What one task wrote to one topic partition: `count` records, offsets first..last."""

    topic: str
    partition: int
    count: int
    first_offset: int
    last_offset: int

    def __str__(self) -> str:
        return (f"{self.topic}-{self.partition}: {self.count} "
                f"[{self.first_offset}..{self.last_offset}]")


@dataclass(frozen=True)
class WriteReport(WriterCommitMessage):
    """A task's commit message: what it wrote, per topic partition."""

    partitions: tuple[PartitionWrite, ...]

    @property
    def rows(self) -> int:
        return sum(p.count for p in self.partitions)

    def __str__(self) -> str:
        return ", ".join(str(p) for p in self.partitions) or "nothing"


class _Deliveries:
    """The producer's delivery callback: records per topic partition, and the failures."""

    def __init__(self) -> None:
        self.written: dict[tuple[str, int], list[int]] = {}  # [count, first, last offset]
        self.failed = 0
        self.first_error: str | None = None

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = str(error)
            return
        offset = message.offset()
        entry = self.written.get((message.topic(), message.partition()))
        if entry is None:
            self.written[(message.topic(), message.partition())] = [1, offset, offset]
        else:
            entry[0] += 1
            entry[1] = min(entry[1], offset)
            entry[2] = max(entry[2], offset)

    def report(self) -> WriteReport:
        return WriteReport(tuple(
            PartitionWrite(topic, partition, count, first, last)
            for (topic, partition), (count, first, last) in sorted(self.written.items())
        ))


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    """Produce every row of `batches`; the report once all are delivered, else SinkWriteError
    (after the flush) naming the failure and what was delivered."""
    from confluent_kafka import Producer

    deliveries = _Deliveries()
    producer = Producer(options.producer)
    try:
        for batch in batches:
            _produce_batch(producer, options.topic, batch, deliveries)
            producer.poll(0)
    except Exception as exc:
        producer.flush(_flush_timeout_s)
        raise SinkWriteError(f"krill sink: producing failed ({exc}); delivered before the "
                             f"failure: {deliveries.report()}") from exc
    left = producer.flush(_flush_timeout_s)
    if left or deliveries.failed:
        reason = deliveries.first_error or f"{left} records not delivered in {_flush_timeout_s} s"
        raise SinkWriteError(f"krill sink: {deliveries.failed + left} records failed ({reason}); "
                             f"delivered: {deliveries.report()}")
    return deliveries.report()


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    if index < 0:  # names are matched as Spark does, without case
        lowered = [n.lower() for n in batch.schema.names]
        index = lowered.index(name) if name in lowered else -1
    return None if index < 0 else batch.column(index).to_pylist()


def _produce_batch(
    producer: Any, topic: str | None, batch: pa.RecordBatch, on_delivery: Callable[..., None]
) -> None:
    values = _column(batch, "value")
    assert values is not None, "check_schema lets no input without a value column through"
    keys = _column(batch, "key") or [None] * len(values)
    topics = None if topic is not None else _column(batch, "topic")
    partitions = _column(batch, "partition")
    headers = _column(batch, "headers")
    produce = producer.produce
    if topics is None and partitions is None and headers is None:
        for key, value in zip(keys, values, strict=True):
            try:
                produce(topic, value, key, on_delivery=on_delivery)
            except BufferError:
                _produce_when_room(producer, topic, value, key, on_delivery=on_delivery)
        return
    for i, value in enumerate(values):
        row_topic = topic if topics is None else topics[i]
        if row_topic is None:
            raise SinkWriteError("null topic in the data: set the topic option for a default")
        partition = -1 if partitions is None or partitions[i] is None else partitions[i]
        row_headers = None if headers is None else _headers(headers[i])
        arguments = (row_topic, value, keys[i], partition)
        try:
            produce(*arguments, on_delivery=on_delivery, headers=row_headers)
        except BufferError:
            _produce_when_room(producer, *arguments, on_delivery=on_delivery,
                               headers=row_headers)


def _headers(entries: Sequence[dict[str, Any]] | None) -> list[tuple[str, Any]] | None:
    if not entries:
        return None
    return [(entry["key"], entry["value"]) for entry in entries]


def _produce_when_room(producer: Any, *arguments: Any, **fields: Any) -> None:
    """The producer's queue is full: serve deliveries until the record finds room."""
    while True:
        producer.poll(_queue_full_poll_s)
        try:
            producer.produce(*arguments, **fields)
            return
        except BufferError:
            continue


def _log_reports(what: str, messages: Sequence[WriterCommitMessage | None]) -> WriteReport:
    reports = [m for m in messages if isinstance(m, WriteReport)]
    merged = WriteReport(tuple(p for r in reports for p in r.partitions))
    failed = sum(1 for m in messages if m is None)
    log.info("krill sink: %s: %d tasks wrote %d records (%s); %d tasks failed", what,
             len(reports), merged.rows, merged, failed)
    return merged


class KrillBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        _log_reports("write committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        # The records the successful tasks wrote stay in the log (no transactions yet).
        _log_reports("write aborted, records left written", messages)


class KrillStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator)

    def commit(  # type: ignore[override]
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        _log_reports(f"micro-batch {batchId} committed", messages)

    def abort(  # type: ignore[override]
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        _log_reports(f"micro-batch {batchId} aborted, records left written", messages)
