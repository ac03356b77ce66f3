"""A replicated partition's in-sync replicas and min.insync.replicas, on three real Partition
actors (real logs, real Raft replicas) whose messages cross in memory
(tests/support/replicated_partitions.py): the leader reports its ISR and each change of it; a
follower whose node is down leaves it at once, a slow one after replica.lag.time.max.ms, and
both come back once caught up; with min.insync.replicas 3 of 3 an acks=all produce is answered
only once all three have flushed it (the high watermark moving with the majority before),
refused NOT_ENOUGH_REPLICAS while a replica is out, and answered
NOT_ENOUGH_REPLICAS_AFTER_APPEND when one leaves while it waits; at 2 of 3 (a majority) nothing
changes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.partition_messages import ProduceResult
from actors.topic_config import TopicSettings
from tests.support.actor_loop import actor_loop, settle
from tests.support.replicated_partitions import ASKS_MAX, REPLICAS, Address, Cluster
from wire.errors import ErrorCode

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

ACKS_ALL, ACKS_1 = -1, 1
LAG_MS = 300  # replica.lag.time.max.ms of these tests' nodes
LONG_LAG_MS = 30_000  # Kafka's default: a late follower stays in sync throughout a test
TURNS = 200  # loop turns of 1 ms a produce is watched for not being answered
STREAM = 100  # produces sent one a loop turn


def settings(min_insync: int) -> TopicSettings:
    return TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False, min_insync_replicas=min_insync)


loop = pytest.fixture(actor_loop)


@pytest.fixture
def tmp_cluster(loop: asyncio.AbstractEventLoop, tmp_path: Path,
                request: pytest.FixtureRequest) -> Iterator[Cluster]:
    min_insync, lag_ms = request.param
    cluster = Cluster(loop, tmp_path, settings(min_insync), lag_ms)
    try:
        yield cluster
    finally:
        cluster.net.close()


def produced(cluster: Cluster, answers: list[ProduceResult]) -> ProduceResult:
    settle(cluster.loop, lambda: bool(answers))
    return answers[0]


def unanswered_for_a_while(cluster: Cluster, answers: list[ProduceResult]) -> bool:
    async def watch() -> None:
        for _ in range(TURNS):
            await asyncio.sleep(0.001)

    cluster.loop.run_until_complete(watch())
    return not answers


def isr_is(cluster: Cluster, leader: Address, expected: tuple[Address, ...]) -> None:
    settle(cluster.loop, lambda: cluster.net.isr.get(leader) == expected)


def wait_high_watermark(cluster: Cluster, address: Address, offset: int) -> None:
    for _ in range(ASKS_MAX):
        if cluster.info(address)["high_watermark"] >= offset:
            return
    raise AssertionError(f"{address}: high watermark never reached {offset}")


@pytest.mark.parametrize("tmp_cluster", [(3, LONG_LAG_MS)], indirect=True)
def test_acks_all_waits_for_all_three_flushes_while_the_watermark_moves_with_two(
        tmp_cluster: Cluster) -> None:
    cluster = tmp_cluster
    leader = cluster.leader()
    isr_is(cluster, leader, REPLICAS)
    assert produced(cluster, cluster.send_produce(leader, ACKS_ALL)).error == ErrorCode.NONE
    slow = next(a for a in REPLICAS if a != leader)
    cluster.net.held.add(slow)  # up and heard from, but its answers are late
    answers = cluster.send_produce(leader, ACKS_ALL)
    assert unanswered_for_a_while(cluster, answers)
    end = cluster.info(leader)["next_offset"]
    wait_high_watermark(cluster, leader, end)  # a majority has it: readable
    assert unanswered_for_a_while(cluster, answers)  # the third has not flushed it
    acks_1 = cluster.send_produce(leader, ACKS_1)
    assert produced(cluster, acks_1).error == ErrorCode.NONE  # the leader's flush, as ever
    cluster.net.release(slow)
    assert produced(cluster, answers).error == ErrorCode.NONE
    assert cluster.net.isr[leader] == REPLICAS  # late by less than the lag: still in sync


@pytest.mark.parametrize("tmp_cluster", [(3, LAG_MS)], indirect=True)
def test_acks_all_is_refused_while_a_replica_is_down_and_taken_once_it_is_back(
        tmp_cluster: Cluster) -> None:
    cluster = tmp_cluster
    leader = cluster.leader()
    isr_is(cluster, leader, REPLICAS)
    down = next(a for a in REPLICAS if a != leader)
    cluster.net.down.add(down)
    isr_is(cluster, leader, tuple(a for a in REPLICAS if a != down))  # at once, not after lag
    refused = produced(cluster, cluster.send_produce(leader, ACKS_ALL))
    assert refused.error == ErrorCode.NOT_ENOUGH_REPLICAS, refused
    assert refused.message == "2 replica(s) in sync, fewer than min.insync.replicas=3"
    end = cluster.info(leader)["next_offset"]
    assert produced(cluster, cluster.send_produce(leader, ACKS_1)).error == ErrorCode.NONE
    assert cluster.info(leader)["next_offset"] == end + 1  # the refused one took no offset
    cluster.net.down.discard(down)
    isr_is(cluster, leader, REPLICAS)  # caught up with what it missed, then back in
    assert produced(cluster, cluster.send_produce(leader, ACKS_ALL)).error == ErrorCode.NONE


@pytest.mark.parametrize("tmp_cluster", [(3, LONG_LAG_MS)], indirect=True)
def test_a_produce_waiting_when_a_replica_goes_down_is_answered_after_append(
        tmp_cluster: Cluster) -> None:
    cluster = tmp_cluster
    leader = cluster.leader()
    isr_is(cluster, leader, REPLICAS)
    going = next(a for a in REPLICAS if a != leader)
    cluster.net.held.add(going)
    answers = cluster.send_produce(leader, ACKS_ALL)
    assert unanswered_for_a_while(cluster, answers)
    cluster.net.down.add(going)
    assert produced(cluster, answers).error == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


@pytest.mark.parametrize("tmp_cluster", [(3, LAG_MS)], indirect=True)
def test_a_follower_that_falls_behind_leaves_after_the_lag_and_rejoins_caught_up(
        tmp_cluster: Cluster) -> None:
    cluster = tmp_cluster
    leader = cluster.leader()
    isr_is(cluster, leader, REPLICAS)
    slow = next(a for a in REPLICAS if a != leader)
    cluster.net.held.add(slow)
    answers = cluster.send_produce(leader, ACKS_1)
    assert produced(cluster, answers).error == ErrorCode.NONE
    isr_is(cluster, leader, tuple(a for a in REPLICAS if a != slow))  # after LAG_MS
    cluster.net.release(slow)
    isr_is(cluster, leader, REPLICAS)


@pytest.mark.parametrize("tmp_cluster", [(2, LAG_MS)], indirect=True)
def test_min_insync_replicas_of_a_majority_asks_nothing_more_than_raft(
        tmp_cluster: Cluster) -> None:
    cluster = tmp_cluster
    leader = cluster.leader()
    down = next(a for a in REPLICAS if a != leader)
    cluster.net.down.add(down)
    isr_is(cluster, leader, tuple(a for a in REPLICAS if a != down))
    assert produced(cluster, cluster.send_produce(leader, ACKS_ALL)).error == ErrorCode.NONE


@pytest.mark.parametrize("tmp_cluster", [(3, LONG_LAG_MS)], indirect=True)
def test_a_stream_of_acks_all_produces_under_three_of_three_is_answered_in_full(
        tmp_cluster: Cluster) -> None:
    """The leader's disk is the slow one: its flushes return after the followers' answers,
    with more appended meanwhile, so its own flush is what moves the offset three replicas
    have while the next flush is wanted."""
    cluster = tmp_cluster
    leader = cluster.leader()
    isr_is(cluster, leader, REPLICAS)
    cluster.services[leader].io_delay_s = 0.005
    answers: list[list[ProduceResult]] = []

    def send_next() -> None:  # one a loop turn, so appends keep coming while flushes are out
        answers.append(cluster.send_produce(leader, ACKS_ALL, b"%d" % len(answers)))
        if len(answers) < STREAM:
            cluster.loop.call_later(0.001, send_next)

    send_next()
    settle(cluster.loop, lambda: len(answers) == STREAM and all(answers))
    assert [a[0].error for a in answers] == [ErrorCode.NONE] * STREAM
    assert sorted(a[0].base_offset for a in answers) == [a[0].base_offset for a in answers]
