"""A cluster's scenario file and the runner's side of it, without a cluster running: nodes
numbered from 1, faults addressed to a node or to a partition's leader, link steps, the seeds
each node is given (a proxy per ordered pair), and the report of what a step hit."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scenarios.cluster import Cluster, free_ports
from scenarios.link_proxy import bind_consecutive
from scenarios.runner import Run
from scenarios.spec import Link, NodeRef, SpecError, Target, parse, target

pytestmark = pytest.mark.timeout(60)

CLUSTER = ("cluster: {nodes: 3, shards: 2}\n"
           "workload: {partitionsPerTopic: 2, producerRate: 10, testDurationSeconds: 30}\n")


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse(text, Path("flow.yaml"))
    return str(caught.value)


def steps(text: str) -> str:
    return CLUSTER + "steps:\n" + text


def test_a_cluster_numbers_its_nodes_from_one_and_replicates_three_ways() -> None:
    scenario = parse(CLUSTER)
    assert scenario.nodes == 3 and scenario.node_ids == [1, 2, 3]
    assert parse("workload: {producerRate: 1}\n").node_ids == [0]
    assert not scenario.link_proxies and scenario.consumer_bootstrap == "all"
    two = parse("cluster: {nodes: 2, link_proxies: true, consumer_bootstrap: spread}\n"
                "workload: {producerRate: 1}\n")
    assert two.link_proxies and two.consumer_bootstrap == "spread"
    assert error_of("cluster: {nodes: 2, settings: {default_replicas: 3}}\n"
                    "workload: {producerRate: 1}\n").startswith(
        "flow.yaml:1:32: cluster.settings.default_replicas: 3 replicas need as many nodes")
    assert "topics[0].replicas: 4 replicas" in error_of(
        CLUSTER + "topics: [{name: t, replicas: 4}]\n")


def test_targets_read_as_a_node_a_shard_or_a_partitions_leader() -> None:
    leader = NodeRef("leader", topic="workload-0", partition=1)
    assert target("leader of workload-0-1") == Target(leader)
    assert target("node 2") == Target(NodeRef("id", id=2))
    assert target({"node": 2, "shard": 1}) == Target(NodeRef("id", id=2), 1)
    assert target({"node": "leader of workload-0-1"}) == Target(leader)
    assert target("shard 1", first_node=1) == Target(NodeRef("id", id=1), 1)
    assert target("shard random of leader of workload-0-1") == Target(leader, -1)
    assert target("node random") == Target(NodeRef("random"))
    scenario = parse(steps("  - {at: 1s, kill: leader of workload-0-1, for: 2s}\n"
                           "  - {at: 5s, stop: {node: 3}, for: 2s}\n"
                           "  - {at: 9s, restart: {node: leader of workload-0-0}}\n"))
    assert [s.name for s in scenario.steps] == [
        "kill leader of workload-0-1", "stop node=3", "restart node=leader of workload-0-0"]


def test_a_target_outside_the_cluster_is_refused_with_its_place() -> None:
    assert error_of(steps("  - {at: 1s, kill: node 0}\n")) == \
        "flow.yaml:4:14: steps[0].kill: there is no node 0 (nodes 1 to 3)"
    assert "there is no node 4" in error_of(steps("  - {at: 1s, stop: {node: 4}}\n"))
    assert "no topic 'orders'" in error_of(steps("  - {at: 1s, kill: leader of orders-0}\n"))
    assert "has 2 partitions, not a partition 2" in error_of(
        steps("  - {at: 1s, kill: leader of workload-0-2}\n"))
    assert "is not in the form" in error_of(steps("  - {at: 1s, kill: leader workload-0-0}\n"))


def test_link_steps_read_their_ends_and_mode() -> None:
    scenario = parse(steps(
        "  - {at: 1s, link: loss, from: leader of workload-0-0, to: others, for: 2s}\n"
        "  - {at: 5s, link: delay, ms: 150, from: 1, to: [node 2, node 3], name: slow}\n"
        "  - {at: 8s, undo: slow}\n"
        "  - {at: 9s, link: cut, from: node 1, to: node 2, for: 1s}\n"
        "  - {at: 12s, link: heal}\n"))
    loss, delay, _, cut, heal = scenario.steps
    assert loss.arg == Link("loss", (NodeRef("leader", topic="workload-0", partition=0),), None)
    assert loss.name == "link loss leader of workload-0-0 -> others"
    assert delay.arg == Link("delay", (NodeRef("id", id=1),),
                             (NodeRef("id", id=2), NodeRef("id", id=3)), 150.0)
    assert cut.name == "link cut node 1 <-> node 2"
    assert heal.arg == Link("heal", None, None) and heal.for_s is None
    assert scenario.link_proxies


@pytest.mark.parametrize(("step", "says"), [
    ("{at: 1s, link: cut, from: node 1}", "link cut needs `from` and `to`"),
    ("{at: 1s, link: delay, from: node 1, to: node 2}", "`ms` goes with link delay"),
    ("{at: 1s, link: cut, ms: 5, from: node 1, to: node 2}", "`ms` goes with link delay"),
    ("{at: 1s, link: cut, from: others, to: others}", "cannot both be `others`"),
    ("{at: 1s, link: heal, for: 2s}", "link heal is not undone"),
    ("{at: 1s, link: cut, from: node 1, to: node 9}", "steps[0].to: there is no node 9"),
    ("{at: 1s, kill: node 1, from: node 2}", "only a `link` step takes"),
    ("{at: 1s, link: sever, from: node 1, to: node 2}", "steps[0].link: 'sever' is not one of"),
])
def test_a_wrong_link_step_says_why(step: str, says: str) -> None:
    assert says in error_of(steps(f"  - {step}\n"))


def test_a_heal_cannot_be_undone() -> None:
    assert "not an earlier step that can be undone" in error_of(steps(
        "  - {at: 1s, link: heal}\n  - {at: 2s, undo: 0}\n"))


# --- the runner, on a cluster that is made but not started -----------------------------------


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[[str], tuple[Run, Cluster]]]:
    """A Run whose cluster is made (ports, proxies, config files) but never started."""
    clusters: list[Cluster] = []

    def make(text: str) -> tuple[Run, Cluster]:
        scenario = parse(text)
        run = Run(scenario, tmp_path)
        run.cluster = Cluster(tmp_path, scenario.node_ids, scenario.shards, run.settings(),
                              link_proxies=scenario.link_proxies)
        run.start_ns = time.monotonic_ns()
        clusters.append(run.cluster)
        return run, run.cluster

    yield make
    for cluster in clusters:
        cluster.close()


def test_each_node_is_given_its_own_rpc_port_and_a_proxy_for_every_other(
        made: Any, tmp_path: Path) -> None:
    _, cluster = made(CLUSTER.replace("shards: 2}", "shards: 2, link_proxies: true}"))
    assert set(cluster.proxies) == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3) if a != b}
    rpc = {i: node.rpc_port for i, node in cluster.nodes.items()}
    ranges = [set(range(port, port + 2)) for port in rpc.values()]
    assert not (ranges[0] & ranges[1] or ranges[1] & ranges[2] or ranges[0] & ranges[2])
    for i in (1, 2, 3):
        config = yaml.safe_load((tmp_path / f"node-{i}.yaml").read_text())
        assert config["rpc_port"] == rpc[i] and config["default_replicas"] == 3
        seeds = dict(entry.split("@") for entry in config["seeds"].split(","))
        assert seeds[str(i)] == f"127.0.0.1:{rpc[i]}"
        for j in {1, 2, 3} - {i}:
            proxy = cluster.proxies[(i, j)]
            assert seeds[str(j)] == f"127.0.0.1:{proxy.port}" and proxy.target[1] == rpc[j]
    # Without link steps or link_proxies the seeds name the nodes themselves.
    _, direct = made(CLUSTER)
    assert not direct.proxies
    config = yaml.safe_load((tmp_path / "node-2.yaml").read_text())
    assert config["seeds"] == ",".join(f"{i}@127.0.0.1:{direct.nodes[i].rpc_port}"
                                       for i in (1, 2, 3))


def test_free_ports_are_consecutive_and_below_the_ephemeral_range() -> None:
    base = free_ports(4)
    assert 10_000 <= base < 32768
    held = bind_consecutive(2)
    try:
        assert held[1].getsockname()[1] == held[0].getsockname()[1] + 1
    finally:
        for s in held:
            s.close()


def test_link_steps_set_the_proxies_and_their_undo_or_a_heal_restores_them(made: Any) -> None:
    run, cluster = made(steps(
        "  - {at: 1s, link: loss, from: node 1, to: others, for: 2s}\n"
        "  - {at: 4s, link: delay, ms: 80, from: node 2, to: node 3, for: 2s}\n"
        "  - {at: 7s, link: cut, from: node 3, to: others}\n"
        "  - {at: 9s, link: heal, from: node 3, to: others}\n"))
    loss, delay, cut, heal = run.s.steps
    modes = lambda: {f"{a}->{b}": p.mode for (a, b), p in sorted(cluster.proxies.items())}  # noqa: E731
    run.do(loss)
    assert modes() == {"1->2": "cut", "1->3": "cut", "2->1": "pass", "2->3": "pass",
                       "3->1": "pass", "3->2": "pass"}
    assert run.step_log[-1]["links"] == "1->2, 1->3" and run.faults[-1]["end_ns"] is None
    run.undo_step(0)
    assert set(modes().values()) == {"pass"} and run.faults[-1]["end_ns"] is not None
    run.do(delay)
    assert modes()["2->3"] == modes()["3->2"] == "delay 80 ms" and modes()["1->2"] == "pass"
    run.undo_all()
    run.do(cut)
    assert [m for m in modes().values() if m == "cut"] == ["cut"] * 4
    run.do(heal)  # ends the cut's window too
    assert set(modes().values()) == {"pass"}
    assert all(f["end_ns"] is not None for f in run.faults) and not run.undo


def test_a_leader_is_found_when_the_step_runs_and_again_at_its_undo(
        made: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run, cluster = made(steps("  - {at: 1s, stop: leader of workload-0-1, for: 3s}\n"))
    asked: list[tuple[str, int, float]] = []
    answers = iter([(2, {1: 2, 2: 2, 3: 2}), (3, {1: 3, 3: 3})])

    def leader_of(topic: str, partition: int, timeout_s: float = 30.0) -> Any:
        asked.append((topic, partition, timeout_s))
        return next(answers)

    monkeypatch.setattr(cluster, "leader_of", leader_of)
    run.do(run.s.steps[0])
    assert cluster.nodes[2].stopped == {-1}  # the whole node 2 is SIGSTOPped (none runs)
    entry = run.step_log[0]
    assert entry["node"] == 2 and entry["leader_of"] == "workload-0-1"
    assert entry["leaders_seen"] == {"1": 2, "2": 2, "3": 2}
    assert run.faults[0]["name"] == "stop leader of workload-0-1 (2)"
    run.undo_all()
    assert entry["leader_at_undo"] == 3 and not cluster.nodes[2].stopped
    assert asked == [("workload-0", 1, 30.0), ("workload-0", 1, 0)]


def test_no_leader_named_is_the_steps_error(made: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run, cluster = made(steps("  - {at: 1s, kill: leader of workload-0-0, for: 3s}\n"))
    monkeypatch.setattr(cluster, "leader_of", lambda *a, **k: (None, {1: None, 2: -1}))
    with pytest.raises(RuntimeError, match="no node that is up names a leader of workload-0-0"):
        run.do(run.s.steps[0])


def test_spread_consumers_bootstrap_each_subscription_from_one_node(made: Any) -> None:
    run, _ = made(CLUSTER.replace("shards: 2}", "shards: 2, consumer_bootstrap: spread}"))
    processes = run._consumer_processes(["sub-0", "sub-1", "sub-2", "sub-3"])
    nodes = run.cluster.nodes
    assert processes == [("consumers-n1", nodes[1].bootstrap, ["sub-0", "sub-3"]),
                         ("consumers-n2", nodes[2].bootstrap, ["sub-1"]),
                         ("consumers-n3", nodes[3].bootstrap, ["sub-2"])]
    run, _ = made(CLUSTER)
    assert run._consumer_processes(["sub-0", "sub-1"]) == [
        ("consumers", run.bootstrap(), ["sub-0", "sub-1"])]


def test_a_node_that_exits_by_itself_fails_the_run_once_and_a_killed_one_does_not(
        made: Any) -> None:
    run, cluster = made(steps("  - {at: 1s, kill: node 2, for: 3s}\n"))
    # Stand-ins for the nodes' supervisors: node 1's stops the node as after a shard's abort.
    cluster.nodes[1].log_path.write_text(
        "2026-01-01 00:00:00,000 ERROR krill.supervisor: shard 1 (pid 7) was killed by signal "
        "6; stopping the node\n2026-01-01 00:00:00,100 INFO shard0 x: stopped\n")
    for i, node in cluster.nodes.items():
        command = ["sh", "-c", "exit 1"] if i == 1 else ["sleep", "60"]
        node.process = subprocess.Popen(command, start_new_session=True)
    cluster.nodes[1].process.wait()
    run.do(run.s.steps[0])  # kill -9 of node 2: its exit is the step's (not undone here)
    run.note_exits()
    run.note_exits()
    [found] = run.node_exits  # once, though looked at twice
    assert (found["node"], found["how"], found["code"]) == (1, "exited with code 1", 1)
    assert found["log"] == ["2026-01-01 00:00:00,000 ERROR krill.supervisor: shard 1 (pid 7) "
                            "was killed by signal 6; stopping the node"]
    assert run.cluster_checks()["nodes_exited"] == {"value": 1, "bound": 0, "ok": False}
    assert not cluster.nodes[2].alive() and cluster.nodes[3].alive()
