"""The nodes of a real-mode scenario: `krill start` processes the runner starts, signals and
stops, and, in a cluster, the link proxies between them.

Each node runs in its own process group (so kill -9 of the node takes the supervisor and
every shard at once, as a power cut would), on free 127.0.0.1 ports, with its settings in a
YAML file (`krill start --config`). A shard process is found as a child of the supervisor.

A node with `disk_size` keeps its data directory on a tmpfs of that size, mounted in a mount
namespace of its own (`unshare --mount`), so a full disk is a real ENOSPC and nothing of the
machine's own disk is filled. A holder process keeps the namespace (and the tmpfs) alive
across kills and restarts of the node; the node and the disk filler enter it with `nsenter`.
This needs the privilege to make a mount namespace (root, or unprivileged user namespaces);
without it a scenario that asks for `disk_size` stops with that reason.

A cluster (`Cluster`, more than one node) numbers its nodes from 1, as their seeds do. Node i
gets `shards` consecutive RPC ports (its shard k listens on rpc_port + k), found free below
the kernel's ephemeral range, so an outgoing connection never takes one while the node is
down between a kill and its restart. With link proxies, node i's seeds name, for every other
node j, the port of the i -> j proxy (scenarios/link_proxy.py) and its own real rpc_port, so
every byte of node RPC crosses a proxy the nemesis can cut or delay. The processes start
together and are waited for together: a node of a cluster may be ready only once its peers
are up. `leader_of` asks each node that is up (not killed or stopped) for a partition's
leader, alone (a client bootstrapped from it), and takes the answer most of them give.

A node knows whether the runner ended it (`kill`, `stop`): `exited_by_itself` answers the
exit code of a process that ended otherwise (a shard's abort stops its node), once, and
`log_evidence` the lines of its log that say why.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from scenarios import limits
from scenarios.link_proxy import LinkProxy, ProxyStats, ProxyThread, bind_consecutive
from scenarios.procs import process_tree

__all__ = ["Cluster", "ClusterError", "Node", "free_port", "free_ports"]

REPO = Path(__file__).resolve().parents[1]
FILLER = ".scenario-disk-filler"
# Log lines that say why a node died (shards/supervisor.py names a shard's exit or signal;
# libzmq's assertions and the interpreter's fatal errors go to stderr, which is the log).
_EVIDENCE = re.compile(r"Assertion failed|assert|killed by signal|exited with code|Fatal Python"
                       r"|Segmentation fault|Error\b|Exception\b|stopping the node|Traceback",
                       re.IGNORECASE)


class ClusterError(RuntimeError):
    """A node could not be started, reached or signalled: one line."""


def free_port() -> int:
    return free_ports(1)


# Ports a node binds again after a restart are drawn from here: below the kernel's ephemeral
# range (net.ipv4.ip_local_port_range, 32768 by default), where no outgoing connection and no
# `bind(0)` lands. Ports below 10000 are left to services.
STABLE_PORT_LOW = 10_000
PORT_TRIES_MAX = 200
# The ports this process handed out last, not handed out again (a node's three ports are
# picked before it binds any of them).
PORTS_REMEMBERED = 1024
_handed_out: dict[int, None] = {}


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports, outside the ephemeral range if it can."""
    high = _ephemeral_low()
    rng = random.Random()
    for _ in range(PORT_TRIES_MAX):
        base = rng.randrange(STABLE_PORT_LOW, max(STABLE_PORT_LOW + 1, high - count))
        if any(port in _handed_out for port in range(base, base + count)):
            continue
        held: list[socket.socket] = []
        try:
            for k in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", base + k))
            _remember(range(base, base + count))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    sockets = bind_consecutive(count)  # anywhere free, then
    base = int(sockets[0].getsockname()[1])
    for s in sockets:
        s.close()
    return base


def _remember(ports: range) -> None:
    for port in ports:
        _handed_out[port] = None
    while len(_handed_out) > PORTS_REMEMBERED:
        del _handed_out[next(iter(_handed_out))]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class Node:
    def __init__(self, node_id: int, out: Path, shards: int, settings: dict[str, Any],
                 disk_size: int | None = None) -> None:
        """Data in `out`/data/node-N (removed after the run unless kept); its log and
        settings beside the report."""
        self.node_id = node_id
        self.data_dir = out / "data" / f"node-{node_id}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = out / f"node-{node_id}.log"
        self.config_path = out / f"node-{node_id}.yaml"
        self.port, self.admin_port, self.reader_port = free_port(), free_port(), free_port()
        self.rpc_port: int | None = settings.get("rpc_port")  # shard 0's, in a cluster
        self.shards = shards
        self.config_path.write_text(yaml.safe_dump(settings or {}))
        self.disk_size = disk_size
        self.process: subprocess.Popen[bytes] | None = None
        self.holder: subprocess.Popen[bytes] | None = None
        self.stopped: set[int] = set()  # pids under SIGSTOP
        # The runner killed or stopped it: its exit is no finding. An exit by itself is
        # reported once (`exited_by_itself`).
        self.expected_exit = False
        self._exit_seen = False
        self.log_from = 0  # where the running process's lines start in its log
        if disk_size is not None:
            self._mount(disk_size)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _enter(self) -> list[str]:
        """The command prefix that runs inside the node's mount namespace (if it has one)."""
        if self.holder is None:
            return []
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--"]

    def _mount(self, size: int) -> None:
        if shutil.which("unshare") is None or shutil.which("nsenter") is None:
            raise ClusterError("disk_size needs unshare and nsenter (util-linux)")
        script = (f"mount -t tmpfs -o size={size} scenario-disk {self.data_dir} "
                  "&& echo mounted && exec sleep infinity")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != b"mounted":
            _, err = self.holder.communicate(timeout=5)
            self.holder = None
            raise ClusterError("disk_size needs a mount namespace of its own (root or "
                               f"unprivileged user namespaces): {err.decode().strip()[-200:]}")

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        log = open(self.log_path, "ab")
        self.log_from = log.tell()  # this process's lines start here
        self.process = subprocess.Popen(
            [*self._enter(), sys.executable, "-m", "shards.cli", "start",
             "--config", str(self.config_path), "--node-id", str(self.node_id),
             "--listen", self.bootstrap, "--data-dir", str(self.data_dir),
             "--smp", str(self.shards), "--reader-listen", f"127.0.0.1:{self.reader_port}",
             "--admin-listen", f"127.0.0.1:{self.admin_port}"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.stopped.clear()
        self.expected_exit = self._exit_seen = False  # after the new process is in place

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + limits.node_start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ClusterError(f"node {self.node_id} exited at start: {self.last_log_line()}")
            if self.ready():
                return
            time.sleep(0.05)
        raise ClusterError(f"node {self.node_id} not ready in {limits.node_start_timeout_s:g}s: "
                           f"{self.last_log_line()}")

    def ready(self) -> bool:
        try:
            return self.admin("GET", "/v1/status/ready", timeout_s=2.0)[0] == 200
        except OSError:
            return False

    def admin(self, method: str, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}",
                                         method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def last_log_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited_by_itself(self) -> int | None:
        """The exit code (negative: the signal) of a node process that ended though nothing
        of the runner's stopped or killed it; once per process, None otherwise."""
        process = self.process
        if process is None or self.expected_exit or self._exit_seen:
            return None
        code = process.poll()
        if code is None or self.expected_exit:
            return None
        self._exit_seen = True
        return code

    def log_evidence(self, lines_max: int = limits.exit_evidence_lines_max) -> list[str]:
        """The last lines the node's latest process wrote to its log that say why something
        died: an assertion, a signal, a shard's exit, an exception."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(self.log_from, f.tell() - limits.exit_evidence_bytes))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        found = [line.strip() for line in text.splitlines() if _EVIDENCE.search(line)]
        return found[-lines_max:]

    def up(self) -> bool:
        """Running and not stopped (a node with a stopped shard may not answer)."""
        return self.alive() and not self.stopped

    def pids(self, target: str) -> list[int]:
        """The processes a target names: the node's group leader (whose group is the node),
        or one shard process."""
        if self.process is None:
            raise ClusterError(f"node {self.node_id} is not running")
        if target == "node":
            return [self.process.pid]
        shard = int(target)
        for pid in self._children():
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--shard" in args and int(args[args.index(b"--shard") + 1]) == shard:
                return [pid]
        raise ClusterError(f"node {self.node_id} has no shard {shard} running")

    def _children(self) -> list[int]:
        assert self.process is not None
        # nsenter execs, so the supervisor is the group leader or its child
        return process_tree(self.process.pid)[1:]

    def kill(self, target: str) -> None:
        """kill -9: the whole node (its process group) or one shard process (after which the
        supervisor stops the node, as a crashed reactor stops Redpanda)."""
        self.expected_exit = True
        if target == "node":
            self._signal_group(signal.SIGKILL)
            self.wait_gone()
            return
        for pid in self.pids(target):
            os.kill(pid, signal.SIGKILL)

    def pause(self, target: str) -> None:
        if target == "node":
            self._signal_group(signal.SIGSTOP)
            self.stopped.add(-1)
            return
        for pid in self.pids(target):
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)

    def resume(self) -> None:
        if -1 in self.stopped:
            self._signal_group(signal.SIGCONT)
        for pid in self.stopped - {-1}:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped.clear()

    def _signal_group(self, sig: int) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout_s: float = limits.node_stop_timeout_s) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()

    def stop(self) -> None:
        """SIGTERM (after SIGCONT of anything stopped), then SIGKILL of the group."""
        if self.process is None:
            return
        self.expected_exit = True
        self.resume()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=limits.node_stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # shards of a supervisor that died
        self.process.wait()

    def fill_disk(self, leave_bytes: int) -> int:
        """Fill the node's filesystem until `leave_bytes` are free; returns the bytes written."""
        if self.holder is None:
            raise ClusterError("disk_full needs `cluster.disk_size` (the data directory on a "
                               "filesystem of its own)")
        script = ("import os,sys; s=os.statvfs(sys.argv[1]); "
                  "n=max(0, s.f_bavail*s.f_frsize-int(sys.argv[2])); "
                  "f=open(os.path.join(sys.argv[1], sys.argv[3]),'ab'); "
                  "[f.write(b'\\0'*min(1<<20, n-i)) for i in range(0, n, 1<<20)]; "
                  "f.close(); print(n)")
        done = subprocess.run([*self._enter(), sys.executable, "-c", script, str(self.data_dir),
                               str(leave_bytes), FILLER], capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            raise ClusterError(f"could not fill node {self.node_id}'s disk: "
                               f"{done.stderr.strip()[-200:]}")
        return int(done.stdout.strip() or 0)

    def free_disk(self) -> None:
        if self.holder is not None:
            subprocess.run([*self._enter(), "rm", "-f", str(self.data_dir / FILLER)],
                           capture_output=True, timeout=30)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.holder is not None and self.holder.poll() is None:
                os.killpg(self.holder.pid, signal.SIGKILL)
                self.holder.wait()


# A cluster's waits.
CLUSTER_READY_TIMEOUT_S = 60.0  # every partition has a leader that every node names
LEADER_LOOKUP_TIMEOUT_S = 30.0  # a step's `leader of` waits this long for an elected leader
METADATA_TIMEOUT_S = 3.0  # one node's Metadata answer (a node that is up answers at once)
LOOKUP_RETRY_S = 0.1


class Cluster:
    """A run's nodes, one (node 0) or a cluster (nodes 1..N, with seeds), and the link proxies
    between them: `proxies[(a, b)]` carries node a's node RPC to node b."""

    def __init__(self, out: Path, node_ids: list[int], shards: int, settings: dict[str, Any],
                 disk_size: int | None = None, link_proxies: bool = False) -> None:
        self.shards = shards
        self.nodes: dict[int, Node] = {}
        self.proxies: dict[tuple[int, int], LinkProxy] = {}
        self._thread: ProxyThread | None = None
        try:
            if len(node_ids) == 1:
                self.nodes[node_ids[0]] = Node(node_ids[0], out, shards, settings, disk_size)
            else:
                self._make(out, node_ids, settings, disk_size, link_proxies)
        except BaseException:
            self.close()
            raise

    def _make(self, out: Path, node_ids: list[int], settings: dict[str, Any],
              disk_size: int | None, link_proxies: bool) -> None:
        rpc: dict[int, int] = {}
        taken: set[int] = set()
        for i in node_ids:  # ranges found one by one may meet: draw again until apart
            while True:
                base = free_ports(self.shards)
                ports = set(range(base, base + self.shards))
                if not ports & taken:
                    break
            rpc[i], taken = base, taken | ports
        if link_proxies:
            self._thread = ProxyThread()
            for a in node_ids:
                for b in node_ids:
                    if a != b:
                        self.proxies[(a, b)] = LinkProxy(
                            rpc[b], self.shards, name=f"{a}->{b}", thread=self._thread).start()
        for i in node_ids:
            seeds = ",".join(f"{j}@127.0.0.1:{self._reach(i, j, rpc)}" for j in node_ids)
            self.nodes[i] = Node(i, out, self.shards,
                                 {**settings, "seeds": seeds, "rpc_port": rpc[i]}, disk_size)

    def _reach(self, a: int, b: int, rpc: dict[int, int]) -> int:
        """The port node a's seeds give node b: b's own, or the a -> b proxy's."""
        proxy = self.proxies.get((a, b))
        return proxy.port if proxy is not None else rpc[b]

    def start(self) -> None:
        """Every node's process first, then each waited for: a node of a cluster may be ready
        only once its peers answer."""
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready()

    def node(self, node_id: int) -> Node:
        if node_id not in self.nodes:
            raise ClusterError(f"there is no node {node_id} (nodes: "
                               f"{', '.join(map(str, self.nodes))})")
        return self.nodes[node_id]

    def bootstrap(self, node_ids: list[int] | None = None) -> str:
        ids = list(self.nodes) if node_ids is None else node_ids
        return ",".join(self.nodes[i].bootstrap for i in ids)

    def up(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.up()]

    # --- Metadata: leaders as the nodes tell them ---------------------------------------------

    def leaders(self, node: Node, timeout_s: float = METADATA_TIMEOUT_S
                ) -> dict[tuple[str, int], int] | None:
        """Every partition's leader (-1: none) as this node answers Metadata; None when it
        does not answer in time."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        client = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 0,
                              "socket.connection.setup.timeout.ms": int(timeout_s * 1000)})
        try:
            metadata = client.list_topics(timeout=timeout_s)
        except KafkaException:
            return None
        return {(name, p): part.leader for name, topic in metadata.topics.items()
                if topic.error is None for p, part in topic.partitions.items()}

    def leader_of(self, topic: str, partition: int, timeout_s: float = LEADER_LOOKUP_TIMEOUT_S
                  ) -> tuple[int | None, dict[int, int | None]]:
        """The node most nodes that are up name as the partition's leader, and each one's
        answer (None: no answer); waits up to `timeout_s` for one to be named (0: asks once)."""
        deadline = time.monotonic() + timeout_s
        while True:
            answers: dict[int, int | None] = {}
            for node in self.up():
                leaders = self.leaders(node)
                answers[node.node_id] = None if leaders is None \
                    else leaders.get((topic, partition), -1)
            named = Counter(a for a in answers.values() if a is not None and a in self.nodes)
            if named:
                return named.most_common(1)[0][0], answers
            if time.monotonic() >= deadline:
                return None, answers
            time.sleep(LOOKUP_RETRY_S)

    def wait_for_leaders(self, topics: list[tuple[str, int]],
                         timeout_s: float = CLUSTER_READY_TIMEOUT_S) -> None:
        """Until every node names a leader for every partition of `topics` (name, count)."""
        deadline = time.monotonic() + timeout_s
        wanted = [(name, p) for name, count in topics for p in range(count)]
        while True:
            missing: list[str] = []
            for node in self.nodes.values():
                leaders = self.leaders(node) or {}
                missing += [f"{t}-{p} (node {node.node_id})" for t, p in wanted
                            if leaders.get((t, p), -1) not in self.nodes]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"no leader after {timeout_s:g}s for {len(missing)} "
                                   f"partition(s): {', '.join(missing[:5])}")
            time.sleep(LOOKUP_RETRY_S)

    def partition_views(self) -> dict[int, Any]:
        """Each node's `/v1/partitions` answer: its replicas' role, leader, log end, high
        watermark and (a leader's) followers' match; None from a node that does not answer."""
        views: dict[int, Any] = {}
        for node in self.nodes.values():
            try:
                status, body = node.admin("GET", "/v1/partitions", limits.admin_timeout_s)
                views[node.node_id] = json.loads(body) if status == 200 else None
            except (OSError, ValueError):
                views[node.node_id] = None
        return views

    # --- links ------------------------------------------------------------------------------

    def link(self, a: int, b: int) -> LinkProxy:
        proxy = self.proxies.get((a, b))
        if proxy is None:
            raise ClusterError(f"no link proxy from node {a} to node {b} (a cluster of one "
                               "node has none)")
        return proxy

    def link_stats(self) -> dict[str, ProxyStats]:
        return {f"{a}->{b}": proxy.stats() for (a, b), proxy in self.proxies.items()}

    def close(self) -> None:
        errors: list[BaseException] = []
        for node in self.nodes.values():
            try:
                node.close()
            except Exception as e:  # noqa: BLE001 - stop the others, then say so
                errors.append(e)
        for proxy in self.proxies.values():
            proxy.close()
        if self._thread is not None:
            self._thread.close()
        if errors:
            raise errors[0]
