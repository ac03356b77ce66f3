"""The `argparse.Namespace` bench/run.py hands a case, at the tiny sizes the tests run it."""

from __future__ import annotations

import argparse
from pathlib import Path


def case_args(tmp_path: Path, **more: object) -> argparse.Namespace:
    base = {
        "quick": True, "smp": 1, "krill": None, "data_root": str(tmp_path), "keep": False,
        "phase_timeout": 60.0, "stall_timeout": 30.0, "rounds": 0, "messages": 0,
        "fixed_seconds": 0.0,
    }  # fmt: skip
    base.update(more)
    return argparse.Namespace(**base)
