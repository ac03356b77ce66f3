"""Failure probes on the partition log's fdatasync: a slow disk and a failing one, on demand.

The admin API's `/v1/failure-probes` (shards/admin.py, after Redpanda's) sets them in every
shard process of a node started with `enable_failure_injection: true`; the scenario runner
uses them for its slow-disk and fdatasync-error faults. Every flush ticket syncs through
`fdatasync` below, so a probe takes the same path a real failure would: the delay is slept on
the I/O thread that runs the flush (never on a shard's loop), and the error is the `OSError`
(EIO) a failing device gives, which the partition handles as any other (actors/partition_flush.py).

The probes are process-wide, set on the loop thread and read by the I/O threads: each is one
attribute, replaced whole, so a thread sees the old value or the new one.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["PROBES", "PROBE_NAMES", "Probes", "clear_probe", "fdatasync", "set_probe"]


@dataclass(slots=True)
class Probes:
    fdatasync_error: bool = False  # every fdatasync fails with EIO, the device untouched
    fdatasync_delay_ms: int = 0  # every fdatasync takes this much longer

    def describe(self) -> dict[str, Any]:
        """The probes set, by their admin API names (`GET /v1/failure-probes`)."""
        probes: dict[str, Any] = {}
        if self.fdatasync_error:
            probes["storage/fdatasync/exception"] = {}
        if self.fdatasync_delay_ms:
            probes["storage/fdatasync/delay"] = {"ms": self.fdatasync_delay_ms}
        return probes

    def clear(self) -> None:
        self.fdatasync_error = False
        self.fdatasync_delay_ms = 0


PROBES = Probes()

# The probes by their admin API names: whether each takes a delay (`ms`).
PROBE_NAMES = {"storage/fdatasync/exception": False, "storage/fdatasync/delay": True}


def set_probe(name: str, ms: int = 0) -> None:
    """Set one probe (a name of PROBE_NAMES; `ms` for a delay)."""
    if name == "storage/fdatasync/exception":
        PROBES.fdatasync_error = True
    elif name == "storage/fdatasync/delay":
        if ms <= 0:
            raise ValueError(f"a delay of {ms} ms")
        PROBES.fdatasync_delay_ms = ms
    else:
        raise KeyError(name)


def clear_probe(name: str | None) -> None:
    """Clear one probe, or every one (None)."""
    if name is None:
        PROBES.clear()
    elif name == "storage/fdatasync/exception":
        PROBES.fdatasync_error = False
    elif name == "storage/fdatasync/delay":
        PROBES.fdatasync_delay_ms = 0
    else:
        raise KeyError(name)


def fdatasync(fd: int) -> None:
    """os.fdatasync, through the probes (on an I/O thread: it may sleep)."""
    delay_ms = PROBES.fdatasync_delay_ms
    if delay_ms:
        time.sleep(delay_ms / 1000)
    if PROBES.fdatasync_error:
        raise OSError(errno.EIO, "fdatasync failed (failure probe storage/fdatasync/exception)")
    os.fdatasync(fd)
