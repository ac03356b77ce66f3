from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

# `make test` runs two workers a file at a time (--dist loadfile): the files that take minutes
# (whole clusters, Spark, the benches) go first and the unit tests' quick files last, so that
# neither worker ends on a long file while the other idles (20 min 11 s in collection order).
_SLOW_FIRST = ("scenarios", "bench", "spark", "jvm", "kafka_tools", "integration", "cli",
               "shards")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        parts = item.path.relative_to(Path(__file__).parent).parts
        top = parts[0] if len(parts) > 1 else ""
        return _SLOW_FIRST.index(top) if top in _SLOW_FIRST else len(_SLOW_FIRST)

    items.sort(key=rank)  # stable: a file's tests stay together and in order


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
