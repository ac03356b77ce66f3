"""What a bench case measures beside its clients: CPU, memory, liveness, client statistics.

CPU of the broker's processes (`ProcessCpu`, per shard from the node's log lines), of this
client process (`client_cpu`), librdkafka's own statistics (`StatsCollector`), errors the
clients report (`ErrorLog`), and the check that a broker is still alive between phases
(`liveness`). `EnvBroker` points a case at a broker started elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from bench.broker import (
    Broker,
    RssSampler,
    log,
    process_cpu_seconds,
    tree_cpu_seconds,
    tree_hwm_mib,
    tree_rss_mib,
)
from bench.report import (
    CaseError,
)
from scenarios.procs import process_tree


def client_cpu() -> float:
    """CPU seconds of this process, every thread (librdkafka's too), to the nanosecond:
    `os.times()` counts 10 ms ticks, and a short phase can use less than one."""
    return time.process_time()


# --------------------------------------------------------------------------- kafka helpers


class StatsCollector:
    """librdkafka statistics (``statistics.interval.ms``); keeps the latest snapshot."""

    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None
        self.count = 0

    def cb(self, stats_json: str) -> None:
        self.last = json.loads(stats_json)
        self.count += 1

    def brokers(self) -> list[dict[str, Any]]:
        if not self.last:
            return []
        return [b for b in self.last.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]

    def produce_requests(self) -> int | None:
        return self.requests("Produce")

    def requests(self, kind: str) -> int | None:
        if not self.last:
            return None
        return sum(int(b.get("req", {}).get(kind, 0)) for b in self.brokers())

    def tx_bytes(self) -> int | None:
        if not self.last:
            return None
        return sum(int(b.get("txbytes", 0)) for b in self.brokers())

    def wait_fresh(self, client: Any, timeout: float = 3.0) -> None:
        """Serve callbacks until a snapshot taken from now on has arrived."""
        seen = self.count
        deadline = time.monotonic() + timeout
        while self.count <= seen and time.monotonic() < deadline:
            client.poll(0.05)


class ErrorLog:
    """error_cb: remembers (and logs) client-level errors such as 'all brokers down'."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.errors: list[str] = []

    def cb(self, err: Any) -> None:
        text = str(err)
        if len(self.errors) < 20:
            self.errors.append(text)
        log(f"{self.name} error: {text}")


def liveness(broker: Broker) -> Callable[[], None]:
    def check() -> None:
        if not broker.alive():
            tail = " | ".join(line.strip() for line in broker.log_tail(3).splitlines())
            raise CaseError(f"broker died (exit {broker.proc.poll()}); log ends: {tail}")

    return check


class EnvBroker(Broker):
    """A ``Broker`` started with extra environment variables (``KRILL_<FIELD>`` config).

    ``bench/broker.py`` passes the bench's own environment to ``krill start``; the variables
    are set only around ``start()`` (the Popen) and restored after.
    """

    def __init__(self, *, env: dict[str, str], **kw: Any) -> None:
        super().__init__(**kw)
        self.env = env

    def start(self) -> Broker:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return super().start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


_SHARD_LINE = re.compile(r"shard (\d+) \(pid (\d+)")


class ProcessCpu:
    """Broker CPU per process of the tree, labelled ``supervisor``, ``shard0``, ``shard1``...

    Shard pids come from the shard's ``shard N (pid P, core C) serving Kafka`` log line;
    a process without one is labelled ``pid<P>``.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.labels: dict[int, str] = {broker.pid: "supervisor"}

    def _read_labels(self) -> None:
        try:
            with open(self.broker.log_path, "rb") as f:
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return
        for m in _SHARD_LINE.finditer(text):
            self.labels.setdefault(int(m.group(2)), f"shard{m.group(1)}")

    def snapshot(self) -> dict[str, float]:
        pids = process_tree(self.broker.pid)
        if any(p not in self.labels for p in pids):
            self._read_labels()
        out: dict[str, float] = {}
        for pid in pids:
            cpu = process_cpu_seconds(pid)
            if cpu is not None:
                out[self.labels.get(pid, f"pid{pid}")] = cpu
        return out

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.snapshot()
        return {k: round(v - before.get(k, 0.0), 3) for k, v in sorted(now.items())}


def idle_cpu(broker: Broker, seconds: float) -> dict[str, Any]:
    """Broker CPU while no client sends anything, per second, whole tree and per process."""
    cpu = ProcessCpu(broker)
    check = liveness(broker)
    before = cpu.snapshot()
    t0 = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - t0
    by_process = cpu.since(before)
    check()
    return {
        "seconds": round(elapsed, 3),
        "broker_cpu_s_per_s": round(sum(by_process.values()) / elapsed, 4),
        "broker_cpu_s_by_process": by_process,
    }


def broker_live_figures(res: dict[str, Any], broker: Broker, rss: RssSampler) -> None:
    """``res["broker"]``: CPU since start, RSS now / peak / HWM sum, processes seen."""
    if not broker.alive():
        return
    res["broker"] = {
        "cpu_s_total": round(tree_cpu_seconds(broker.pid), 3),
        "rss_end_mib": round(tree_rss_mib(broker.pid), 1),
        "rss_hwm_sum_mib": round(tree_hwm_mib(broker.pid), 1),
    }
    rss.sample()
    res["broker"]["rss_peak_mib"] = round(rss.peak_mib, 1)
    res["broker"]["processes"] = rss.max_processes


def broker_stop_figures(res: dict[str, Any], broker: Broker) -> None:
    res.setdefault("broker", {}).update(
        {
            "stop": broker.stop_how,
            "exit_code": broker.exit_code,
            "first_log_error": broker.first_log_error or None,
        }
    )
