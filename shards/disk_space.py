"""The shard's looks at its data disk's free space, for its free-space guard.

Every `disk_space_check_interval_s` the shard's read pool runs a statvfs of the data
directory (off the loop: a filesystem that hangs holds a pool thread, never the shard) and
hands the figure to the guard (storage/free_space.py), which its partitions ask before they
append. One look is out at a time; a look that fails keeps the last figure and is logged once.
The first look is taken inline at start-up, before the shard serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shards import limits
from storage.free_space import FreeSpaceGuard, free_bytes

__all__ = ["DiskSpaceWatch"]

log = logging.getLogger(__name__)

RunOffLoop = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]


class DiskSpaceWatch:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, guard: FreeSpaceGuard, data_dir: str,
        run_off_loop: RunOffLoop,
    ) -> None:
        self._loop = loop
        self.guard = guard
        self._data_dir = data_dir
        self._run_off_loop = run_off_loop
        self._timer: asyncio.TimerHandle | None = None
        self._failing = False  # the last look failed (logged once per run of failures)
        self._closed = False

    def start(self) -> None:
        self.guard.looked(free_bytes(self._data_dir), self.guard.look_started())
        self._schedule()

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        if not self._closed:
            self._timer = self._loop.call_later(limits.disk_space_check_interval_s, self._look)

    def _look(self) -> None:
        self._timer = None
        token = self.guard.look_started()
        data_dir = self._data_dir

        def done(free: Any, error: BaseException | None) -> None:
            if error is None:
                self.guard.looked(free, token)
                self._failing = False
            elif not self._failing:
                self._failing = True
                log.warning("cannot read the free space of %s: %r", data_dir, error)
            self._schedule()

        self._run_off_loop(lambda: free_bytes(data_dir), done)
