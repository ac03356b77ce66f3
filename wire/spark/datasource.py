"""The PySpark data source `krill`: batch and streaming reads of Krill topics.

    from wire.spark import register
    register(spark)                       # once per session
    spark.read.format("krill").option("krill.bootstrap", "127.0.0.1:9093")
         .option("subscribe", "orders").load()

The driver side (`partitions()`, `initialOffset()`, `latestOffset()`) asks the node's reader
endpoint for metadata and offsets and plans with the pure functions of `wire.spark.offsets`.
Each planned `KrillPartition` (one offset range of one topic partition) is pickled to an
executor, whose `read()` opens its own socket, fetches raw batches and yields Arrow record
batches built by `wire.spark.arrow`. Options and schema are those of Spark's Kafka source
(see offsets.py). Exactly-once progress: offsets are the only state, Spark checkpoints them,
and a range always yields the same rows, so a replayed micro-batch is identical.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from wire.spark import offsets as plan
from wire.spark import protocol
from wire.spark.arrow import RowBuilder
from wire.spark.client import ReaderClient
from wire.spark.offsets import DataLossError, OffsetRange, SourceOptions, TopicPartition
from wire.spark.protocol import ReaderError

__all__ = ["KrillDataSource", "KrillPartition", "register", "read_range"]

log = logging.getLogger(__name__)

_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
           "timestamp timestamp, timestampType int")
_HEADERS = ", headers array<struct<key: string, value: binary>>"


def register(spark: Any) -> None:
    """Make `spark.read.format("krill")` and `spark.readStream.format("krill")` work."""
    spark.dataSource.register(KrillDataSource)


class KrillDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "krill"

    def schema(self) -> str:
        options = {str(k).lower(): str(v) for k, v in self.options.items()}
        headers = options.get("includeheaders", "false").lower() == "true"
        return _SCHEMA + (_HEADERS if headers else "")

    def reader(self, schema: Any) -> DataSourceReader:
        return KrillBatchReader(plan.parse_options(dict(self.options), streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KrillStreamReader(plan.parse_options(dict(self.options), streaming=True))


class KrillPartition(InputPartition):
    """One offset range to read, with what the executor needs to read it (picklable)."""

    def __init__(self, address: str, offset_range: OffsetRange, options: SourceOptions) -> None:
        super().__init__(offset_range)
        self.address = address
        self.range = offset_range
        self.include_headers = options.include_headers
        self.fail_on_data_loss = options.fail_on_data_loss
        self.timeout_s = options.timeout_s

    def __repr__(self) -> str:
        r = self.range
        return f"KrillPartition({r.topic}-{r.partition} [{r.start}, {r.end}) at {self.address})"


# The driver side ----------------------------------------------------------------------------


class _Snapshot:
    """The partitions a query reads and their earliest and latest offsets, asked once."""

    def __init__(self, options: SourceOptions) -> None:
        with ReaderClient(options.bootstrap, options.timeout_s) as client:
            wanted = None if options.subscribe_pattern is not None else sorted(
                set(options.subscribe) | {t for t, _ in options.assign})
            metadata = client.metadata(wanted)
            counts = {name: len(leaders) for name, leaders in metadata.topics.items()}
            missing = [tp for tp in options.assign if tp[1] >= counts.get(tp[0], 0)]
            if missing:
                raise ValueError(f"assigned partitions do not exist: {missing}")
            self.partitions = plan.select_partitions(options, counts)
            self.addresses = {
                (t, p): metadata.nodes.get(metadata.topics[t][p], options.bootstrap)
                for t, p in self.partitions
            }
            self.earliest, self.latest = _offsets(client, self.partitions)


def _offsets(
    client: ReaderClient, partitions: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    queries = [(t, p, protocol.EARLIEST) for t, p in partitions]
    queries += [(t, p, protocol.LATEST) for t, p in partitions]
    results = client.offsets(queries)
    for (topic, partition, _), (error, _) in zip(queries, results, strict=True):
        if error != protocol.ERROR_NONE:
            raise ReaderError(error, f"offsets of {topic}-{partition}")
    count = len(partitions)
    earliest = {tp: results[i][1] for i, tp in enumerate(partitions)}
    latest = {tp: results[count + i][1] for i, tp in enumerate(partitions)}
    return earliest, latest


def _input_partitions(
    options: SourceOptions,
    addresses: dict[TopicPartition, str],
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
) -> list[KrillPartition]:
    ranges = plan.plan_ranges(start, end, options.min_partitions)
    return [
        KrillPartition(addresses.get((r.topic, r.partition), options.bootstrap), r, options)
        for r in ranges
    ]


class KrillBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[KrillPartition]:
        options = self.options
        snapshot = _Snapshot(options)
        parts = snapshot.partitions
        start = plan.resolve_offsets(options.starting, parts, snapshot.earliest, snapshot.latest)
        end = plan.resolve_offsets(options.ending, parts, snapshot.earliest, snapshot.latest,
                                   default=plan.LATEST)
        start, losses = plan.check_data_loss(
            start, snapshot.earliest, snapshot.latest, options.fail_on_data_loss)
        for loss in losses:
            log.warning("krill: %s", loss)
        for tp, offset in end.items():
            if offset > snapshot.latest[tp]:
                raise ValueError(f"endingOffsets {offset} of {tp[0]}-{tp[1]} is past its "
                                 f"latest offset {snapshot.latest[tp]}")
        return _input_partitions(options, snapshot.addresses, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class KrillStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict[str, Any]:
        options = self.options
        snapshot = _Snapshot(options)
        start = plan.resolve_offsets(
            options.starting, snapshot.partitions, snapshot.earliest, snapshot.latest)
        start, _ = plan.check_data_loss(
            start, snapshot.earliest, snapshot.latest, options.fail_on_data_loss)
        return plan.offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = dict(_Snapshot(self.options).latest)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        snapshot = _Snapshot(self.options)
        begin = plan.offsets_from_json(start)
        for tp in snapshot.partitions:
            begin.setdefault(tp, snapshot.earliest[tp])  # a partition new since the last batch
        end = dict(snapshot.latest)
        if self._target is not None:
            end = {tp: min(offset, self._target.get(tp, begin[tp])) for tp, offset in end.items()}
        for tp, offset in end.items():
            if offset < begin[tp] and self.options.fail_on_data_loss:
                # Without failOnDataLoss the end goes back, and partitions() reads the
                # re-created log from its start.
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: latest offset {offset} is below the last one read "
                    f"{begin[tp]} (topic re-created or log truncated); some data may have "
                    "been lost. Set failOnDataLoss=false to go on.")
        if isinstance(limit, ReadMaxRows):
            end = plan.rate_limit(limit.max_rows, begin, end)
        return plan.offsets_to_json({**begin, **end})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KrillPartition]:
        begin, finish = plan.offsets_from_json(start), plan.offsets_from_json(end)
        snapshot = _Snapshot(self.options)
        for tp in finish:
            begin.setdefault(tp, snapshot.earliest.get(tp, 0))
            if finish[tp] < begin[tp]:  # the log went back (only without failOnDataLoss)
                log.warning("krill: %s-%d went back from %d to %d; some data may have been "
                            "lost, reading it from its start", tp[0], tp[1], begin[tp], finish[tp])
                begin[tp] = min(snapshot.earliest.get(tp, 0), finish[tp])
        return _input_partitions(self.options, snapshot.addresses, begin, finish)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # nothing to release: the node keeps no per-query state


# The executor side --------------------------------------------------------------------------


def _read(partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
    # With nothing planned Spark still runs one task, with a partition that is not ours.
    if not isinstance(partition, KrillPartition):
        return iter(())
    return read_range(partition)


def read_range(partition: KrillPartition) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in the partition's range, one batch per fetch."""
    r = partition.range
    builder = RowBuilder(r.topic, r.partition, r.start, r.end, partition.include_headers)
    with ReaderClient(partition.address, partition.timeout_s) as client:
        while not builder.done:
            try:
                result = client.fetch(r.topic, r.partition, builder.next_offset)
            except ReaderError as exc:
                if exc.code != protocol.ERROR_OFFSET_OUT_OF_RANGE:
                    raise
                if not _skip_lost(partition, builder, exc.details):
                    break
                continue
            if builder.add(result.records) == 0:
                if result.high_watermark <= builder.next_offset:
                    # The range ends past what the log holds now: it was truncated.
                    message = (f"{r.topic}-{r.partition}: offsets {builder.next_offset}.."
                               f"{r.end - 1} no longer exist (high watermark "
                               f"{result.high_watermark}); some data may have been lost")
                    if partition.fail_on_data_loss:
                        raise DataLossError(message)
                    log.warning("krill: %s", message)
                    break
                raise RuntimeError(f"{r.topic}-{r.partition}: empty fetch at "
                                   f"{builder.next_offset} below the high watermark")
            if builder.rows:
                yield builder.build()
    if builder.rows:
        yield builder.build()


def _skip_lost(partition: KrillPartition, builder: RowBuilder, details: dict[str, Any]) -> bool:
    """An out-of-range fetch: fail, or move on to the log start; False when nothing is left."""
    r = partition.range
    log_start = int(details.get("log_start", -1))
    offset = builder.next_offset
    if log_start > offset:
        message = (f"{r.topic}-{r.partition}: offsets {offset}..{log_start - 1} were deleted "
                   f"before they were read (log start {log_start}); some data may have been "
                   "lost")
    else:
        message = (f"{r.topic}-{r.partition}: offset {offset} is out of range (log start "
                   f"{log_start}, high watermark {details.get('high_watermark')})")
    if partition.fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip ahead.")
    log.warning("krill: %s", message)
    if log_start <= offset:
        return False
    builder.skip_to(log_start)
    return not builder.done
