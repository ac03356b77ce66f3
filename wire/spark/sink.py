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
retries it.

Exactly once (the default; `krill.deliveryGuarantee=at-least-once` writes without
transactions, as Spark's Kafka sink does). Every task writes into a Kafka transaction whose
id names the write and the task, and leaves it open; the driver commits them all in
`commit()` (aborts them in `abort()`) with EndTxn (wire/spark/transactions.py):

    transactional id   krill-sink-<write>-<task partition>, <write> = a batch write's uuid
                       (made on the driver), or <query id>-<batch id> of a micro-batch (Spark's
                       local properties: the same when the batch is replayed after a restart)
    task attempt       DescribeTransactions: committed by an earlier run -> write nothing;
                       else InitProducerId (fences an earlier attempt and aborts what it
                       left open), begin, produce, flush; report the transaction's producer
                       id and epoch (from librdkafka's statistics: its API hides them)
    driver commit      EndTxn(commit) for each reported transaction; a fenced one fails the
                       write (a later attempt owns the id: nothing is doubled)

So a retried task's earlier writes are aborted, and a micro-batch replayed after the driver
died between committing and recording the commit finds its transactions committed and
writes nothing. Readers see a micro-batch's records once it commits, with
`isolation.level=read_committed` (Kafka clients; the krill source's `kafka.isolation.level`).
What this rests on, as every exactly-once sink of Spark: a replayed micro-batch hands each
task partition the same rows (Spark's deterministic replay of its checkpointed offsets).
A committed id is forgotten after transactional.id.expiration.ms (7 days): a replay later
than that writes again. A batch write is atomic per task, not as a whole: a failed job's
`abort()` aborts every transaction, the failed tasks' too, but a driver that dies midway
through `commit()` leaves the tasks it reached committed. A failed micro-batch's open
transactions are aborted by its replay, or by their timeout if the query is not restarted.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from wire.spark.transactions import COMMITTED_STATES, TransactionClient, TransactionError

__all__ = [
    "SinkOptions",
    "SinkSchemaError",
    "SinkWriteError",
    "PartitionWrite",
    "TaskTransaction",
    "WriteReport",
    "end_transactions",
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
_KRILL_OPTIONS = ("krill.bootstrap", "krill.deliveryguarantee")
_GUARANTEES = ("exactly-once", "at-least-once")
# Each task's transaction stays open until the driver commits the whole write: past
# librdkafka's default (60 s), for long batch writes. A node refuses more than its
# transaction.max.timeout.ms (15 min); `kafka.transaction.timeout.ms` changes it.
_TRANSACTION_TIMEOUT_MS = "300000"
# How often librdkafka reports its statistics, which carry the producer id and epoch the
# driver commits with (the producer API does not expose them).
_STATISTICS_INTERVAL_MS = 100
# How long a task waits for that report once its records are delivered.
_identity_timeout_s = 10.0
# The transactional ids the sink writes with: <prefix><write>-<task partition>.
TRANSACTIONAL_ID_PREFIX = "krill-sink-"
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
    """The default topic (None: every row's `topic` column), the producer's settings, and
    whether tasks write in transactions the driver commits (`exactly_once`)."""

    topic: str | None
    producer: dict[str, str]
    exactly_once: bool = True


def parse_sink_options(options: dict[str, str]) -> SinkOptions:
    """`topic`, `krill.bootstrap` (Kafka listeners "host:port,...", or Spark's
    `kafka.bootstrap.servers`) and `kafka.*` producer settings with the prefix removed."""
    producer: dict[str, str] = {}
    topic: str | None = None
    bootstrap: str | None = None
    guarantee = _GUARANTEES[0]
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
            elif str(value).lower() not in _GUARANTEES:
                raise ValueError(f"option {name}={value} is refused: it is one of "
                                 f"{', '.join(_GUARANTEES)}")
            else:
                guarantee = str(value).lower()
    for setting, fixed in _PRODUCER_FIXED.items():
        given = producer.get(setting, fixed).lower()
        allowed = _ACKS_ALL if setting == "acks" else ("true",)
        if given not in allowed:
            raise ValueError(f"option kafka.{setting}={producer[setting]} is refused: the krill "
                             f"sink produces with {setting}={fixed}")
    if "transactional.id" in producer:
        raise ValueError("option kafka.transactional.id is refused: the krill sink names each "
                         "task's transaction itself")
    exactly_once = guarantee == "exactly-once"
    if exactly_once:
        producer.setdefault("transaction.timeout.ms", _TRANSACTION_TIMEOUT_MS)
    elif "transaction.timeout.ms" in producer:
        raise ValueError("option kafka.transaction.timeout.ms is refused: an at-least-once "
                         "write has no transactions")
    producer.update(_PRODUCER_FIXED)
    if bootstrap:
        producer["bootstrap.servers"] = bootstrap
    if not producer.get("bootstrap.servers"):
        raise ValueError("option krill.bootstrap (the Kafka listeners, host:port) is required "
                         "to write")
    return SinkOptions(topic, producer, exactly_once)


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
class TaskTransaction:
    """The open transaction a task wrote into, for the driver to end."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class WriteReport(WriterCommitMessage):
    """A task's commit message: what it wrote, per topic partition; the transaction it wrote
    into (exactly once), or `committed_before`: a run before this one committed this task's
    transaction, so it wrote nothing."""

    partitions: tuple[PartitionWrite, ...]
    transaction: TaskTransaction | None = None
    committed_before: str | None = None  # that transaction's id

    @property
    def rows(self) -> int:
        return sum(p.count for p in self.partitions)

    def __str__(self) -> str:
        if self.committed_before is not None:
            return f"nothing (committed before, {self.committed_before})"
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


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch],
                  scope: str | None = None) -> WriteReport:
    """Produce every row of `batches`; the report once all are delivered, else SinkWriteError
    (after the flush) naming the failure and what was delivered.

    Exactly once (`scope` names the write: a batch write, or a query's micro-batch), the task
    writes into a transaction `<prefix><scope>-<task partition>` and leaves it open for the
    driver, unless a run before this one committed it."""
    first = next(batches, None)
    if first is None:  # nothing to write: no producer, no transaction
        return WriteReport(())
    rows = itertools.chain((first,), batches)
    if scope is None:
        return _produce(options.producer, options.topic, rows, None)
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "write() runs in a Spark task"
    transactional_id = f"{TRANSACTIONAL_ID_PREFIX}{scope}-{context.partitionId()}"
    with TransactionClient(options.producer["bootstrap.servers"]) as client:
        found = client.describe(transactional_id)
    if found.state in COMMITTED_STATES:
        log.info("krill sink: %s was committed by an earlier run: writing nothing",
                 transactional_id)
        return WriteReport((), committed_before=transactional_id)
    return _produce(options.producer, options.topic, rows, transactional_id)


class _Identity:
    """librdkafka's statistics callback, kept for the producer id and epoch it reports."""

    def __init__(self) -> None:
        self.producer_id = -1
        self.producer_epoch = -1

    def __call__(self, report: str) -> None:
        eos = json.loads(report).get("eos") or {}
        if eos.get("idemp_state") == "Assigned" and eos.get("producer_id", -1) >= 0:
            self.producer_id, self.producer_epoch = eos["producer_id"], eos["producer_epoch"]


def _produce(settings: dict[str, str], topic: str | None, batches: Iterator[pa.RecordBatch],
             transactional_id: str | None) -> WriteReport:
    from confluent_kafka import Producer

    deliveries = _Deliveries()
    identity = _Identity()
    config: dict[str, Any] = dict(settings)
    if transactional_id is not None:
        config |= {"transactional.id": transactional_id,
                   "statistics.interval.ms": _STATISTICS_INTERVAL_MS, "stats_cb": identity}
    producer = Producer(config)
    try:
        if transactional_id is not None:
            # Fences any earlier attempt of this task and aborts what it left open.
            producer.init_transactions(_flush_timeout_s)
            producer.begin_transaction()
        for batch in batches:
            _produce_batch(producer, topic, batch, deliveries)
            producer.poll(0)
    except Exception as exc:
        producer.flush(_flush_timeout_s)
        _abort_quietly(producer, transactional_id)
        raise SinkWriteError(f"krill sink: producing failed ({exc}); delivered before the "
                             f"failure: {deliveries.report()}") from exc
    left = producer.flush(_flush_timeout_s)
    if left or deliveries.failed:
        _abort_quietly(producer, transactional_id)
        reason = deliveries.first_error or f"{left} records not delivered in {_flush_timeout_s} s"
        raise SinkWriteError(f"krill sink: {deliveries.failed + left} records failed ({reason}); "
                             f"delivered: {deliveries.report()}")
    report = deliveries.report()
    if transactional_id is None:
        return report
    deadline = time.monotonic() + _identity_timeout_s
    while identity.producer_id < 0 and time.monotonic() < deadline:
        producer.poll(_STATISTICS_INTERVAL_MS / 1000)
    if identity.producer_id < 0:
        _abort_quietly(producer, transactional_id)
        raise SinkWriteError(f"krill sink: no producer id reported for {transactional_id} in "
                             f"{_identity_timeout_s:.0f} s")
    # The transaction stays open: the driver commits it once every task is done. A later
    # attempt of this task (or a replay) fences it; its commit then fails, never doubles.
    return WriteReport(report.partitions, TaskTransaction(
        transactional_id, identity.producer_id, identity.producer_epoch))


def _abort_quietly(producer: Any, transactional_id: str | None) -> None:
    if transactional_id is None:
        return
    try:
        producer.abort_transaction(_flush_timeout_s)
    except Exception as exc:  # fenced, or the coordinator gone: its timeout aborts it
        log.warning("krill sink: abort of %s failed: %s", transactional_id, exc)


def end_transactions(options: SinkOptions, messages: Sequence[WriterCommitMessage | None],
                     commit: bool, scope: str | None = None) -> None:
    """The driver's half: commit (or abort) every task's transaction. A commit that is
    fenced raises TransactionError (the write fails; nothing was doubled); an abort that
    fails is logged (the transaction times out). An abort given the write's `scope` also
    aborts what the tasks that failed left open (`messages` is in task partition order)."""
    transactions = [m.transaction for m in messages
                    if isinstance(m, WriteReport) and m.transaction is not None]
    failed = [i for i, m in enumerate(messages) if m is None] if scope and not commit else []
    if not transactions and not failed:
        return
    with TransactionClient(options.producer["bootstrap.servers"]) as client:
        for t in transactions:
            try:
                client.end(t.transactional_id, t.producer_id, t.producer_epoch, commit)
            except (TransactionError, ConnectionError) as exc:
                if commit:
                    raise
                log.warning("krill sink: %s", exc)
        for partition in failed:
            transactional_id = f"{TRANSACTIONAL_ID_PREFIX}{scope}-{partition}"
            try:
                found = client.describe(transactional_id)
                if found.state == "Ongoing":
                    client.end(transactional_id, found.producer_id, found.producer_epoch,
                               commit=False)
            except (TransactionError, ConnectionError) as exc:
                log.warning("krill sink: %s", exc)


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
        # Made on the driver and shipped to every task: a retried task finds its transaction.
        self.scope = uuid.uuid4().hex if options.exactly_once else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator, self.scope)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        end_transactions(self.options, messages, commit=True)
        _log_reports("write committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        end_transactions(self.options, messages, commit=False, scope=self.scope)
        _log_reports("write aborted" if self.options.exactly_once
                     else "write aborted, records left written", messages)


class KrillStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator, _micro_batch_scope(self.options))

    def commit(  # type: ignore[override]
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        end_transactions(self.options, messages, commit=True)
        _log_reports(f"micro-batch {batchId} committed", messages)

    def abort(  # type: ignore[override]
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        end_transactions(self.options, messages, commit=False)
        _log_reports(f"micro-batch {batchId} aborted" if self.options.exactly_once
                     else f"micro-batch {batchId} aborted, records left written", messages)


def _micro_batch_scope(options: SinkOptions) -> str | None:
    """`<query id>-<batch id>` of the micro-batch this task writes (Spark sets both as local
    properties of the batch's jobs): the same when the batch is replayed after a restart."""
    if not options.exactly_once:
        return None
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "write() runs in a Spark task"
    query = context.getLocalProperty("sql.streaming.queryId")
    batch = context.getLocalProperty("streaming.sql.batchId")
    if not query or batch is None:
        raise SinkWriteError("krill sink: no streaming query id or batch id in the task's "
                             "properties; cannot name its transaction")
    return f"{query}-{batch}"
