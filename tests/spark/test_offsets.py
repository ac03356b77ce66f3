"""Planning and offset resolution, without Spark or a broker (wire/spark/offsets.py)."""

from __future__ import annotations

import json

import pytest

from wire.spark import offsets as plan
from wire.spark.offsets import DataLossError, OffsetRange


def test_options_arrive_lowercased_and_both_bootstrap_keys_work() -> None:
    options = plan.parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "a, b",
            "maxoffsetspertrigger": "10",
            "failondataloss": "false",
            "includeheaders": "true",
            "minpartitions": "4",
        },
        streaming=True,
    )
    assert options.bootstrap == "h:1" and options.subscribe == ("a", "b")
    assert options.max_offsets_per_trigger == 10 and not options.fail_on_data_loss
    assert options.include_headers and options.min_partitions == 4
    assert options.starting == "latest"  # a stream starts at latest unless told
    mixed = plan.parse_options(
        {"krill.bootstrap": "h:2", "SubscribePattern": "t.*"}, streaming=False
    )
    assert mixed.subscribe_pattern == "t.*" and mixed.starting == "earliest"


@pytest.mark.parametrize(
    "options",
    [
        {"subscribe": "a"},  # no bootstrap
        {"krill.bootstrap": "h:1"},  # no topic
        {"krill.bootstrap": "h:1", "subscribe": "a", "assign": '{"a": [0]}'},
        {"krill.bootstrap": "h:1", "subscribe": "a", "startingoffsets": "latest"},  # batch
        {"krill.bootstrap": "h:1", "subscribe": "a", "endingoffsets": "earliest"},
        {"krill.bootstrap": "h:1", "subscribe": "a", "startingoffsets": "{bad json"},
        {"krill.bootstrap": "h:1", "subscribe": "a", "maxoffsetspertrigger": "0"},
        {"krill.bootstrap": "h:1", "subscribe": "a", "failondataloss": "maybe"},
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        plan.parse_options(options, streaming=False)


def test_offsets_json_round_trip_is_kafkas_shape() -> None:
    offsets = {("t", 1): 5, ("t", 0): 7, ("u", 0): 0}
    as_json = plan.offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"t": {"0": 7, "1": 5}, "u": {"0": 0}}'
    assert plan.offsets_from_json(json.dumps(as_json)) == offsets
    assert plan.offsets_from_json(as_json) == offsets


def test_resolve_keywords_and_minus_two_minus_one() -> None:
    parts = [("t", 0), ("t", 1), ("t", 2)]
    earliest = {("t", 0): 3, ("t", 1): 0, ("t", 2): 10}
    latest = {("t", 0): 30, ("t", 1): 20, ("t", 2): 10}
    assert plan.resolve_offsets("earliest", parts, earliest, latest) == earliest
    assert plan.resolve_offsets("latest", parts, earliest, latest) == latest
    spec = plan.parse_offset_spec('{"t": {"0": -2, "1": -1}}', "startingOffsets")
    assert plan.resolve_offsets(spec, parts, earliest, latest) == {
        ("t", 0): 3,
        ("t", 1): 20,
        ("t", 2): 10,
    }  # absent: the default, earliest
    assert plan.resolve_offsets(spec, parts, earliest, latest, default=plan.LATEST)[("t", 2)] == 10


def test_select_partitions() -> None:
    topics = {"orders": 2, "orders-eu": 1, "users": 1}
    base = plan.SourceOptions(bootstrap="h:1")
    assert plan.select_partitions(
        plan.SourceOptions("h:1", subscribe=("orders", "missing")), topics
    ) == [("orders", 0), ("orders", 1)]
    assert plan.select_partitions(
        plan.SourceOptions("h:1", subscribe_pattern="orders.*"), topics
    ) == [("orders", 0), ("orders", 1), ("orders-eu", 0)]
    assert plan.select_partitions(plan.SourceOptions("h:1", assign=(("users", 0),)), topics) == [
        ("users", 0)
    ]
    assert plan.select_partitions(base, topics) == []


def test_rate_limit_shares_by_lag() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 50}
    end = {("t", 0): 300, ("t", 1): 100, ("t", 2): 50}
    assert plan.rate_limit(100, start, end) == {("t", 0): 75, ("t", 1): 25, ("t", 2): 50}
    # Enough room for everything: the end as it is.
    assert plan.rate_limit(1000, start, end) == end
    # A tiny lag still moves by one (no starvation), never past its end.
    small = plan.rate_limit(10, {("a", 0): 0, ("b", 0): 0}, {("a", 0): 1000, ("b", 0): 1})
    assert small == {("a", 0): 9, ("b", 0): 1}


def test_plan_ranges_one_per_partition_and_min_partitions_split() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    end = {("t", 0): 100, ("t", 1): 10, ("t", 2): 30}
    assert plan.plan_ranges(start, end) == [OffsetRange("t", 0, 0, 100), OffsetRange("t", 2, 5, 30)]
    split = plan.plan_ranges(start, end, min_partitions=5)
    assert len(split) >= 5
    for tp in (("t", 0), ("t", 2)):
        pieces = [r for r in split if (r.topic, r.partition) == tp]
        assert pieces[0].start == start[tp] and pieces[-1].end == end[tp]
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    # Splitting never makes empty ranges.
    assert all(r.size > 0 for r in plan.plan_ranges({("t", 0): 0}, {("t", 0): 2}, 10))


def test_data_loss_below_log_start_fails_or_skips_ahead() -> None:
    # The log start moved past what the query still needs (retention, DeleteRecords).
    start = {("t", 0): 5, ("t", 1): 50}
    earliest = {("t", 0): 20, ("t", 1): 0}
    latest = {("t", 0): 100, ("t", 1): 100}
    with pytest.raises(DataLossError, match=r"t-0: offsets 5\.\.19 were deleted"):
        plan.check_data_loss(start, earliest, latest, fail_on_data_loss=True)
    adjusted, losses = plan.check_data_loss(start, earliest, latest, fail_on_data_loss=False)
    assert adjusted == {("t", 0): 20, ("t", 1): 50} and len(losses) == 1


def test_data_loss_past_the_end_restarts_from_log_start() -> None:
    start = {("t", 0): 500}
    earliest, latest = {("t", 0): 0}, {("t", 0): 10}
    with pytest.raises(DataLossError, match="past the end"):
        plan.check_data_loss(start, earliest, latest, fail_on_data_loss=True)
    assert plan.check_data_loss(start, earliest, latest, False)[0] == {("t", 0): 0}
    assert plan.check_data_loss({("t", 0): 10}, earliest, latest, True) == ({("t", 0): 10}, [])
