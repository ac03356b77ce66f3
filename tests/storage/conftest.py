"""Fixtures shared by the storage tests: a factory for either log kind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import DiskLog, Log, LogConfig, MemoryLog

LogFactory = Callable[..., Log]


@pytest.fixture(params=["disk", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """make_log(config) -> a fresh empty log of the parametrized kind, closed at teardown."""
    opened: list[Log] = []

    def factory(config: LogConfig = LogConfig()) -> Log:  # noqa: B008
        if request.param == "disk":
            log: Log = DiskLog.open(tmp_path / f"topic-{len(opened)}", config)
        else:
            log = MemoryLog(config)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()
