"""The checker: what a history (scenarios/history.py) says went wrong, as Jepsen names it.

A pure function of the operations: `check(ops, bounds)` reads nothing else, so a recorded
history can be checked again (`history.jsonl`). Anomalies, each reported with the records
that show it (Jepsen's Kafka workload, without transactions):

- `inconsistent-offsets`: two values seen at one offset of a partition (by sends' answers
  or polls), with who saw each (`seen_by`): in a cluster, consumers reading through
  different nodes that disagree on an offset's value.
- `duplicate`: one sent value seen at two offsets.
- `unexpected`: a polled value that no send wrote, or whose send certainly failed.
- `lost-write`: an acknowledged send whose value nobody read, though polls read past its
  offset in its partition.
- `nonmonotonic-send`: one producer's acknowledged sends to a partition, in the order it
  made them, whose offsets do not increase.
- `nonmonotonic-poll`: one consumer's records of a partition, in the order it read them,
  whose offsets do not increase (an `assign` starts it afresh).
- `poll-skip`: a consumer read offset a then b > a + 1 of a partition, though some offset
  between them is known to exist (a send was acknowledged there, or a poll read it). A
  compacted topic has such gaps by design: leave its partitions out (`skip_topics`).

DeleteRecords (a `fault` whose `deleted_below` is `[topic, partition, offset]`) takes every
record below its offset by request: such a record is not called lost, whenever the request
came (it may have been gone before anyone read it), and a consumer that skipped offsets all
below the highest such offset asked for before its poll ended (its position was reset to the
new log start) made no poll-skip. A request whose answer was lost counts as done.

Figures beside them: sends by outcome and the error rate; acknowledged sends' latency
(p50/p99/p99.9) outside the faults' windows and inside them; per fault, how long after it
was undone the first send was acknowledged (`recovery_ms`) and the longest stretch without an
acknowledgement from its start to then (`outage_ms`); `offsets_read_by_several` counts the
offsets that more than one consumer read, each a comparison that could have found
`inconsistent-offsets`. `Bounds` turns figures into checks.

Example: sends p0-1 -> offset 0, p0-2 -> offset 1 (both ok); a consumer polls offsets 1 then
nothing else: p0-1 at offset 0 was acknowledged, nobody read it, but offset 1 was read:
`lost-write` [{"value": "p0-1", "topic": "t", "partition": 0, "offset": 0, "read_up_to": 1}].
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scenarios.history import Op

__all__ = ["ANOMALIES", "Bounds", "CheckResult", "check"]

ANOMALIES = ("lost-write", "duplicate", "inconsistent-offsets", "nonmonotonic-send",
             "nonmonotonic-poll", "poll-skip", "unexpected")

# Offsets of a poll-skip listed in its report (the count is always there).
SKIPPED_LISTED_MAX = 10

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Bounds:
    """Limits the figures must keep; None: not checked."""

    p99_ms_outside_faults: float | None = None
    recovery_ms: float | None = None  # every fault's
    error_rate: float | None = None  # failed and unknown sends over all sends


@dataclass(slots=True)
class CheckResult:
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> value, bound, ok

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values()) and all(c["ok"] for c in self.checks.values())

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "anomalies": self.anomalies, "figures": self.figures,
                "checks": self.checks}


def check(ops: Sequence[Op], bounds: Bounds = Bounds(),  # noqa: B008 - frozen
          skip_topics: Iterable[str] = ()) -> CheckResult:
    skipped = set(skip_topics)
    result = CheckResult(anomalies={name: [] for name in ANOMALIES})
    sends = [op for op in ops if op.op == "send"]
    by_value = {op.value: op for op in sends if op.value is not None}
    seen = _observations(ops)
    deleted = _deletions(ops)
    _inconsistent_offsets(ops, seen, result.anomalies["inconsistent-offsets"])
    _duplicates(seen, result.anomalies["duplicate"])
    _unexpected(ops, by_value, result.anomalies["unexpected"])
    _lost_writes(sends, seen, deleted, result.anomalies["lost-write"])
    _nonmonotonic_sends(sends, result.anomalies["nonmonotonic-send"])
    _polls_in_order(ops, seen, skipped, deleted, result.anomalies)
    _figures(ops, sends, result.figures, seen.read_by_several)
    if deleted:
        result.figures["records_deleted_below"] = {
            f"{t}-{p}": max(offset for _, offset in asked) for (t, p), asked in
            sorted(deleted.items())}
    _bounds(result, bounds)
    return result


# Anomalies ----------------------------------------------------------------------------------


class _Seen:
    """Every (partition, offset) -> values, and value -> places, from sends' answers and polls."""

    def __init__(self) -> None:
        self.at: dict[TopicPartition, dict[int, set[str | None]]] = defaultdict(dict)
        self.places: dict[str | None, set[tuple[str, int, int]]] = defaultdict(set)
        self.read: dict[str | None, int] = defaultdict(int)  # value -> times polled
        self.read_up_to: dict[TopicPartition, int] = {}  # highest offset polled
        # The first consumer to read each offset, None once a second one read it too.
        self.first_reader: dict[TopicPartition, dict[int, str | None]] = defaultdict(dict)
        self.read_by_several = 0
        self._offsets: dict[TopicPartition, list[int]] = {}

    def add(self, topic: str, partition: int, offset: int, value: str | None) -> None:
        self.at[(topic, partition)].setdefault(offset, set()).add(value)
        self.places[value].add((topic, partition, offset))

    def known_between(self, tp: TopicPartition, low: int, high: int) -> list[int]:
        """Known offsets strictly between low and high."""
        offsets = self._offsets.get(tp)
        if offsets is None:
            offsets = self._offsets[tp] = sorted(self.at.get(tp, {}))
        start = bisect_right(offsets, low)
        end = bisect_right(offsets, high - 1)
        return offsets[start:end]


def _observations(ops: Sequence[Op]) -> _Seen:
    seen = _Seen()
    for op in ops:
        if op.op == "send" and op.outcome == "ok" and op.offset is not None:
            assert op.topic is not None and op.partition is not None
            seen.add(op.topic, op.partition, op.offset, op.value)
        elif op.op == "poll" and op.outcome == "ok":
            for topic, partition, offset, value in op.records:
                seen.add(topic, partition, offset, value)
                seen.read[value] += 1
                tp = (topic, partition)
                seen.read_up_to[tp] = max(seen.read_up_to.get(tp, -1), offset)
                readers = seen.first_reader[tp]
                first = readers.setdefault(offset, op.client)
                if first is not None and first != op.client:
                    readers[offset] = None
                    seen.read_by_several += 1
    return seen


def _inconsistent_offsets(ops: Sequence[Op], seen: _Seen, out: list[dict[str, Any]]) -> None:
    cases: dict[tuple[str, int, int], dict[str, Any]] = {}
    for (topic, partition), offsets in sorted(seen.at.items()):
        for offset, values in sorted(offsets.items()):
            if len(values) > 1:
                case = {"topic": topic, "partition": partition, "offset": offset,
                        "values": sorted(values, key=str), "seen_by": {}}
                cases[(topic, partition, offset)] = case
                out.append(case)
    if not cases:
        return
    # Who saw which value there (a producer by its answer, a consumer by its read): a second
    # pass, only for the offsets found.
    seen_by: dict[tuple[str, int, int], dict[str, set[str]]] = defaultdict(
        lambda: defaultdict(set))
    for op in ops:
        if op.outcome != "ok":
            continue
        if op.op == "send" and (op.topic, op.partition, op.offset) in cases:
            seen_by[(str(op.topic), int(op.partition or 0), int(op.offset or 0))][
                str(op.value)].add(op.client)
        elif op.op == "poll":
            for topic, partition, offset, value in op.records:
                if (topic, partition, offset) in cases:
                    seen_by[(topic, partition, offset)][str(value)].add(op.client)
    for key, case in cases.items():
        case["seen_by"] = {value: sorted(clients) for value, clients in
                           sorted(seen_by[key].items())}


def _duplicates(seen: _Seen, out: list[dict[str, Any]]) -> None:
    for value, places in sorted(seen.places.items(), key=lambda item: str(item[0])):
        if value is not None and len(places) > 1:
            out.append({"value": value, "at": sorted(list(p) for p in places)})


def _unexpected(ops: Sequence[Op], by_value: dict[str, Op], out: list[dict[str, Any]]) -> None:
    for op in ops:
        if op.op != "poll" or op.outcome != "ok":
            continue
        for topic, partition, offset, value in op.records:
            sent = by_value.get(value) if value is not None else None
            if sent is None:
                out.append({"value": value, "at": [topic, partition, offset],
                            "client": op.client, "why": "never sent"})
            elif sent.outcome == "failed":
                out.append({"value": value, "at": [topic, partition, offset],
                            "client": op.client, "why": "its send failed"})


def _deletions(ops: Sequence[Op]) -> dict[TopicPartition, list[tuple[int, int]]]:
    """DeleteRecords asked for, per partition: (when it was asked, the offset below which
    every record goes), in the order asked."""
    found: dict[TopicPartition, list[tuple[int, int]]] = defaultdict(list)
    for op in sorted((o for o in ops if o.op == "fault" and "deleted_below" in o.extra),
                     key=lambda o: o.invoke_ns):
        topic, partition, offset = op.extra["deleted_below"]
        found[(str(topic), int(partition))].append((op.invoke_ns, int(offset)))
    return dict(found)


def _deleted_below(deleted: dict[TopicPartition, list[tuple[int, int]]], tp: TopicPartition,
                   before_ns: int | None = None) -> int:
    """The highest offset below which DeleteRecords took the partition's records (asked for
    before `before_ns`, when given); 0 when none did."""
    return max((offset for asked_ns, offset in deleted.get(tp, ())
                if before_ns is None or asked_ns < before_ns), default=0)


def _lost_writes(sends: Sequence[Op], seen: _Seen,
                 deleted: dict[TopicPartition, list[tuple[int, int]]],
                 out: list[dict[str, Any]]) -> None:
    for op in sends:
        if op.outcome != "ok" or op.offset is None or seen.read[op.value]:
            continue
        assert op.topic is not None and op.partition is not None
        if op.offset < _deleted_below(deleted, (op.topic, op.partition)):
            continue
        up_to = seen.read_up_to.get((op.topic, op.partition), -1)
        if up_to > op.offset:
            out.append({"value": op.value, "topic": op.topic, "partition": op.partition,
                        "offset": op.offset, "read_up_to": up_to})


def _nonmonotonic_sends(sends: Sequence[Op], out: list[dict[str, Any]]) -> None:
    last: dict[tuple[str, str, int], Op] = {}
    for op in sorted(sends, key=lambda o: o.invoke_ns):
        if op.outcome != "ok" or op.offset is None:
            continue
        assert op.topic is not None and op.partition is not None
        key = (op.client, op.topic, op.partition)
        before = last.get(key)
        if before is not None and before.offset is not None and op.offset <= before.offset:
            out.append({"client": op.client, "topic": op.topic, "partition": op.partition,
                        "previous": {"value": before.value, "offset": before.offset},
                        "next": {"value": op.value, "offset": op.offset}})
        last[key] = op


def _polls_in_order(ops: Sequence[Op], seen: _Seen, skipped: set[str],
                    deleted: dict[TopicPartition, list[tuple[int, int]]],
                    anomalies: dict[str, list[dict[str, Any]]]) -> None:
    """nonmonotonic-poll and poll-skip: each consumer's records in the order it read them."""
    position: dict[tuple[str, str, int], int] = {}  # (client, topic, partition) -> last offset
    for op in sorted((o for o in ops if o.op in ("poll", "assign")),
                     key=lambda o: o.complete_ns):
        if op.op == "assign":
            for key in [k for k in position if k[0] == op.client]:
                del position[key]
            continue
        if op.outcome != "ok":
            continue
        for topic, partition, offset, value in op.records:
            key = (op.client, topic, partition)
            before = position.get(key)
            position[key] = offset
            if before is None or topic in skipped:
                continue
            where = {"client": op.client, "topic": topic, "partition": partition,
                     "previous": before, "next": offset, "value": value}
            if offset <= before:
                anomalies["nonmonotonic-poll"].append(where)
                continue
            missed = seen.known_between((topic, partition), before, offset)
            if missed and (topic, partition) in deleted:
                gone = _deleted_below(deleted, (topic, partition), op.complete_ns)
                missed = [o for o in missed if o >= gone]
            if missed:
                anomalies["poll-skip"].append(
                    {**where, "skipped": len(missed), "offsets": missed[:SKIPPED_LISTED_MAX]})


# Figures and bounds -------------------------------------------------------------------------


def _figures(ops: Sequence[Op], sends: Sequence[Op], figures: dict[str, Any],
             read_by_several: int = 0) -> None:
    outcomes = {name: sum(1 for op in sends if op.outcome == name)
                for name in ("ok", "failed", "unknown")}
    figures["sends"] = {"total": len(sends), **outcomes}
    figures["error_rate"] = (
        round((outcomes["failed"] + outcomes["unknown"]) / len(sends), 6) if sends else 0.0)
    figures["records_polled"] = sum(len(op.records) for op in ops if op.op == "poll")
    figures["offsets_read_by_several"] = read_by_several
    faults = [op for op in ops if op.op == "fault"]
    acked = sorted((op for op in sends if op.outcome == "ok"), key=lambda o: o.complete_ns)
    inside = [op.latency_ns for op in acked if _in_any(op, faults)]
    outside = [op.latency_ns for op in acked if not _in_any(op, faults)]
    figures["latency_ms_outside_faults"] = _summary(outside)
    figures["latency_ms_during_faults"] = _summary(inside)
    figures["faults"] = [_recovery(fault, acked) for fault in faults]


def _in_any(op: Op, faults: Sequence[Op]) -> bool:
    """Whether the operation overlapped a fault's window."""
    return any(op.invoke_ns <= f.complete_ns and op.complete_ns >= f.invoke_ns for f in faults)


def _summary(latencies_ns: list[int]) -> dict[str, Any]:
    if not latencies_ns:
        return {"count": 0}
    ordered = sorted(latencies_ns)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6, 3)

    return {"count": len(ordered), "p50": at(0.5), "p99": at(0.99), "p99_9": at(0.999),
            "max": round(ordered[-1] / 1e6, 3)}


def _recovery(fault: Op, acked: Sequence[Op]) -> dict[str, Any]:
    """How long after the fault was undone sends were acknowledged again, and the longest
    stretch without an acknowledgement from the fault's start until then."""
    first_after = next((op for op in acked if op.complete_ns >= fault.complete_ns), None)
    figures: dict[str, Any] = {"name": fault.name,
                               "window_ms": round(fault.latency_ns / 1e6, 3)}
    if first_after is None:
        figures.update(recovery_ms=None, outage_ms=None)  # never recovered in this history
        return figures
    figures["recovery_ms"] = round((first_after.complete_ns - fault.complete_ns) / 1e6, 3)
    times = [fault.invoke_ns] + [op.complete_ns for op in acked
                                 if fault.invoke_ns <= op.complete_ns <= first_after.complete_ns]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    figures["outage_ms"] = round(max(gaps, default=0) / 1e6, 3)
    return figures


def _bounds(result: CheckResult, bounds: Bounds) -> None:
    figures = result.figures
    if bounds.p99_ms_outside_faults is not None:
        p99 = figures["latency_ms_outside_faults"].get("p99")
        result.checks["p99_ms_outside_faults"] = {
            "value": p99, "bound": bounds.p99_ms_outside_faults,
            "ok": p99 is not None and p99 <= bounds.p99_ms_outside_faults}
    if bounds.recovery_ms is not None:
        worst = [f["recovery_ms"] for f in figures["faults"]]
        value = None if None in worst else max(worst, default=0.0)
        result.checks["recovery_ms"] = {"value": value, "bound": bounds.recovery_ms,
                                        "ok": value is not None and value <= bounds.recovery_ms}
    if bounds.error_rate is not None:
        result.checks["error_rate"] = {"value": figures["error_rate"], "bound": bounds.error_rate,
                                       "ok": figures["error_rate"] <= bounds.error_rate}
