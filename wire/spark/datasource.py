"""The PySpark data source `krill`: batch and streaming reads of Krill topics (and writes,
through wire/spark/sink.py).

    from wire.spark import register
    register(spark)                       # once per session
    spark.read.format("krill").option("krill.bootstrap", "127.0.0.1:9093")
         .option("subscribe", "orders").load()

The driver side (`partitions()`, `initialOffset()`, `latestOffset()`) asks a bootstrap
node's reader endpoint for metadata and each partition's leader for its offsets, and plans
with the pure functions of `wire.spark.offsets`. Each planned `KrillPartition` (one offset
range of one topic partition, and the node to read it from: its leader, or with
`krill.readFrom=replica` one of its in-sync replicas, wire/spark/replicas.py) is pickled to
an executor, whose `read()` opens its own socket, fetches raw batches and yields Arrow record
batches built by `wire.spark.arrow`. A node that fails a read (gone, or no longer leading the
partition) is replaced by the one fresh metadata names, a bounded number of times. Options
and schema are those of Spark's Kafka source (see offsets.py). Exactly-once progress:
offsets are the only state, Spark checkpoints them, and a range always yields the same rows
(from any replica), so a replayed micro-batch is identical.
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
    DataSourceStreamWriter,
    DataSourceWriter,
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
from wire.spark.client import FetchResult, Metadata, ReaderClient, ReaderTimeout
from wire.spark.offsets import DataLossError, OffsetRange, SourceOptions, TopicPartition
from wire.spark.protocol import ReaderError
from wire.spark.replicas import RETRIABLE, Failover, choose
from wire.spark.sink import KrillBatchWriter, KrillStreamWriter, check_schema, parse_sink_options

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

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        options = parse_sink_options(dict(self.options))
        check_schema(schema, options.topic)
        return KrillBatchWriter(options)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(dict(self.options))
        check_schema(schema, options.topic)
        return KrillStreamWriter(options)


class KrillPartition(InputPartition):
    """One offset range to read, with what the executor needs to read it (picklable): the
    reader planned for it, and the readers to ask for metadata when that one fails."""

    def __init__(
        self, address: str, offset_range: OffsetRange, options: SourceOptions,
        nodes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(offset_range)
        self.address = address
        self.range = offset_range
        self.include_headers = options.include_headers
        self.fail_on_data_loss = options.fail_on_data_loss
        self.timeout_s = options.timeout_s
        self.connect_timeout_s = options.connect_timeout_s
        self.read_from = options.read_from
        self.read_committed = options.read_committed
        self.known = tuple(dict.fromkeys((*options.bootstrap_addresses, *nodes)))

    def __repr__(self) -> str:
        r = self.range
        return f"KrillPartition({r.topic}-{r.partition} [{r.start}, {r.end}) at {self.address})"


# The driver side ----------------------------------------------------------------------------


class _Snapshot:
    """The partitions a query reads, their earliest and latest offsets, and the reader each
    is read from, asked once.

    Offsets are always the leaders': a leader's high watermark is the partition's, and it
    only grows, which the checks between micro-batches rely on (a follower's lags by about a
    heartbeat, and two followers' differ). Reads then go where `krill.readFrom` says; a
    follower not yet at the planned end is waited for (`_Source.behind`)."""

    def __init__(self, options: SourceOptions) -> None:
        wanted = None if options.subscribe_pattern is not None else sorted(
            set(options.subscribe) | {t for t, _ in options.assign})
        failover = Failover("metadata and offsets", options.bootstrap_addresses, wanted,
                            "leader", options.timeout_s, options.connect_timeout_s)
        metadata = failover.first_metadata()
        counts = {name: len(leaders) for name, leaders in metadata.topics.items()}
        missing = [tp for tp in options.assign if tp[1] >= counts.get(tp[0], 0)]
        if missing:
            raise ValueError(f"assigned partitions do not exist: {missing}")
        self.partitions = plan.select_partitions(options, counts)
        leaders: dict[TopicPartition, str] = {}
        found, metadata = _offsets(failover, metadata, self.partitions, leaders,
                                   options.read_committed)
        self.addresses = leaders if options.read_from == "leader" else {
            tp: choose(metadata, *tp, options.read_from, failover.failed) or leaders[tp]
            for tp in self.partitions
        }
        self.earliest = {tp: found[tp][0] for tp in self.partitions}
        self.latest = {tp: found[tp][1] for tp in self.partitions}
        self.nodes = failover.known


def _offsets(
    failover: Failover,
    metadata: Metadata,
    partitions: list[TopicPartition],
    leaders: dict[TopicPartition, str],
    read_committed: bool = False,
) -> tuple[dict[TopicPartition, tuple[int, int]], Metadata]:
    """(earliest, latest) of each partition, asked of its leader, partitions grouped by
    leader, and the metadata last asked; `leaders` gets the node that answered. Partitions
    whose leader failed are asked again of the one fresh metadata names. Latest is the last
    stable offset when `read_committed`."""
    found: dict[TopicPartition, tuple[int, int]] = {}
    while True:
        groups: dict[str | None, list[TopicPartition]] = {}
        for tp in partitions:
            if tp not in found:
                groups.setdefault(failover.choose(metadata, *tp), []).append(tp)
        if not groups:
            return found, metadata
        reasons: list[str] = []
        failed: list[str] = []
        for address, group in groups.items():
            if address is None:
                reasons.append(f"no {failover.read_from} known for {_names(group)}")
                continue
            try:
                answers = _offsets_of(failover, address, group, read_committed)
            except ReaderTimeout as exc:
                reasons.append(str(exc))
                failed.append(address)
                continue
            for tp, (earliest, latest) in zip(group, answers, strict=True):
                error = earliest[0] or latest[0]
                if error == protocol.ERROR_NONE:
                    found[tp] = (earliest[1], latest[1])
                    leaders[tp] = address
                elif error in RETRIABLE:
                    reasons.append(f"{address}: error {error} for {tp[0]}-{tp[1]}")
                    failed.append(address)
                else:
                    raise ReaderError(error, f"offsets of {tp[0]}-{tp[1]} from {address}")
        if len(found) < len(partitions):
            failover.failure("; ".join(reasons), failed)
            metadata = failover.metadata() or metadata


def _offsets_of(
    failover: Failover, address: str, group: list[TopicPartition], read_committed: bool
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((error, earliest), (error, latest)) of each partition, from the reader at `address`."""
    queries = [(t, p, protocol.EARLIEST) for t, p in group]
    queries += [(t, p, protocol.LATEST) for t, p in group]
    with failover.client(address) as client:
        results = client.offsets(queries, read_committed=read_committed)
    count = len(group)
    return [(results[i], results[count + i]) for i in range(count)]


def _names(partitions: list[TopicPartition]) -> str:
    shown = ", ".join(f"{t}-{p}" for t, p in partitions[:3])
    return shown + (f" and {len(partitions) - 3} more" if len(partitions) > 3 else "")


def _input_partitions(
    options: SourceOptions,
    snapshot: _Snapshot,
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
) -> list[KrillPartition]:
    ranges = plan.plan_ranges(start, end, options.min_partitions)
    return [
        KrillPartition(snapshot.addresses.get((r.topic, r.partition), options.bootstrap), r,
                       options, snapshot.nodes)
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
        return _input_partitions(options, snapshot, start, end)

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
        return _input_partitions(self.options, snapshot, begin, finish)

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
    with _Source(partition) as source:
        while not builder.done:
            offset = builder.next_offset
            try:
                result = source.fetch(offset)
            except ReaderError as exc:
                if exc.code != protocol.ERROR_OFFSET_OUT_OF_RANGE:
                    raise
                log_start = int(exc.details.get("log_start", -1))
                if log_start <= offset and source.behind(f"offset {offset} past its end"):
                    continue
                if not _skip_lost(partition, builder, exc.details):
                    break
                continue
            if builder.add(result.records, result.aborted) == 0:
                readable = (result.last_stable_offset if partition.read_committed
                            else result.high_watermark)
                if readable <= offset:
                    reason = f"high watermark {result.high_watermark} at offset {offset}"
                    if partition.read_committed:
                        reason = f"last stable offset {readable} at offset {offset}"
                    if source.behind(reason):
                        continue
                    # The range ends past what the log holds now: it was truncated.
                    message = (f"{r.topic}-{r.partition}: offsets {offset}..{r.end - 1} no "
                               f"longer exist (high watermark {result.high_watermark}); some "
                               "data may have been lost")
                    if partition.fail_on_data_loss:
                        raise DataLossError(message)
                    log.warning("krill: %s", message)
                    break
                raise RuntimeError(f"{r.topic}-{r.partition}: empty fetch at {offset} below "
                                   "the high watermark")
            if builder.rows:
                yield builder.build()
    if builder.rows:
        yield builder.build()


# Fetches short of the range asked of one node before another is asked: a follower hears the
# high watermark with the leader's next append or heartbeat (150 ms by default).
_behind_tries_per_node = 3


class _Source:
    """Fetches of one partition from the reader planned for it, and from the one fresh
    metadata names when that fails (replicas.py)."""

    def __init__(self, partition: KrillPartition) -> None:
        r = partition.range
        self._topic, self._partition = r.topic, r.partition
        self._any_replica = partition.read_from == "replica"
        self._read_committed = partition.read_committed
        self._failover = Failover(
            f"reading {r.topic}-{r.partition} [{r.start}, {r.end})", partition.known,
            [r.topic], partition.read_from, partition.timeout_s, partition.connect_timeout_s)
        self._address: str | None = partition.address
        self._client: ReaderClient | None = None
        self._behind = 0  # fetches that found the node short of the range

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *_: object) -> None:
        self._close()

    def fetch(self, offset: int) -> FetchResult:
        """The fetch at `offset` from a node that serves it; ReaderError for what no other
        replica would answer differently, ReplicasUnavailable when out of tries."""
        while True:
            address = self._address
            if address is None:
                reason = f"no {self._failover.read_from} of the partition known"
            else:
                try:
                    if self._client is None:
                        self._client = self._failover.client(address)
                    return self._client.fetch(self._topic, self._partition, offset,
                                              any_replica=self._any_replica,
                                              read_committed=self._read_committed)
                except ReaderTimeout as exc:
                    reason = str(exc)
                except ReaderError as exc:
                    if exc.code not in RETRIABLE:
                        raise
                    reason = f"{address}: {exc}"
            self._move(reason)

    def behind(self, reason: str) -> bool:
        """The node has less of the log than the range needs (a follower that has not heard
        the high watermark yet, a new leader whose high watermark has not caught up): wait
        and ask it again, and every `_behind_tries_per_node`th time another replica. False
        when out of tries: the records are gone (the log was truncated)."""
        if self._failover.last_try:
            return False
        self._behind += 1
        reason = f"{self._address}: {reason}"
        if self._behind % _behind_tries_per_node:
            self._failover.failure(reason)
        else:
            self._move(reason)
        return True

    def _move(self, reason: str) -> None:
        self._close()
        self._failover.failure(reason, [self._address] if self._address else [])
        metadata = self._failover.metadata()
        if metadata is not None:
            self._address = self._failover.choose(metadata, self._topic, self._partition)

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
