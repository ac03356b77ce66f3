"""The Controller writes its metadata files on the I/O pool, never on the loop thread.

Its JSON writes fsync (file and directory): on the loop they stalled every partition and
connection of shard 0. Here the pool is played by the test: each write is held until the test
runs it, so the tests see what waits for what.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors import limits
from actors.controller import (
    AllocateProducerId,
    Controller,
    CreateTopics,
    DeleteTopics,
    TopicResult,
    TopicSpec,
    load_topic_table,
)
from actors.services import BrokerSettings, TopicTable
from tests.support.actor_loop import actor_loop
from wire.errors import ErrorCode

pytestmark = pytest.mark.timeout(30)


class HeldPool:
    """run_blocking that holds every call until `release()` (or fails it with `error`)."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], Any], Callable[[Any, Any], None]]] = []

    def __call__(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self.held.append((fn, done))

    def release(self, error: BaseException | None = None) -> None:
        held, self.held = self.held, []
        for fn, done in held:
            if error is None:
                done(fn(), None)
            else:
                done(None, error)


loop = pytest.fixture(actor_loop)


def turn(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0.01))


def start(tmp_path: Path, pool: HeldPool) -> tuple[Any, list[TopicTable]]:
    published: list[TopicTable] = []

    def on_change(table: TopicTable, done: Callable[[], None]) -> None:
        published.append(table)
        done()

    settings = BrokerSettings(0, "127.0.0.1", 9092, str(tmp_path), "cluster")
    return Controller.start(settings, on_change, pool), published


def create(name: str, replies: list[list[TopicResult]]) -> CreateTopics:
    return CreateTopics([TopicSpec(name, 2, -1, [], {})], False, replies.append)


def test_a_write_runs_on_the_pool_and_later_requests_wait_for_it(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    pool = HeldPool()
    controller, published = start(tmp_path, pool)
    turn(loop)
    created: list[list[TopicResult]] = []
    deleted: list[list[TopicResult]] = []
    controller.tell(create("a", created))
    controller.tell(DeleteTopics(["a"], [None], deleted.append))
    turn(loop)
    # The create's write is out on the pool: nothing written, answered or published yet, and
    # the delete behind it has not even been looked at.
    assert len(pool.held) == 1 and created == [] and deleted == []
    assert not (tmp_path / "_krill" / "topics.json").exists()
    pool.release()
    turn(loop)
    assert [r.error for r in created[0]] == [ErrorCode.NONE]
    assert "a" in load_topic_table(tmp_path).topics and "a" in published[-1].topics
    assert deleted == [] and len(pool.held) == 1  # now the delete's write is out
    pool.release()
    turn(loop)
    assert [r.error for r in deleted[0]] == [ErrorCode.NONE]
    assert "a" not in load_topic_table(tmp_path).topics and "a" not in published[-1].topics


def test_a_failed_write_changes_nothing_and_says_so(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    pool = HeldPool()
    controller, published = start(tmp_path, pool)
    turn(loop)
    created: list[list[TopicResult]] = []
    controller.tell(create("a", created))
    turn(loop)
    pool.release(OSError(28, "No space left on device"))
    turn(loop)
    assert [r.error for r in created[0]] == [ErrorCode.KAFKA_STORAGE_ERROR]
    assert "No space left" in (created[0][0].message or "")
    assert all("a" not in table.topics for table in published)
    controller.tell(create("a", created))  # the next request goes ahead as if none failed
    turn(loop)
    pool.release()
    turn(loop)
    assert [r.error for r in created[1]] == [ErrorCode.NONE]


def test_producer_id_blocks_are_written_on_the_pool(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    pool = HeldPool()
    controller, _ = start(tmp_path, pool)
    turn(loop)
    ids: list[int] = []
    for _ in range(3):
        controller.tell(AllocateProducerId(ids.append))
    turn(loop)
    assert ids == [] and len(pool.held) == 1  # the first block's write is out
    pool.release()
    turn(loop)
    assert ids == [1, 2, 3]
    controller.tell(AllocateProducerId(ids.append))
    pool.release(OSError(5, "Input/output error"))  # nothing held: a block is there
    turn(loop)
    assert ids == [1, 2, 3, 4]


def test_requests_waiting_behind_a_write_are_bounded(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "controller_requests_waiting_max", 2)
    pool = HeldPool()
    controller, _ = start(tmp_path, pool)
    turn(loop)
    replies: list[list[TopicResult]] = []
    ids: list[int] = []
    controller.tell(create("first", replies))  # its write is held
    controller.tell(create("second", replies))
    controller.tell(create("third", replies))
    controller.tell(create("fourth", replies))  # past the two that may wait: refused
    controller.tell(AllocateProducerId(ids.append))  # likewise
    turn(loop)
    assert [(r[0].name, r[0].error) for r in replies] == [
        ("fourth", ErrorCode.REQUEST_TIMED_OUT)
    ]
    assert ids == [-1]
    for _ in range(3):
        pool.release()
        turn(loop)
    assert sorted(r[0].name for r in replies if r[0].error == ErrorCode.NONE) == [
        "first", "second", "third",
    ]
