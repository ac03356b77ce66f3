"""A simulated-mode scenario (`cluster: {mode: simulated}`), reported as a real one is.

scenarios/sim/ runs the real actors in this process on a simulated clock, disk and pipes and
returns their clients' history; this module checks it with the same checker, adds the
steps' own expectations, and writes the same `report.json`, `history.jsonl` and
`timeline.png` (times on the simulated clock).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from scenarios.history import write_history
from scenarios.runner import judge
from scenarios.spec import Scenario

__all__ = ["run_simulated"]


def run_simulated(scenario: Scenario, out: Path, quiet: bool = False) -> dict[str, Any]:
    from scenarios import sim
    from scenarios.report import Progress, timeline_png, verdict_table

    out.mkdir(parents=True, exist_ok=True)
    # The actors log as a shard's do; here into the report directory, not over the table.
    handler = logging.FileHandler(out / "sim.log", mode="w")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers, root.level = [handler], logging.INFO
    progress = Progress(quiet=quiet)
    started = time.monotonic()
    total_s = scenario.workload.duration_s

    def show(state: dict[str, Any]) -> None:
        progress.update(state.get("elapsed_s", 0.0), total_s, state.get("msgs_per_s", 0.0),
                        state.get("p99_ms"), state.get("faults", 0))

    try:
        result = sim.run(scenario.document, scenario.seed, show)
    finally:
        progress.close()
        root.handlers, root.level = saved
        handler.close()
    write_history(out / "history.jsonl", result.ops)
    report = judge(scenario, result.ops, result.faults)
    failed_steps = [c for c in result.step_checks if not c["ok"]]
    if failed_steps:
        report["verdict"], report["valid"] = "FAIL", False
    report.update(scenario=scenario.name, file=str(scenario.path) if scenario.path else None,
                  mode="simulated", seed=result.seed, digest=result.digest,
                  step_checks=result.step_checks, sim=result.figures,
                  faults=[list(f) for f in result.faults],
                  duration_s=round(time.monotonic() - started, 2))
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    timeline_png(out / "timeline.png", result.ops, result.faults, 0)
    if not quiet:
        verdict_table(report)
    return report
