"""Membership changes of a partition's Raft group through its real logs (actors/replica.py,
actors/replica_memberships.py): the replicas of tests/actors/test_replica.py, real segment
logs and files, a dictionary for a network.

What must hold: a change is a control batch in every replica's log, at the same offset; the
memberships file holds it before the log does, on the leader and on every follower; a
restarted replica knows every change its log holds (and the one in force below its log
start) from that file, checked against the log, whatever Config it is started with.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.raft import Membership, Role
from actors.replica_memberships import (
    MEMBERSHIP_FILE,
    confs_to_file,
    membership_batch,
    memberships_in,
    recovered,
)
from storage import DiskLog
from tests.actors.test_replica import (
    NODES,
    Net,
    Node,
    leader,
    produce_tens,
    read_range,
    stop,
    ticking,
    until,
)
from wire.record_batch import iter_batches
from wire.records import build_batch, iter_records

pytestmark = pytest.mark.timeout(60)


def ids(*ns: int) -> frozenset[tuple[int, int]]:
    return frozenset((n, 0) for n in ns)


def changes_in(node: Node) -> list[tuple[int, Membership]]:
    data = read_range(node.log, node.log.log_start_offset, node.log.next_offset - 1)
    return memberships_in(data, iter_batches(data, check_crc=False))


def test_a_learner_joins_is_promoted_and_the_leader_removed_and_a_restart_knows_it(
        tmp_path: Path) -> None:
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        # A fourth replica starts as a learner: it takes the log and never stands.
        fourth = Node(4, tmp_path, net, learners=(4,))
        everyone = [*nodes, fourth]
        net.nodes = {node.id: node for node in everyone}
        ticker = asyncio.ensure_future(ticking(everyone))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None
            produce_tens(first, 2, "a")
            await until(lambda: first.high_watermark == 20, "commit")

            with_learner = Membership(ids(*NODES), learners=ids(4))
            assert first.replica.propose_membership(with_learner)
            await until(lambda: all(n.replica.machine.membership == with_learner
                                    for n in everyone)
                        and fourth.log.next_offset == first.log.next_offset, "the learner")
            promoted = Membership(ids(1, 2, 3, 4))
            await until(lambda: first.replica.propose_membership(promoted), "one at a time")
            await until(lambda: all(n.replica.machine.membership == promoted
                                    for n in everyone), "promoted")
            without_leader = Membership(ids(1, 2, 3, 4) - {first.id})
            await until(lambda: first.replica.propose_membership(without_leader),
                        "after the promotion committed")
            rest = [n for n in everyone if n is not first]
            await until(lambda: leader(rest) is not None
                        and first.replica.machine.role != Role.Leader, "the leader left")
            second = leader(rest)
            assert second is not None
            produce_tens(second, 1, "b")
            end = second.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in rest), "commit without it")

            # Every log holds the changes as control batches at the same offsets, and every
            # file holds them.
            expected = changes_in(second)
            assert [m for _, m in expected] == [with_learner, promoted, without_leader]
            for node in rest:
                assert changes_in(node) == expected
                saved = node.log.read_state(MEMBERSHIP_FILE)
                assert saved["confs"][-3:] == confs_to_file(expected)["confs"]
            # A client reads the data and never a membership: they are control batches.
            values = [r.value for r in iter_records(read_range(second.log, 0, end - 1))
                      if r.value is not None and r.value.startswith((b"a", b"b"))]
            assert len(values) == 30
        finally:
            ticker.cancel()
            await stop(everyone)

        # Restarted with the first Config ({1,2,3}): each knows the membership its log says.
        net = Net()
        nodes = [Node(n, tmp_path, net, learners=(4,) if n == 4 else ())
                 for n in (1, 2, 3, 4) if (n, 0) != first.id]
        net.nodes = {node.id: node for node in nodes}
        for node in nodes:
            assert node.replica.machine.membership == without_leader
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader after the restart")
            third = leader(nodes)
            assert third is not None and third.id in without_leader.voters
            produce_tens(third, 1, "c")
            end = third.log.next_offset
            await until(lambda: all(n.high_watermark == end for n in nodes), "commit")
        finally:
            ticker.cancel()
            await stop(nodes)

    asyncio.run(main())


def test_the_file_holds_a_change_before_the_log_does_on_the_leader_and_a_follower(
        tmp_path: Path) -> None:
    async def main() -> None:
        net = Net()
        nodes = [Node(n, tmp_path, net) for n in NODES]
        net.nodes = {node.id: node for node in nodes}
        ticker = asyncio.ensure_future(ticking(nodes))
        try:
            await until(lambda: leader(nodes) is not None, "a leader")
            first = leader(nodes)
            assert first is not None
            produce_tens(first, 1, "a")
            await until(lambda: all(n.high_watermark == 10 for n in nodes), "commit")
            follower = next(n for n in nodes if n is not first)
            first.hold_files = follower.hold_files = True

            learner = Membership(ids(*NODES), learners=ids(4))
            assert first.replica.propose_membership(learner)
            at = first.replica.machine.log.last_offset
            await until(lambda: first.held_files != [], "the leader's file write")
            # The machine placed the change; the log waits for the file, and so do the
            # leader's produces (the partition holds them: actors/partition_produce.py).
            assert first.log.next_offset == at and first.replica.writes_waiting
            assert first.log.read_state(MEMBERSHIP_FILE) is None
            first.release_files()
            await until(lambda: first.log.next_offset == at + 1, "the leader's append")
            assert not first.replica.writes_waiting
            assert changes_in(first) == [(at, learner)]

            await until(lambda: follower.held_files != [], "the follower's file write")
            assert follower.log.next_offset == at and follower.replica.writes_waiting
            follower.release_files()
            await until(lambda: follower.log.next_offset == at + 1, "the follower's append")
            assert changes_in(follower) == [(at, learner)]
            for node in nodes:
                await until(lambda n=node: n.log.read_state(MEMBERSHIP_FILE) is not None,
                            "every file")
                assert node.log.read_state(MEMBERSHIP_FILE)["confs"][-1] == \
                    confs_to_file([(at, learner)])["confs"][0]
        finally:
            ticker.cancel()
            await stop(nodes)

    asyncio.run(main())


def test_recovery_checks_the_file_against_the_log(tmp_path: Path) -> None:
    """Entries past the log's end go (never written, or cut), an entry whose offset holds no
    such membership batch goes (stale), and of those below the log start the last is the
    anchor; the file then needs writing again."""
    log_ = DiskLog.open(tmp_path / "p")
    a, b, c = (Membership(ids(1, 2, 3), learners=ids(4)), Membership(ids(1, 2, 3, 4)),
               Membership(ids(2, 3, 4)))

    def data(n: int) -> None:
        batch = build_batch([(None, b"v", []) for _ in range(n)])
        log_.append(batch, iter_batches(batch), 1, 0)

    def change(m: Membership) -> int:
        batch = membership_batch(m, 0)
        return log_.append(batch, iter_batches(batch), 1, 0).base_offset

    data(5)
    at_a = change(a)      # 5
    data(5)
    at_b = change(b)      # 11
    data(5)
    at_c = change(c)      # 17
    data(5)               # 18..22
    log_.state_writer(MEMBERSHIP_FILE, confs_to_file([(at_a, a), (at_b, b), (at_c, c)]))()
    assert recovered(log_) == (((at_a, a), (at_b, b), (at_c, c)), True)

    # The log start past the first two: the second is the anchor.
    assert log_.advance_log_start(15)
    assert recovered(log_) == (((at_b, b), (at_c, c)), False)

    # A stale entry (data at 20) and one past the end (30) go.
    log_.state_writer(MEMBERSHIP_FILE, confs_to_file(
        [(at_a, a), (at_b, b), (at_c, c), (20, a), (30, b)]))()
    assert recovered(log_) == (((at_b, b), (at_c, c)), False)

    # No file: nothing changed since the group's Config.
    (tmp_path / "p" / MEMBERSHIP_FILE).unlink()
    assert recovered(log_) == ((), True)
    log_.close()
