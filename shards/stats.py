"""The shard's stats endpoint: what the supervisor reads to serve /metrics and health checks.

Each shard binds a ZeroMQ ROUTER at `ipc://<run_dir>/stats-<shard>`, served on its loop
(shards/loop_router.py). The supervisor's admin HTTP server (shards/admin.py) sends it one
msgpack request per scrape, `{"q": "snapshot"}`, and gets one msgpack map back: the shard's
metrics (actors/metrics.py), the partitions it owns with their published watermarks, and the
gauges of everything that could grow (memory budget, long-poll watches, cross-shard calls,
arena regions). The snapshot is built on the loop thread between two messages, so it reads
every actor's published state consistently, and costs the shard one turn per scrape.

The same socket takes the shard's commands, one map each way: `{"q": "probes", ...}` sets or
clears the failure probes of the admin API's /v1/failure-probes (shards/admin.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from shards import limits
from shards.loop_router import LoopRouter
from storage.probes import PROBES, clear_probe, set_probe

__all__ = ["StatsEndpoint", "failure_probes", "stats_path"]

log = logging.getLogger(__name__)


def stats_path(run_dir: str, shard_id: int) -> str:
    path = os.path.join(run_dir, f"stats-{shard_id}")
    assert len(path) < limits.pipe_path_chars_max, f"stats socket path too long: {path}"
    return path


class StatsEndpoint:
    """Answers snapshot requests with `snapshot()`, a msgpack-able map. Loop thread only."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: zmq.Context[Any],
        run_dir: str,
        shard_id: int,
        snapshot: Callable[[], dict[str, Any]],
        commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._commands = commands or {}
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, limits.stats_request_bytes_max)
        socket.setsockopt(zmq.SNDHWM, limits.stats_high_water_mark_messages)
        socket.setsockopt(zmq.RCVHWM, limits.stats_high_water_mark_messages)
        socket.bind("ipc://" + stats_path(run_dir, shard_id))
        self._router = LoopRouter(
            loop, socket, self._handle, limits.stats_requests_per_turn_max, "stats"
        )

    def close(self) -> None:
        self._router.close()

    def _handle(self, identity: bytes, frames: list[Any]) -> None:
        try:
            request = msgpack.unpackb(frames[0].buffer) if len(frames) == 1 else None
        except Exception:  # only the supervisor talks here: a bad request is its bug
            request = None
        query = request.get("q") if isinstance(request, dict) else None
        if query == "snapshot":
            started = time.monotonic()
            answer = self._snapshot()
            answer["snapshot_seconds"] = time.monotonic() - started
        elif isinstance(request, dict) and query in self._commands:
            answer = self._commands[query](request)
        else:
            log.error("stats: bad request of %d frames dropped", len(frames))
            return
        self._router.send(identity, [msgpack.packb(answer, use_bin_type=True)])


def failure_probes(enabled: bool, shard_id: int, request: dict[str, Any]) -> dict[str, Any]:
    """The admin API's /v1/failure-probes, on this shard (shards/stats.py): set or clear
    a probe (storage/probes.py), then say which are set. `enabled`: the node's
    `enable_failure_injection`."""
    if not enabled:
        return {"error": "failure injection is off (enable_failure_injection: false)"}
    op, name = request.get("op"), request.get("probe")
    try:
        if op == "set":
            set_probe(str(name), int(request.get("ms", 0)))
            log.warning("shard %d: failure probe %s set %s", shard_id, name,
                        request.get("ms", ""))
        elif op == "clear":
            clear_probe(None if name is None else str(name))
            log.warning("shard %d: failure probe %s cleared", shard_id, name or "(all)")
        elif op != "list":
            return {"error": f"unknown probe operation {op!r}"}
    except (KeyError, ValueError, TypeError):
        return {"error": f"bad probe request {request!r}"}
    return {"probes": PROBES.describe()}
