"""The node supervisor: starts one shard process per core, watches them, stops them.

`krill start` lands here. The supervisor takes the data directory's lock (two nodes on one
directory would corrupt it), starts the shard processes, and then only waits:

- SIGTERM/SIGINT: forward SIGTERM to every shard, wait for each to flush and exit (killing
  any that outlive `shard_stop_timeout_s`), exit 0.
- A shard exits on its own: log which one and how, stop the others cleanly, exit 1. Like
  Seastar, the node fails fast rather than run with a core missing; nothing acknowledged was
  lost (acks are answered only after fdatasync) and a restart recovers the logs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from actors.controller import load_cluster_id
from shards import limits
from shards.arena import create_arena_fds
from shards.config import NodeConfig
from shards.shard import setup_logging

__all__ = ["run"]

log = logging.getLogger("krill.supervisor")


def run(config: NodeConfig) -> int:
    setup_logging(config.log_level, None)
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_data_dir(data_dir)
    if lock is None:
        print(f"krill: error: data directory {data_dir} is in use by another node", file=sys.stderr)
        return 1
    shards = config.smp
    cores = sorted(os.sched_getaffinity(0))
    load_cluster_id(data_dir)  # made once, before any shard reads it
    # The pipes' ipc:// sockets live here; a short path (sun_path holds 107 bytes).
    run_dir = tempfile.mkdtemp(prefix="krill-")
    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    # One shared-memory arena per shard for cross-core produce batches; every shard maps all.
    arena_fds: list[int] = []
    if shards > 1 and config.pipe_arena_bytes:
        try:
            arena_fds = create_arena_fds(shards, config.pipe_arena_bytes)
        except OSError as e:  # no memfd here: batches cross as pipe frames, slower but whole
            log.warning("no shared-memory arenas (%s); forwarded batches go as pipe frames", e)
    children = []
    try:
        for shard_id in range(shards):
            core = cores[shard_id % len(cores)]
            log.info("shard %d owns core %d", shard_id, core)
            children.append(_start_shard(config, shard_id, shards, core, run_dir, arena_fds))
    finally:
        for fd in arena_fds:
            os.close(fd)  # the shards hold their own copies
    host, port = config.listen
    log.info("node %d listening on %s:%d with %d shard(s)", config.node_id, host, port, shards)
    try:
        return _watch(children, lambda: stopping)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        lock.close()


def _start_shard(
    config: NodeConfig, shard_id: int, shards: int, core: int, run_dir: str, arena_fds: list[int]
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "shards.shard",
        "--shard",
        str(shard_id),
        "--core",
        str(core),
        "--config-json",
        config.to_json(),
        "--supervisor-pid",
        str(os.getpid()),
        "--shards",
        str(shards),
        "--run-dir",
        run_dir,
    ]
    if arena_fds:
        command += ["--arena-fds", ",".join(map(str, arena_fds))]
    # The shard ignores the terminal's SIGINT: the supervisor decides when it stops.
    return subprocess.Popen(command, preexec_fn=_ignore_sigint, pass_fds=arena_fds)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch(children: list[subprocess.Popen[bytes]], stopping: object) -> int:
    assert callable(stopping)
    while True:
        if stopping():
            log.info("stopping node")
            _stop_all(children)
            return 0
        for shard_id, child in enumerate(children):
            code = child.poll()
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                log.error("shard %d (pid %d) %s; stopping the node", shard_id, child.pid, how)
                _stop_all(children)
                return 1
        time.sleep(0.05)


def _stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + limits.shard_stop_timeout_s
    for shard_id, child in enumerate(children):
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("shard %d did not stop in time; killing it", shard_id)
            child.kill()
            child.wait()


def _lock_data_dir(data_dir: Path) -> IO[bytes] | None:
    handle = open(data_dir / ".lock", "wb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
