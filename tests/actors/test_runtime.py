"""The loop-actor runtime: pykka semantics on one event-loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors.runtime import LoopActor, LoopFuture, bind_loop, stop_all_actors

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    bind_loop(loop)
    try:
        yield loop
    finally:
        stop_all_actors()
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()


def run_until(loop: asyncio.AbstractEventLoop, predicate: Any, limit_s: float = 5.0) -> None:
    async def wait() -> None:
        deadline = loop.time() + limit_s
        while not predicate():
            assert loop.time() < deadline, "condition not reached"
            await asyncio.sleep(0.001)

    loop.run_until_complete(wait())


class Recorder(LoopActor):
    latest: Recorder | None = None  # the last one made, for the test to inspect

    def __init__(self) -> None:
        super().__init__()
        Recorder.latest = self
        self.seen: list[Any] = []
        self.started_on: int | None = None
        self.stopped = False

    def on_start(self) -> None:
        self.started_on = threading.get_ident()

    def on_stop(self) -> None:
        self.stopped = True

    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom")
        self.seen.append((message, threading.get_ident()))
        return message * 2

    def add(self, a: int, b: int) -> int:
        return a + b


def test_tell_ask_and_proxy_run_on_the_loop_thread(loop: asyncio.AbstractEventLoop) -> None:
    ref = Recorder.start()
    actor = Recorder.latest
    assert actor is not None
    for i in range(5):
        ref.tell(i)
    answers: list[Any] = []
    ref.ask(21, block=False).add_done_callback(lambda f: answers.append(f.result()))
    ref.proxy().add(2, 3).add_done_callback(lambda f: answers.append(f.result()))
    run_until(loop, lambda: len(answers) == 2)
    assert answers == [42, 5]
    assert [m for m, _ in actor.seen] == [0, 1, 2, 3, 4, 21]  # order kept
    assert {thread for _, thread in actor.seen} == {threading.get_ident()}
    assert actor.started_on == threading.get_ident()


def test_ask_failure_reaches_the_caller_and_the_actor_survives(
    loop: asyncio.AbstractEventLoop,
) -> None:
    ref = Recorder.start()
    outcomes: list[Any] = []

    def record(f: LoopFuture) -> None:
        try:
            outcomes.append(f.result())
        except ValueError as e:
            outcomes.append(e)

    ref.ask("boom", block=False).add_done_callback(record)
    ref.ask(1, block=False).add_done_callback(record)
    run_until(loop, lambda: len(outcomes) == 2)
    assert isinstance(outcomes[0], ValueError) and outcomes[1] == 2


def test_get_on_the_loop_thread_refuses_to_deadlock(loop: asyncio.AbstractEventLoop) -> None:
    ref = Recorder.start()
    future = ref.ask(1, block=False)
    with pytest.raises(RuntimeError, match="deadlock"):
        future.get(timeout=0.1)


def test_tell_from_another_thread_hops_onto_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    ref = Recorder.start()
    actor = Recorder.latest
    assert actor is not None
    threads = [threading.Thread(target=lambda: [ref.tell(i) for i in range(100)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run_until(loop, lambda: len(actor.seen) == 400)
    assert {thread for _, thread in actor.seen} == {threading.get_ident()}


def test_off_loop_get_waits_for_the_answer(loop: asyncio.AbstractEventLoop) -> None:
    ref = Recorder.start()
    results: list[Any] = []
    caller = threading.Thread(target=lambda: results.append(ref.ask(4, timeout=5)))
    caller.start()
    run_until(loop, lambda: results != [])
    caller.join()
    assert results == [8]


def test_stop_runs_on_stop_and_fails_pending_asks(loop: asyncio.AbstractEventLoop) -> None:
    ref = Recorder.start()
    actor = Recorder.latest
    assert actor is not None
    ref.stop(block=False)
    queued_behind_stop = ref.ask(1, block=False)  # still accepted: the stop is not handled yet
    run_until(loop, lambda: actor.stopped and queued_behind_stop.done())
    with pytest.raises(pykka.ActorDeadError):
        queued_behind_stop.result()
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.tell(2)


def test_actors_left_on_a_closed_loop_are_forgotten_not_stopped() -> None:
    # A run cut short (a simulated scenario's timeout) closes its loop with actors in it.
    cut_short = asyncio.new_event_loop()
    bind_loop(cut_short)
    ref = Recorder.start()
    cut_short.run_until_complete(asyncio.sleep(0.01))
    cut_short.close()
    assert ref in pykka.ActorRegistry.get_all()

    stop_all_actors()  # what the next test's teardown calls: no "Event loop is closed"

    assert ref not in pykka.ActorRegistry.get_all()
