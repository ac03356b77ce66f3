from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh node with its own data directory, stopped (or killed) in teardown."""
    node = BrokerProcess(tmp_path / "data").start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One node for a whole module of tests that only add topics of their own."""
    node = BrokerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()
