"""Several shard processes behind one Kafka port: routing, ordering, failure, memory bounds."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shards.shard_table import shard_of
from tests.support.acked import StreamingProducer, assert_acknowledged_kept, read_whole_log
from tests.support.broker import BrokerProcess
from tests.support.kafka import consume, create_topic, produce
from tests.support.raw_client import RawClient
from wire.messages.produce import ProduceRequest
from wire.records import build_batch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores for two shards"),
]


@pytest.fixture
def two_shards(tmp_path: Path):  # type: ignore[no-untyped-def]
    node = BrokerProcess(tmp_path / "data", smp=2).start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


def _partitions_on_both_shards(topic: str, count: int) -> None:
    owners = {shard_of(topic, p, 2) for p in range(count)}
    assert owners == {0, 1}, "the test topic must span both shards"


def test_many_connections_keep_per_partition_order(two_shards: BrokerProcess) -> None:
    topic = "spread"
    create_topic(two_shards, topic, partitions=8)
    _partitions_on_both_shards(topic, 8)
    errors: list[str] = []

    def run_producer(n: int) -> None:
        try:
            produce(
                two_shards,
                topic,
                [(None, f"{n}:{i}".encode(), None, i % 8) for i in range(1000)],
                **{"enable.idempotence": True, "linger.ms": 1},
            )
        except AssertionError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=run_producer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    got = consume(two_shards, topic, 8, 6000)
    assert len(got) == 6000
    assert len({m.value() for m in got}) == 6000  # no duplicates, no loss
    for p in range(8):
        in_partition = [m for m in got if m.partition() == p]
        assert [m.offset() for m in in_partition] == list(range(len(in_partition)))
        for n in range(6):  # each producer's records keep their order within a partition
            sequence = [
                int(m.value().split(b":")[1])
                for m in in_partition
                if m.value().startswith(f"{n}:".encode())
            ]
            assert sequence == sorted(sequence)


@pytest.mark.parametrize(
    "arena_bytes",
    [None, 64 * 1024, 0],
    ids=["arena", "arena-too-small", "frames"],
)
def test_one_request_spanning_both_shards_and_pipelined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arena_bytes: int | None
) -> None:
    """Batches cross in the shared-memory arena (the default), as pipe frames when it is
    full, or always as frames (`pipe_arena_bytes: 0`): the same answers every way."""
    if arena_bytes is not None:
        monkeypatch.setenv("KRILL_PIPE_ARENA_BYTES", str(arena_bytes))
    node = BrokerProcess(tmp_path / "data", smp=2).start()
    try:
        _span_and_pipeline(node)
        if arena_bytes == 64 * 1024:  # 30 requests of ~40 KiB in flight cannot all fit
            assert "batches sent as frames" in node.log()
        else:
            assert "batches sent as frames" not in node.log()
    finally:
        node.stop()


def _one_record_per_partition(topic: str, values: list[bytes]) -> ProduceRequest:
    """A Produce v9 request (acks=all) with one batch of one record, values[p], per partition p."""
    return ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.PartitionProduceData(
                        index=p, records=build_batch([(None, value, [])])
                    )
                    for p, value in enumerate(values)
                ],
            )
        ],
    )


def _produce_pipelined(
    node: BrokerProcess,
    topic: str,
    partitions: int,
    rounds: int,
    value: Callable[[int, int], bytes],
) -> list[list[Any]]:
    """`rounds` Produce requests in flight at once on one connection, each with one record,
    `value(round, p)`, for every partition p. Checks that the responses come back in request
    order (whichever shard finished first), every partition appended at offset `round`, and
    that each partition reads back its values in order; returns each response's partitions.
    """
    answered: list[list[Any]] = []
    with RawClient(node.bootstrap) as client:
        correlations = [
            client.send(
                0,
                9,
                _one_record_per_partition(topic, [value(r, p) for p in range(partitions)]),
            )
            for r in range(rounds)
        ]
        for r, correlation in enumerate(correlations):
            got, response = client.receive(0, 9)
            assert got == correlation
            answer = response.responses[0].partition_responses
            assert sorted((p.index, p.error_code, p.base_offset) for p in answer) == [
                (p, 0, r) for p in range(partitions)
            ], answer
            answered.append(answer)
    got = consume(node, topic, partitions, partitions * rounds)
    for p in range(partitions):
        expected = [value(r, p) for r in range(rounds)]
        assert [m.value() for m in got if m.partition() == p] == expected
    return answered


def _span_and_pipeline(node: BrokerProcess) -> None:
    topic = "span"
    create_topic(node, topic, partitions=8)
    _partitions_on_both_shards(topic, 8)
    padding = b"." * 20_000  # partitions 4-7 get ~20 KB batches

    def value(round_: int, p: int) -> bytes:
        return f"{round_}-{p}".encode() + (padding if p >= 4 else b"")

    _produce_pipelined(node, topic, 8, 30, value)


def test_only_the_loop_thread_of_a_shard_preempts(two_shards: BrokerProcess) -> None:
    """Each shard's helpers (ZeroMQ's I/O threads, the fdatasync pool) run as SCHED_BATCH,
    so waking one never preempts the shard's loop thread, which keeps the default policy."""
    topic = "policies"
    create_topic(two_shards, topic, partitions=4)
    _partitions_on_both_shards(topic, 4)
    produce(two_shards, topic, [(None, b"v", None, p) for p in range(4)] * 10)  # pool starts
    for pid in two_shards.shard_pids():
        policies, comms = {}, []
        for task in Path(f"/proc/{pid}/task").iterdir():
            policies[int(task.name)] = os.sched_getscheduler(int(task.name))
            if int(task.name) != pid:
                comms.append((task / "comm").read_text().strip())
        assert policies.pop(pid) == os.SCHED_OTHER  # the loop runs on the main thread
        assert "ZMQbg/IO/0" in comms, comms  # the pipes' I/O thread
        assert any(not c.startswith("ZMQbg") for c in comms), comms  # an I/O pool worker
        assert set(policies.values()) == {os.SCHED_BATCH}, (policies, comms)


def test_kill9_of_one_shard_stops_node_and_loses_nothing(two_shards: BrokerProcess) -> None:
    topic = "survivor"
    create_topic(two_shards, topic, partitions=4)
    _partitions_on_both_shards(topic, 4)
    with StreamingProducer(two_shards, topic) as producer:
        producer.wait_for(10_000)
        os.kill(two_shards.shard_pids()[1], signal.SIGKILL)
        # The supervisor sees it, stops shard 0 cleanly and exits non-zero (fail fast).
        assert two_shards.process is not None
        assert two_shards.process.wait(timeout=60) == 1
    assert "shard 1" in two_shards.log() and "killed by signal 9" in two_shards.log()
    two_shards.stop()
    acked = list(producer.acknowledged)
    two_shards.start()
    stored, ends = read_whole_log(two_shards, topic, 4)
    assert_acknowledged_kept(acked, stored, ends)


def _tree_rss_mib(broker: BrokerProcess) -> float:
    assert broker.process is not None
    total = 0
    for pid in [broker.process.pid, *broker.shard_pids()]:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def test_producer_flood_over_the_budget_stays_bounded(tmp_path: Path) -> None:
    budget = 4 * 1024 * 1024
    node = BrokerProcess(tmp_path / "data", smp=2)
    os.environ["KRILL_MEMORY_BUDGET_BYTES"] = str(budget)
    try:
        node.start()
    finally:
        del os.environ["KRILL_MEMORY_BUDGET_BYTES"]
    try:
        create_topic(node, "flood", partitions=4)
        baseline = _tree_rss_mib(node)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss_mib(node))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        value = b"f" * 100_000
        errors: list[str] = []

        def flood(n: int) -> None:
            try:
                delivered = produce(
                    node,
                    "flood",
                    [(None, value, None, i % 4) for i in range(300)],
                    **{"acks": "all", "linger.ms": 0, "batch.size": 1_000_000},
                )
                assert len(delivered) == 300
            except AssertionError as e:
                errors.append(str(e))

        producers = [threading.Thread(target=flood, args=(n,)) for n in range(8)]
        for t in producers:
            t.start()
        for t in producers:
            t.join(timeout=150)
        done.set()
        sampler.join()
        assert not errors
        # 8 x 300 x 100 KB = 240 MB went through a 4 MiB budget per shard.
        assert len(consume(node, "flood", 4, 2400)) == 2400
        assert peak[0] - baseline < 150, (baseline, peak[0])
    finally:
        node.kill9() if node.alive() else node.stop()


@pytest.mark.parametrize("smp", [1, 2])
def test_large_requests_received_into_the_arena(tmp_path: Path, smp: int) -> None:
    """Produce requests over the scratch buffer (256 KiB) are received straight into the
    shard's arena and, with 2 shards, forwarded from there by reference: 20 pipelined
    requests of ~600 KB, every byte read back where it belongs."""
    node = BrokerProcess(tmp_path / "data", smp=smp).start()
    try:
        topic = "large"
        create_topic(node, topic, partitions=3)

        def value(round_: int, p: int) -> bytes:
            return bytes([round_ * 3 + p]) * 200_000

        for partitions in _produce_pipelined(node, topic, 3, 20, value):
            assert [p.index for p in partitions] == [0, 1, 2]  # in the request's order
        assert "batches sent as frames" not in node.log()
    finally:
        node.stop()
