"""The GroupCoordinator's transactional offsets (TxnOffsetCommit): appended as the producer's
transactional batch, pending until the real Partition actor of the group's offsets partition
commits the producer's marker and tells the coordinator; COMMIT makes them committed, ABORT
drops them, require_stable sees them as unstable, a load keeps the undecided ones pending, a
deleted group drops them, an older epoch is fenced by the partition.

The harness is test_group_coordinator's: real actors on a real loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from actors.group import limits, offsets_partition
from actors.group.messages import (
    CommitEntry,
    DeleteGroups,
    FetchOffsets,
    TxnCommitOffsets,
)
from actors.partition_messages import Read, WriteTxnMarker
from tests.actors.test_group_coordinator import PARTITIONS, Node, ask, group_in, loop, start
from tests.support.actor_loop import settle
from wire.errors import ErrorCode as E

pytestmark = pytest.mark.timeout(60)

__all__ = ["loop"]  # the fixture, used by name

PID = 9000


class OffsetsNode(Node):
    """The node, with the shard's coordinator the offsets partitions tell of markers."""

    coordinator: Any = None

    def local_group_coordinator(self) -> Any:
        return self.coordinator


@pytest.fixture
def node(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> OffsetsNode:
    return OffsetsNode(loop, tmp_path)


def serve(node: OffsetsNode) -> Any:
    node.coordinator = start(node, owns=lambda _p: True)
    return node.coordinator


def txn_commit(loop: asyncio.AbstractEventLoop, coordinator: Any, group_id: str, offset: int,
               epoch: int = 0, member_id: str = "", generation_id: int = -1) -> list[E]:
    entry = CommitEntry("t", 0, offset, -1, None)
    errors: list[E] = ask(loop, lambda reply: coordinator.tell(TxnCommitOffsets(
        "tx", group_id, PID, epoch, generation_id, member_id, None, [entry], reply)))
    return errors


def marker(loop: asyncio.AbstractEventLoop, node: OffsetsNode, group_id: str, commit: bool,
           epoch: int = 0) -> None:
    ref = node.gates[offsets_partition(group_id, PARTITIONS)].ref
    error = ask(loop, lambda reply: ref.tell(WriteTxnMarker(PID, epoch, commit, 0, reply)))
    assert error == E.NONE


def fetched(loop: asyncio.AbstractEventLoop, coordinator: Any, group_id: str,
            require_stable: bool = True) -> tuple[E, int | None]:
    """(error, offset or None) of partition t-0."""
    error, offsets = ask(loop, lambda reply: coordinator.tell(FetchOffsets(
        group_id, [("t", 0)], reply, with_error=True, require_stable=require_stable)))
    assert error == E.NONE
    value = offsets[0].value
    return offsets[0].error, None if value is None else value.offset


def settled(loop: asyncio.AbstractEventLoop, coordinator: Any, group_id: str,
            expected: tuple[E, int | None]) -> None:
    """The marker's word reaches the coordinator after the marker's own answer."""
    for _ in range(200):
        if fetched(loop, coordinator, group_id) == expected:
            return
        loop.run_until_complete(asyncio.sleep(0.01))
    assert fetched(loop, coordinator, group_id) == expected


def test_commit_marker_commits_and_abort_drops(
        loop: asyncio.AbstractEventLoop, node: OffsetsNode) -> None:
    g = group_in(1)
    coordinator = serve(node)
    assert txn_commit(loop, coordinator, g, 5) == [E.NONE]
    assert fetched(loop, coordinator, g) == (E.UNSTABLE_OFFSET_COMMIT, None)
    assert fetched(loop, coordinator, g, require_stable=False) == (E.NONE, None)
    marker(loop, node, g, commit=True)
    settled(loop, coordinator, g, (E.NONE, 5))

    assert txn_commit(loop, coordinator, g, 9) == [E.NONE]
    assert fetched(loop, coordinator, g, require_stable=False) == (E.NONE, 5)
    marker(loop, node, g, commit=False)
    settled(loop, coordinator, g, (E.NONE, 5))


def test_a_load_keeps_undecided_offsets_pending_until_their_marker(
        loop: asyncio.AbstractEventLoop, node: OffsetsNode) -> None:
    g = group_in(2)
    coordinator = serve(node)
    assert txn_commit(loop, coordinator, g, 4) == [E.NONE]
    marker(loop, node, g, commit=True)
    assert txn_commit(loop, coordinator, g, 12) == [E.NONE]
    coordinator.stop(block=False)
    settle(loop, lambda: not coordinator.is_alive())
    again = serve(node)
    assert fetched(loop, again, g) == (E.UNSTABLE_OFFSET_COMMIT, None)
    assert fetched(loop, again, g, require_stable=False) == (E.NONE, 4)
    marker(loop, node, g, commit=True)
    settled(loop, again, g, (E.NONE, 12))


def test_an_older_epoch_is_fenced_by_the_partition(
        loop: asyncio.AbstractEventLoop, node: OffsetsNode) -> None:
    g = group_in(3)
    coordinator = serve(node)
    assert txn_commit(loop, coordinator, g, 4, epoch=2) == [E.NONE]
    assert txn_commit(loop, coordinator, g, 5, epoch=1) == [E.INVALID_PRODUCER_EPOCH]
    assert fetched(loop, coordinator, g) == (E.UNSTABLE_OFFSET_COMMIT, None)


def test_member_checks_and_a_deleted_group_drops_its_pending_offsets(
        loop: asyncio.AbstractEventLoop, node: OffsetsNode) -> None:
    g = group_in(0)
    coordinator = serve(node)
    assert txn_commit(loop, coordinator, g, 3, member_id="m1") == [E.UNKNOWN_MEMBER_ID]
    assert txn_commit(loop, coordinator, g, 3, generation_id=4) == [E.ILLEGAL_GENERATION]
    assert txn_commit(loop, coordinator, g, 3) == [E.NONE]
    assert ask(loop, lambda reply: coordinator.tell(DeleteGroups([g], reply))) == [E.NONE]
    assert fetched(loop, coordinator, g) == (E.NONE, None)
    marker(loop, node, g, commit=True)
    loop.run_until_complete(asyncio.sleep(0.05))
    assert fetched(loop, coordinator, g) == (E.NONE, None)
    coordinator.stop(block=False)
    settle(loop, lambda: not coordinator.is_alive())
    assert fetched(loop, serve(node), g) == (E.NONE, None)  # the load agrees


class HoldReads:
    """Stands for an offsets partition: passes everything on but a load's reads, which it
    holds until `release` (a load whose target is known, its replay not yet done)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.held: list[Any] | None = []

    def tell(self, message: Any) -> None:
        if isinstance(message, Read) and self.held is not None:
            self.held.append(message)
        else:
            self.ref.tell(message)

    def release(self) -> None:
        held, self.held = self.held or [], None
        for message in held:
            self.ref.tell(message)


def test_a_marker_past_a_loads_target_is_applied_once_it_has_replayed(
        loop: asyncio.AbstractEventLoop, node: OffsetsNode,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One batch per read: the load's last read stops at its target, short of the marker.
    monkeypatch.setattr(limits, "load_read_bytes_max", 1)
    g = group_in(1)
    coordinator = serve(node)
    assert txn_commit(loop, coordinator, g, 21) == [E.NONE]
    coordinator.stop(block=False)
    settle(loop, lambda: not coordinator.is_alive())
    p = offsets_partition(g, PARTITIONS)
    gate = node.gates[p]
    holding = HoldReads(gate.ref)
    node.gates[p] = holding  # type: ignore[assignment]
    again = serve(node)
    settle(loop, lambda: bool(holding.held))  # the target is known; its read waits
    marker(loop, node, g, commit=True)  # lands past the target
    loop.run_until_complete(asyncio.sleep(0.05))
    holding.release()
    settled(loop, again, g, (E.NONE, 21))
