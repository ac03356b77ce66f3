"""Consumers that read one partition through different nodes must agree on every offset's
value: the checker counts the offsets read more than once and names who saw what where they
disagree."""

from __future__ import annotations

import pytest

from scenarios.checker import check
from scenarios.history import Op

pytestmark = pytest.mark.timeout(30)


def poll(client: str, at: int, *records: tuple[int, str]) -> Op:
    return Op("poll", client, at, at + 1, "ok",
              records=tuple(("t", 0, offset, value) for offset, value in records))


def send(client: str, at: int, value: str, offset: int) -> Op:
    return Op("send", client, at, at + 1, "ok", topic="t", partition=0, value=value,
              offset=offset)


def test_offsets_read_by_several_consumers_are_counted_once_each() -> None:
    ops = [send("p0", 0, "p0-0", 0), send("p0", 2, "p0-1", 1), send("p0", 4, "p0-2", 2),
           poll("c0", 10, (0, "p0-0"), (1, "p0-1"), (2, "p0-2")),
           poll("c1", 20, (0, "p0-0"), (1, "p0-1")),
           poll("c2", 30, (0, "p0-0"))]
    result = check(ops)
    assert result.valid
    assert result.figures["offsets_read_by_several"] == 2  # offsets 0 and 1; 2 by c0 alone


def test_consumers_that_disagree_are_named_with_the_value_each_saw() -> None:
    # A deposed leader kept an unreplicated tail: c1, reading through it, saw another value
    # at offset 1 than the producer's answer and c0.
    ops = [send("p0", 0, "p0-0", 0), send("p0", 2, "p0-1", 1), send("p1", 3, "p1-0", 2),
           poll("c0", 10, (0, "p0-0"), (1, "p0-1")),
           poll("c1", 20, (0, "p0-0"), (1, "p1-0"))]
    found = check(ops).anomalies["inconsistent-offsets"]
    assert found == [{"topic": "t", "partition": 0, "offset": 1, "values": ["p0-1", "p1-0"],
                      "seen_by": {"p0-1": ["c0", "p0"], "p1-0": ["c1"]}}]
