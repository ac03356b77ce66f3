"""Consumer groups against a real Krill node with real clients: membership, rebalances,
committed offsets across restarts, static members, the three Python clients, `krill group`.

One shard (the group coordinator is not reachable across shards yet) and a 100 ms initial
rebalance delay, so groups form quickly; session timeouts are Kafka's minimum, 6 s.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shards import cli
from tests.support.broker import REPO, BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SESSION_TIMEOUT_MS = 6000
_WAIT_S = 30.0
_GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "100", "--offsets-topic-partitions", "10")


def _start(data_dir: Path) -> BrokerProcess:
    return BrokerProcess(data_dir, *_GROUP_ARGS).start()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = _start(tmp_path_factory.mktemp("groups") / "data")
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = _start(tmp_path / "data")
    try:
        yield broker
    finally:
        broker.kill9() if broker.alive() else broker.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic(broker: BrokerProcess, partitions: int, records: int = 0) -> str:
    name = _name("t")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=15)
    if records:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(records):
            producer.produce(name, value=b"%d" % i, partition=i % partitions)
        assert producer.flush(30) == 0
    return name


def _consumer(broker: BrokerProcess, group: str, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 500,
            **conf,
        }
    )


def _owned(consumers: list[Consumer]) -> list[set[int]]:
    return [{tp.partition for tp in c.assignment()} for c in consumers]


def _wait_balanced(
    consumers: list[Consumer], partitions: int, timeout_s: float = _WAIT_S, external: int = 0
) -> list[set[int]]:
    """Poll every consumer until together they own all partitions, each some, none twice.
    `external` counts members outside this process whose share is unknown (then the local
    ones must own everything but never overlap). Checks "none twice" at every sample."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        owned = _owned(consumers)
        union: set[int] = set().union(*owned)
        assert sum(map(len, owned)) == len(union), f"a partition owned twice: {owned}"
        if union == set(range(partitions)) and all(owned) and not external:
            return owned
    raise AssertionError(f"not balanced within {timeout_s}s: {_owned(consumers)}")


# Membership --------------------------------------------------------------------------------


def test_three_members_share_six_partitions_and_move_on_leave_join_and_kill(
    node: BrokerProcess,
) -> None:
    topic = _topic(node, 6)
    group = _name("g")
    members = [_consumer(node, group) for _ in range(3)]
    for c in members:
        c.subscribe([topic])
    owned = _wait_balanced(members, 6)
    assert sorted(map(len, owned)) == [2, 2, 2]

    members.pop(0).close()  # leaves the group: the other two take its partitions
    owned = _wait_balanced(members, 6)
    assert sorted(map(len, owned)) == [3, 3]

    joiner = _consumer(node, group)
    joiner.subscribe([topic])
    members.append(joiner)
    owned = _wait_balanced(members, 6)
    assert sorted(map(len, owned)) == [2, 2, 2]

    # A member in another process is killed: its session expires, its partitions move.
    victim = _member_process(node, group, topic)
    try:
        started = time.monotonic()
        deadline = started + _WAIT_S
        while time.monotonic() < deadline:
            for c in members:
                c.poll(0.05)
            owned = _owned(members)
            assert sum(map(len, owned)) == len(set().union(*owned)), owned
            if sum(map(len, owned)) < 6:
                break  # the victim now owns some
        else:
            raise AssertionError("the fourth member was never given partitions")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    killed_at = time.monotonic()
    owned = _wait_balanced(members, 6, timeout_s=SESSION_TIMEOUT_MS / 1000 + _WAIT_S)
    moved_s = time.monotonic() - killed_at
    assert sorted(map(len, owned)) == [2, 2, 2]
    assert moved_s < SESSION_TIMEOUT_MS / 1000 + 10, moved_s
    for c in members:
        c.close()


_MEMBER_SCRIPT = f"""
import sys, time
from confluent_kafka import Consumer
c = Consumer({{"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "session.timeout.ms": {SESSION_TIMEOUT_MS}, "heartbeat.interval.ms": 500}})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.1)
"""


def _member_process(broker: BrokerProcess, group: str, topic: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _MEMBER_SCRIPT, broker.bootstrap, group, topic],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_static_member_rejoins_without_rebalance(node: BrokerProcess) -> None:
    topic = _topic(node, 4)
    group = _name("static")
    events: dict[str, list[str]] = {"a": [], "b": []}

    def member(name: str) -> Consumer:
        c = _consumer(node, group, **{"group.instance.id": f"instance-{name}"})
        c.subscribe(
            [topic],
            on_assign=lambda _c, tps: events[name].append(f"assign {len(tps)}"),
            on_revoke=lambda _c, tps: events[name].append(f"revoke {len(tps)}"),
        )
        return c

    a, b = member("a"), member("b")
    before = _wait_balanced([a, b], 4)
    b.close()  # a static member's close sends no LeaveGroup: its place is kept
    b = member("b")
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline and not b.assignment():
        a.poll(0.05)
        b.poll(0.05)
    after = _owned([a, b])
    assert after == before, (before, after)
    for _ in range(20):  # a rebalance would show up as a revoke on a
        a.poll(0.05)
        b.poll(0.05)
    assert not any(e.startswith("revoke") for e in events["a"]), events
    a.close()
    b.close()


# Offsets -----------------------------------------------------------------------------------


def _read(consumer: Consumer, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + _WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            got.append(message)
    return got


def test_commits_survive_a_broker_restart(own_node: BrokerProcess) -> None:
    topic = _topic(own_node, 2, records=20)
    group = _name("durable")
    consumer = _consumer(own_node, group, **{"enable.auto.commit": False})
    consumer.subscribe([topic])
    got = _read(consumer, 20)
    assert len(got) == 20
    consumer.commit(asynchronous=False)
    wanted = [TopicPartition(topic, p) for p in range(2)]
    before = [tp.offset for tp in consumer.committed(wanted, timeout=10)]
    assert before == [10, 10]
    consumer.close()

    own_node.restart()
    fresh = _consumer(own_node, group)
    after = [tp.offset for tp in fresh.committed(wanted, timeout=15)]
    assert after == before
    producer = Producer({"bootstrap.servers": own_node.bootstrap})
    producer.produce(topic, value=b"new", partition=0)
    assert producer.flush(15) == 0
    fresh.subscribe([topic])
    resumed = _read(fresh, 1)  # from the committed offsets: only the new record
    assert [(m.partition(), m.offset()) for m in resumed] == [(0, 10)]
    assert _read_briefly(fresh) == []
    fresh.close()


def test_uncommitted_records_are_read_again(node: BrokerProcess) -> None:
    topic = _topic(node, 1, records=10)
    group = _name("redo")
    first = _consumer(node, group, **{"enable.auto.commit": False})
    first.subscribe([topic])
    got = _read(first, 10)
    assert [m.offset() for m in got] == list(range(10))
    first.commit(message=got[4], asynchronous=False)  # processed 0-4 durably, 5-9 not
    first.close()  # as good as killed: nothing more is committed

    second = _consumer(node, group, **{"enable.auto.commit": False})
    second.subscribe([topic])
    again = _read(second, 5)
    assert [m.offset() for m in again] == [5, 6, 7, 8, 9]
    assert _read_briefly(second) == []
    second.close()


def _read_briefly(consumer: Consumer) -> list[Any]:
    got = []
    for _ in range(10):
        message = consumer.poll(0.05)
        if message is not None and message.error() is None:
            got.append(message)
    return got


# The other clients ------------------------------------------------------------------------


def test_kafka_python_group_auto_and_manual_commit(node: BrokerProcess) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    topic = _topic(node, 3, records=30)
    group = _name("kp")
    for auto in (True, False):
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=node.bootstrap,
            group_id=f"{group}-{auto}",
            auto_offset_reset="earliest",
            enable_auto_commit=auto,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=500,
            consumer_timeout_ms=10_000,
        )
        got = []
        for message in consumer:
            got.append(message)
            if len(got) == 30:
                break
        assert len(got) == 30
        consumer.commit()
        committed = [consumer.committed(KTopicPartition(topic, p)) for p in range(3)]
        assert committed == [10, 10, 10]
        consumer.close()


def test_aiokafka_group_manual_and_auto_commit(node: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATopicPartition

    topic = _topic(node, 3, records=30)
    group = _name("aio")

    async def run(auto: bool) -> list[int]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=node.bootstrap,
            group_id=f"{group}-{auto}",
            auto_offset_reset="earliest",
            enable_auto_commit=auto,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        try:
            got = 0
            while got < 30:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), _WAIT_S)
                got += sum(len(b) for b in batches.values())
            await consumer.commit()
            return [await consumer.committed(ATopicPartition(topic, p)) for p in range(3)]
        finally:
            await consumer.stop()

    assert asyncio.run(run(False)) == [10, 10, 10]
    assert asyncio.run(run(True)) == [10, 10, 10]


# The CLI ----------------------------------------------------------------------------------


def test_group_cli_list_describe_seek_delete(
    node: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = _topic(node, 2, records=10)
    group = _name("cli")
    consumer = _consumer(node, group, **{"enable.auto.commit": False})
    consumer.subscribe([topic])
    assert len(_read(consumer, 10)) == 10
    consumer.commit(asynchronous=False)
    brokers = ["-b", node.bootstrap]

    assert cli.main(["group", "describe", group, *brokers]) == 0
    out = capsys.readouterr().out
    assert "STABLE" in out and topic in out
    assert cli.main(["group", "seek", group, "--to", "start", *brokers]) == 1
    assert "not empty" in capsys.readouterr().err
    consumer.close()

    assert cli.main(["group", "list", *brokers]) == 0
    assert group in capsys.readouterr().out
    assert cli.main(["group", "seek", group, "--to", "start", *brokers]) == 0
    capsys.readouterr()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    offsets = _committed(admin, group)
    assert offsets == {(topic, 0): 0, (topic, 1): 0}
    assert cli.main(["group", "seek", group, "--to", "3", "--topic", topic, *brokers]) == 0
    assert _committed(admin, group) == {(topic, 0): 3, (topic, 1): 3}
    assert cli.main(["group", "seek", group, "--to", "end", *brokers]) == 0
    assert _committed(admin, group) == {(topic, 0): 5, (topic, 1): 5}
    capsys.readouterr()

    assert cli.main(["group", "delete", group, *brokers]) == 0
    assert cli.main(["group", "describe", group, *brokers]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert _committed(admin, group) == {}


def _committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    result = future.result(timeout=15)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}
