"""Every script in tests/raft/testdata/ (see tests/raft/scripts.py for the format and the
rewrite mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.raft.scripts import check_script

TESTDATA = Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(path: Path) -> None:
    check_script(path)
