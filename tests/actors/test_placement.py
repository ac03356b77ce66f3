"""Replica placement (actors/cluster/placement.py) and the proposals built on it
(actors/cluster/proposals.py): the constraints always hold, leaders and replicas spread over
nodes and shards for a fresh topic and stay balanced as topics accumulate, and the same
inputs give the same replicas."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.cluster.commands import (
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    NodeInfo,
    RegisterNode,
    Replicas,
)
from actors.cluster.placement import Load, PlacementError, assign_shards, place_replicas
from actors.cluster.proposals import (
    propose_create_partitions,
    propose_create_topic,
    propose_delete_topic,
)
from actors.cluster.state import Applied, ClusterState, PlacedTopic
from wire.errors import ErrorCode

E = ErrorCode
K = TypeVar("K")


def spread(counts: Mapping[K, int], keys: Iterable[K]) -> int:
    values = [counts.get(k, 0) for k in keys]
    return max(values) - min(values)


def check_constraints(nodes: Mapping[int, int], placed: Sequence[Replicas], factor: int) -> None:
    for replicas in placed:
        assert len(replicas) == factor
        assert len({n for n, _ in replicas}) == factor, f"a node twice in {replicas}"
        assert all(n in nodes and 0 <= s < nodes[n] for n, s in replicas), replicas


def node_spreads(load: Load, nodes: Mapping[int, int]) -> tuple[int, int]:
    """(leaders, replicas) per node: max - min."""
    replicas = {n: load.replicas(n) for n in nodes}
    return spread(load.node_leaders, nodes), spread(replicas, nodes)


def worst_shard_spreads(load: Load, nodes: Mapping[int, int]) -> tuple[int, int, int]:
    """(leaders, followers, replicas) per shard within a node: the worst node's max - min."""
    worst = [0, 0, 0]
    for n, shards in nodes.items():
        keys = [(n, s) for s in range(shards)]
        replicas = {k: load.replicas_on(k) for k in keys}
        for i, counts in enumerate((load.shard_leaders, load.shard_followers, replicas)):
            worst[i] = max(worst[i], spread(counts, keys))
    return worst[0], worst[1], worst[2]


# A fresh topic on an empty cluster -----------------------------------------------------------


COMBOS = [
    (nodes, shards, factor, partitions)
    for nodes in range(1, 9)
    for shards in (1, 2, 3, 4)
    for factor in range(1, min(nodes, 4) + 1)
    for partitions in (1, 2, 3, 5, 8, 13, 24, 50)
]


@pytest.mark.parametrize("start", [0, 5])
def test_a_fresh_topic_spreads_evenly(start: int) -> None:
    for count, shards, factor, partitions in COMBOS:
        nodes = {n: shards for n in range(count)}
        placed = place_replicas(nodes, partitions, factor, start=start)
        assert len(placed) == partitions
        check_constraints(nodes, placed, factor)
        load = Load(placed)
        leaders, replicas = node_spreads(load, nodes)
        assert leaders <= 1, (count, shards, factor, partitions, placed)
        assert replicas <= 2, (count, shards, factor, partitions, placed)
        shard_leaders, shard_followers, shard_replicas = worst_shard_spreads(load, nodes)
        assert shard_leaders <= 1 and shard_followers <= 1 and shard_replicas <= 1, placed


def test_a_fresh_topic_on_nodes_of_different_sizes() -> None:
    nodes = {1: 1, 2: 4, 3: 2, 7: 3}
    placed = place_replicas(nodes, 24, 3)
    check_constraints(nodes, placed, 3)
    load = Load(placed)
    assert node_spreads(load, nodes) == (0, 0)  # nodes are weighed equally, shards or not
    assert worst_shard_spreads(load, nodes)[0] <= 1


def test_the_documented_example() -> None:
    placed = place_replicas({0: 1, 1: 1, 2: 1}, 6, 2)
    assert [[n for n, _ in r] for r in placed] == [[0, 1], [1, 2], [2, 0], [1, 0], [2, 1], [0, 2]]


def test_a_nodes_partners_vary() -> None:
    """When a node fails, its leaderships and its re-replication fall on many nodes: each
    node shares partitions with every other, and leads with every other as a follower."""
    for count, factor, partitions in ((5, 3, 20), (4, 2, 12), (7, 3, 42)):
        load = Load(place_replicas({n: 2 for n in range(count)}, partitions, factor))
        pairs, follows = load.pairs.values(), load.follows.values()
        assert len(pairs) == count * (count - 1) // 2 and max(pairs) - min(pairs) <= 2
        assert len(follows) >= count * (count - 1) - 1 and max(follows) - min(follows) <= 2


def test_the_same_inputs_give_the_same_replicas() -> None:
    nodes = {1: 2, 2: 3, 3: 1, 4: 2}
    existing = place_replicas(nodes, 10, 2, start=3)
    a = place_replicas(nodes, 16, 3, existing=existing, start=11, room={1: 40, 2: 9, 3: 40, 4: 40})
    b = place_replicas(dict(reversed(nodes.items())), 16, 3, existing=list(existing), start=11,
                       room={4: 40, 3: 40, 2: 9, 1: 40})
    assert a == b
    assert place_replicas(nodes, 16, 3, existing=existing, start=12) != a  # start matters


# Topics accumulating -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_many_topics_stay_balanced(seed: int) -> None:
    rng = random.Random(seed)
    nodes = {n: rng.randint(1, 4) for n in range(rng.randint(2, 7))}
    existing: list[Replicas] = []
    for _ in range(120):
        factor = rng.randint(1, min(3, len(nodes)))
        partitions = rng.choice([1, 1, 2, 3, 6, 12])
        placed = place_replicas(nodes, partitions, factor, existing=existing,
                                start=rng.randrange(1000))
        check_constraints(nodes, placed, factor)
        assert node_spreads(Load(placed), nodes)[0] <= 1  # each topic's own leaders
        existing += placed
        load = Load(existing)
        leaders, replicas = node_spreads(load, nodes)
        assert leaders <= 3 and replicas <= 2, (leaders, replicas)
        shard_leaders, _, shard_replicas = worst_shard_spreads(load, nodes)
        assert shard_leaders <= 1 and shard_replicas <= 2


def test_a_topic_is_balanced_on_an_unbalanced_cluster() -> None:
    """A node that joins late gets its share of each new topic, not all of them (which would
    make it every new topic's hot spot), and the cluster's ties go its way."""
    old = {1: 2, 2: 2, 3: 2}
    existing = place_replicas(old, 30, 3)
    nodes = {**old, 4: 2}
    placed = place_replicas(nodes, 8, 2, existing=existing)
    load = Load(placed)
    assert node_spreads(load, nodes)[0] == 0
    assert load.replicas(4) == max(load.replicas(n) for n in nodes)


def test_new_partitions_balance_with_the_topics_others() -> None:
    nodes = {n: 3 for n in range(4)}
    first = place_replicas(nodes, 5, 2)
    more = place_replicas(nodes, 7, 2, existing=first, topic_existing=first, start=5)
    load = Load(first + more)
    assert node_spreads(load, nodes) == (0, 0)
    assert worst_shard_spreads(load, nodes)[0] <= 1


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.integers(0, 20), st.integers(1, 4), min_size=1, max_size=6),
    st.integers(1, 4),
    st.integers(1, 30),
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3)), max_size=40),
    st.integers(0, 100),
)
def test_placement_properties(
    nodes: dict[int, int], factor: int, partitions: int,
    scattered: list[tuple[int, int]], start: int,
) -> None:
    """Whatever was placed before (even single replicas scattered anywhere), a new topic's
    replicas are on distinct nodes and its leaders spread over nodes and shards."""
    existing = [((n, s),) for n, s in scattered]
    if factor > len(nodes):
        with pytest.raises(PlacementError) as refused:
            place_replicas(nodes, partitions, factor, existing=existing, start=start)
        assert refused.value.error == E.INVALID_REPLICATION_FACTOR
        return
    placed = place_replicas(nodes, partitions, factor, existing=existing, start=start)
    check_constraints(nodes, placed, factor)
    load = Load(placed)
    assert node_spreads(load, nodes)[0] <= 1
    assert worst_shard_spreads(load, nodes)[0] <= 1
    assert placed == place_replicas(nodes, partitions, factor, existing=existing, start=start)


# Refusals and room ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes, partitions, factor, error", [
    ({1: 1, 2: 1}, 3, 3, E.INVALID_REPLICATION_FACTOR),
    ({1: 1}, 3, 0, E.INVALID_REPLICATION_FACTOR),
    ({}, 3, 1, E.INVALID_REPLICATION_FACTOR),
    ({1: 1}, 0, 1, E.INVALID_PARTITIONS),
])
def test_placement_refuses(
    nodes: dict[int, int], partitions: int, factor: int, error: ErrorCode
) -> None:
    with pytest.raises(PlacementError) as refused:
        place_replicas(nodes, partitions, factor)
    assert refused.value.error == error


def test_a_node_without_room_takes_no_more() -> None:
    nodes = {1: 2, 2: 2, 3: 2}
    placed = place_replicas(nodes, 6, 2, room={1: 1, 2: 10, 3: 10})
    assert Load(placed).replicas(1) == 1
    with pytest.raises(PlacementError) as refused:
        place_replicas(nodes, 6, 2, room={1: 1, 2: 2, 3: 10})
    assert refused.value.error == E.INVALID_PARTITIONS


# Explicit assignments ------------------------------------------------------------------------


def test_an_explicit_assignment_keeps_its_nodes_and_gets_balanced_shards() -> None:
    nodes = {1: 2, 2: 2, 3: 1}
    wanted = [(1, [2, 1]), (0, [1, 2]), (2, [1, 3]), (3, [2, 3])]
    placed = assign_shards(nodes, wanted)
    assert [[n for n, _ in r] for r in placed] == [[1, 2], [2, 1], [1, 3], [2, 3]]
    check_constraints(nodes, placed, 2)
    assert worst_shard_spreads(Load(placed), nodes)[0] <= 1


@pytest.mark.parametrize("wanted", [
    [],
    [(0, [1, 9])],  # an unknown node
    [(0, [1, 1])],  # a node twice
    [(0, [1, 2]), (1, [3])],  # two replication factors
    [(0, [1, 2]), (2, [2, 3])],  # a gap
    [(0, [1, 2]), (0, [2, 3])],  # an index twice
    [(1, [1, 2])],  # not from 0
    [(0, [])],
])
def test_an_explicit_assignment_is_checked(wanted: list[tuple[int, list[int]]]) -> None:
    with pytest.raises(PlacementError) as refused:
        assign_shards({1: 1, 2: 1, 3: 1}, wanted)
    assert refused.value.error == E.INVALID_REPLICA_ASSIGNMENT


# Proposals -----------------------------------------------------------------------------------


def cluster(*shard_counts: int, partitions_max: int = 1000) -> ClusterState:
    state = ClusterState()
    for offset, (n, shards) in enumerate(enumerate(shard_counts, start=1)):
        info = NodeInfo(n, f"h{n}", 9092, f"h{n}", 33145, shards, partitions_max)
        assert state.apply(RegisterNode(info), offset).error == E.NONE
    return state


ID = bytes(range(1, 17))


def create(state: ClusterState, name: str = "t", partitions: int = -1, factor: int = -1,
           assignments: Sequence[tuple[int, Sequence[int]]] = (),
           configs: Mapping[str, str | None] | None = None,
           live: Iterable[int] = (1, 2, 3)) -> CreateTopic | Applied:
    return propose_create_topic(
        state.view(), name, partitions, factor, assignments, configs or {}, topic_id=ID,
        live=set(live), default_partitions=4, default_replication_factor=2)


def test_propose_a_topic_with_the_defaults_and_apply_it() -> None:
    state = cluster(2, 2, 2)
    command = create(state, configs={"retention.ms": "10", "segment.ms": None})
    assert isinstance(command, CreateTopic)
    assert len(command.replicas) == 4 and {len(r) for r in command.replicas} == {2}
    assert command.configs == {"retention.ms": "10"}
    assert state.check(command).error == E.NONE
    assert state.apply(command, state.version).error == E.NONE


def test_propose_places_on_live_nodes_only() -> None:
    state = cluster(1, 1, 1)
    command = create(state, partitions=6, factor=2, live=(1, 3))
    assert isinstance(command, CreateTopic)
    assert {n for r in command.replicas for n, _ in r} == {1, 3}
    refused = create(state, partitions=6, factor=3, live=(1, 3))
    assert isinstance(refused, Applied) and refused.error == E.INVALID_REPLICATION_FACTOR


def test_propose_respects_each_nodes_room() -> None:
    state = cluster(1, 1, 1, partitions_max=2)
    command = create(state, partitions=3, factor=2)
    assert isinstance(command, CreateTopic)
    assert state.apply(command, state.version).error == E.NONE
    refused = create(state, "u", partitions=1, factor=1)
    assert isinstance(refused, Applied) and refused.error == E.INVALID_PARTITIONS


@pytest.mark.parametrize("partitions, factor, assignments, configs, error", [
    (3, -1, [(0, [1])], {}, E.INVALID_REQUEST),
    (-1, 2, [(0, [1])], {}, E.INVALID_REQUEST),
    (0, -1, [], {}, E.INVALID_PARTITIONS),
    (-1, 4, [], {}, E.INVALID_REPLICATION_FACTOR),
    (-1, -1, [(0, [1, 5])], {}, E.INVALID_REPLICA_ASSIGNMENT),
    (-1, -1, [], {"retention.ms": "x"}, E.INVALID_CONFIG),
])
def test_propose_refuses(
    partitions: int, factor: int, assignments: list[tuple[int, list[int]]],
    configs: dict[str, str], error: ErrorCode,
) -> None:
    refused = create(cluster(1, 1, 1), partitions=partitions, factor=factor,
                     assignments=assignments, configs=configs)
    assert isinstance(refused, Applied) and refused.error == error


def test_propose_an_explicit_assignment_on_any_registered_node() -> None:
    state = cluster(2, 2, 2)
    command = create(state, assignments=[(0, [3, 1]), (1, [1, 3])], live=(1,))
    assert isinstance(command, CreateTopic)
    assert [[n for n, _ in r] for r in command.replicas] == [[3, 1], [1, 3]]


def test_propose_more_partitions_placed_and_explicit() -> None:
    state = cluster(2, 2, 2)
    command = create(state, partitions=2, factor=2)
    assert isinstance(command, CreateTopic)
    state.apply(command, state.version)
    grow = propose_create_partitions(state.view(), "t", 6, None, live={1, 2, 3})
    assert isinstance(grow, CreatePartitions) and len(grow.replicas) == 4
    assert state.apply(grow, state.version).error == E.NONE
    topic = state.view().table.topics["t"]
    assert isinstance(topic, PlacedTopic)
    leaders = Counter(r[0][0] for r in topic.replicas)
    assert max(leaders.values()) - min(leaders.values()) <= 1
    explicit = propose_create_partitions(state.view(), "t", 7, [[2, 3]], live={1})
    assert isinstance(explicit, CreatePartitions)
    assert [n for n, _ in explicit.replicas[0]] == [2, 3]
    assert state.apply(explicit, state.version).error == E.NONE
    for count, assignments, error in [
        (7, None, E.INVALID_PARTITIONS), (9, [[1, 2]], E.INVALID_REPLICA_ASSIGNMENT),
        (8, [[1]], E.INVALID_REPLICA_ASSIGNMENT),
    ]:
        refused = propose_create_partitions(state.view(), "t", count, assignments, live={1, 2})
        assert isinstance(refused, Applied) and refused.error == error, (count, refused)
    refused = propose_create_partitions(state.view(), "nope", 9, None, live={1})
    assert isinstance(refused, Applied) and refused.error == E.UNKNOWN_TOPIC_OR_PARTITION


def test_propose_a_delete_by_name_or_id() -> None:
    state = cluster(1)
    command = create(state, factor=1, live=(1,))
    assert isinstance(command, CreateTopic)
    state.apply(command, state.version)
    view = state.view()
    assert propose_delete_topic(view, "t", None) == DeleteTopic("t", ID)
    assert propose_delete_topic(view, None, ID) == DeleteTopic("t", ID)
    for name, topic_id, error in [("u", None, E.UNKNOWN_TOPIC_OR_PARTITION),
                                  (None, bytes(16), E.UNKNOWN_TOPIC_ID),
                                  (None, None, E.UNKNOWN_TOPIC_ID)]:
        refused = propose_delete_topic(view, name, topic_id)
        assert isinstance(refused, Applied) and refused.error == error


def test_a_large_topic_next_to_many_others() -> None:
    """Placement at scale (a control-plane cost, ~50 us a partition): 4,000 partitions at RF
    3 on 9 nodes of 8 shards, next to 8,000 placed before."""
    nodes = {n: 8 for n in range(9)}
    existing = place_replicas(nodes, 8_000, 3)
    placed = place_replicas(nodes, 4_000, 3, existing=existing)
    load = Load(itertools.chain(existing, placed))
    leaders, replicas = node_spreads(load, nodes)
    assert leaders <= 1 and replicas <= 1
    shard_leaders, shard_followers, shard_replicas = worst_shard_spreads(load, nodes)
    assert shard_leaders <= 1 and shard_followers <= 1 and shard_replicas <= 2
