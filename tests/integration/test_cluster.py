"""A 3-node cluster under faults: Metadata from every node, SIGSTOP and SIGTERM of a leader, a
follower's power loss (its log's tail cut and torn), kill -9 of a group's coordinator once
every Raft group has gone quiet, a whole-cluster restart; and the controller group's own: its
leader cut off by link proxies, a follower's controller log cut by a power loss.

Each test starts its own cluster (tests/support/cluster.py): every node a seed, one shard
each, every partition replicated 3 times. Loads are confluent-kafka idempotent acks=all
producers writing unique values; after the fault every acknowledged value must sit exactly
once at the offset it was acknowledged at, and the replicas' segment files must end up holding
the same batches. Times to recover are printed, never asserted. The kill -9 of a leader under
each client library is in test_cluster_clients.py.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import ConfigResource, NewTopic

from actors.cluster.commands import AllocateProducerIdBlock
from actors.limits import producer_id_block_size
from tests.support.cluster import (
    Cluster,
    ClusterNode,
    ConfluentLoad,
    assert_acknowledged_once,
    cluster_fixture,
    controller_commands,
    first_offset_after_epoch,
    read_partitions,
    stored_batches,
    wait_until,
    whole_batches,
)
from tests.support.power_loss import cachestat_available, lose_unsynced, unsynced_files
from tests.support.raw_client import RawClient, request
from wire.messages.create_topics import CreateTopicsRequest
from wire.record_batch import read_header

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ELECTION_TIMEOUT_MS = 1000
# A slow link's one-way delay: a node's answers reach the leader this late (under ZeroMQ's
# heartbeat timeout, 3 s, for a round trip).
ACK_DELAY_MS = 1000
PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS)
    )


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes]]) -> dict:
    """Produce (partition, value) records with acks=all; {(partition, offset): value}."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True, "message.timeout.ms": 60_000})  # fmt: skip
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, message: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[(message.partition(), message.offset())] = message.value()

    for partition, value in records:
        producer.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0, "records left undelivered"
    assert not errors, errors[:5]
    return delivered


def _assert_every_node_reads(cluster: Cluster, topic: str, expected: dict) -> None:
    """Consumers bootstrapped from each running node read exactly `expected`."""
    for node in cluster.running():
        got = read_partitions(node.bootstrap, topic, PARTITIONS)
        assert got == expected, f"bootstrapped from {node}: records differ"


# 1. Metadata ---------------------------------------------------------------------------------


def test_every_node_answers_the_same_metadata(cluster: Cluster) -> None:
    cluster.create_topic("meta", PARTITIONS)
    expected_brokers = {(n.node_id, "127.0.0.1", n.kafka_port) for n in cluster.nodes.values()}
    views: dict[int, Any] = {}

    def one_view() -> bool:
        views.clear()
        for node in cluster.nodes.values():
            answer = node.metadata(["meta"])
            (topic,) = answer.topics
            partitions = tuple(
                (p.partition_index, p.error_code, p.leader_id, p.leader_epoch,
                 tuple(p.replica_nodes), tuple(sorted(p.isr_nodes)))
                for p in sorted(topic.partitions, key=lambda p: p.partition_index)
            )  # fmt: skip
            brokers = frozenset((b.node_id, b.host, b.port) for b in answer.brokers)
            views[node.node_id] = (answer.cluster_id, answer.controller_id, brokers,
                                   topic.error_code, partitions)  # fmt: skip
        full_isr = all(p[5] == (1, 2, 3) for v in views.values() for p in v[4])
        return len(set(views.values())) == 1 and full_isr

    try:
        wait_until(one_view, 30, "every node answering the same Metadata, every ISR full")
    except AssertionError as e:
        shown = "\n".join(f"node {i}: {v}" for i, v in views.items())
        raise AssertionError(f"{e}\n{shown}") from None
    cluster_id, controller_id, brokers, error_code, partitions = views[1]
    assert cluster_id, "no cluster id"
    assert controller_id in cluster.nodes
    assert brokers == expected_brokers
    assert error_code == 0
    assert [p[0] for p in partitions] == list(range(PARTITIONS))
    for index, partition_error, leader, epoch, replicas, isr in partitions:
        assert partition_error == 0, (index, partition_error)
        assert sorted(replicas) == [1, 2, 3], (index, replicas)
        assert leader in replicas and leader in isr, (index, leader)
        assert epoch >= 0, (index, epoch)


# 4. SIGSTOP of a leader ----------------------------------------------------------------------


def test_sigstopped_leader_is_replaced_and_rejoins(cluster: Cluster) -> None:
    topic = "stalled"
    cluster.create_topic(topic, PARTITIONS)
    (epoch_before,) = [p.leader_epoch for p in cluster[1].metadata([topic]).topics[0].partitions
                       if p.partition_index == 0]  # fmt: skip
    with ConfluentLoad(cluster.bootstrap(), topic, PARTITIONS) as load:
        load.wait_acks(300)
        victim = cluster.wait_leader(topic, 0)
        epoch = cluster.leader_epoch(topic, 0, via=cluster[victim])
        acked_before = load.last_offset(0)
        stopped_at = time.monotonic()
        cluster[victim].pause()
        # While it is stopped the others elect a leader and Metadata names it.
        successor = cluster.wait_leader(topic, 0, not_on=victim)
        print(f"node {victim} stopped; node {successor} leads {topic}-0 after "
              f"{time.monotonic() - stopped_at:.2f}s")  # fmt: skip
        time.sleep(max(0.0, 3 * ELECTION_TIMEOUT_MS / 1000 - (time.monotonic() - stopped_at)))
        for node in cluster.running():
            assert cluster.leaders(topic, node)[0] != victim, f"{node} names the stopped node"
        cluster[victim].resume()
        load.wait_ack_after(0, stopped_at, acked_before)
        load.wait_acks(len(load.acknowledged) + 300)
    load.print_recovery(0, stopped_at, first_offset_after_epoch(
        cluster[successor].data_dir, topic, 0, epoch), "the SIGSTOP")  # fmt: skip

    # The resumed node stepped down: every node, it too, names one leader in a later epoch.
    def one_leader_later_epoch() -> bool:
        seen = {
            (p.leader_id, p.leader_epoch)
            for n in cluster.nodes.values()
            for p in n.metadata([topic]).topics[0].partitions
            if p.partition_index == 0
        }
        return len(seen) == 1 and seen.pop()[1] > epoch_before

    wait_until(one_leader_later_epoch, 30, f"every node naming one leader of {topic}-0 in an "
                                           f"epoch after {epoch_before}")  # fmt: skip
    cluster.wait_replicas_converged(topic, PARTITIONS)
    stored = read_partitions(cluster.bootstrap(), topic, PARTITIONS)
    assert_acknowledged_once(load.acknowledged, stored)
    _assert_every_node_reads(cluster, topic, stored)


# 4b. A follower's power loss ------------------------------------------------------------------


def _lose_unacknowledged_tail(data_dir: Path, topic: str, partition: int, acked: int) -> int:
    """Power loss on a stopped follower: its log keeps the batches up to `acked` (the last
    offset its leader counted as acknowledged by it) and loses the rest, and the write under
    way is torn (half a batch after the cut). How many batches were cut."""
    segment = max((data_dir / f"{topic}-{partition}").glob("*.log"))
    data = segment.read_bytes()
    batches = [(start, start + header.size, header.last_offset)
               for start, header in whole_batches(data)]
    kept = [b for b in batches if b[2] <= acked]
    assert kept and kept[-1][2] == acked, (acked, batches[-3:])
    cut = kept[-1][1]
    torn = data[batches[-1][0]:batches[-1][1]]
    torn = torn[: len(torn) // 2]  # the first half of a batch: a torn write
    with open(segment, "r+b") as f:
        f.truncate(cut)
        f.seek(cut)
        f.write(torn)
    return len(batches) - len(kept)


def test_a_follower_that_lost_its_tail_to_power_loss_is_repaired(cluster: Cluster) -> None:
    # Power loss takes what no fdatasync covered: a follower acknowledges only what one did,
    # so what it loses is past what its leader counted. Frozen first, so that every answer it
    # sent has reached the leader; then killed, its tail cut there and torn.
    topic = "torn"
    cluster.create_topic(topic, PARTITIONS)
    with ConfluentLoad(cluster.bootstrap(), topic, PARTITIONS) as load:
        load.wait_acks(600)
        leader = cluster.wait_leader(topic, 0)
        follower = next(i for i in cluster.nodes if i != leader)
        cluster[follower].pause()
        time.sleep(1.0)
        view = cluster[leader].replicas()
        assert view is not None
        acked = view[(topic, 0)]["followers"][str(follower)]
        cluster[follower].kill9()
        cut = _lose_unacknowledged_tail(cluster[follower].data_dir, topic, 0, acked)
        print(f"node {follower}, a follower of {topic}-0, lost {cut} batches past offset "
              f"{acked} and half a batch after")  # fmt: skip
        load.wait_acks(len(load.acknowledged) + 300)  # the other two go on meanwhile
        cluster.restart(follower)
        load.wait_acks(len(load.acknowledged) + 300)
    cluster.wait_replicas_converged(topic, PARTITIONS)
    stored = read_partitions(cluster.bootstrap(), topic, PARTITIONS)
    assert_acknowledged_once(load.acknowledged, stored)
    _assert_every_node_reads(cluster, topic, stored)


# 4c. A follower's power loss after a kill -9 and a restart ------------------------------------

_DELAY_PROBE = "/v1/failure-probes/storage/fdatasync/delay?ms=60000"


def _put(node: Any, path: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{node.admin_port}{path}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200, answer.status


def _stored_end(data_dir: Path, topic: str) -> int:
    """One past the last offset of the whole batches in a replica's segment files."""
    batches = stored_batches(data_dir, topic, 0)
    return read_header(batches[-1][2]).last_offset + 1 if batches else 0


@pytest.fixture
def injectable(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS),
        "--enable-failure-injection")


def test_a_follower_acknowledges_what_recovery_kept_only_once_it_is_synced(
    injectable: Cluster,
) -> None:
    # A kill -9 leaves a follower's unsynced appends in the page cache, where recovery finds
    # them whole. Counted as flushed at once, they were acknowledged by the restarted follower
    # and made records committed with it and the leader alone; a power loss of the follower,
    # then a kill -9 of the leader, and the third node and the follower elected a leader
    # without them: acknowledged records gone. The power loss cuts each of the follower's
    # files where its page cache still held dirty pages (tests/support/power_loss.py).
    if not cachestat_available():
        pytest.skip("cachestat(2) (Linux 6.5) tells what a power loss would take")
    cluster, topic = injectable, "recovered"
    cluster.create_topic(topic, 1, config={"segment.ms": "1"})  # a segment for each append
    delivered: dict[tuple[int, int], bytes] = {}
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "linger.ms": 5, "enable.idempotence": True,
                         "message.timeout.ms": 90_000})  # fmt: skip

    def on_delivery(err: Any, message: Any) -> None:
        assert err is None, err
        delivered[(message.partition(), message.offset())] = message.value()

    # Its producer id first: the controller's log is synced through the same probe.
    for i in range(50):
        producer.produce(topic, value=b"before %d" % i, partition=0, on_delivery=on_delivery)
    assert producer.flush(60) == 0, "records left undelivered"
    acked = dict(delivered)
    delivered.clear()
    leader = cluster.wait_leader(topic, 0)
    follower, third = [i for i in cluster.nodes if i != leader]
    before = _stored_end(cluster[leader].data_dir, topic)
    cluster[third].kill9()
    _put(cluster[follower], _DELAY_PROBE)  # its fdatasyncs hang: what it appends stays dirty
    for i in range(30):
        producer.produce(topic, value=b"after %d" % i, partition=0, on_delivery=on_delivery)

    def follower_has_them() -> bool:
        producer.poll(0.1)
        return _stored_end(cluster[follower].data_dir, topic) == before + 30

    wait_until(follower_has_them, 30, "the follower holding them all")
    assert not delivered, "acknowledged by the leader alone"
    cluster[follower].kill9()
    partition_dir = cluster[follower].data_dir / f"{topic}-0"
    assert unsynced_files(partition_dir), "the follower's appends are on the disk already"
    cluster.restart(follower)
    assert producer.flush(60) == 0, "records left undelivered"
    acked.update(delivered)
    # Power loss of the follower, then a kill -9 of the leader; the other two elect.
    cluster[follower].kill9()
    lost = lose_unsynced(partition_dir)
    print(f"node {follower}'s power loss cut {lost}")
    cluster[leader].kill9()
    cluster.restart(third)
    cluster.restart(follower)
    cluster.wait_leader(topic, 0, not_on=leader)
    cluster.restart(leader)
    cluster.wait_replicas_converged(topic, 1)
    stored = read_partitions(cluster.bootstrap(), topic, 1)
    assert_acknowledged_once([(p, o, v) for (p, o), v in acked.items()], stored)


# 5. SIGTERM of a leader ----------------------------------------------------------------------


def test_sigterm_of_a_leader_hands_its_partitions_over(cluster: Cluster) -> None:
    topic = "handover"
    cluster.create_topic(topic, PARTITIONS)
    with ConfluentLoad(cluster.bootstrap(), topic, PARTITIONS) as load:
        load.wait_acks(300)
        victim = cluster.wait_leader(topic, 0)
        led = [p for p, leader in enumerate(cluster.leaders(topic, cluster[victim]))
               if leader == victim]  # fmt: skip
        epochs = {p: cluster.leader_epoch(topic, p, via=cluster[victim]) for p in led}
        acked_before = {p: load.last_offset(p) for p in led}
        stopped_at = time.monotonic()
        assert cluster[victim].stop() == 0, cluster[victim].log_tail()
        print(f"node {victim} (leading {topic} {led}) exited "
              f"{time.monotonic() - stopped_at:.2f}s after its SIGTERM")  # fmt: skip
        successors = {p: cluster.wait_leader(topic, p, not_on=victim) for p in led}
        for partition in led:
            load.wait_ack_after(partition, stopped_at, acked_before[partition])
        load.wait_acks(len(load.acknowledged) + 300)
    for partition, successor in successors.items():
        print(f"{topic}-{partition}: node {successor} leads")
        data_dir = cluster[successor].data_dir
        first = first_offset_after_epoch(data_dir, topic, partition, epochs[partition])
        load.print_recovery(partition, stopped_at, first, "the SIGTERM")
    stored = read_partitions(cluster.bootstrap(*[n.node_id for n in cluster.running()]),
                             topic, PARTITIONS)  # fmt: skip
    assert_acknowledged_once(load.acknowledged, stored)
    _assert_every_node_reads(cluster, topic, stored)


# 6. A consumer group's coordinator killed ----------------------------------------------------

_GROUP = "failover-group"
_COMMIT_RETRY_S = 60.0  # a commit retried while the group's new coordinator is found


def _group_consumer(bootstrap: str) -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap, "group.id": _GROUP, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
    })  # fmt: skip


def _consume(consumer: Consumer, want: int, seen: dict, timeout_s: float = 60.0) -> dict:
    """Poll until `seen` ({(partition, offset): value}) holds `want` records; each partition's
    next offset after what this call read."""
    after: dict[int, int] = {}
    errors: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < want:
        assert time.monotonic() < deadline, (
            f"read {len(seen)} of {want} records; last errors {errors[-3:]}, assignment "
            f"{[(tp.partition, tp.offset) for tp in consumer.assignment()]}"
        )
        for message in consumer.consume(200, 0.2):
            if message.error() is not None:
                errors.append(message.error())  # a coordinator or leader moving: retried
                continue
            seen[(message.partition(), message.offset())] = message.value()
            after[message.partition()] = message.offset() + 1
    return after


def _commit(consumer: Consumer, topic: str, offsets: dict[int, int]) -> float:
    """Commit synchronously, retrying while the coordinator is unavailable; seconds taken."""
    started = time.monotonic()
    chosen = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    while True:
        try:
            consumer.commit(offsets=chosen, asynchronous=False)
            return time.monotonic() - started
        except KafkaException as e:
            assert time.monotonic() - started < _COMMIT_RETRY_S, f"commit still failing: {e}"
            time.sleep(0.2)


def _committed(cluster: Cluster, topic: str) -> dict[int, int]:
    """The group's committed offsets, asked of the running nodes through the AdminClient."""
    admin = cluster.admin(*[n.node_id for n in cluster.running()])
    request = [ConsumerGroupTopicPartitions(
        _GROUP, [TopicPartition(topic, p) for p in range(PARTITIONS)])]  # fmt: skip
    answer = admin.list_consumer_group_offsets(request, request_timeout=10)[_GROUP].result(15)
    for tp in answer.topic_partitions:
        assert tp.error is None, tp.error
    return {tp.partition: tp.offset for tp in answer.topic_partitions}


def _all_quiet(cluster: Cluster) -> bool:
    views = [node.replicas() for node in cluster.running()]
    return all(view and all(r["quiesced"] for r in view.values()) for view in views)


def test_group_keeps_its_offsets_when_its_coordinator_is_killed(cluster: Cluster) -> None:
    topic = "grouped"
    cluster.create_topic(topic, PARTITIONS)
    records = [(i % PARTITIONS, f"{i:08d}".encode()) for i in range(600)]
    produced = _produce(cluster.bootstrap(), topic, records)
    consumer = _group_consumer(cluster.bootstrap())
    try:
        consumer.subscribe([topic])
        seen: dict[tuple[int, int], bytes] = {}
        committed_before = _consume(consumer, 300, seen)
        _commit(consumer, topic, committed_before)
        # Nothing is written now: every Raft group goes quiet (no heartbeats, followers'
        # election clocks stopped), so the failover below starts from quiet groups and relies
        # on the peers' keepalives stopping (shards/raft_host.py).
        wait_until(lambda: _all_quiet(cluster), 30, "every replica on every node quiesced")
        coordinator = cluster.coordinator(_GROUP)
        killed_at = time.monotonic()
        cluster[coordinator].kill9()
        print(f"killed node {coordinator}, the coordinator of {_GROUP}; committed "
              f"{committed_before}")  # fmt: skip

        successor = cluster.coordinator(_GROUP, not_on=coordinator)
        committed = wait_until(lambda: _committed(cluster, topic), 60,
                               f"{_GROUP}'s offsets from its new coordinator")  # fmt: skip
        print(f"node {successor} coordinates {_GROUP} after "
              f"{time.monotonic() - killed_at:.2f}s; it has {committed}")  # fmt: skip
        for partition, offset in committed_before.items():
            assert committed.get(partition, -1) >= offset, (
                f"{topic}-{partition}: committed {offset} before the kill, {committed} after"
            )

        # The group goes on: the same member reads the rest and commits through the new one.
        done = _consume(consumer, len(produced), seen)
        final = {**committed_before, **done}
        print(f"final commit took {_commit(consumer, topic, final):.2f}s: {final}")
    finally:
        consumer.close()
    assert seen == produced
    assert wait_until(lambda: _committed(cluster, topic), 30, "committed offsets") == final

    # A new member resumes at the committed offsets: it reads only what came after.
    more = _produce(cluster.bootstrap(), topic, [(p, f"more-{p}".encode()) for p in range(3)])
    resumed = _group_consumer(cluster.bootstrap(*[n.node_id for n in cluster.running()]))
    try:
        resumed.subscribe([topic])
        read: dict[tuple[int, int], bytes] = {}
        _consume(resumed, len(more), read)
        time.sleep(1.0)  # anything read before the committed offsets would show up by now
        for message in resumed.consume(200, 0.5):
            if message.error() is None:
                read[(message.partition(), message.offset())] = message.value()
    finally:
        resumed.close()
    assert read == more, f"the new member read {sorted(read)}, not just {sorted(more)}"


# 7. The whole cluster restarted --------------------------------------------------------------


def _producer_ids(cluster: Cluster) -> set[int]:
    """One producer id from each node (InitProducerId without a transactional id)."""
    ids = set()
    for node in cluster.nodes.values():
        with RawClient(node.bootstrap) as client:
            answer = client.call(22, 1, request(22, transactional_id=None,
                                                transaction_timeout_ms=60_000))  # fmt: skip
        assert answer.error_code == 0, (node, answer.error_code)
        ids.add(answer.producer_id)
    return ids


def test_whole_cluster_restart_keeps_topics_and_records(cluster: Cluster) -> None:
    cluster.create_topic("kept-a", PARTITIONS, config={"retention.ms": "86400123"})
    cluster.create_topic("kept-b", 1)
    kept_a = _produce(cluster.bootstrap(), "kept-a",
                      [(i % PARTITIONS, f"a{i}".encode()) for i in range(600)])  # fmt: skip
    kept_b = _produce(cluster.bootstrap(), "kept-b", [(0, f"b{i}".encode()) for i in range(200)])

    handed_out = _producer_ids(cluster)

    codes = cluster.stop_all()
    assert codes == {1: 0, 2: 0, 3: 0}, codes
    cluster.start()
    for partition in range(PARTITIONS):
        cluster.wait_leader("kept-a", partition)
    cluster.wait_leader("kept-b", 0)

    for node in cluster.nodes.values():
        topics = {t.name: t for t in node.metadata(["kept-a", "kept-b"]).topics}
        assert {name: (t.error_code, len(t.partitions)) for name, t in topics.items()} == {
            "kept-a": (0, PARTITIONS), "kept-b": (0, 1)}, node  # fmt: skip
        for t in topics.values():
            assert all(sorted(p.replica_nodes) == [1, 2, 3] for p in t.partitions), (node, t)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "kept-a")
    admin = cluster.admin()  # alive until the answer is in
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["retention.ms"].value == "86400123"

    assert read_partitions(cluster.bootstrap(), "kept-a", PARTITIONS) == kept_a
    assert read_partitions(cluster.bootstrap(), "kept-b", 1) == kept_b
    # Producer ids are never handed out twice (DESIGN §7: the controller's blocks), or a new
    # idempotent producer would meet an old one's sequence numbers.
    again = _producer_ids(cluster)
    assert not handed_out & again, (
        f"producer ids handed out again after the restart: "
        f"{sorted(handed_out & again)} (before: {sorted(handed_out)}, after: {sorted(again)})"
    )
    # Appends go on after the last offsets.
    after = _produce(cluster.bootstrap(), "kept-a", [(p, b"after") for p in range(PARTITIONS)])
    for partition, offset in after:
        last = max(o for p, o in kept_a if p == partition)
        assert offset > last, (partition, offset, last)
    cluster.wait_replicas_converged("kept-a", PARTITIONS)


# 8. The controller group: a leader cut off, a follower's power loss ---------------------------


@pytest.fixture
def linked_cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS),
        link_proxies=True,
    )  # fmt: skip


def _controller(cluster: Cluster, node_ids: list[int], not_on: int | None = None) -> int:
    """The controller leader every one of `node_ids` names in Metadata, other than
    `not_on`."""

    def agreed() -> int | None:
        named = {cluster[i].metadata([]).controller_id for i in node_ids}
        leader = named.pop() if len(named) == 1 else -1
        return leader if leader in cluster.nodes and leader != not_on else None

    return wait_until(agreed, 30, f"nodes {node_ids} naming one controller but {not_on}")


def _names(node: ClusterNode, topic: str) -> bool:
    (found,) = node.metadata([topic]).topics
    return found.error_code == 0


def test_a_controller_leader_cut_off_applies_what_it_missed_once_healed(
    linked_cluster: Cluster,
) -> None:
    # Cut off with a proposal of its own, the old leader comes back to a log whose tail is cut
    # and replaced, the commit covering the new entries in the same append: once the cut is
    # durable they must be applied, not at the next controller write (none comes here).
    cluster = linked_cluster
    old = _controller(cluster, list(cluster.nodes))
    others = [i for i in cluster.nodes if i != old]
    cluster.isolate(old)
    with RawClient(cluster[old].bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="ghost", num_partitions=1,
                                                   replication_factor=3)  # fmt: skip
        client.send(19, 5, request(19, topics=[topic], timeout_ms=30_000))
        wait_until(lambda: any(getattr(c, "name", "") == "ghost"
                               for _, c in controller_commands(cluster[old].data_dir)),
                   10, "the old leader's proposal in its log")  # fmt: skip
    new = _controller(cluster, others, not_on=old)
    admin = cluster.admin(*others)  # alive until the answer is in
    admin.create_topics([NewTopic("kept", 1, 3)])["kept"].result(timeout=30)
    wait_until(lambda: all(_names(cluster[i], "kept") for i in others), 10, "kept, on the two")
    assert not _names(cluster[old], "kept")

    cluster.heal_links()
    wait_until(lambda: cluster[old].metadata([]).controller_id == new, 30,
               f"node {old} hearing of the new controller, node {new}")  # fmt: skip
    heard = time.monotonic()
    wait_until(lambda: _names(cluster[old], "kept"), 1.0,
               f"node {old}'s Metadata naming the topic created while it was cut off",
               every_s=0.02)  # fmt: skip
    print(f"node {old} named kept {time.monotonic() - heard:.3f}s after it heard of node {new}")
    assert not _names(cluster[old], "ghost")


def test_a_producer_id_block_a_power_loss_cut_from_a_log_is_not_handed_out_again(
    linked_cluster: Cluster,
) -> None:
    # A follower hands out a producer id from a block whose grant it has applied but whose
    # acknowledgement has not reached the leader (its link to the leader is slow, then cut,
    # and what it held dropped), so the leader did not count it; then it loses power and the
    # grant with it. Restarted, it gets the grant again from the leader: the ids it hands
    # out from then on must be new ones.
    cluster = linked_cluster
    leader = _controller(cluster, list(cluster.nodes))
    node = next(i for i in cluster.nodes if i != leader)
    link = cluster.link(node, leader)
    link.delay(ACK_DELAY_MS)
    first = wait_until(lambda: _producer_id(cluster[node]), 30, f"a producer id from {node}")
    link.cut()  # within ACK_DELAY_MS of the grant: its acknowledgement still on the way
    cluster[node].kill9()
    link.reset()

    def grants() -> list[int]:
        return [offset for offset, c in controller_commands(cluster[node].data_dir)
                if isinstance(c, AllocateProducerIdBlock) and c.node == node]  # fmt: skip

    (grant,) = grants()
    _lose_controller_log_from(cluster[node].data_dir, grant)
    link.heal()
    cluster.restart(node)
    again = [wait_until(lambda: _producer_id(cluster[node]), 30, f"a producer id from {node}")]
    wait_until(lambda: grant in grants(), 10, "the lost grant back in the node's log")
    again.append(wait_until(lambda: _producer_id(cluster[node]), 30, "another producer id"))
    reused = [i for i in again if first <= i < first + producer_id_block_size]
    assert not reused, (
        f"node {node} handed out {reused} again from its block at {first} after it lost the "
        f"block's grant (offset {grant}) to a power loss")  # fmt: skip


def _producer_id(node: ClusterNode) -> int | None:
    """A producer id from the node (InitProducerId without a transactional id); None when it
    has none to give now."""
    with RawClient(node.bootstrap) as client:
        answer = client.call(22, 1, request(22, transactional_id=None,
                                            transaction_timeout_ms=60_000))  # fmt: skip
    return int(answer.producer_id) if answer.error_code == 0 else None


def _lose_controller_log_from(data_dir: Path, offset: int) -> None:
    """Power loss on a stopped node: its controller log loses the batch holding `offset` and
    every one after it."""
    for segment in sorted((data_dir / "_krill" / "controller").glob("*.log")):
        data = segment.read_bytes()
        kept = [start + h.size for start, h in whole_batches(data) if h.last_offset < offset]
        with open(segment, "r+b") as f:
            f.truncate(max(kept, default=0))
