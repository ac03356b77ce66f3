"""The simulated mode of scenarios: real actors on a simulated clock, disk and pipes.

`run(spec, seed)` runs a scenario document whose cluster says `mode: simulated` in this one
process, on one virtual-time loop (scenarios/sim/engine.py): the same seed gives the same
run, byte for byte, and the result's `digest` says so. The step and fault keys a simulated
scenario may use are in scenarios/sim/schema.py and README-section.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scenarios.sim.engine import SimResult, Simulation

__all__ = ["SimResult", "run"]


def run(
    spec: dict[str, Any], seed: int, progress: Callable[[dict[str, Any]], None] | None = None
) -> SimResult:
    """Run the simulated scenario `spec` (parsed YAML) with `seed`."""
    return Simulation(spec, seed, progress).run()
