"""The free-space guard of one shard: produces refused before the data disk runs out.

As Redpanda's `storage_min_free_bytes`: below the threshold, writes are refused with
KAFKA_STORAGE_ERROR before anything is appended, so no segment is ever torn by a full disk,
and they are taken again as soon as there is room, with no restart. Reads go on.

The shard looks at the filesystem (statvfs, off its loop) every
`disk_space_check_interval_s`; between looks it counts what its partitions append, so a burst
cannot write past the threshold before the next look sees it. A look subtracts only what was
appended before it was taken: bytes appended while it ran may or may not be in its figure, and
counting them twice errs on the safe side.

    guard = FreeSpaceGuard(min_free_bytes=1 << 30)
    token = guard.look_started()            # loop: the statvfs goes to a pool
    guard.looked(free_bytes(path), token)   # loop, when it returns: 3 GiB free
    guard.admits(1 << 20)                   # True: 3 GiB - 1 MiB >= 1 GiB
    guard.appended(2 << 30)                 # a burst: 1 GiB - 1 MiB left, under the line
    guard.admits(1)                         # False until a look sees room again

`min_free_bytes` 0 turns the guard off: writes go until the disk itself refuses (ENOSPC,
which the log survives, storage/log.py). Nothing here blocks; `free_bytes` is the blocking
call, for a pool thread.
"""

from __future__ import annotations

import logging
import os

__all__ = ["FreeSpaceGuard", "free_bytes"]

log = logging.getLogger("krill.storage")


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class FreeSpaceGuard:
    def __init__(self, min_free_bytes: int) -> None:
        assert min_free_bytes >= 0, min_free_bytes
        self.min_free_bytes = min_free_bytes
        self._looked_bytes: int | None = None  # free bytes the last look found
        self._appended_at_look = 0  # `_appended_total` when that look was taken
        self._appended_total = 0  # bytes appended by this shard since it started
        self.alert = False  # free space is under the threshold: produces are refused

    @property
    def free_bytes(self) -> int | None:
        """What is free now, as far as this shard knows (None before the first look)."""
        if self._looked_bytes is None:
            return None
        return self._looked_bytes - (self._appended_total - self._appended_at_look)

    def admits(self, nbytes: int) -> bool:
        """Whether `nbytes` may be appended and leave the threshold free."""
        free = self.free_bytes
        return not self.min_free_bytes or free is None or free - nbytes >= self.min_free_bytes

    def appended(self, nbytes: int) -> None:
        self._appended_total += nbytes
        self._update()

    def look_started(self) -> int:
        """A look is about to be taken: the token to hand back to `looked`."""
        return self._appended_total

    def looked(self, free_bytes: int, token: int) -> None:
        self._looked_bytes = free_bytes
        self._appended_at_look = token
        self._update()

    def write_failed(self) -> None:
        """A write met a full disk (ENOSPC): nothing is free until the next look says so."""
        self.looked(0, self._appended_total)

    def _update(self) -> None:
        free = self.free_bytes
        alert = bool(self.min_free_bytes) and free is not None and free < self.min_free_bytes
        if alert == self.alert:
            return
        self.alert = alert
        if alert:
            log.warning("free space on the data disk (%d bytes) is under storage_min_free_bytes "
                        "(%d): produces are refused with KAFKA_STORAGE_ERROR until there is "
                        "room", free, self.min_free_bytes)
        else:
            log.warning("free space on the data disk (%d bytes) is back over "
                        "storage_min_free_bytes (%d): produces are taken again", free,
                        self.min_free_bytes)
