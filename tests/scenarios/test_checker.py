"""The checker on hand-made histories: each anomaly alone, a clean history, figures, bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.checker import ANOMALIES, Bounds, check
from scenarios.history import HistoryError, Op, read_history, write_history

pytestmark = pytest.mark.timeout(30)

MS = 1_000_000


class History:
    """Builds operations on a clock that moves 1 ms per operation unless told."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.now = 0

    def _times(self, took_ms: float) -> tuple[int, int]:
        start = self.now
        self.now += int(max(took_ms, 1) * MS)
        return start, start + int(took_ms * MS)

    def send(self, client: str, value: str, offset: int | None, partition: int = 0,
             outcome: str = "ok", took_ms: float = 1) -> History:
        start, end = self._times(took_ms)
        self.ops.append(Op("send", client, start, end, outcome, topic="t", partition=partition,
                           value=value, offset=offset if outcome == "ok" else None))
        return self

    def poll(self, client: str, *records: tuple[int, str], partition: int = 0) -> History:
        start, end = self._times(1)
        self.ops.append(Op("poll", client, start, end, "ok",
                           records=tuple(("t", partition, o, v) for o, v in records)))
        return self

    def assign(self, client: str) -> History:
        start, end = self._times(0)
        self.ops.append(Op("assign", client, start, end, "ok", partitions=(("t", 0),)))
        return self

    def fault(self, name: str, start_ms: float, end_ms: float) -> History:
        self.ops.append(Op("fault", "nemesis", int(start_ms * MS), int(end_ms * MS), "ok",
                           name=name))
        return self

    def delete_records(self, below: int, partition: int = 0) -> History:
        """DeleteRecords asked now: every record of the partition below `below` goes."""
        start, end = self._times(1)
        self.ops.append(Op("fault", "nemesis", start, end, "ok", name=f"delete below {below}",
                           extra={"deleted_below": ["t", partition, below]}))
        return self


def found(history: History, **kwargs: object) -> dict[str, list[dict[str, object]]]:
    """The anomalies found, only those with cases."""
    result = check(history.ops, **kwargs)  # type: ignore[arg-type]
    return {name: cases for name, cases in result.anomalies.items() if cases}


def clean() -> History:
    h = History()
    h.send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p1", "p1-0", 2)
    h.poll("c0", (0, "p0-0"), (1, "p0-1")).poll("c0", (2, "p1-0"))
    return h


def test_a_clean_history_is_valid() -> None:
    result = check(clean().ops)
    assert result.valid and set(result.anomalies) == set(ANOMALIES)
    assert result.figures["sends"] == {"total": 3, "ok": 3, "failed": 0, "unknown": 0}
    assert result.figures["records_polled"] == 3


def test_lost_write_needs_reads_past_it() -> None:
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).poll("c0", (1, "p0-1"))
    assert found(h) == {"lost-write": [{"value": "p0-0", "topic": "t", "partition": 0,
                                        "offset": 0, "read_up_to": 1}]}
    # Not read, but nobody read past it either: not (yet) lost.
    assert found(History().send("p0", "p0-0", 0).poll("c0")) == {}
    # An unknown send that was never read is no anomaly: it may not have happened.
    h = History().send("p0", "p0-0", None, outcome="unknown").send("p0", "p0-1", 1)
    assert found(h.poll("c0", (1, "p0-1"))) == {}


def test_duplicate() -> None:
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1)
    h.poll("c0", (0, "p0-0"), (1, "p0-1"), (2, "p0-0"))  # p0-0 again, at 2
    assert found(h) == {"duplicate": [{"value": "p0-0", "at": [["t", 0, 0], ["t", 0, 2]]}]}


def test_inconsistent_offsets() -> None:
    h = History().send("p0", "p0-0", 0).send("p1", "p1-0", 1)
    h.poll("c0", (0, "p0-0"), (1, "p1-0")).assign("c1").poll("c1", (0, "p0-0"), (1, "p0-9"))
    assert found(h)["inconsistent-offsets"] == [
        {"topic": "t", "partition": 0, "offset": 1, "values": ["p0-9", "p1-0"],
         "seen_by": {"p0-9": ["c1"], "p1-0": ["c0", "p1"]}}]


def test_unexpected_never_sent_or_failed() -> None:
    h = History().send("p0", "p0-0", None, outcome="failed").send("p0", "p0-1", 0)
    h.poll("c0", (0, "p0-1"), (1, "p0-0"), (2, "zz-1"))
    assert found(h) == {"unexpected": [
        {"value": "p0-0", "at": ["t", 0, 1], "client": "c0", "why": "its send failed"},
        {"value": "zz-1", "at": ["t", 0, 2], "client": "c0", "why": "never sent"},
    ]}


def test_nonmonotonic_send_in_the_order_the_producer_sent() -> None:
    h = History().send("p0", "p0-0", 5).send("p0", "p0-1", 3).send("p1", "p1-0", 4)
    h.poll("c0", (3, "p0-1"), (4, "p1-0"), (5, "p0-0"))
    assert found(h) == {"nonmonotonic-send": [
        {"client": "p0", "topic": "t", "partition": 0, "previous": {"value": "p0-0", "offset": 5},
         "next": {"value": "p0-1", "offset": 3}}]}
    # Different partitions of one producer are independent.
    h = History().send("p0", "p0-0", 5, partition=0).send("p0", "p0-1", 3, partition=1)
    assert found(h) == {}


def test_nonmonotonic_poll_and_a_reassignment_resets() -> None:
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1)
    h.poll("c0", (0, "p0-0"), (1, "p0-1")).poll("c0", (1, "p0-1"))  # 1 again
    assert found(h) == {"nonmonotonic-poll": [
        {"client": "c0", "topic": "t", "partition": 0, "previous": 1, "next": 1,
         "value": "p0-1"}]}
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1)
    h.poll("c0", (0, "p0-0"), (1, "p0-1")).assign("c0").poll("c0", (0, "p0-0"))
    assert found(h) == {}  # a seek back after an assignment is no anomaly


def test_poll_skip_only_over_offsets_known_to_exist() -> None:
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.poll("c0", (0, "p0-0")).poll("c0", (2, "p0-2")).assign("c1").poll("c1", (1, "p0-1"))
    assert found(h) == {"poll-skip": [
        {"client": "c0", "topic": "t", "partition": 0, "previous": 0, "next": 2,
         "value": "p0-2", "skipped": 1, "offsets": [1]}]}
    # A gap nobody knows anything about (a control record, a compacted offset) is no skip.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-2", 2)
    assert found(h.poll("c0", (0, "p0-0"), (2, "p0-2"))) == {}
    # And a compacted topic's partitions can be left out altogether.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.poll("c0", (0, "p0-0"), (2, "p0-2")).assign("c1").poll("c1", (1, "p0-1"))
    assert found(h, skip_topics=["t"]) == {}


def test_records_delete_records_took_are_not_lost_nor_skipped() -> None:
    # Acknowledged at 0..3; DeleteRecords below 3; a consumer that was at 0 is reset to the
    # new log start and reads 3: neither the records it never read nor its jump is a finding.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.send("p0", "p0-3", 3).poll("c0", (0, "p0-0")).delete_records(3).poll("c0", (3, "p0-3"))
    result = check(h.ops)
    assert result.valid, result.anomalies
    assert result.figures["records_deleted_below"] == {"t-0": 3}
    # Without the deletion the same reads are a loss and a skip.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.send("p0", "p0-3", 3).poll("c0", (0, "p0-0")).poll("c0", (3, "p0-3"))
    assert set(found(h)) == {"lost-write", "poll-skip"}


def test_delete_records_excuses_only_below_its_offset_and_after_it_was_asked() -> None:
    # Below 2 deleted: the record at 2 that the consumer jumped over is still a skip and a
    # loss; another partition is untouched by it.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.send("p0", "p0-3", 3).poll("c0", (0, "p0-0")).delete_records(2).poll("c0", (3, "p0-3"))
    assert found(h) == {
        "lost-write": [{"value": "p0-2", "topic": "t", "partition": 0, "offset": 2,
                        "read_up_to": 3}],
        "poll-skip": [{"client": "c0", "topic": "t", "partition": 0, "previous": 0, "next": 3,
                       "value": "p0-3", "skipped": 1, "offsets": [2]}]}
    # A skip made before the deletion was asked for is a skip all the same.
    h = History().send("p0", "p0-0", 0).send("p0", "p0-1", 1).send("p0", "p0-2", 2)
    h.poll("c0", (0, "p0-0")).poll("c0", (2, "p0-2")).delete_records(2)
    assert list(found(h)) == ["poll-skip"]
    h = History().send("p0", "p0-0", 0).send("p1", "p1-0", 0, partition=1)
    h.send("p1", "p1-1", 1, partition=1).delete_records(1, partition=0)
    h.poll("c0", (1, "p1-1"), partition=1)
    assert found(h)["lost-write"] == [{"value": "p1-0", "topic": "t", "partition": 1,
                                       "offset": 0, "read_up_to": 1}]


def test_latency_outside_faults_recovery_and_bounds() -> None:
    h = History()
    for i in range(10):
        h.send("p0", f"p0-{i}", i, took_ms=2)  # 0..20 ms, 2 ms each
    h.now = 100 * MS
    h.send("p0", "p0-slow", 10, took_ms=50)  # during the fault below
    h.now = 200 * MS
    h.send("p0", "p0-after", 11, took_ms=5)  # acknowledged at 205 ms
    h.fault("kill -9 node 0", 90, 180)
    h.poll("c0", *((i, f"p0-{i}") for i in range(10)), (10, "p0-slow"), (11, "p0-after"))
    result = check(h.ops, Bounds(p99_ms_outside_faults=10, recovery_ms=20, error_rate=0.0))
    figures = result.figures
    assert figures["latency_ms_outside_faults"]["count"] == 11
    assert figures["latency_ms_outside_faults"]["max"] == 5.0
    assert figures["latency_ms_during_faults"] == {"count": 1, "p50": 50.0, "p99": 50.0,
                                                   "p99_9": 50.0, "max": 50.0}
    (fault,) = figures["faults"]
    assert fault["recovery_ms"] == 25.0  # undone at 180, the next ack at 205
    assert fault["outage_ms"] == 60.0  # from the fault's start (90 ms) to the ack at 150
    assert result.checks["recovery_ms"] == {"value": 25.0, "bound": 20, "ok": False}
    assert result.checks["p99_ms_outside_faults"]["ok"]
    assert result.checks["error_rate"]["ok"]
    assert not result.valid  # no anomaly, but a bound missed


def test_a_fault_never_recovered_from_fails_its_bound() -> None:
    h = History().send("p0", "p0-0", 0).fault("SIGSTOP shard 1", 5, 10)
    result = check(h.ops, Bounds(recovery_ms=1000))
    assert result.figures["faults"][0]["recovery_ms"] is None
    assert not result.checks["recovery_ms"]["ok"]


def test_history_round_trip_and_bad_lines(tmp_path: Path) -> None:
    h = clean().fault("restart", 1, 2).assign("c0").delete_records(1)
    path = tmp_path / "history.jsonl"
    write_history(path, h.ops)
    assert read_history(path) == h.ops
    assert check(read_history(path)).to_json() == check(h.ops).to_json()
    path.write_text('{"op": "send", "client": "p", "invoke_ns": 1, "complete_ns": 2, '
                    '"outcome": "ok", "topic": "t", "partition": 0}\n{"op": "jump"}\n')
    with pytest.raises(HistoryError, match=r"history.jsonl:2: op must be one of"):
        read_history(path)
