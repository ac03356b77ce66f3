"""The consumer worker's drain: what it names when it runs out of time (the runner turns that
into an error, so a run whose consumers read nothing cannot pass)."""

from __future__ import annotations

import pytest

from scenarios.worker import _short_of

pytestmark = pytest.mark.timeout(10)


class _Positions:
    """Consumers as the drain sees them: each member's (name, group, _) and its positions."""

    def __init__(self, members: list[tuple[str, dict[tuple[str, int], int]]]) -> None:
        self.members = [(f"c{i}", group, None) for i, (group, _) in enumerate(members)]
        self.at = [positions for _, positions in members]

    def positions(self, index: int) -> dict[tuple[str, int], int]:
        return self.at[index]


CONFIG = {"subscriptions": {"g1": ["t"], "g2": ["t", "u"]}}
ENDS = {("t", 0): 10, ("t", 1): 0, ("u", 0): 5}


def test_a_group_at_every_end_is_drained_and_an_empty_partition_asks_nothing() -> None:
    consumers = _Positions([("g1", {("t", 0): 10}), ("g2", {("t", 0): 12}),
                            ("g2", {("u", 0): 5})])
    assert _short_of(consumers, CONFIG, ENDS) == {}


def test_what_is_short_is_named_per_group_with_the_position_or_minus_one() -> None:
    consumers = _Positions([("g1", {("t", 0): 7}), ("g2", {("t", 0): 10})])
    assert _short_of(consumers, CONFIG, ENDS) == {"g1": [("t", 0, 7, 10)],
                                                  "g2": [("u", 0, -1, 5)]}
