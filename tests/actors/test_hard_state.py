"""The shard's Raft hard-state table: one atomic write per loop turn, `then` only once durable,
writes in order, a failed write answered with its error and written again later."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.hard_state import FILE_NAME, HardStateStore, load_hard_states
from actors.raft import HardState

pytestmark = pytest.mark.timeout(30)


class Pool:
    """The I/O pool's contract on a real thread: fn there, done(result, error) on the loop.
    `fail` makes the next calls raise instead of writing."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls = 0
        self.fail = 0

    def run(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
            ) -> None:
        self.calls += 1
        failing = self.fail > 0
        self.fail -= failing

        def work() -> None:
            if failing:
                raise OSError(5, "Input/output error")
            fn()

        future = self.loop.run_in_executor(None, work)
        future.add_done_callback(lambda f: done(None, f.exception()))


async def settle(store: HardStateStore) -> None:
    for _ in range(200):
        await asyncio.sleep(0.005)
        if not store.pending:
            return
    raise AssertionError("the store never settled")


def test_saves_of_one_turn_are_one_write_and_answered_after_it(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        store = HardStateStore(tmp_path, pool.run, loop.call_soon)
        answered: list[tuple[str, BaseException | None]] = []
        store.save("orders-0", HardState(5, (2, 1)), lambda e: answered.append(("a", e)))
        store.save("orders-1", HardState(7, None), lambda e: answered.append(("b", e)))
        assert answered == [] and not (tmp_path / FILE_NAME).exists()
        await settle(store)
        assert answered == [("a", None), ("b", None)]
        assert pool.calls == 1 and store.writes == 1

    asyncio.run(main())
    assert load_hard_states(tmp_path) == {"orders-0": HardState(5, (2, 1)),
                                          "orders-1": HardState(7, None)}


def test_saves_while_a_write_is_out_ride_the_next_and_the_newest_lands_last(
        tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        store = HardStateStore(tmp_path, pool.run, loop.call_soon)
        order: list[int] = []
        store.save("t-0", HardState(1, 1), lambda e: order.append(1))
        await asyncio.sleep(0)  # the first write starts
        for term in (2, 3, 4):
            store.save("t-0", HardState(term, 1), lambda e, t=term: order.append(t))
        await settle(store)
        assert order == [1, 2, 3, 4]
        assert pool.calls == 2  # the three saves made while the first was out: one write

    asyncio.run(main())
    assert load_hard_states(tmp_path) == {"t-0": HardState(4, 1)}


def test_a_failed_write_answers_its_error_and_a_retry_writes_it(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        pool.fail = 1
        store = HardStateStore(tmp_path, pool.run, loop.call_soon)
        errors: list[BaseException | None] = []
        store.save("t-0", HardState(3, 2), errors.append)
        for _ in range(200):
            await asyncio.sleep(0.005)
            if errors:
                break
        assert len(errors) == 1 and isinstance(errors[0], OSError)
        assert not (tmp_path / FILE_NAME).exists()
        assert store.pending  # still to be written
        store.retry()
        await settle(store)
        assert store.writes == 1

    asyncio.run(main())
    assert load_hard_states(tmp_path) == {"t-0": HardState(3, 2)}


def test_a_forgotten_group_leaves_the_file_and_a_torn_temp_file_is_ignored(
        tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = Pool(loop)
        store = HardStateStore(tmp_path, pool.run, loop.call_soon)
        store.save("gone-0", HardState(2, 1), lambda e: None)
        store.save("kept-0", HardState(9, 3), lambda e: None)
        await settle(store)
        forgotten: list[BaseException | None] = []
        store.forget("gone-0", forgotten.append)
        store.forget("never-there", forgotten.append)  # answered at once
        await settle(store)
        assert forgotten == [None, None]

    asyncio.run(main())
    (tmp_path / (FILE_NAME + ".tmp")).write_bytes(b"\x93torn")  # a crash mid-write
    assert load_hard_states(tmp_path) == {"kept-0": HardState(9, 3)}
    reopened = HardStateStore(tmp_path, lambda fn, done: None, lambda f: None)
    assert reopened.get("kept-0") == HardState(9, 3) and reopened.get("gone-0") is None
