"""Start and stop a Krill broker process for one bench case, and measure its process tree.

The broker may be a supervisor with shard child processes, so CPU and RSS are summed over
the whole process tree, found by walking ``/proc/<pid>/task/*/children`` (no psutil).
"""

from __future__ import annotations

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

from bench.peers.process import Started
from scenarios.procs import process_tree

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def krill_executable(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "krill"
    if beside.exists():
        return str(beside)
    found = shutil.which("krill")
    if found:
        return found
    raise FileNotFoundError("no `krill` executable next to the interpreter or on PATH")


_HELP_CACHE: dict[str, str] = {}


def extra_port_flags(exe: str) -> list[str]:
    """Free ports for the broker's other listeners, for those flags its --help shows.

    ``krill start`` also binds a Spark reader, node RPC and admin HTTP port with fixed
    defaults; a bench broker must not collide with another broker (or test) on the host.
    """
    if exe not in _HELP_CACHE:
        try:
            _HELP_CACHE[exe] = subprocess.run(
                [exe, "start", "--help"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            _HELP_CACHE[exe] = ""
    text = _HELP_CACHE[exe]
    flags: list[str] = []
    for flag, host_port in (
        ("--reader-listen", True),
        ("--rpc-port", False),
        ("--admin-port", False),
    ):
        if flag in text:
            port = free_port()
            flags += [flag, f"127.0.0.1:{port}" if host_port else str(port)]
    return flags


# --------------------------------------------------------------------------- /proc reading


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):  # gone, or a zombie awaiting its reaper
        return None
    return int(fields[19])


def process_cpu_seconds(pid: int) -> float | None:
    """CPU (user+system, all threads, live and exited) of one process, in ns resolution.

    Reads the process's CPU-time clock (clock id ``(~pid << 3) | 2``, CPUCLOCK_SCHED, what
    ``clock_getcpuclockid`` returns); /proc's utime/stime only have a 10 ms resolution,
    too coarse for a short phase.
    """
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return None


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of the live tree, plus what its reaped children used.

    Per process: its CPU clock (ns), or utime+stime from /proc/<pid>/stat (clock ticks) if
    that clock can't be read; plus cutime+cstime, the CPU of children that have exited
    and been waited for, so a shard process that has gone is still counted.
    """
    total = 0.0
    for pid in process_tree(root):
        fields = _stat_fields(pid)
        if fields is None:
            continue
        # After the split, index 0 is field 3 (state): utime (field 14) -> 11, stime 12,
        # cutime 13, cstime 14.
        own = process_cpu_seconds(pid)
        if own is None:
            own = (int(fields[11]) + int(fields[12])) / CLK_TCK
        total += own + (int(fields[13]) + int(fields[14])) / CLK_TCK
    return total


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_open_fds(root: int) -> int:
    """Open file descriptors of ``root`` and all its descendants."""
    total = 0
    for pid in process_tree(root):
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return total


def tree_rss_mib(root: int) -> float:
    return sum(_status_kib(p, "VmRSS:") for p in process_tree(root)) / 1024.0


def tree_hwm_mib(root: int) -> float:
    """Sum of per-process peak RSS (VmHWM): an upper bound on the tree's peak."""
    return sum(_status_kib(p, "VmHWM:") for p in process_tree(root)) / 1024.0


class RssSampler:
    """Samples the tree's summed VmRSS every ``interval`` s in a thread; keeps the peak."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root = root
        self.interval = interval
        self.peak_mib = 0.0
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> float:
        pids = process_tree(self.root)
        rss = sum(_status_kib(p, "VmRSS:") for p in pids) / 1024.0
        self.peak_mib = max(self.peak_mib, rss)
        self.max_processes = max(self.max_processes, len(pids))
        return rss

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sample()


# --------------------------------------------------------------------------- the broker


class BrokerError(RuntimeError):
    pass


class Broker(Started):
    """One ``krill start`` process on a free port with a temp data dir.

    Use as a context manager: the process is stopped (SIGTERM, then SIGKILL to the whole
    tree after ``stop_timeout``) and the temp dir removed on exit, whatever happened.
    """

    def __init__(
        self,
        *,
        smp: int = 1,
        krill: str | None = None,
        data_root: str | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 15.0,
        keep: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.smp = smp
        self.extra_args = extra_args  # more `krill start` flags
        self.admin_port = 0  # the admin HTTP port (/metrics), when the krill has one
        self.reader_address = ""  # the Spark reader endpoint (--reader-listen), when it has one
        self.krill = krill
        self.data_root = data_root
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep = keep
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: str | None = None
        self.data_dir = ""
        self.log_path = ""
        self.stop_how = ""
        self.exit_code: int | None = None
        self._log_file = None
        self.final_log_tail = ""
        self.first_log_error = ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Broker:
        exe = krill_executable(self.krill)
        self.tmp = tempfile.mkdtemp(prefix="krill-bench-", dir=self.data_root)
        self.data_dir = os.path.join(self.tmp, "data")
        os.mkdir(self.data_dir)
        self.log_path = os.path.join(self.tmp, "broker.log")
        self._log_file = open(self.log_path, "wb")  # closed in stop()
        self.port = free_port()
        extra = extra_port_flags(exe)
        if "--admin-port" in extra:
            self.admin_port = int(extra[extra.index("--admin-port") + 1])
        if "--reader-listen" in extra:
            self.reader_address = extra[extra.index("--reader-listen") + 1]
        cmd = [
            exe, "start",
            "--listen", self.bootstrap,
            "--data-dir", self.data_dir,
            "--smp", str(self.smp),
            "--node-id", "0",
            *extra,
            *self.extra_args,
        ]  # fmt: skip
        log(f"starting broker: {' '.join(cmd)}")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout
        # 1. the port accepts TCP connections
        while True:
            self._check_alive("while starting")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BrokerError(f"broker did not listen on {self.bootstrap} in time")
            time.sleep(0.05)
        # 2. it answers a Metadata request
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive("while starting")
            try:
                admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                log(f"broker pid {self.pid} ready on {self.bootstrap}")
                return
            except Exception as e:  # KafkaException
                last = e
                time.sleep(0.1)
        raise BrokerError(f"broker did not answer Metadata in time: {last}")

    def _check_alive(self, when: str) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None:
            raise BrokerError(f"broker exited with code {rc} {when}; log tail: {self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        if not self.tmp:  # stopped and cleaned up
            return "\n".join(self.final_log_tail.splitlines()[-lines:])
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _first_error(self) -> str:
        """The first ERROR/CRITICAL log line, plus the exception line of a traceback after it."""
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read(4 << 20).decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        for i, line in enumerate(lines):
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                out = line.strip()
                for follow in lines[i + 1 : i + 60]:
                    if (
                        follow
                        and not follow[0].isspace()
                        and not follow.startswith(
                            ("Traceback", "handle:", "During handling", "The above")
                        )
                    ):
                        if follow != line:
                            out += " | " + follow.strip()
                        break
                return out[:500]
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            tree = [(p, start_time(p)) for p in process_tree(self.proc.pid)]
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=self.stop_timeout)
                    self.stop_how = "sigterm"
                except subprocess.TimeoutExpired:
                    log(f"broker did not stop within {self.stop_timeout}s of SIGTERM: SIGKILL")
                    self.stop_how = "sigkill"
            else:
                self.stop_how = "already-exited"
            # Kill anything of the tree still alive (children orphaned by a SIGKILL, or
            # ones the supervisor failed to stop). These are all processes we started.
            for pid, started in reversed(tree):
                if pid == self.proc.pid and self.proc.poll() is not None:
                    continue
                if started is None or start_time(pid) != started:
                    continue  # gone (or the pid now belongs to someone else)
                try:
                    os.kill(pid, signal.SIGKILL)
                    if pid != self.proc.pid:
                        self.stop_how += f"+killed-child-{pid}"
                except ProcessLookupError:
                    pass
            try:
                self.exit_code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.exit_code = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.final_log_tail = self.log_tail(30)
        self.first_log_error = self._first_error()
        if self.tmp is not None and not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
