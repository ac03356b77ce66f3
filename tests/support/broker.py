"""A real Krill node in a child process, for integration tests.

Starts `python -m shards.cli start` on a free 127.0.0.1 port with its own data directory, in
its own process group (so `kill9()` takes the supervisor and every shard at once, as a power
cut would), and always stops it in teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scenarios.cluster import free_ports
from scenarios.procs import child_pids

__all__ = ["BrokerProcess", "free_port", "wait_for"]

REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` every 0.1 s until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.1)


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def free_port() -> int:
    """A free 127.0.0.1 port below the ephemeral range (scenarios.cluster.free_ports): no
    client's outgoing connection takes it between this pick and the broker's bind, or while
    the broker is down for a restart."""
    return free_ports(1)


class BrokerProcess:
    def __init__(
        self, data_dir: Path, *extra_args: str, port: int | None = None, smp: int | None = None
    ) -> None:
        self.data_dir = data_dir
        # Shard processes: KRILL_TEST_SMP, else 2 where there are two cores (every partition's
        # owner is then a coin toss away from the shard that accepted the connection).
        default = min(2, len(os.sched_getaffinity(0)))
        self.smp = smp or int(os.environ.get("KRILL_TEST_SMP", default))
        self.port = port or free_port()
        self.reader_port = free_port()  # the Spark reader endpoint (shards/reader.py)
        self.admin_port = free_port()  # /metrics and health (shards/admin.py)
        self.extra_args = list(extra_args)
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def reader_address(self) -> str:
        return f"127.0.0.1:{self.reader_port}"

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    def admin_get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """GET the admin endpoint: (status, body)."""
        return http_get(f"http://{self.admin_address}{path}", timeout_s)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """One /metrics scrape, parsed: (name, sorted labels) -> value."""
        status, body = self.admin_get("/metrics")
        assert status == 200, (status, body[:200])
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def start(self) -> BrokerProcess:
        assert self.process is None, "already running"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shards.cli",
                "start",
                "--listen",
                self.bootstrap,
                "--data-dir",
                str(self.data_dir),
                "--smp",
                str(self.smp),
                "--reader-listen",
                self.reader_address,
                "--admin-port",
                str(self.admin_port),
                *self.extra_args,
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.kill9()  # a node that did not come up is not left running
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited at start:\n{self.log()}")
            try:  # every shard serves (shards/admin.py), as a load balancer would check
                status, _ = self.admin_get("/v1/status/ready", timeout_s=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"broker not ready within {_START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it was not running)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                raise RuntimeError(f"broker ignored SIGTERM:\n{self.log()}") from None
        _kill_group(process)  # shards of a supervisor that died
        return process.returncode

    def kill9(self) -> None:
        """SIGKILL the supervisor and every shard process at once."""
        process, self.process = self.process, None
        if process is None:
            return
        _kill_group(process)

    def shard_pids(self) -> list[int]:
        """The shard processes, in shard order (children of the supervisor)."""
        assert self.process is not None
        pids = child_pids(self.process.pid)

        def shard_number(pid: int) -> int:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            return int(args[args.index(b"--shard") + 1])

        return sorted(pids, key=shard_number)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    pgid = process.pid
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()  # reap the supervisor: a zombie would keep its group alive
    # Wait for the shard processes to be gone, so the next start can take the lock and port.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
