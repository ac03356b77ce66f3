"""What every peer's processes share: each runs in its own process group, is stopped with
SIGTERM (its clean shutdown) and then SIGKILL to whatever of its group is left, and is a
context manager that stops it whatever happened, even a failed start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Self

__all__ = ["Started", "stop_group", "wait_listening"]

_LISTEN_POLL_S = 0.05


def wait_listening(port: int, deadline: float, check: Callable[[], None]) -> bool:
    """Until 127.0.0.1:`port` accepts a connection (True) or `deadline` (monotonic) passes
    (False); `check()` raises if the process died meanwhile."""
    while True:
        check()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(_LISTEN_POLL_S)


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to `proc`'s group, `timeout` s for it to exit, SIGKILL to what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything left of its group
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class Started:
    """`with Peer(...) as peer:` starts it and stops it on the way out."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
