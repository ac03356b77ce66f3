"""What every peer's processes share: each runs in its own process group, is stopped with
SIGTERM (its clean shutdown) and then SIGKILL to whatever of its group is left, and is a
context manager that stops it whatever happened, even a failed start."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Self

__all__ = ["Started", "stop_group"]


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
