"""A scenario's history: every operation its clients did, with when and how it ended.

One JSON object per line (`history.jsonl`), in the order operations completed. Times are
nanoseconds on one monotonic clock shared by the run. Four kinds:

    {"op": "send", "client": "p0", "invoke_ns": 10, "complete_ns": 20, "outcome": "ok",
     "topic": "t", "partition": 0, "value": "p0-17", "offset": 42}
    {"op": "poll", "client": "c0", "invoke_ns": 30, "complete_ns": 40, "outcome": "ok",
     "records": [["t", 0, 42, "p0-17"], ...]}
    {"op": "assign", "client": "c0", "invoke_ns": 50, "complete_ns": 50, "outcome": "ok",
     "partitions": [["t", 0], ...]}
    {"op": "fault", "client": "nemesis", "invoke_ns": 60, "complete_ns": 90, "outcome": "ok",
     "name": "kill -9 node 0"}

`outcome` is Jepsen's: `ok` (it happened), `failed` (it certainly did not: the broker
refused it before writing), `unknown` (it may have: a timeout, a lost connection). A send's
`offset` is set when it is ok. An `assign` says a consumer's positions were set anew (an
assignment, a rebalance, a seek): what it polls next need not follow what it polled before.
A `fault` spans its window, from the step that started it to the one that undid it. Values
are unique per run (the runner makes them `<client>-<n>`), which is what lets the checker
tell a duplicate from two writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Op", "OUTCOMES", "KINDS", "HistoryError", "read_history", "write_history"]

OUTCOMES = ("ok", "failed", "unknown")
KINDS = ("send", "poll", "assign", "fault")


class HistoryError(ValueError):
    """A line that is not an operation; the message names the line."""


@dataclass(frozen=True, slots=True)
class Op:
    op: str
    client: str
    invoke_ns: int
    complete_ns: int
    outcome: str
    topic: str | None = None  # send
    partition: int | None = None  # send
    value: str | None = None  # send
    offset: int | None = None  # send, when ok
    records: tuple[tuple[str, int, int, str | None], ...] = ()  # poll
    partitions: tuple[tuple[str, int], ...] = ()  # assign
    name: str | None = None  # fault
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the runner kept

    @property
    def latency_ns(self) -> int:
        return self.complete_ns - self.invoke_ns

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "client": self.client,
                               "invoke_ns": self.invoke_ns, "complete_ns": self.complete_ns,
                               "outcome": self.outcome}
        if self.op == "send":
            out.update(topic=self.topic, partition=self.partition, value=self.value,
                       offset=self.offset)
        elif self.op == "poll":
            out["records"] = [list(r) for r in self.records]
        elif self.op == "assign":
            out["partitions"] = [list(p) for p in self.partitions]
        elif self.op == "fault":
            out["name"] = self.name
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Op:
        known = {"op", "client", "invoke_ns", "complete_ns", "outcome", "topic", "partition",
                 "value", "offset", "records", "partitions", "name"}
        kind, outcome = raw.get("op"), raw.get("outcome")
        if kind not in KINDS:
            raise HistoryError(f"op must be one of {', '.join(KINDS)}, not {kind!r}")
        if outcome not in OUTCOMES:
            raise HistoryError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        for key in ("invoke_ns", "complete_ns"):
            if not isinstance(raw.get(key), int):
                raise HistoryError(f"{key} must be an integer, not {raw.get(key)!r}")
        if kind == "send" and (raw.get("topic") is None or raw.get("partition") is None):
            raise HistoryError("a send names its topic and partition")
        return cls(
            op=kind, client=str(raw.get("client", "")), invoke_ns=raw["invoke_ns"],
            complete_ns=raw["complete_ns"], outcome=outcome, topic=raw.get("topic"),
            partition=raw.get("partition"), value=raw.get("value"), offset=raw.get("offset"),
            records=tuple((str(t), int(p), int(o), v) for t, p, o, v in raw.get("records", ())),
            partitions=tuple((str(t), int(p)) for t, p in raw.get("partitions", ())),
            name=raw.get("name"),
            extra={k: v for k, v in raw.items() if k not in known},
        )


def read_history(path: str | Path) -> list[Op]:
    """Every operation in a history file; HistoryError names the first bad line."""
    ops = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ops.append(Op.from_json(json.loads(line)))
            except (json.JSONDecodeError, HistoryError, TypeError, ValueError) as e:
                raise HistoryError(f"{path}:{number}: {e}") from None
    return ops


def write_history(path: str | Path, ops: Iterable[Op]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def sends(ops: Iterable[Op]) -> Iterator[Op]:
    return (op for op in ops if op.op == "send")
