"""The nodes of bench/cluster.py's cases: a cluster of `krill start` processes on this host,
what each node says of its replicas, and its topics.

Each node is `krill start --node-id I --seeds 1@127.0.0.1:R1,2@...,3@... --smp 1
--default-replicas 3` on free 127.0.0.1 ports, in its own process group (kill -9 of the
group takes the supervisor and its shard at once, as a power cut would), with its data
directory kept across stops so it can start again as the same node. A shard pins itself to
its supervisor's first allowed core, so each node is started on one core of its own
(`node_cores`: round-robin over the cores the bench may use) rather than all on core 0.

A replica's state (role, leader, term, high watermark, log end, followers' matched offsets)
comes from the node's admin API, `GET /v1/partitions` (shards/admin.py); a node whose API
does not answer it is asked through its shards' stats sockets, which the admin API reads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from bench.broker import (
    free_port,
    krill_executable,
    log,
    tree_cpu_seconds,
    tree_rss_mib,
)
from bench.report import CaseError
from scenarios.procs import process_tree

__all__ = [
    "Cluster", "ClusterNode", "catch_up_state", "create_topic", "delete_topic", "dir_bytes",
    "leaders_by_node", "node_processes", "replicas", "wait_caught_up",
]  # fmt: skip

NODES = 3
NODE_START_TIMEOUT_S = 60.0  # interpreter start, log recovery, the controller's election
NODE_STOP_TIMEOUT_S = 20.0  # SIGTERM to exit (the supervisor waits on its shards)
CLUSTER_READY_TIMEOUT_S = 60.0  # every node ready and Metadata listing every broker
TOPIC_READY_TIMEOUT_S = 120.0  # every partition led (1,000 groups electing on 2 cores)
POLL_S = 0.02  # how often the failover and catch-up watchers look
ADMIN_TIMEOUT_S = 5.0
# Starts of a cluster whose node found a port taken between picking it free and binding it
# (another process on the host, a test beside it): each try picks new ports.
PORT_TAKEN = "already in use"
START_ATTEMPTS = 3


# --------------------------------------------------------------------------- one node


class ClusterNode:
    """One `krill start` of a cluster: its own process group (kill -9 takes the supervisor
    and its shard at once), fixed ports and data directory, so it can be stopped and
    started again as the same node. `core`: the CPU the node (and so its shard) runs on."""

    def __init__(
        self, node_id: int, seeds: str, rpc_port: int, root: str, krill: str,
        core: int | None, extra: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.seeds = seeds
        self.rpc_port = rpc_port
        self.port, self.admin_port, self.reader_port = free_port(), free_port(), free_port()
        self.data_dir = os.path.join(root, f"n{node_id}")
        self.log_path = os.path.join(root, f"n{node_id}.log")
        self.krill = krill
        self.core = core
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # perf_counter of the last start()
        self.exits: list[int | None] = []
        self.admin_partitions = True  # GET /v1/partitions answers; else the stats sockets
        self.snapshot_seconds: list[float] = []  # what each stats snapshot cost the shard

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            self.krill, "start", "--node-id", str(self.node_id), "--seeds", self.seeds,
            "--rpc-port", str(self.rpc_port), "--listen", self.bootstrap,
            "--admin-port", str(self.admin_port),
            "--reader-listen", f"127.0.0.1:{self.reader_port}",
            "--data-dir", self.data_dir, "--smp", "1", "--default-replicas", str(NODES),
            *self.extra,
        ]  # fmt: skip

    def start(self) -> None:
        assert not self.alive(), f"node {self.node_id} already runs"
        core = self.core

        def place() -> None:
            if core is not None:
                os.sched_setaffinity(0, {core})

        with open(self.log_path, "ab") as out:
            self.started_at = time.perf_counter()
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=place,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        try:
            return admin_get(self, "/v1/status/ready", 3.0)[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = NODE_START_TIMEOUT_S) -> float:
        """Seconds from start() until the admin API answers ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise CaseError(f"node {self.node_id} exited at start: {self.log_tail(3)}")
            if self.ready():
                return time.perf_counter() - self.started_at
            time.sleep(0.05)
        raise CaseError(f"node {self.node_id} not ready in {timeout:g}s: {self.log_tail(3)}")

    def kill9(self) -> None:
        """SIGKILL to the node's process group: supervisor and shard die at once."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.exits.append(self.proc.wait(timeout=10))

    def sigterm(self) -> None:
        """A clean stop: SIGTERM to the supervisor, returns at once (see `wait_exit`)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = NODE_STOP_TIMEOUT_S) -> None:
        assert self.proc is not None
        try:
            self.exits.append(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            log(f"node {self.node_id} did not stop within {timeout:g}s of SIGTERM: SIGKILL")
            self.kill9()

    def stop(self) -> None:
        """Whatever state it is in: SIGTERM, SIGKILL after the timeout, then the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.sigterm()
            self.wait_exit()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # a shard left behind

    def cpu_seconds(self) -> float:
        """CPU of the node's process tree (supervisor, shard), every thread."""
        return tree_cpu_seconds(self.pid) if self.alive() else 0.0

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.splitlines()[-lines:])

    def first_log_error(self) -> str | None:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read(4 << 20).decode("utf-8", "replace")
        except OSError:
            return None
        for line in text.splitlines():
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                return line.strip()[:300]
        return None


def admin_get(node: ClusterNode, path: str, timeout: float = ADMIN_TIMEOUT_S) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{node.admin_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def replicas(node: ClusterNode) -> dict[tuple[str, int], dict[str, Any]]:
    """The node's replicas by (topic, partition): role, leader, term, high_watermark,
    log_end, followers. From `GET /v1/partitions`; a node whose admin API does not answer it
    (404, 500) is asked through its shards' stats sockets (`_replicas_from_stats`)."""
    if node.admin_partitions:
        status, body = admin_get(node, "/v1/partitions")
        if status == 200:
            return {(r["topic"], r["partition"]): r for r in json.loads(body)["partitions"]}
        log(f"node {node.node_id}: GET /v1/partitions answered {status}; "
            "reading the shards' stats sockets instead")
        node.admin_partitions = False  # not there (404), or failing (500)
    rows = _replicas_from_stats(node)
    return {(r["topic"], r["partition"]): r for r in rows}


def _replicas_from_stats(node: ClusterNode) -> list[dict[str, Any]]:
    """Each shard's snapshot's "raft" entries ([topic, partition, role, leader, term,
    high_watermark, log_end, followers]), read from the stats socket the admin API reads
    (its run dir is on the shard's command line)."""
    import msgpack
    import zmq

    rows: list[dict[str, Any]] = []
    context = zmq.Context.instance()
    for pid in process_tree(node.pid)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:
            continue
        if "--run-dir" not in argv or "--shard" not in argv:
            continue
        run_dir, shard = argv[argv.index("--run-dir") + 1], argv[argv.index("--shard") + 1]
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(f"ipc://{run_dir}/stats-{shard}")
            sock.send(msgpack.packb({"q": "snapshot"}))
            if not sock.poll(int(ADMIN_TIMEOUT_S * 1000)):
                raise CaseError(f"node {node.node_id} shard {shard}: no stats snapshot")
            snapshot = msgpack.unpackb(sock.recv(), strict_map_key=False)
            node.snapshot_seconds.append(snapshot.get("snapshot_seconds", 0.0))
        finally:
            sock.close(linger=0)
        for topic, part, role, leader, term, hwm, log_end, followers, *_ in snapshot.get(
                "raft", ()):  # then quiesced, isr, replicas, min.insync.replicas (shards/admin.py)
            rows.append({"topic": topic, "partition": part, "role": role, "leader": leader,
                         "term": term, "high_watermark": hwm, "log_end": log_end,
                         "followers": followers})  # fmt: skip
    return rows


# --------------------------------------------------------------------------- the cluster


def node_cores(nodes: int) -> list[int | None]:
    """Node i's core: round-robin over the cores this process may use (a shard pins itself
    to its supervisor's first core, so unplaced nodes would all share core 0)."""
    cores = sorted(os.sched_getaffinity(0))
    return [cores[i % len(cores)] for i in range(nodes)]


class Cluster:
    """`NODES` nodes, every one a seed, under one temp dir; a context manager that stops
    every node and removes the dir (unless `keep`)."""

    def __init__(self, args: argparse.Namespace, extra: tuple[str, ...] = ()) -> None:
        self.root = tempfile.mkdtemp(prefix="krill-bench-cluster-", dir=args.data_root)
        self.keep = args.keep
        self._exe = krill_executable(args.krill)
        self._extra = extra
        self.nodes = self._make_nodes()

    def _make_nodes(self) -> list[ClusterNode]:
        """The nodes, on ports picked free now."""
        rpc = [free_port() for _ in range(NODES)]
        # Shard k of a node uses rpc + k: with --smp 1 only the port itself.
        seeds = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(rpc))
        cores = node_cores(NODES)
        return [ClusterNode(i + 1, seeds, rpc[i], self.root, self._exe, cores[i], self._extra)
                for i in range(NODES)]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes if n.alive())

    def start(self) -> float:
        """Starts every node; seconds until all are ready and Metadata lists every broker
        and a controller. A node that found a port taken: all again, on new ports."""
        for attempt in range(START_ATTEMPTS):
            try:
                return self._start_once()
            except CaseError as e:
                if PORT_TAKEN not in str(e) or attempt == START_ATTEMPTS - 1:
                    raise
                log(f"a port was taken between picking and binding ({e}): again, new ports")
                for n in self.nodes:
                    n.stop()
                    shutil.rmtree(n.data_dir, ignore_errors=True)
                self.nodes = self._make_nodes()
        raise AssertionError("unreachable")

    def _start_once(self) -> float:
        t0 = time.perf_counter()
        log(f"starting {NODES} nodes: {' '.join(self.nodes[0].command())} ...")
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            n.wait_ready()
        wait_brokers(self.bootstrap, NODES, CLUSTER_READY_TIMEOUT_S)
        took = time.perf_counter() - t0
        log(f"cluster ready in {took:.1f}s: pids {[n.pid for n in self.nodes]}")
        return took

    def check(self) -> None:
        for n in self.nodes:
            if n.proc is not None and not n.alive() and n.proc.returncode not in (0, -9):
                # Only nodes the case itself stopped may be down; those exit 0 or -9.
                raise CaseError(f"node {n.node_id} died (exit {n.proc.returncode}): "
                                f"{n.log_tail(3)}")  # fmt: skip

    def live_check(self) -> Callable[[], None]:
        """A liveness check for a phase during which every node should run."""

        def check() -> None:
            for n in self.nodes:
                if not n.alive():
                    raise CaseError(f"node {n.node_id} died (exit {n.proc and n.proc.poll()}):"
                                    f" {n.log_tail(3)}")  # fmt: skip

        return check

    def cpu_seconds(self) -> float:
        return sum(n.cpu_seconds() for n in self.nodes)

    def rss_mib(self) -> float:
        return sum(tree_rss_mib(n.pid) for n in self.nodes if n.alive())

    def figures(self) -> dict[str, Any]:
        return {
            "nodes": [{"node_id": n.node_id, "core": n.core, "exits": n.exits,
                       "first_log_error": n.first_log_error()} for n in self.nodes],
        }  # fmt: skip

    def stop(self) -> None:
        for n in self.nodes:
            if n.alive():
                n.sigterm()
        for n in self.nodes:
            n.stop()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            log(f"kept {self.root}")

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # before stop() removes the logs
            for n in self.nodes:
                log(f"node {n.node_id} log ends: {n.log_tail(5)}")
        self.stop()


def wait_brokers(bootstrap: str, brokers: int, timeout: float) -> None:
    """Until Metadata (from any of `bootstrap`) lists `brokers` brokers and a controller."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=2)
            if len(md.brokers) >= brokers and md.controller_id >= 0:
                return
            last = f"{len(md.brokers)} brokers, controller {md.controller_id}"
        except Exception as e:  # KafkaException
            last = str(e)
        time.sleep(0.1)
    raise CaseError(f"cluster not formed after {timeout:g}s: {last}")


def create_topic(
    bootstrap: str, name: str, partitions: int, replicas: int,
    timeout: float = TOPIC_READY_TIMEOUT_S,
) -> float:  # fmt: skip
    """CreateTopics, then until Metadata shows every partition led; the seconds it took."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    t0 = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futs = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replicas)],
        request_timeout=30,
    )
    try:
        futs[name].result(timeout=60)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise CaseError(f"CreateTopics {name} x{partitions} RF={replicas}: {e}") from e
    except TimeoutError as e:
        raise CaseError(f"CreateTopics {name}: no answer in 60s") from e
    deadline = time.monotonic() + timeout
    last = "no metadata"
    while time.monotonic() < deadline:
        try:
            leaders = topic_leaders(admin, name)
        except CaseError as e:
            last = str(e)
        else:
            if len(leaders) == partitions and all(v >= 0 for v in leaders.values()):
                return time.perf_counter() - t0
            last = f"{sum(v >= 0 for v in leaders.values())}/{partitions} partitions led"
        time.sleep(0.1)
    raise CaseError(f"topic {name} not ready after {timeout:g}s: {last}")


def topic_leaders(admin: Any, topic: str, timeout: float = 2.0) -> dict[int, int]:
    """partition -> leader (-1: none) from one Metadata request."""
    try:
        md = admin.list_topics(topic=topic, timeout=timeout)
    except Exception as e:  # KafkaException
        raise CaseError(f"Metadata: {e}") from e
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise CaseError(f"Metadata for {topic}: {t.error if t else 'missing'}")
    return {p: (m.leader if m.error is None else -1) for p, m in t.partitions.items()}


def delete_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        admin.delete_topics([name], request_timeout=30)[name].result(timeout=60)
    except Exception as e:  # KafkaException, TimeoutError
        raise CaseError(f"DeleteTopics {name}: {e}") from e


# --------------------------------------------------------------------------- replica states


def leaders_by_node(cluster: Cluster, topic: str) -> dict[int, list[int]]:
    """node id -> the partitions of `topic` it leads, as the live nodes say."""
    out: dict[int, list[int]] = {}
    for nd in cluster.nodes:
        if not nd.alive():
            continue
        for (t, p), r in replicas(nd).items():
            if t == topic and r["role"] == "leader":
                out.setdefault(nd.node_id, []).append(p)
    return {k: sorted(v) for k, v in sorted(out.items())}


def catch_up_state(cluster: Cluster, topic: str, node: ClusterNode) -> tuple[int | None, int]:
    """(partitions of `topic` whose replica on `node` has a log end short of the leader's,
    the sum of its replicas' log ends). The first is None while some partition has no
    leader among the live nodes, or `node` does not answer yet."""
    leader_end: dict[int, int] = {}
    mine: dict[int, int] = {}
    for nd in cluster.nodes:
        if not nd.alive():
            continue
        try:
            states = replicas(nd)
        except (OSError, CaseError):  # a node still starting its admin side or shard
            if nd is node:
                return None, 0
            continue
        for (t, p), r in states.items():
            if t != topic:
                continue
            if r["role"] == "leader":
                leader_end[p] = r["log_end"]
            if nd is node:
                mine[p] = r["log_end"]
    if not leader_end or set(leader_end) != set(mine) or len(leader_end) < len(mine):
        return None, sum(mine.values())
    return sum(mine[p] < end for p, end in leader_end.items()), sum(mine.values())


def wait_caught_up(
    cluster: Cluster, topic: str, node: ClusterNode, timeout: float, log_end_before: int = -1
) -> dict[str, float | None]:
    """Polls every `POLL_S` from `node`'s start on until its replica of every partition of
    `topic` has the leader's log end. Seconds from the start: `ready_s` (admin ready),
    `first_progress_s` (the first poll that saw its log ends past `log_end_before`, their
    sum when it stopped), `caught_up_s`."""
    out: dict[str, float | None] = {"ready_s": None, "first_progress_s": None}
    deadline = time.monotonic() + timeout
    behind: int | None = None
    while time.monotonic() < deadline:
        cluster.check()
        now = time.perf_counter() - node.started_at
        if out["ready_s"] is None and node.ready():
            out["ready_s"] = now
        behind, log_end = catch_up_state(cluster, topic, node)
        if out["first_progress_s"] is None and log_end_before >= 0 and log_end > log_end_before:
            out["first_progress_s"] = now
        if behind == 0 and out["ready_s"] is not None:
            out["caught_up_s"] = time.perf_counter() - node.started_at
            return out
        time.sleep(POLL_S)
    raise CaseError(f"node {node.node_id} not caught up on {topic} after {timeout:g}s "
                    f"({behind} partitions behind)")  # fmt: skip


def dir_bytes(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(top, name)).st_size
    return total


# --------------------------------------------------------------------------- processes


def node_processes(nd: ClusterNode) -> dict[int, str]:
    labels = {}
    for pid in process_tree(nd.pid):
        if pid == nd.pid:
            labels[pid] = "supervisor"
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:
            continue
        shard = argv[argv.index("--shard") + 1] if "--shard" in argv else None
        labels[pid] = f"shard{shard}" if shard is not None else f"pid{pid}"
    return labels
