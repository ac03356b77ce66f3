"""A bench case's JSON line: what every case's result carries, and how it is compared.

`header` opens a case's result (the revision, the machine, its load), `finish` closes it, and
`case_failed` records an error in it; `vs_ceiling` and `compare` set figures beside the
ceilings measured in the same run (bench/ceilings.py). Every case module builds its line with
these, so the lines read alike (bench/README.md names every field).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.broker import (
    Broker,
    log,
)


class CaseError(RuntimeError):
    pass


# --------------------------------------------------------------------------- environment


def git_rev() -> tuple[str, bool | None]:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if rev.returncode != 0:
            return "uncommitted", None
        st = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return rev.stdout.strip(), bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "uncommitted", None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def finish(res: dict[str, Any], t0: float) -> dict[str, Any]:
    """The fields every case's line ends with: load at the end, wall time, error (or None)."""
    res["loadavg_end"] = loadavg()
    res["wall_s"] = round(time.monotonic() - t0, 2)
    res.setdefault("error", None)
    return res


def header(case: str, args: argparse.Namespace) -> dict[str, Any]:
    import confluent_kafka

    rev, dirty = git_rev()
    return {
        "case": case,
        "git_rev": rev,
        "git_dirty": dirty,
        "smp": args.smp,
        "quick": args.quick,
        "loadavg": loadavg(),
        "cpu_count": os.cpu_count(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
    }


def case_failed(res: dict[str, Any], label: str, error: Exception, **brokers: Broker) -> None:
    """Record a case's failure in `res` and log it with each named broker's log tail."""
    res["error"] = f"{type(error).__name__}: {error}"
    log(f"{label} FAILED: {res['error']}")
    for name, broker in brokers.items():
        log(f"{name} log tail:\n{broker.log_tail(30)}")


# --------------------------------------------------------------------------- cases


def ratio(a: Any, b: Any, digits: int = 3) -> float | None:
    try:
        return round(float(a) / float(b), digits) if a is not None and b else None
    except (TypeError, ValueError):
        return None


def get_path(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def vs_ceiling(res: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    prod, cons, fixed = res.get("produce"), res.get("consume"), res.get("fixed_rate_20k")
    out: dict[str, Any] = {
        "ceilings_used": {
            "measured": c.get("measured"),
            "fdatasync_16k_mb_per_s": get_path(c, "fdatasync_16k", "mb_per_s"),
            "fdatasync_64k_mb_per_s": get_path(c, "fdatasync_64k", "mb_per_s"),
            "fdatasync_64k_appends_per_s": get_path(c, "fdatasync_64k", "appends_per_s"),
            "fdatasync_16k_p99_ms": get_path(c, "fdatasync_16k", "p99_ms"),
            "echo_64k_mb_per_s": get_path(c, "echo_64k", "mb_per_s"),
            "echo_1k_round_trips_per_s": get_path(c, "echo_1k", "round_trips_per_s"),
        }
    }
    u = out["ceilings_used"]
    out["produce_mb_per_s_over_fdatasync_16k"] = ratio(
        get_path(prod, "mb_per_s"), u["fdatasync_16k_mb_per_s"]
    )
    out["produce_mb_per_s_over_fdatasync_64k"] = ratio(
        get_path(prod, "mb_per_s"), u["fdatasync_64k_mb_per_s"]
    )
    out["produce_requests_per_s_over_fdatasync_64k_appends_per_s"] = ratio(
        get_path(prod, "requests_per_s"), u["fdatasync_64k_appends_per_s"]
    )
    out["consume_mb_per_s_over_echo_64k"] = ratio(
        get_path(cons, "mb_per_s"), u["echo_64k_mb_per_s"]
    )
    out["fixed_rate_p99_over_fdatasync_16k_p99"] = ratio(
        get_path(fixed, "latency_ms", "p99"), u["fdatasync_16k_p99_ms"], 2
    )
    return out


def compare(value: Any, op: str, limit: float) -> bool | None:
    if value is None:
        return None
    return {"ge": value >= limit, "le": value <= limit, "lt": value < limit}[op]
