"""A shard's process: `python -m shards.shard_process --shard N ...`, started by the supervisor.

It reads the node's configuration the supervisor hands it, sets up what only a process can
(logging, the kernel's SIGTERM when the supervisor dies, its core, its open-files limit),
and runs one `Shard` (shards/shard.py) until it stops; the shard's exit code is the process's.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import resource
import signal
import sys
import threading

from shards import limits
from shards.config import NodeConfig
from shards.shard import Shard

__all__ = ["main", "setup_logging"]

log = logging.getLogger("shards.shard")  # the name the shard's own lines have always had

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = (
        min(hard, limits.open_files_wanted)
        if hard != resource.RLIM_INFINITY
        else limits.open_files_wanted
    )
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def setup_logging(level: str, shard_id: int | None) -> None:
    who = "supervisor" if shard_id is None else f"shard{shard_id}"
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s {who} %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _die_with_supervisor(supervisor_pid: int) -> None:
    """Ask the kernel to SIGTERM this shard when the supervisor dies, even by SIGKILL.

    Without it a killed supervisor leaves shards serving the port and holding the logs.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != supervisor_pid:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shards.shard_process")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--core", type=int, required=True)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--supervisor-pid", type=int, default=os.getppid())
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--run-dir", default="")
    parser.add_argument("--arena-fds", default="", help="memfds of every shard's arena, in order")
    parser.add_argument("--listen-fd", type=int, help="the Kafka listening socket to accept on")
    parser.add_argument("--reader-fd", type=int, help="the Spark reader's listening socket")
    parser.add_argument("--rpc-fd", type=int, help="the node RPC socket (a cluster's node)")
    args = parser.parse_args(argv)
    config = NodeConfig.from_json(args.config_json)
    setup_logging(config.log_level, args.shard)
    _die_with_supervisor(args.supervisor_pid)
    os.sched_setaffinity(0, {args.core})
    _raise_open_files_limit()
    threading.current_thread().name = f"shard{args.shard}"
    try:
        arena_fds = [int(fd) for fd in args.arena_fds.split(",")] if args.arena_fds else None
        shard = Shard(
            config, args.shard, args.shards, args.run_dir, arena_fds, args.listen_fd,
            args.reader_fd, args.rpc_fd,
        )
        shard.run()
    except OSError as e:
        log.error("shard %d cannot serve: %s", args.shard, e)
        return 1
    return shard.exit_code


if __name__ == "__main__":
    sys.exit(main())
