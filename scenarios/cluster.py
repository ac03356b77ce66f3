"""The nodes of a real-mode scenario: `krill start` processes the runner starts, signals and
stops.

Each node runs in its own process group (so kill -9 of the node takes the supervisor and
every shard at once, as a power cut would), on free 127.0.0.1 ports, with its settings in a
YAML file (`krill start --config`). A shard process is found as a child of the supervisor.

A node with `disk_size` keeps its data directory on a tmpfs of that size, mounted in a mount
namespace of its own (`unshare --mount`), so a full disk is a real ENOSPC and nothing of the
machine's own disk is filled. A holder process keeps the namespace (and the tmpfs) alive
across kills and restarts of the node; the node and the disk filler enter it with `nsenter`.
This needs the privilege to make a mount namespace (root, or unprivileged user namespaces);
without it a scenario that asks for `disk_size` stops with that reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from scenarios import limits

__all__ = ["ClusterError", "Node", "free_port"]

REPO = Path(__file__).resolve().parents[1]
FILLER = ".scenario-disk-filler"


class ClusterError(RuntimeError):
    """A node could not be started, reached or signalled: one line."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        self.shards = shards
        self.config_path.write_text(yaml.safe_dump(settings or {}))
        self.disk_size = disk_size
        self.process: subprocess.Popen[bytes] | None = None
        self.holder: subprocess.Popen[bytes] | None = None
        self.stopped: set[int] = set()  # pids under SIGSTOP
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
        assert self.process is None or self.process.poll() is not None, "already running"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [*self._enter(), sys.executable, "-m", "shards.cli", "start",
             "--config", str(self.config_path), "--node-id", str(self.node_id),
             "--listen", self.bootstrap, "--data-dir", str(self.data_dir),
             "--smp", str(self.shards), "--reader-listen", f"127.0.0.1:{self.reader_port}",
             "--admin-listen", f"127.0.0.1:{self.admin_port}"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.stopped.clear()
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
        root = self.process.pid
        out: list[int] = []
        frontier = [root]
        while frontier:  # nsenter execs, so the supervisor is the group leader or its child
            pid = frontier.pop()
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    kids = [int(p) for p in (task / "children").read_text().split()]
                    out += kids
                    frontier += kids
            except FileNotFoundError:
                continue
        return out

    def kill(self, target: str) -> None:
        """kill -9: the whole node (its process group) or one shard process (after which the
        supervisor stops the node, as a crashed reactor stops Redpanda)."""
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
