"""Fixtures shared by the storage tests: a factory for each log kind (a DiskLog in buffered
mode, one in direct mode with a small chunk pool, so that chunks are evicted and reused, served
so that what they no longer hold is read with O_DIRECT, and a MemoryLog)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import DiskLog, Log, LogConfig, MemoryLog
from storage.appender import ChunkPool

LogFactory = Callable[..., Log]


def small_pool() -> ChunkPool:
    """16 chunks of 8 KiB: a few appends fill it, so eviction and reuse are exercised."""
    return ChunkPool(8192, 16 * 8192)


@pytest.fixture(params=["disk", "direct", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """make_log(config) -> a fresh empty log of the parametrized kind, closed at teardown."""
    opened: list[Log] = []

    def factory(config: LogConfig = LogConfig()) -> Log:  # noqa: B008
        if request.param == "disk":
            log: Log = DiskLog.open(tmp_path / f"topic-{len(opened)}", config)
        elif request.param == "direct":  # served: old bytes read with O_DIRECT
            log = DiskLog.open(tmp_path / f"topic-{len(opened)}", config, small_pool())
            log.serve()
        else:
            log = MemoryLog(config)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()


@pytest.fixture(params=["buffered", "direct"])
def storage_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every DiskLog the test opens without chunks of its own is of the parametrized mode
    (direct: a small pool each)."""
    if request.param == "direct":
        opened = DiskLog.open.__func__  # type: ignore[attr-defined]

        def open_direct(cls, directory, config=LogConfig(), chunks=None):  # type: ignore[no-untyped-def]  # noqa: B008
            return opened(cls, directory, config, chunks or small_pool())

        monkeypatch.setattr(DiskLog, "open", classmethod(open_direct))
    return str(request.param)
