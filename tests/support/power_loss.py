"""Power loss on a stopped node's files: moved to scenarios/power_loss.py, which the scenario
runner's `power_loss` fault shares with the cluster tests; this name stays for them."""

from scenarios.power_loss import (
    cachestat_available,
    first_unsynced_position,
    lose_unsynced,
    unsynced_files,
)

__all__ = ["cachestat_available", "first_unsynced_position", "lose_unsynced", "unsynced_files"]
