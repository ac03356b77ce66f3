"""The node supervisor: starts one shard process per core, watches them, stops them.

`krill start` lands here. The supervisor takes the data directory's lock (two nodes on one
directory would corrupt it) and every port of the node (shards/ports.py): a node whose Kafka,
reader, admin or (in a cluster) node RPC address is taken by anything refuses to start, exit
code 1, one line naming the address. It removes what a crash left of deleted topics, starts
the shard processes, each with its listening sockets, serves the admin HTTP endpoint
(shards/admin.py) on a thread of its own, and then only waits:

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
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, NamedTuple

from actors.controller import load_cluster_id
from shards import limits, tune
from shards.admin import AdminServer, Node
from shards.arena import create_arena_fds
from shards.config import NodeConfig
from shards.ports import PortTaken, kafka_listeners, listen_socket, node_rpc_listeners
from shards.shard_process import setup_logging
from storage.appender import direct_io_supported
from storage.partition_dir import TRASH_SUFFIX

__all__ = ["run"]

log = logging.getLogger("krill.supervisor")


def run(config: NodeConfig) -> int:
    setup_logging(config.log_level, None)
    data_dir = Path(config.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if config.storage_mode == "direct":
        refused = direct_io_supported(str(data_dir))
        if refused is not None:
            print(f"krill: error: storage_mode direct: {refused}; use storage_mode buffered",
                  file=sys.stderr)
            return 1
    lock = _lock_data_dir(data_dir)
    if lock is None:
        print(f"krill: error: data directory {data_dir} is in use by another node", file=sys.stderr)
        return 1
    try:
        listeners, reader, admin_socket, rpc = _take_ports(config)
    except PortTaken as e:
        print(f"krill: error: {e}", file=sys.stderr)
        lock.close()
        return 1
    _remove_trash(data_dir)
    tune.log_off_settings(data_dir, config.storage_mode)  # once each (`krill tune`)
    shards = config.smp
    cores = sorted(os.sched_getaffinity(0))
    load_cluster_id(data_dir)  # made once, before any shard reads it
    # The pipes' and stats' ipc:// sockets live here; a short path (sun_path holds 107 bytes).
    run_dir = tempfile.mkdtemp(prefix="krill-")
    wake = threading.Event()  # a signal came: look at the children, or stop
    stopping = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stopping.set()
        wake.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: wake.set())
    # One shared-memory arena per shard for cross-core produce batches; every shard maps all.
    arena_fds: list[int] = []
    if shards > 1 and config.pipe_arena_bytes:
        try:
            arena_fds = create_arena_fds(shards, config.pipe_arena_bytes)
        except OSError as e:  # no memfd here: batches cross as pipe frames, slower but whole
            log.warning("no shared-memory arenas (%s); forwarded batches go as pipe frames", e)
    children: list[subprocess.Popen[bytes]] = []
    try:
        for shard_id in range(shards):
            core = cores[shard_id % len(cores)]
            log.info("shard %d owns core %d", shard_id, core)
            sockets = _ShardSockets(
                listen=listeners[shard_id] if shard_id < len(listeners) else None,
                reader=reader if shard_id == 0 else None,
                rpc=rpc[shard_id] if rpc else None,
            )
            children.append(
                _start_shard(config, shard_id, shards, core, run_dir, arena_fds, sockets)
            )
    finally:
        for fd in arena_fds:
            os.close(fd)  # the shards hold their own copies
        for sock in [*listeners, reader, *rpc]:
            sock.close()  # likewise: each shard accepts on its own
    host, port = config.listen
    log.info("node %d listening on %s:%d with %d shard(s); admin on %s:%d", config.node_id,
             host, port, shards, *config.admin_listen)
    node = Node(
        node_id=config.node_id,
        data_dir=str(data_dir.resolve()),
        kafka_address=f"{config.advertise[0]}:{config.advertise[1]}",
        shards=shards,
        run_dir=run_dir,
        started=time.time(),
        metrics_enabled=not config.disable_metrics,
        shard_pids=lambda: [c.pid if _running(c.pid) else None for c in children],
        failure_injection=config.enable_failure_injection,
    )
    admin = AdminServer(admin_socket, node)
    admin.start()
    try:
        return _watch(children, wake, stopping)
    finally:
        admin.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        lock.close()


def _running(pid: int) -> bool:
    """Whether a child shard still runs, asked from another thread than the one that reaps
    it: waitid with WNOWAIT reaps nothing and takes no lock of Popen's (a second thread's
    Popen.poll() answers "running" while the first waits on that child)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # already reaped: gone
        return False


def _take_ports(
    config: NodeConfig,
) -> tuple[list[socket.socket], socket.socket, socket.socket, list[socket.socket]]:
    """Bind every address of the node (shards/ports.py), or raise PortTaken for the first
    that is taken, holding none: (Kafka listeners, reader, admin, node RPC per shard; no RPC
    sockets for a node of its own)."""
    accepting = config.kafka_shards or config.smp
    listeners = kafka_listeners(config.listen, accepting)
    taken: list[socket.socket] = list(listeners)
    try:
        reader = listen_socket("Spark reader", config.reader_listen)
        taken.append(reader)
        admin = listen_socket("admin", config.admin_listen)
        taken.append(admin)
        rpc = node_rpc_listeners(config.rpc_listen, config.smp) if config.seed_nodes else []
    except PortTaken:
        for sock in taken:
            sock.close()
        raise
    return listeners, reader, admin, rpc


def _remove_trash(data_dir: Path) -> None:
    """Directories of deleted partitions that a crash left behind (shards/shard_topics.py)."""
    for path in data_dir.glob(f"*{TRASH_SUFFIX}"):
        if path.is_dir():
            log.info("removing %s, left by a topic deletion", path.name)
            shutil.rmtree(path, ignore_errors=True)


class _ShardSockets(NamedTuple):
    """The listening sockets one shard is handed (None: not this shard's)."""

    listen: socket.socket | None  # Kafka, on shards that accept connections
    reader: socket.socket | None  # the Spark reader, shard 0's
    rpc: socket.socket | None  # node RPC on rpc_port + shard, in a cluster


def _start_shard(
    config: NodeConfig,
    shard_id: int,
    shards: int,
    core: int,
    run_dir: str,
    arena_fds: list[int],
    sockets: _ShardSockets,
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "shards.shard_process",
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
    fds = list(arena_fds)
    if arena_fds:
        command += ["--arena-fds", ",".join(map(str, arena_fds))]
    for flag, sock in (("--listen-fd", sockets.listen), ("--reader-fd", sockets.reader),
                       ("--rpc-fd", sockets.rpc)):
        if sock is not None:
            command += [flag, str(sock.fileno())]
            fds.append(sock.fileno())
    # The shard ignores the terminal's SIGINT: the supervisor decides when it stops.
    return subprocess.Popen(command, preexec_fn=_ignore_sigint, pass_fds=fds)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch(
    children: list[subprocess.Popen[bytes]], wake: threading.Event, stopping: threading.Event
) -> int:
    while True:
        wake.wait(limits.supervisor_poll_s)  # SIGCHLD or SIGTERM wake it at once
        wake.clear()
        if stopping.is_set():
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
