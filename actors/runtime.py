"""Pykka actors that run on one event-loop thread: the Seastar-style shard runtime.

Every actor of a shard runs on the shard's single asyncio loop thread, cooperatively: a
message never crosses a thread, the hot path takes no locks, and an `ask` round trip costs a
few microseconds instead of a thread switch (DESIGN.md §4, §11). This module plugs into
pykka's seams for another runtime (`_create_actor_inbox`, `_create_future`,
`_start_actor_loop`):

- `LoopInbox` is a deque. A `put` on the loop thread appends and schedules one drain with
  `call_soon`; a `put` from another thread (an I/O pool worker, a test) hops onto the loop with
  `call_soon_threadsafe` first, so the deque is only ever touched by the loop thread.
- `LoopFuture` completes by callbacks on the loop thread. `get()` may block only off the loop
  (tests, the shard's own start-up); on the loop it raises instead of deadlocking the shard.

The loop is bound once per process with `bind_loop()` before any actor is created: pykka makes
the inbox in `Actor.__init__`, before the actor could be told which loop it lives on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pykka
from pykka import ActorDeadError, ActorRegistry, Future, Timeout, messages

from actors import limits

__all__ = ["LoopActor", "LoopFuture", "bind_loop", "current_loop", "on_loop_thread"]

log = logging.getLogger(__name__)

_bound_loop: asyncio.AbstractEventLoop | None = None
_bound_thread_id: int | None = None


def bind_loop(loop: asyncio.AbstractEventLoop, thread_id: int | None = None) -> None:
    """Make `loop` (run by thread `thread_id`, default: this thread) home to every LoopActor."""
    global _bound_loop, _bound_thread_id
    _bound_loop = loop
    _bound_thread_id = threading.get_ident() if thread_id is None else thread_id


def current_loop() -> asyncio.AbstractEventLoop:
    assert _bound_loop is not None, "bind_loop() must run before any LoopActor is created"
    return _bound_loop


def on_loop_thread() -> bool:
    return threading.get_ident() == _bound_thread_id


class LoopFuture(Future[Any]):
    """A pykka future completed on the loop thread; callbacks run there too."""

    def __init__(self) -> None:
        super().__init__()
        self._done = False
        self._value: Any = None
        self._exc_info: Any = None
        self._callbacks: list[Callable[[LoopFuture], None]] | None = None
        self._event: threading.Event | None = None

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[LoopFuture], None]) -> None:
        """Run `callback(self)` when the future completes (at once if it already has)."""
        if self._done:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def result(self) -> Any:
        """The value of a completed future, raising its exception if it failed."""
        assert self._done, "result() of a future that is not done"
        if self._exc_info is not None:
            _, value, traceback = self._exc_info
            raise value.with_traceback(traceback)
        return self._value

    def get(self, *, timeout: float | None = None) -> Any:
        if not self._done:
            if on_loop_thread():
                raise RuntimeError("LoopFuture.get() on the loop thread would deadlock the shard")
            if self._event is None:
                self._event = threading.Event()
                if self._done:  # completed while the event was being made
                    self._event.set()
            if not self._event.wait(timeout):
                raise Timeout(f"{timeout} seconds")
        return self.result()

    def set(self, value: Any = None) -> None:
        self._complete(value, None)

    def set_exception(self, exc_info: Any = None) -> None:
        self._complete(None, exc_info if exc_info is not None else sys.exc_info())

    def _complete(self, value: Any, exc_info: Any) -> None:
        if not on_loop_thread() and _bound_loop is not None and _bound_loop.is_running():
            _bound_loop.call_soon_threadsafe(self._complete, value, exc_info)
            return
        assert not self._done, "a future completed twice"
        self._value, self._exc_info, self._done = value, exc_info, True
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback(self)


class LoopInbox:
    """A deque drained on the loop thread; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: collections.deque[Any] = collections.deque()
        self._actor: LoopActor | None = None
        self._scheduled = False

    def bind(self, actor: LoopActor) -> None:
        self._actor = actor
        if self._queue:
            self._schedule()

    def put(self, envelope: Any, /) -> None:
        if not on_loop_thread():
            self._loop.call_soon_threadsafe(self.put, envelope)
            return
        self._queue.append(envelope)
        if self._actor is not None and not self._scheduled:
            self._schedule()

    def get(self) -> Any:
        return self._queue.popleft()

    def empty(self) -> bool:
        return not self._queue

    def _schedule(self) -> None:
        self._scheduled = True
        self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        actor = self._actor
        assert actor is not None
        # Bounded per turn so one busy actor cannot starve the sockets or other actors.
        for _ in range(limits.inbox_drain_messages_max):
            if not self._queue or actor.actor_stopped.is_set():
                break
            actor._process(self._queue.popleft())
        if actor.actor_stopped.is_set():
            actor._fail_pending()
        elif self._queue:
            self._schedule()


class LoopActor(pykka.Actor):
    """Base class of every Krill actor: a pykka actor that lives on the shard's loop."""

    @staticmethod
    def _create_actor_inbox() -> LoopInbox:  # type: ignore[override]
        return LoopInbox(current_loop())

    @staticmethod
    def _create_future() -> LoopFuture:
        return LoopFuture()

    def _start_actor_loop(self) -> None:
        if on_loop_thread():
            self._begin()
        else:
            current_loop().call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self._actor_loop_setup()  # on_start(); a failure is logged and stops the actor
        inbox = self.actor_inbox
        assert isinstance(inbox, LoopInbox)
        inbox.bind(self)

    def _process(self, envelope: Any) -> None:
        """Handle one message, exactly as pykka's thread loop does for one envelope."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())

    def _fail_pending(self) -> None:
        inbox = self.actor_inbox
        while not inbox.empty():
            envelope = inbox.get()
            if envelope.reply_to is None:
                self.on_dropped(envelope.message)
                continue
            if isinstance(envelope.message, messages._ActorStop):
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(
                    exc_info=(ActorDeadError, ActorDeadError(f"{self} stopped"), None)
                )

    def on_dropped(self, message: Any) -> None:
        """A told message left in the inbox when the actor stopped; answer it if it waits."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """A timer on the shard loop; the callback runs in this actor's context."""
        return current_loop().call_later(delay_s, callback)

    def stop_now(self) -> None:
        """Stop from inside the actor itself (on its own thread), running on_stop()."""
        if not self.actor_stopped.is_set():
            self._stop()


def actor_of(ref: Any) -> LoopActor | None:
    """The actor behind `ref`, for a read on the loop thread (stats, a ticker): never to
    change its state from outside its messages."""
    inbox = getattr(ref, "actor_inbox", None)
    return getattr(inbox, "_actor", None)


def stop_all_actors() -> None:
    """Ask every registered actor to stop; each runs on_stop() on its next drain. An actor
    whose loop is already closed (a run cut short: a simulated scenario timed out) can run
    nothing more: it is only forgotten, so the next loop starts from an empty registry."""
    for ref in ActorRegistry.get_all():
        inbox = ref.actor_inbox
        if isinstance(inbox, LoopInbox) and inbox._loop.is_closed():
            ActorRegistry.unregister(ref)
            continue
        ref.stop(block=False)
