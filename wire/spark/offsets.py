"""Planning for the Spark source: options, offset specs, ranges, rate limits, data loss.

Pure functions of their inputs (no sockets, no Spark), so every rule is unit-tested alone.
They follow Spark's Kafka source (KafkaSourceProvider, KafkaOffsetRangeCalculator,
KafkaMicroBatchStream.rateLimit):

    startingOffsets   "earliest" | "latest" | '{"t": {"0": 23, "1": -2}}'  (-2 earliest, -1 latest)
    endingOffsets     "latest" | '{"t": {"0": 50, "1": -1}}'  (batch only; end exclusive)
    maxOffsetsPerTrigger  records per micro-batch, shared by lag: a partition's share is
                      limit * lag / total lag, floored, but at least 1 for a lagging partition
    minPartitions     split ranges so there are at least this many, big ranges first
    failOnDataLoss    a start below the log start (deleted records) fails the query with a
                      message saying what was lost, or (false) skips ahead to the log start

and Krill's own: `krill.bootstrap` (reader endpoints "host:port", a comma list: any one
answers metadata), `krill.readFrom` (`leader`, the default, or `replica`: any in-sync
replica, wire/spark/replicas.py), `krill.timeoutMs` (one request) and
`krill.connectTimeoutMs` (reaching a node, before another replica is asked).

Offsets travel as Kafka's JSON shape, {"topic": {"0": next_offset}}: a partition's entry is the
first offset *not yet* read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EARLIEST",
    "LATEST",
    "TopicPartition",
    "OffsetRange",
    "DataLossError",
    "SourceOptions",
    "READ_FROM",
    "parse_options",
    "parse_offset_spec",
    "select_partitions",
    "resolve_offsets",
    "check_data_loss",
    "rate_limit",
    "plan_ranges",
    "offsets_to_json",
    "offsets_from_json",
]

EARLIEST = -2
LATEST = -1

# krill.readFrom: each partition's leader, or any of its in-sync replicas.
READ_FROM = ("leader", "replica")

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

# A range of more than this many records is not split further by minPartitions (as Spark).
_SPLIT_RECORDS_MIN = 1


class DataLossError(Exception):
    """Records the query needs were deleted (or offsets went backwards)."""


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records start <= offset < end of one partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    starting: str | PartitionOffsets = "latest"
    ending: str | PartitionOffsets = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    include_headers: bool = False
    timeout_s: float = 30.0
    read_from: str = "leader"  # one of READ_FROM
    connect_timeout_s: float = 5.0
    # Kafka's isolation.level=read_committed: read up to the last stable offset, without
    # aborted transactions' records.
    read_committed: bool = False

    @property
    def bootstrap_addresses(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.bootstrap.split(",") if a.strip())


def parse_options(options: dict[str, str], *, streaming: bool) -> SourceOptions:
    """Spark hands options with lowercased keys (and values as strings)."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    bootstrap = lowered.get("krill.bootstrap") or lowered.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise ValueError("option krill.bootstrap (the reader endpoint, host:port) is required")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in lowered]
    if len(chosen) != 1:
        raise ValueError("exactly one of subscribe, subscribePattern or assign is required, "
                         f"got {chosen or 'none'}")
    subscribe = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
    if "subscribe" in lowered and not subscribe:
        raise ValueError("subscribe names no topic")
    assign: tuple[TopicPartition, ...] = ()
    if "assign" in lowered:
        assign = tuple(sorted(_parse_assign(lowered["assign"])))
    starting = parse_offset_spec(
        lowered.get("startingoffsets", "latest" if streaming else "earliest"), "startingOffsets")
    ending = parse_offset_spec(lowered.get("endingoffsets", "latest"), "endingOffsets")
    if streaming and "endingoffsets" in lowered:
        raise ValueError("endingOffsets is for batch queries only")
    if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
        raise ValueError("endingOffsets cannot be earliest (-2)")
    read_from = lowered.get("krill.readfrom", "leader").lower()
    if read_from not in READ_FROM:
        raise ValueError(f"option krill.readFrom must be leader or replica, not {read_from!r}")
    isolation = lowered.get("kafka.isolation.level", "read_uncommitted").lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise ValueError("option kafka.isolation.level must be read_uncommitted or "
                         f"read_committed, not {isolation!r}")
    if not streaming and (starting == "latest"
                          or (isinstance(starting, dict) and LATEST in starting.values())):
        raise ValueError("startingOffsets cannot be latest (-1) for batch queries")
    return SourceOptions(
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=lowered.get("subscribepattern"),
        assign=assign,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_positive(lowered, "maxoffsetspertrigger"),
        fail_on_data_loss=_boolean(lowered, "failondataloss", True),
        min_partitions=_positive(lowered, "minpartitions"),
        include_headers=_boolean(lowered, "includeheaders", False),
        timeout_s=float(lowered.get("krill.timeoutms", "30000")) / 1000,
        read_from=read_from,
        connect_timeout_s=float(lowered.get("krill.connecttimeoutms", "5000")) / 1000,
        read_committed=isolation == "read_committed",
    )


def _positive(options: dict[str, str], key: str) -> int | None:
    if key not in options:
        return None
    try:
        value = int(options[key])
    except ValueError:
        raise ValueError(f"option {key} must be an integer, not {options[key]!r}") from None
    if value < 1:
        raise ValueError(f"option {key} must be positive, not {value}")
    return value


def _boolean(options: dict[str, str], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"option {key} must be true or false, not {value!r}")
    return value.lower() == "true"


def _parse_assign(text: str) -> list[TopicPartition]:
    try:
        value = json.loads(text)
        return [(str(topic), int(p)) for topic, parts in value.items() for p in parts]
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f'assign must be JSON like {{"topic": [0, 1]}}, not {text!r}') from None


def parse_offset_spec(text: str, name: str) -> str | PartitionOffsets:
    """'earliest', 'latest', or {(topic, partition): offset} from Kafka's JSON shape."""
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    try:
        return offsets_from_json(stripped)
    except ValueError:
        raise ValueError(f"{name} must be earliest, latest or JSON like "
                         f'{{"topic": {{"0": 23}}}}, not {text!r}') from None


def offsets_to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """{(topic, p): offset} -> {"topic": {"p": offset}}, sorted (a stable checkpoint)."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def offsets_from_json(value: str | dict[str, Any]) -> PartitionOffsets:
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, dict):
        raise ValueError("offsets JSON is not an object")
    result: PartitionOffsets = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ValueError(f"offsets of {topic!r} are not an object")
        for partition, offset in partitions.items():
            offset = int(offset)
            if offset < EARLIEST:
                raise ValueError(f"offset {offset} of {topic}-{partition}")
            result[(str(topic), int(partition))] = offset
    return result


def select_partitions(
    options: SourceOptions, topics: dict[str, int]
) -> list[TopicPartition]:
    """The partitions the query reads, from the node's {topic: partition count}."""
    if options.assign:
        return list(options.assign)
    if options.subscribe_pattern is not None:
        pattern = re.compile(options.subscribe_pattern)
        names = [t for t in topics if pattern.fullmatch(t)]
    else:
        names = [t for t in options.subscribe if t in topics]
    return sorted((t, p) for t in names for p in range(topics[t]))


def resolve_offsets(
    spec: str | PartitionOffsets,
    partitions: list[TopicPartition],
    earliest: PartitionOffsets,
    latest: PartitionOffsets,
    *,
    default: int = EARLIEST,
) -> PartitionOffsets:
    """Actual offsets for `partitions`: earliest/latest and -2/-1 become the log start and the
    high watermark; a partition absent from a JSON spec takes `default`."""
    if spec == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec == "latest":
        return {tp: latest[tp] for tp in partitions}
    assert isinstance(spec, dict)
    result: PartitionOffsets = {}
    for tp in partitions:
        wanted = spec.get(tp, default)
        result[tp] = earliest[tp] if wanted == EARLIEST else latest[tp] if wanted == LATEST \
            else wanted
    return result


def check_data_loss(
    start: PartitionOffsets,
    earliest: PartitionOffsets,
    latest: PartitionOffsets,
    fail_on_data_loss: bool,
) -> tuple[PartitionOffsets, list[str]]:
    """(start moved to what still exists, a warning per loss). A start below the log start
    lost the deleted records; a start past the high watermark means the log went backwards
    (topic re-created or truncated): read it from its start. With fail_on_data_loss the
    first loss raises DataLossError instead."""
    adjusted = dict(start)
    losses: list[str] = []
    for tp, offset in start.items():
        low, high = earliest.get(tp), latest.get(tp)
        if low is None or high is None:
            continue
        if offset < low:
            losses.append(f"{tp[0]}-{tp[1]}: offsets {offset}..{low - 1} were deleted "
                          f"(log start is {low}); some data may have been lost")
            adjusted[tp] = low
        elif offset > high:
            losses.append(f"{tp[0]}-{tp[1]}: offset {offset} is past the end {high} (topic "
                          f"re-created or log truncated); some data may have been lost")
            adjusted[tp] = low
    if losses and fail_on_data_loss:
        raise DataLossError(
            "; ".join(losses) + ". Set failOnDataLoss=false to skip ahead instead of failing.")
    return adjusted, losses


def rate_limit(limit: int, start: PartitionOffsets, end: PartitionOffsets) -> PartitionOffsets:
    """End offsets moving at most ~`limit` records past `start`, shared by lag (Spark's
    KafkaMicroBatchStream.rateLimit): share = limit * lag / total lag, floored, but a lagging
    partition always gets at least 1 so none starves; never past its end."""
    lags = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    lags = {tp: lag for tp, lag in lags.items() if lag > 0}
    total = sum(lags.values())
    if total <= limit:
        return dict(end)
    limited = dict(end)
    for tp, lag in lags.items():
        share = limit * (lag / total)
        step = int(share) if share >= 1 else 1
        limited[tp] = min(end[tp], start[tp] + step)
    return limited


def plan_ranges(
    start: PartitionOffsets, end: PartitionOffsets, min_partitions: int | None = None
) -> list[OffsetRange]:
    """One range per partition with records to read; with min_partitions, ranges are split
    (in proportion to their size, as Spark's KafkaOffsetRangeCalculator) until there are at
    least that many."""
    ranges = [
        OffsetRange(tp[0], tp[1], start[tp], end[tp])
        for tp in sorted(end)
        if tp in start and end[tp] > start[tp]
    ]
    if min_partitions is None or len(ranges) >= min_partitions or not ranges:
        return ranges
    total = sum(r.size for r in ranges)
    result: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions))
        parts = min(parts, r.size)
        step, extra = divmod(r.size, parts)
        offset = r.start
        for i in range(parts):
            size = step + (1 if i < extra else 0)
            result.append(OffsetRange(r.topic, r.partition, offset, offset + size))
            offset += size
        assert offset == r.end
    return result
