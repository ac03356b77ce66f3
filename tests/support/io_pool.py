"""What tests' stand-ins for the shard's I/O pools share: one pool call as a plain callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["pool_call"]


def pool_call(fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> Callable[[], None]:
    """`fn` run and its outcome handed to `done(result, error)`, as Services.run_blocking's
    pool does: a test runs it on its loop at once (call_soon), or holds it to release later."""

    def run() -> None:
        try:
            result, error = fn(), None
        except Exception as e:  # handed to `done`, as the I/O pool does
            result, error = None, e
        done(result, error)

    return run
