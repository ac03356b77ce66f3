"""Fixtures shared by the actor tests."""

from __future__ import annotations

import pytest

from tests.support.replicated_partitions import Cluster


@pytest.fixture(params=["buffered", "direct"])
def storage_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every replicated-partition Cluster the test makes keeps its logs in this storage mode
    (direct: storage/appender.py, a small chunk pool per node)."""
    monkeypatch.setattr(Cluster, "storage_mode", request.param)
    return str(request.param)
