"""Transactions on a replicated partition: three real Partition actors (real logs, real Raft
replicas) on one loop, their Raft messages carried in memory (tests/support/
replicated_partitions.py). A marker written on the leader reaches the followers through Raft
like any batch, they derive the same open transactions, last stable offset and aborted index
from what they append, and after the leader goes away the new leader answers read_committed
reads as the old one did and ends the transaction left open. ListOffsets MAX_TIMESTAMP names
a data record, never a control batch stamped later (a leader's LEADER_CHANGE, a marker)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.partition_messages import (
    MAX_TIMESTAMP,
    EpochEndOffset,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
    WriteTxnMarker,
)
from tests.support.actor_loop import actor_loop
from tests.support.replicated_partitions import ASKS_MAX, REPLICAS, Address, Cluster
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

PID = 900


loop = pytest.fixture(actor_loop)


def produce(cluster: Cluster, address: Address, pid: int, sequence: int = 0) -> ProduceResult:
    batch = build_batch([(None, b"v%d" % sequence, [])], producer_id=pid, producer_epoch=0,
                        base_sequence=sequence, transactional=True)
    result: ProduceResult = cluster.ask(address, lambda reply: Produce(
        memoryview(batch), iter_batches(batch), -1, reply))
    return result


def read(cluster: Cluster, address: Address) -> ReadResult:
    result: ReadResult = cluster.ask(address, lambda reply: Read(
        0, 1 << 20, -1, FetchBudget(1 << 20), reply, any_replica=True, committed=True))
    return result


def test_markers_reach_followers_and_survive_failover(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    cluster = Cluster(loop, tmp_path)
    try:
        leader = cluster.leader()
        first = {}
        for pid in (PID, PID + 1, PID + 2):
            produced = produce(cluster, leader, pid)
            assert produced.error == ErrorCode.NONE, produced
            first[pid] = produced.base_offset
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID, 0, False, 1, reply))
        assert marker == ErrorCode.NONE
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID + 1, 0, True, 1, reply))
        assert marker == ErrorCode.NONE
        followers = [a for a in REPLICAS if a != leader]
        refused = cluster.ask(followers[0], lambda reply: WriteTxnMarker(PID, 0, True, 1,
                                                                          reply))
        assert refused == ErrorCode.NOT_LEADER_OR_FOLLOWER
        expected = read(cluster, leader)
        assert expected.last_stable_offset == first[PID + 2]  # the one left open
        assert expected.aborted_transactions == [(PID, first[PID])]
        # Every follower derives the same from what it appended, once its high watermark
        # covers the markers.
        for follower in followers:
            info = cluster.info(follower)
            for _ in range(ASKS_MAX):
                if info["high_watermark"] == expected.high_watermark:
                    break
                info = cluster.info(follower)
            assert (info["open_transactions"], info["aborted_transactions"]) == (1, 1)
            got = read(cluster, follower)
            assert got.last_stable_offset == expected.last_stable_offset
            assert got.aborted_transactions == expected.aborted_transactions
        # The leader goes away; a new one answers as it did and ends the open transaction.
        cluster.net.down.add(leader)
        new_leader = cluster.leader()
        assert new_leader != leader
        after = read(cluster, new_leader)
        assert after.last_stable_offset == expected.last_stable_offset
        assert after.aborted_transactions == expected.aborted_transactions
        marker = cluster.ask(new_leader, lambda reply: WriteTxnMarker(PID + 2, 0, True, 2,
                                                                       reply))
        assert marker == ErrorCode.NONE
        ended = read(cluster, new_leader)
        assert ended.last_stable_offset == ended.high_watermark
        assert ended.aborted_transactions == [(PID, first[PID])]
    finally:
        cluster.net.close()


def test_max_timestamp_names_a_data_record_never_a_control_batch(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    cluster = Cluster(loop, tmp_path)

    def max_timestamp(address: Address) -> tuple[int, int]:
        result: ListOffsetResult = cluster.ask(
            address, lambda reply: ListOffset(MAX_TIMESTAMP, -1, reply))
        assert result.error == ErrorCode.NONE
        return result.offset, result.timestamp

    try:
        leader = cluster.leader()
        batch = build_batch([(b"k", b"v", [])] * 3, timestamps=[1_000, 3_000, 2_000])
        produced: ProduceResult = cluster.ask(leader, lambda reply: Produce(
            memoryview(batch), iter_batches(batch), -1, reply))
        assert produced.base_offset == 0
        marker = cluster.ask(leader, lambda reply: WriteTxnMarker(PID, 0, True, 1, reply))
        assert marker == ErrorCode.NONE  # a control batch stamped now, at offset 3
        assert max_timestamp(leader) == (1, 3_000)
        # Restarted replicas know no commit: the new leader writes a LEADER_CHANGE (stamped
        # now, at offset 4, in a segment of its own as a new term starts one).
        cluster.restart_all()
        leader = cluster.leader()
        for _ in range(ASKS_MAX):
            info = cluster.info(leader)
            if info["high_watermark"] == info["next_offset"] == 5:
                break
        assert (info["high_watermark"], info["segments"]) == (5, 2)
        assert max_timestamp(leader) == (1, 3_000)
    finally:
        cluster.net.close()


def test_a_new_leader_answers_its_own_epoch_before_it_wrote_a_batch_in_it(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    """OffsetForLeaderEpoch at a leader elected with everything committed (no no-op batch):
    Kafka's leader starts its own epoch at its log end when elected, so the current epoch
    ends at the log end, and an epoch between the last batch's and it ends there too. An
    UNDEFINED answer makes kafka-python reset a consumer to earliest and read again."""
    cluster = Cluster(loop, tmp_path)
    try:
        leader = cluster.leader()
        for sequence in range(3):
            assert produce(cluster, leader, PID, sequence).error == ErrorCode.NONE
        end = cluster.info(leader)["high_watermark"]
        followers = [a for a in REPLICAS if a != leader]
        for follower in followers:  # every replica knows it all committed: no no-op later
            for _ in range(ASKS_MAX):
                if cluster.info(follower)["high_watermark"] == end:
                    break
            assert cluster.info(follower)["high_watermark"] == end
        old_epoch = cluster.info(leader)["leader_epoch"]
        cluster.net.down.add(leader)
        new_leader = cluster.leader()
        epoch = cluster.info(new_leader)["leader_epoch"]
        assert epoch > old_epoch and cluster.info(new_leader)["next_offset"] == end
        for asked, expected in ((epoch, (epoch, end)), (old_epoch, (old_epoch, end)),
                                (epoch + 1, (-1, -1))):
            answer = cluster.ask(new_leader, lambda reply, e=asked: EpochEndOffset(
                e, epoch, reply))
            assert answer == (ErrorCode.NONE, *expected), (asked, answer)
        if epoch > old_epoch + 1:  # an epoch with no batch between them ends there as well
            answer = cluster.ask(new_leader, lambda reply: EpochEndOffset(
                epoch - 1, epoch, reply))
            assert answer == (ErrorCode.NONE, old_epoch, end)
    finally:
        cluster.net.close()
