"""An idempotent producer across Raft leader changes: three real Partition actors (real logs,
real Raft replicas) on one loop, their Raft messages carried in memory (tests/support/
replicated_partitions.py).

A new leader refuses a batch by its sequence only once an entry of its term has committed
(actors/partition_held.py). Before, a leader that lacked a batch its predecessor
had appended answered the next batch OUT_OF_ORDER_SEQUENCE_NUMBER at once; librdkafka then
bumps its epoch and sends the missing batch again under new sequences; and when that leader's
no-op never committed, a later leader that held the first copy kept it: the value was stored
twice (issue #28's CI run, tests/integration/test_cluster_pauses.py, twice in three runs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.partition_messages import Produce, ProduceResult
from actors.raft import MsgType
from tests.support.actor_loop import actor_loop, settle
from tests.support.replicated_partitions import ASKS_MAX, REPLICAS, Address, Cluster
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

PID = 700
VOTES = frozenset({MsgType.MsgPreVote, MsgType.MsgPreVoteResp, MsgType.MsgVote,
                   MsgType.MsgVoteResp})

loop = pytest.fixture(actor_loop)


def send(cluster: Cluster, address: Address, sequence: int,
         value_bytes: int = 0) -> list[ProduceResult]:
    """The producer's batch of `sequence` (value b"v<sequence>", padded to `value_bytes`),
    acks=all, not waited for: the list its answer will be appended to."""
    value = (b"v%d" % sequence).ljust(value_bytes, b".")
    batch = build_batch([(None, value, [])], producer_id=PID, producer_epoch=0,
                        base_sequence=sequence)
    answers: list[ProduceResult] = []
    cluster.net.refs[address].tell(Produce(memoryview(batch), iter_batches(batch), -1,
                                           answers.append))
    return answers


def answer(cluster: Cluster, answers: list[ProduceResult]) -> ProduceResult:
    settle(cluster.loop, lambda: bool(answers))
    return answers[0]


def wait_info(cluster: Cluster, address: Address, key: str, value: int) -> None:
    for _ in range(ASKS_MAX):
        if cluster.info(address)[key] == value:
            return
    assert cluster.info(address)[key] == value, (address, key)


def test_a_new_leader_checks_sequences_once_its_election_log_is_committed(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    cluster = Cluster(loop, tmp_path)
    net = cluster.net
    try:
        old = cluster.leader()
        assert answer(cluster, send(cluster, old, 0)).error == ErrorCode.NONE
        end = cluster.info(old)["high_watermark"]
        for address in REPLICAS:
            wait_info(cluster, address, "high_watermark", end)

        # The old leader appends sequence 1 and nothing it sends arrives: its log alone has it.
        net.held.add(old)
        send(cluster, old, 1)
        wait_info(cluster, old, "next_offset", end + 1)
        net.down.add(old)
        # Between the other two only votes pass: one is elected, its no-op never commits.
        net.drops = lambda sender, m: m.type not in VOTES
        others = [a for a in REPLICAS if a != old]
        settle(loop, lambda: any(net.leaders.get(a) == a for a in others))
        new = next(a for a in others if net.leaders.get(a) == a)
        # Elected with everything committed, it placed no no-op, and it lacks sequence 1.
        assert cluster.info(new)["next_offset"] == end

        # Sequence 2 at the new leader: not OUT_OF_ORDER (sequence 1 may yet be kept), held
        # behind the no-op it places now, until it no longer leads (check-quorum steps it
        # down), then refused retriable.
        refused = answer(cluster, send(cluster, new, 2))
        assert refused.error == ErrorCode.NOT_LEADER_OR_FOLLOWER, refused
        info = cluster.info(new)
        assert (info["next_offset"], info["high_watermark"]) == (end + 1, end), info

        # The old leader comes back, and the one elected meanwhile goes: sequence 1 is kept.
        net.drops = lambda _sender, _m: False
        net.down.add(new)
        net.down.discard(old)
        net.release(old)  # its appends from the old term arrive late, and are refused
        assert cluster.leader() == old
        kept = answer(cluster, send(cluster, old, 1))  # the producer's retry: a duplicate
        assert (kept.error, kept.base_offset) == (ErrorCode.NONE, end), kept
        last = answer(cluster, send(cluster, old, 2))
        assert last.error == ErrorCode.NONE and last.base_offset > end, last
        assert cluster.info(old)["next_offset"] == last.base_offset + 1
    finally:
        net.close()


def test_an_in_order_write_to_a_new_leader_goes_straight_in_with_no_no_op(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    """A write the producer state takes is safe before the new leader settles: it is
    appended at once, and a quiet election leaves no no-op among the offsets (a new topic's
    first record is at 0, the next leader's first at the log end)."""
    cluster = Cluster(loop, tmp_path)
    net = cluster.net
    try:
        old = cluster.leader()
        first = answer(cluster, send(cluster, old, 0))
        assert (first.error, first.base_offset) == (ErrorCode.NONE, 0), first
        end = cluster.info(old)["high_watermark"]
        for address in REPLICAS:
            wait_info(cluster, address, "high_watermark", end)
        net.down.add(old)
        new = cluster.leader()
        follower = next(a for a in REPLICAS if a not in (old, new))
        net.held.add(follower)  # its answers wait: nothing of the new term can commit yet
        produced = send(cluster, new, 1)
        loop.run_until_complete(asyncio.sleep(0.02))  # two ticks: check-quorum waits ten
        assert produced == [] and cluster.info(new)["next_offset"] == end + 1  # appended
        net.release(follower)
        result = answer(cluster, produced)
        assert result.error == ErrorCode.NONE and result.base_offset == end, result
    finally:
        net.close()
