"""The simulated disk: the real storage code on real files, with durability decided here.

The broker's logs live on a temporary directory and are written by the real storage code
(page cache, `pwrite`). What the disk would keep after a power cut is modelled per file:
each `fsync`/`fdatasync` that succeeds makes the file durable up to its size at that moment
(keyed by inode, so a rename after the fsync keeps it). A crash of a shard cuts every file the
shard owns back to its durable length (a file never synced to nothing), then the shard's
actors start again from these files through the real recovery path. Renames and new
directory entries count as durable at once: the model loses unsynced bytes, not names.

    append 100 B, fdatasync      -> durable 100
    append 50 B                  -> file 150 B, durable 100
    crash                        -> file cut to 100 B; recovery scans it

`os.fsync` and `os.fdatasync` are replaced while a simulation runs (`installed()`); the
storage package has no seam of its own for them. Each blocking job of a shard runs through
that shard's `SimIoPool`, which says whose sync it is, so a fault can fail or slow down one
shard's fdatasyncs: a failed one raises `OSError(EIO)` inside the real flush, which hands it
to the partition's real failure path, and makes nothing durable. A lying disk (the
`fsync_lies` fault, a volatile write cache) reports success and keeps nothing either: what a
checker must then catch.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["SimDisk", "SimIoPool"]

Done = Callable[[Any, BaseException | None], None]


class SimDisk:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._durable: dict[tuple[int, int], int] = {}  # (device, inode) -> bytes
        self._fail_next: dict[int, int] = collections.defaultdict(int)  # shard -> count
        self.fail_rate = 0.0  # of each fdatasync, drawn by the pool's random stream
        self.syncing_shard: int | None = None  # whose job is running (SimIoPool)
        self.job_fails = False  # the running job's fdatasyncs fail (a seeded fault)
        self.job_lies = False  # the running job's syncs succeed and keep nothing (a fault)
        self.frozen = False  # a crash is under way: nothing becomes durable
        self.fdatasyncs = 0
        self.failed_fdatasyncs = 0
        self._real: tuple[Callable[[int], None], Callable[[int], None]] | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[SimDisk]:
        """Route `os.fsync` and `os.fdatasync` here for the duration."""
        assert self._real is None, "the simulated disk is installed already"
        self._real = (os.fsync, os.fdatasync)
        os.fsync, os.fdatasync = self._fsync, self._fdatasync  # type: ignore[assignment]
        try:
            yield self
        finally:
            os.fsync, os.fdatasync = self._real
            self._real = None

    def fail_next(self, shard: int, count: int) -> None:
        """The next `count` fdatasyncs of `shard` fail with EIO."""
        self._fail_next[shard] += count

    def clear_failures(self) -> None:
        self._fail_next.clear()

    def _fdatasync(self, fd: int) -> None:
        shard = self.syncing_shard
        self.fdatasyncs += 1
        if shard is not None and (self.job_fails or self._fail_next[shard] > 0):
            if not self.job_fails:
                self._fail_next[shard] -= 1
            self.failed_fdatasyncs += 1
            raise OSError(errno.EIO, "simulated fdatasync failure")
        self._sync(fd)

    def _fsync(self, fd: int) -> None:
        self._sync(fd)

    def _sync(self, fd: int) -> None:
        st = os.fstat(fd)
        if self.frozen or self.job_lies or not stat.S_ISREG(st.st_mode):
            return  # directories: names are durable at once
        self._durable[(st.st_dev, st.st_ino)] = st.st_size

    def crash(self, owned: Callable[[Path], bool]) -> int:
        """Cut every file under the root that `owned(path)` says the crashed shard owns back
        to its durable length; the bytes lost."""
        lost = 0
        for directory, _dirs, files in os.walk(self.root):
            for name in sorted(files):
                path = Path(directory) / name
                if not owned(path):
                    continue
                st = path.stat()
                keep = self._durable.get((st.st_dev, st.st_ino), 0)
                if st.st_size > keep:
                    os.truncate(path, keep)
                    lost += st.st_size - keep
        return lost


class SimIoPool:
    """One shard's I/O pool: jobs run one at a time in submission order, each taking a
    simulated latency drawn from `latency_s()`; `fn` runs (and its sync takes effect) when the
    job completes, then `done` is called, all on the loop thread."""

    def __init__(
        self,
        loop: Any,
        disk: SimDisk,
        shard: int,
        latency_s: Callable[[], float],
        fail: Callable[[], bool],
        lie: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._disk = disk
        self._shard = shard
        self._latency_s = latency_s
        self._fail = fail
        self._lie = lie
        self._busy_until = 0.0
        self._jobs: dict[int, tuple[Callable[[], Any], Done]] = {}
        self._next_job = 0
        self.dead = False

    @property
    def outstanding(self) -> int:
        return len(self._jobs)

    def run(self, fn: Callable[[], Any], done: Done) -> None:
        if self.dead:
            return  # a crashed shard's late submissions go nowhere
        start = max(self._loop.time(), self._busy_until)
        self._busy_until = start + self._latency_s()
        job = self._next_job
        self._next_job += 1
        self._jobs[job] = (fn, done)
        self._loop.call_at(self._busy_until, self._complete, job)

    def _complete(self, job: int) -> None:
        entry = self._jobs.pop(job, None)
        if entry is None or self.dead:
            return
        fn, done = entry
        disk = self._disk
        disk.job_fails, disk.job_lies = self._fail(), self._lie()
        disk.syncing_shard = self._shard
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn()
        except Exception as e:  # handed to the caller, as the real pool does
            error = e
        finally:
            disk.syncing_shard, disk.job_fails, disk.job_lies = None, False, False
        done(result, error)

    def abandon(self) -> None:
        """The shard crashed: its jobs never complete, and never call back."""
        self.dead = True
        self._jobs.clear()


def run_now(loop: Any, fn: Callable[[], Any], done: Done) -> None:
    """A job with no simulated latency (reads, cleaning): run on the next loop turn."""

    def job() -> None:
        try:
            result = fn()
        except Exception as e:
            done(None, e)
            return
        done(result, None)

    loop.call_soon(job)
