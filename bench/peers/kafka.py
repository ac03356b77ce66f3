"""Apache Kafka as a peer: KRaft nodes (combined broker and controller) started from the jars
`make peers` fetched, on free 127.0.0.1 ports, with their logs in a temp dir.

    with KafkaCluster(nodes=1, fsync=True) as kafka:     # or nodes=3
        produce(kafka.bootstrap, ...)
        kafka.cpu_seconds()                               # every node's JVM together

Two sides, as the Redpanda comparison runs Kafka: `fsync=True` sets
`log.flush.interval.messages=1`, an fsync per append (what Krill does before it answers
acks=all), and `fsync=False` keeps Kafka's default, the page cache (replication is its
durability). Each node is one JVM in its own process group, started as Kafka's
`kafka-server-start.sh` starts it (G1, `-Xms`/`-Xmx` of `heap_mib`, 1 GiB by default, as
Kafka's script sets), its storage formatted first (`kafka.tools.StorageTool`), and stopped
with SIGTERM (a controlled shutdown), SIGKILL after `stop_timeout`. `describe()` is what a
bench line says of it: version, nodes, heap, the settings that differ from Kafka's defaults.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.broker import free_port, log, tree_cpu_seconds, tree_rss_mib
from bench.peers.fetch import KAFKA_VERSION, kafka_libs
from bench.peers.process import Started, stop_group, wait_listening

__all__ = ["KAFKA_VERSION", "KafkaCluster", "KafkaError", "kafka_java"]

_JVM_FLAGS = [  # kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS
    "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]  # fmt: skip

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


class KafkaError(RuntimeError):
    pass


def kafka_java(main_class: str, *args: str, heap_mib: int = 256,
               log_level: str = "WARN", config_dir: Path | None = None,
               libs: Path | None = None) -> list[str]:
    """The command line that runs one of Kafka's classes (a tool's main, the broker) as
    Kafka's scripts run it, on the fetched jars (`libs`: another set, Connect's)."""
    libs = libs or kafka_libs()
    conf = config_dir or libs.parent
    log4j = conf / f"log4j2-{log_level.lower()}.properties"
    if not log4j.exists():
        log4j.write_text(_LOG4J2.format(level=log_level))
    return [
        shutil.which("java") or "java", f"-Xms{heap_mib}m", f"-Xmx{heap_mib}m", *_JVM_FLAGS,
        f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{libs}/*", main_class, *args,
    ]


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding; never one that
    starts with '-', which kafka-storage's argument parser takes for a flag (Kafka's own
    Uuid.randomUuid draws again for the same reason): 1 run in 64 failed so."""
    for _ in range(100):  # 1 in 64 draws starts with '-': 100 in a row never happen
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
    raise KafkaError("no KRaft cluster id without a leading '-' in 100 draws")


class _Node:
    def __init__(self, node_id: int, root: Path) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.controller_port = free_port()
        self.dir = root / f"node-{node_id}"
        self.log_dir = self.dir / "data"
        self.config = self.dir / "server.properties"
        self.log_path = self.dir / "kafka.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


class KafkaCluster(Started):
    """`nodes` KRaft nodes, each broker and controller, started as one cluster; a context
    manager that stops every JVM and removes the temp dir, whatever happened."""

    def __init__(self, *, nodes: int = 1, fsync: bool = True, heap_mib: int = 1024,
                 data_root: str | None = None, start_timeout: float = 90.0,
                 stop_timeout: float = 20.0, keep: bool = False) -> None:
        self.fsync = fsync
        self.heap_mib = heap_mib
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="kafka-peer-", dir=data_root))
        self.nodes = [_Node(i + 1, self.root) for i in range(nodes)]
        self.cluster_id = _cluster_id()

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def pids(self) -> list[int]:
        return [node.proc.pid for node in self.nodes if node.proc is not None]

    def settings(self) -> dict[str, str]:
        """The broker settings that differ from Kafka's defaults."""
        replicas = str(len(self.nodes))
        out = {
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": str(min(2, len(self.nodes))),
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "1",
        }
        if self.fsync:
            out["log.flush.interval.messages"] = "1"
        return out

    def describe(self) -> dict[str, Any]:
        return {"broker": "kafka", "version": KAFKA_VERSION, "nodes": len(self.nodes),
                "fsync_per_batch": self.fsync, "heap_mib_per_node": self.heap_mib,
                "gc": "G1", "settings": self.settings()}

    def _write_config(self, node: _Node) -> None:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        lines = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},"
                         f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.log_dir),
            **self.settings(),
        }
        node.dir.mkdir(parents=True, exist_ok=True)
        node.config.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))

    def start(self) -> KafkaCluster:
        for node in self.nodes:
            self._write_config(node)
            fmt = kafka_java("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                             "-c", str(node.config), config_dir=self.root)
            done = subprocess.run(fmt, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise KafkaError(f"kafka-storage format failed: {done.stderr.strip()[-500:]}")
        for node in self.nodes:
            cmd = kafka_java("kafka.Kafka", str(node.config), heap_mib=self.heap_mib,
                             log_level="INFO", config_dir=self.root)
            with open(node.log_path, "wb") as out:
                node.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        log(f"kafka {KAFKA_VERSION}: {len(self.nodes)} node(s) starting, fsync="
            f"{self.fsync}, pids {self.pids}")
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout
        for node in self.nodes:
            if not wait_listening(node.port, deadline, self.check):
                raise KafkaError(f"kafka node {node.node_id} did not listen in time; "
                                 f"{self.log_tail(node)}")
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        while True:
            self.check()
            try:
                brokers = admin.list_topics(timeout=5).brokers
                if len(brokers) == len(self.nodes):
                    log(f"kafka ready on {self.bootstrap}")
                    return
            except Exception:  # KafkaException: not yet
                pass
            if time.monotonic() > deadline:
                raise KafkaError(f"kafka did not answer Metadata with every broker in time; "
                                 f"{self.log_tail(self.nodes[0])}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return all(node.proc is not None and node.proc.poll() is None for node in self.nodes)

    def check(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None:
                raise KafkaError(f"kafka node {node.node_id} exited with code "
                                 f"{node.proc.returncode}; {self.log_tail(node)}")

    def log_tail(self, node: _Node | None = None, lines: int = 5) -> str:
        node = node or self.nodes[0]
        try:
            text = node.log_path.read_bytes()[-8192:].decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return sum(tree_cpu_seconds(pid) for pid in self.pids)

    def rss_mib(self) -> float:
        return sum(tree_rss_mib(pid) for pid in self.pids)

    def stop(self) -> None:
        live = [node.proc for node in self.nodes if node.proc is not None]
        for proc in live:  # every node's SIGTERM at once: they shut down together
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in live:
            stop_group(proc, self.stop_timeout)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
