"""The `chaos` step's file side, without a cluster (scenarios/chaos.py, scenarios/spec.py): a
plan drawn from the seed (the same seed, the same faults), every kind dealt once a round,
one fault at a time within the window, the mistakes a file can make, and a workload of
three client libraries."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scenarios.chaos import CHAOS_FAULTS, LINK_FAULTS, NODE_FAULTS
from scenarios.cli import LIBRARY
from scenarios.spec import NodeRef, SpecError, load, parse

pytestmark = pytest.mark.timeout(30)

FILE = """\
cluster: {nodes: 3, shards: 2}
topics: [{name: events, partitions: 4}, {name: side, partitions: 2}]
workload: {topics: 2, producerRate: 10, testDurationSeconds: 120}
steps:
  - at: 5s
    chaos: {gap: 1s..3s, length: 2s..4s, topic: side%s}
    for: 100s
"""


def chaos_of(text: str = FILE % "", seed: int = 1, duration_s: float | None = None) -> list:
    [step] = parse(text, seed=seed, duration_s=duration_s).steps
    assert step.action == "chaos"
    return list(step.arg.faults)


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse(text, Path("flow.yaml"))
    return str(caught.value)


def test_the_same_seed_draws_the_same_faults_and_another_seed_others() -> None:
    assert chaos_of(seed=7) == chaos_of(seed=7)
    assert chaos_of(seed=7) != chaos_of(seed=8)
    assert [str(f) for f in chaos_of(seed=7)] == [str(f) for f in chaos_of(seed=7)]


def test_every_kind_comes_once_a_round_within_its_ranges_and_the_window() -> None:
    faults = chaos_of()
    kinds = len(CHAOS_FAULTS)
    for start in range(0, len(faults) - kinds + 1, kinds):
        assert Counter(f.kind for f in faults[start:start + kinds]) == Counter(CHAOS_FAULTS)
    assert all(1 <= f.gap_s <= 3 for f in faults)
    assert all(2 <= f.length_s <= 4 for f in faults if f.kind != "delete_records")
    # Drawn until the window (100 s) is spent: no more, and not much less.
    spent = [f.gap_s + f.length_s for f in faults]
    assert sum(spent[:-1]) < 100 <= sum(spent)


def test_what_each_fault_hits_is_drawn_and_fits_the_cluster() -> None:
    faults = chaos_of(seed=3)
    for f in faults:
        if f.kind in NODE_FAULTS or f.kind in LINK_FAULTS:
            assert f.node is not None
            assert f.node.kind == "leader" or f.node.id in (1, 2, 3)
            if f.node.kind == "leader":
                assert f.node.topic == "events" and 0 <= (f.node.partition or 0) < 4
        if f.kind.endswith("_shard"):
            assert f.shard in (0, 1)
        if f.kind == "power_loss":
            assert f.node == NodeRef("id", id=f.node.id)  # a node by number, not a leader
        if f.kind == "cut":
            assert f.peer in (0, 1)
        if f.kind == "loss":
            assert f.peer in (-1, 0, 1)
        if f.kind == "delete_records":
            assert f.partition is not None and f.partition[0] == "events"
            assert f.length_s == 0 and f.fraction is not None and 0.2 <= f.fraction <= 0.9
    assert {f.node.kind for f in faults if f.node is not None} == {"id", "leader"}


def test_a_chosen_mix_and_a_shorter_run() -> None:
    faults = chaos_of(FILE % ", faults: {pause: 2, cut: 1}")
    assert {f.kind for f in faults} == {"pause", "cut"}
    assert Counter(f.kind for f in faults[:3]) == {"pause": 2, "cut": 1}
    # --duration shrinks the window (100 s of 120 -> 50 s of 60), not the faults' lengths.
    shorter = chaos_of(duration_s=60)
    assert len(shorter) < len(chaos_of())
    assert all(2 <= f.length_s <= 4 for f in shorter if f.kind != "delete_records")


def test_the_scenario_around_a_chaos_step() -> None:
    scenario = parse(FILE % "")
    assert scenario.unchecked_topics == {"side"}  # deleted and made again: not checked
    assert scenario.link_proxies  # its cuts need them
    assert not parse(FILE % ", faults: [kill, pause]").link_proxies
    assert parse(FILE % ", faults: [kill]").unchecked_topics == set()


def test_mistakes_in_a_chaos_step_are_one_line_each() -> None:
    assert error_of(FILE % ", faults: [kill, jump]").startswith(
        "flow.yaml:6:70: steps[0].chaos.faults[1]: 'jump' is not one of ['kill', ")
    assert "recreate_topic needs `topic`" in error_of(
        (FILE % "").replace(", topic: side", ""))
    assert "no topic 'nope' in this scenario" in error_of(FILE.replace("topic: side", "topic: nope")
                                                          % "")
    assert "DeleteRecords goes to a topic the checker reads" in error_of(
        FILE % ", records: [side]")
    assert "a range runs from low to high" in error_of(FILE.replace("1s..3s", "3s..1s") % "")
    one_node = FILE.replace("nodes: 3", "nodes: 1") % ", faults: [kill, cut]"
    assert "['cut'] join two nodes" in error_of(one_node)
    assert "steps[0].chaos.speed: unknown key 'speed'" in error_of(FILE % ", speed: 2")


def test_a_workload_of_three_client_libraries_with_settings_each() -> None:
    scenario = parse("workload:\n  client: [confluent-kafka, kafka-python, aiokafka]\n"
                     "  producerConfig:\n"
                     "    confluent-kafka: {enable.idempotence: true}\n"
                     "    aiokafka: {enable_idempotence: true}\n"
                     "  consumerConfig: {session_timeout_ms: 10000}\n")
    w = scenario.workload
    assert w.clients == ("confluent-kafka", "kafka-python", "aiokafka")
    assert w.client == "confluent-kafka"
    assert w.producer_config_for("confluent-kafka") == {"enable.idempotence": True}
    assert w.producer_config_for("kafka-python") == {}
    assert w.consumer_config_for("aiokafka") == {"session_timeout_ms": 10000}
    assert parse("workload: {client: aiokafka}\n").workload.clients == ("aiokafka",)
    assert "workload.client" in error_of("workload: {client: [aiokafka, aiokafka]}\n")
    assert "workload.producerConfig" in error_of(
        "workload: {producerConfig: {rdkafka: {acks: all}}}\n")
    # A topic only some of them use.
    scenario = parse("topics: [{name: a}, {name: b, clients: [aiokafka]}]\n"
                     "workload: {topics: 2, client: [confluent-kafka, aiokafka]}\n")
    assert scenario.clients_of("a") == ("confluent-kafka", "aiokafka")
    assert scenario.clients_of("b") == ("aiokafka",)
    assert "topics[0].clients[0]: 'kafka-python' is not one of the workload's clients" in \
        error_of("topics: [{name: a, clients: [kafka-python]}]\nworkload: {topics: 1}\n")


def test_the_shipped_fault_mix_draws_every_kind() -> None:
    scenario = load(LIBRARY / "cluster-fault-mix.yaml")
    [step] = scenario.steps
    assert {f.kind for f in step.arg.faults} == set(CHAOS_FAULTS)
    assert scenario.nodes == 3 and len(scenario.workload.clients) == 3
    assert scenario.unchecked_topics == {"side"}
