"""A real multi-node Krill cluster in child processes, for failover tests.

`Cluster(tmp_path).start()` runs N nodes (`python -m shards.cli start --node-id I --seeds ...`)
on free 127.0.0.1 ports, each in its own process group (so `kill9()` takes the supervisor and
every shard at once, as a power cut would, and `pause()` freezes the whole node as a stalled VM
would), each writing its stdout and stderr to `n<I>.log` beside its data directory. `close()`
resumes and kills every node; the `cluster` fixtures call it in teardown and print each node's
log tail there (pytest shows teardown output only for a test that failed).

With `link_proxies=True` every byte of node RPC between two nodes crosses a proxy of its own
per direction (scenarios/link_proxy.py): node i's seeds name, for node j, the port of the
i -> j proxy. A test cuts links with `isolate(i)` (every link to and from node i, as a
network partition would) or `link(a, b).cut()` (a's node RPC to b only: one-way loss), and
restores them with `heal_links()`; a cut is in force once the call returns, and ZeroMQ finds
out by itself (its heartbeats time out), as on a real partition. Kafka clients and the admin
endpoint reach every node directly, cut or not.

Besides the processes it answers what a failover test asks: Metadata from one node exactly
(`metadata(i)`, on the raw client, so no client library picks the broker), a partition's
leader, the coordinator of a group, each node's replicas (`/v1/partitions`), and each node's
stored batches of a partition read from its segment files (`stored_batches`), which is how
replicas' logs are compared byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from actors.cluster.commands import decode as decode_command
from scenarios.cluster import free_ports
from scenarios.link_proxy import LinkProxy, ProxyThread
from tests.support.broker import http_get
from tests.support.raw_client import RawClient, request
from wire.messages.metadata import MetadataRequest, MetadataResponse
from wire.record_batch import HEADER_BYTES, BatchHeader, read_header
from wire.records import decode_batch

__all__ = [
    "Cluster",
    "ClusterNode",
    "ConfluentLoad",
    "Load",
    "assert_acknowledged_once",
    "cluster_fixture",
    "controller_commands",
    "first_offset_after_epoch",
    "read_partitions",
    "stored_batches",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 30.0  # one node's admin endpoint answering ready
_CLUSTER_FORMED_TIMEOUT_S = 60.0  # every node's Metadata listing every broker and a controller
_STOP_TIMEOUT_S = 30.0  # a SIGTERM'd node exiting
_GROUP_GONE_TIMEOUT_S = 10.0  # a killed node's shard processes gone
_LOG_TAIL_BYTES = 6000  # of each node's log, printed in teardown
_METADATA_VERSION = 9  # flexible, with cluster_id, controller_id and leader epochs

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 0.1
) -> T:
    """Call `probe` until it returns something other than None or False (exceptions count as
    not yet); that value. Fails naming `what` and the last exception after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as e:  # noqa: BLE001 - a node down or electing answers with errors
            last_error = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s}s: {what} (last error: {last_error!r})")
        time.sleep(every_s)


class ClusterNode:
    """One node: its ports, data directory, log file and (while running) process group."""

    def __init__(self, root: Path, node_id: int, smp: int) -> None:
        self.node_id = node_id
        self.smp = smp
        # Below the ephemeral range, never the same port twice in this process
        # (scenarios.cluster.free_ports): no client's connection takes one while the node
        # restarts.
        self.kafka_port = free_ports(1)
        self.admin_port = free_ports(1)
        self.reader_port = free_ports(1)
        self.rpc_port = free_ports(smp)  # shard k listens on rpc_port + k
        self.data_dir = root / f"n{node_id}"
        self.log_path = root / f"n{node_id}.log"
        self.args: list[str] = []  # set by the cluster: seeds and shared flags
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def __repr__(self) -> str:
        return f"node {self.node_id}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    # Processes -------------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the node's process; `wait_ready` waits for it."""
        assert self.process is None, f"{self} already running"
        with open(self.log_path, "ab") as log:
            log.write(f"---- start at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shards.cli", "start", *self.args],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.paused = False

    def wait_ready(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Until the admin endpoint says every shard serves; fails if the node exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None, f"{self} not started"
            if self.process.poll() is not None:
                raise AssertionError(f"{self} exited at start:\n{self.log_tail()}")
            try:
                if self.admin_get("/v1/status/ready", timeout_s=5.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{self} not ready within {timeout_s}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        """SIGKILL the supervisor and every shard at once; returns once all are gone."""
        process, self.process = self.process, None
        if process is not None:
            _kill_group(process)
        self.paused = False

    def terminate(self) -> None:
        """SIGTERM the supervisor (a clean shutdown: it stops its shards); `stop` waits."""
        assert self.process is not None, f"{self} not running"
        if self.paused:
            self.resume()
        self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S, *, signalled: bool = False) -> int:
        """SIGTERM the node (unless `signalled` already) and wait; the supervisor's exit
        code. A node that does not exit in time is killed and the test fails."""
        process = self.process
        assert process is not None, f"{self} not running"
        if not signalled:
            self.terminate()
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(f"{self} ignored SIGTERM:\n{self.log_tail()}") from None
        self.process = None
        _kill_group(process)  # shards the supervisor left behind, if any
        return code

    def pause(self) -> None:
        """SIGSTOP every process of the node: it keeps its sockets and answers nothing."""
        assert self.process is not None and not self.paused
        os.killpg(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None and self.paused
        os.killpg(self.process.pid, signal.SIGCONT)
        self.paused = False

    def log_tail(self, size: int = _LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - size))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    # What the node says ----------------------------------------------------------------------

    def admin_get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        return http_get(f"http://127.0.0.1:{self.admin_port}{path}", timeout_s)

    def replicas(self) -> dict[tuple[str, int], dict[str, Any]] | None:
        """/v1/partitions: this node's replicas by (topic, partition): role, leader, term,
        high_watermark, log_end, followers; None where the endpoint does not answer 200."""
        status, body = self.admin_get("/v1/partitions")
        if status != 200:
            return None
        return {(r["topic"], r["partition"]): r for r in json.loads(body)["partitions"]}

    def metadata(self, topics: list[str] | None = None,
                 version: int = _METADATA_VERSION) -> MetadataResponse:
        """One Metadata answer from this node alone (None: every topic); v10+ names topic
        ids."""
        wanted = (
            None
            if topics is None
            else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        )
        with RawClient(self.bootstrap) as client:
            return client.call(3, version, request(
                3, topics=wanted, allow_auto_topic_creation=False))  # fmt: skip

    def find_coordinator(self, group: str) -> int:
        """The node id this node names as `group`'s coordinator (-1 with an error)."""
        with RawClient(self.bootstrap) as client:
            answer = client.call(10, 1, request(10, key=group, key_type=0))
        return int(answer.node_id) if answer.error_code == 0 else -1


class Cluster:
    """N nodes, all seeds, every partition replicated `replicas` times by default; with
    `link_proxies`, a link proxy per ordered node pair (see the module's notes)."""

    def __init__(self, root: Path, size: int = 3, smp: int = 1, *extra_args: str,
                 link_proxies: bool = False) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.nodes = {i: ClusterNode(root, i, smp) for i in range(1, size + 1)}
        self.proxies: dict[tuple[int, int], LinkProxy] = {}
        self._proxy_thread: ProxyThread | None = None
        if link_proxies:
            self._start_proxies(smp)
        for node in self.nodes.values():
            seeds = ",".join(self._seed(node.node_id, j) for j in self.nodes)
            node.args = [
                "--node-id", str(node.node_id), "--seeds", seeds,
                "--rpc-port", str(node.rpc_port), "--listen", node.bootstrap,
                "--admin-port", str(node.admin_port),
                "--reader-listen", f"127.0.0.1:{node.reader_port}",
                "--data-dir", str(node.data_dir), "--smp", str(smp),
                "--default-replicas", str(size), *extra_args,
            ]  # fmt: skip

    def __getitem__(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id]

    # Links -------------------------------------------------------------------------------------

    def _start_proxies(self, smp: int) -> None:
        self._proxy_thread = ProxyThread("cluster-links")
        try:
            for a in self.nodes:
                for b, target in self.nodes.items():
                    if a != b:
                        self.proxies[(a, b)] = LinkProxy(
                            target.rpc_port, smp, name=f"{a}->{b}", thread=self._proxy_thread
                        ).start()  # fmt: skip
        except BaseException:
            self._close_proxies()
            raise

    def _seed(self, a: int, b: int) -> str:
        """Node b as node a's seeds name it: b's own RPC port, or the a -> b proxy's."""
        proxy = self.proxies.get((a, b))
        return f"{b}@127.0.0.1:{self.nodes[b].rpc_port if proxy is None else proxy.port}"

    def link(self, a: int, b: int) -> LinkProxy:
        """The proxy that carries node a's node RPC to node b (`cut()`, `delay(ms)`,
        `reset()`: drop what it holds, `heal()`)."""
        assert self.proxies, "a cluster started without link_proxies has no links to cut"
        return self.proxies[(a, b)]

    def isolate(self, node_id: int) -> None:
        """Cut every link to and from the node: a network partition of one."""
        assert self.proxies, "a cluster started without link_proxies has no links to cut"
        for (a, b), proxy in self.proxies.items():
            if node_id in (a, b):
                proxy.cut()

    def heal_links(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def _close_proxies(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        if self._proxy_thread is not None:
            self._proxy_thread.close()
            self._proxy_thread = None

    def running(self) -> list[ClusterNode]:
        """The nodes started and not paused."""
        return [n for n in self.nodes.values() if n.alive() and not n.paused]

    def bootstrap(self, *node_ids: int) -> str:
        """Bootstrap servers: the named nodes, else every node."""
        chosen = node_ids or tuple(self.nodes)
        return ",".join(self.nodes[i].bootstrap for i in chosen)

    def admin(self, *node_ids: int) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap(*node_ids)})

    # Life cycle --------------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start every node and wait until the cluster has formed."""
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready()
        self.wait_formed()
        return self

    def wait_formed(self, timeout_s: float = _CLUSTER_FORMED_TIMEOUT_S) -> None:
        """Until Metadata from every running node lists every node and one controller."""
        expected = set(self.nodes)

        def formed() -> bool:
            controllers = set()
            for node in self.running():
                answer = node.metadata([])
                if {b.node_id for b in answer.brokers} != expected or answer.controller_id < 0:
                    return False
                controllers.add(answer.controller_id)
            return len(controllers) == 1

        wait_until(formed, timeout_s, f"cluster of {sorted(expected)} formed")

    def restart(self, node_id: int) -> ClusterNode:
        """Start a node that was killed or stopped, with its data directory, and wait for it."""
        node = self.nodes[node_id]
        node.launch()
        node.wait_ready()
        return node

    def stop_all(self, timeout_s: float = _STOP_TIMEOUT_S) -> dict[int, int]:
        """SIGTERM every running node at once, then wait for each; exit codes by node."""
        stopping = [n for n in self.nodes.values() if n.process is not None]
        for node in stopping:
            node.terminate()
        return {node.node_id: node.stop(timeout_s, signalled=True) for node in stopping}

    def close(self) -> None:
        """Kill every node, paused ones too, then close the link proxies; teardown. Every
        node's group is killed before any is waited for: a killed group takes up to 2 s here
        to be gone (its shards reaped by PID 1), and one node after the other made each
        cluster's teardown 6-8 s."""
        try:
            killed = []
            for node in self.nodes.values():
                process, node.process, node.paused = node.process, None, False
                if process is not None:
                    _send_kill(process)
                    killed.append(process)
            for process in killed:
                _wait_gone(process)
        finally:
            self._close_proxies()

    def print_log_tails(self) -> None:
        for node in self.nodes.values():
            print(f"\n===== {node} log tail ({node.log_path}) =====\n{node.log_tail()}")

    # Topics and leaders ------------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int, replicas: int = 3, config: dict[str, str] | None = None
    ) -> None:
        """Create it and wait until every partition has a leader that every running node
        names (and that leader answers Metadata)."""
        admin = self.admin()
        future = admin.create_topics([NewTopic(name, partitions, replicas, config=config or {})])
        future[name].result(timeout=30)
        for partition in range(partitions):
            self.wait_leader(name, partition)

    def leader_epoch(self, topic: str, partition: int, via: ClusterNode) -> int:
        """The partition's leader epoch as `via` reports it."""
        (found,) = via.metadata([topic]).topics
        (epoch,) = [p.leader_epoch for p in found.partitions if p.partition_index == partition]
        return int(epoch)

    def leaders(self, topic: str, via: ClusterNode) -> list[int]:
        """Each partition's leader as `via` reports it (-1: none)."""
        answer = via.metadata([topic])
        (found,) = answer.topics
        assert found.error_code == 0, (via, topic, found.error_code)
        return [p.leader_id for p in sorted(found.partitions, key=lambda p: p.partition_index)]

    def wait_leader(
        self, topic: str, partition: int, not_on: int | None = None, timeout_s: float = 30.0
    ) -> int:
        """Until every running node names the same leader for the partition, a running node
        other than `not_on`; its id."""

        def agreed() -> int | None:
            running = self.running()
            named = {self.leaders(topic, n)[partition] for n in running}
            if len(named) != 1:
                return None
            leader = named.pop()
            ok = leader != not_on and leader in self.nodes and self.nodes[leader] in running
            return leader if ok else None

        return wait_until(agreed, timeout_s, f"{topic}-{partition} led by one running node "
                                             f"other than {not_on}")  # fmt: skip

    def coordinator(self, group: str, timeout_s: float = 30.0, not_on: int | None = None) -> int:
        """The node every running node names as the group's coordinator, other than `not_on`
        (a node just killed: until they notice, the others still name it)."""

        def agreed() -> int | None:
            named = {n.find_coordinator(group) for n in self.running()}
            return named.pop() if len(named) == 1 and not named & {-1, not_on} else None

        return wait_until(agreed, timeout_s, f"one coordinator for group {group}")

    def wait_replicas_converged(self, topic: str, partitions: int, timeout_s: float = 60.0) -> None:
        """Until every node's replica of each partition has the same log end and high
        watermark (where /v1/partitions answers), and the segment files hold the same
        batches, at least one (read from disk, node by node); fails showing the last
        difference."""
        last: list[str] = []

        def converged() -> bool:
            last.clear()
            views = {n.node_id: n.replicas() for n in self.nodes.values()}
            for partition in range(partitions):
                if None not in views.values():  # /v1/partitions answers: compare it first
                    ends = {i: _ends(v, topic, partition) for i, v in views.items()}
                    if None in ends.values() or len(set(ends.values())) != 1:
                        last.append(f"{topic}-{partition} (log end, high watermark): {ends}")
                        continue
                stored = {i: stored_batches(self.nodes[i].data_dir, topic, partition)
                          for i in self.nodes}  # fmt: skip
                if not all(stored.values()):  # every test writes to every partition first
                    last.append(
                        f"{topic}-{partition}: no batch stored on some node: "
                        f"{ {i: _describe(b) for i, b in stored.items()} }"
                    )
                elif len({tuple(b) for b in stored.values()}) != 1:
                    last.append(
                        f"{topic}-{partition} stored batches differ: "
                        f"{ {i: _describe(b) for i, b in stored.items()} }"
                    )
            return not last

        try:
            wait_until(converged, timeout_s, f"replicas of {topic} converged", every_s=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n" + "\n".join(last)) from None


def _ends(
    view: dict[tuple[str, int], dict[str, Any]] | None, topic: str, partition: int
) -> tuple[int, int] | None:
    replica = (view or {}).get((topic, partition))
    return None if replica is None else (replica["log_end"], replica["high_watermark"])


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    _send_kill(process)
    _wait_gone(process)


def _send_kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGCONT)  # a paused group is killed too, reaped sooner
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(process: subprocess.Popen[bytes]) -> None:
    """Until the killed group's processes are all gone (bounded)."""
    pgid = process.pid
    process.wait()  # reap the supervisor: a zombie would keep its group alive
    deadline = time.monotonic() + _GROUP_GONE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


# Stored logs ---------------------------------------------------------------------------------


def stored_batches(data_dir: Path, topic: str, partition: int) -> list[tuple[int, int, bytes]]:
    """The whole batches in a replica's segment files, in order: (base offset, leader epoch,
    bytes). Reads a running node's files too: it stops at the first incomplete or zeroed
    header (a preallocated or torn tail)."""
    directory = data_dir / f"{topic}-{partition}"
    batches: list[tuple[int, int, bytes]] = []
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        for start, header in whole_batches(data):
            batch = data[start : start + header.size]
            batches.append((header.base_offset, header.partition_leader_epoch, batch))
    return batches


def whole_batches(data: bytes) -> list[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch of a segment's bytes, in order, up to the first
    incomplete or zeroed header (a preallocated or torn tail)."""
    batches = []
    position = 0
    while position + HEADER_BYTES <= len(data):
        try:
            header = read_header(data, position)
        except ValueError:
            break
        if position + header.size > len(data):
            break
        batches.append((position, header))
        position += header.size
    return batches


def controller_commands(data_dir: Path) -> list[tuple[int, Any]]:
    """The commands in a node's controller log files, committed or not, with their offsets
    (actors/cluster/commands.py): (offset, command), in log order. Reads a running node's
    files too, up to the first incomplete batch."""
    found: list[tuple[int, Any]] = []
    for path in sorted((data_dir / "_krill" / "controller").glob("*.log")):
        data = path.read_bytes()
        for start, header in whole_batches(data):
            if header.is_control:
                continue
            _, records = decode_batch(data[start : start + header.size], check_crc=False)
            found += [(r.offset, decode_command(r.value or b"")) for r in records]
    return found


def first_offset_after_epoch(data_dir: Path, topic: str, partition: int, epoch: int) -> int | None:
    """The first offset a replica stores in a leader epoch (Raft term) after `epoch`: the
    first record a later leader wrote."""
    later = [base for base, e, _ in stored_batches(data_dir, topic, partition) if e > epoch]
    return min(later, default=None)


def _describe(batches: list[tuple[int, int, bytes]]) -> str:
    if not batches:
        return "none"
    last_base, last_epoch, _ = batches[-1]
    return f"{len(batches)} batches, last at {last_base} (epoch {last_epoch})"


# Reading back --------------------------------------------------------------------------------


def read_partitions(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0
) -> dict[tuple[int, int], bytes]:
    """Every record of every partition, from offset 0 to the high watermark it had when the
    read began, by (partition, offset). A consumer skips control batches, so offsets may have
    gaps; the consumer's position says when a partition is done."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "cluster-test-reader",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })  # fmt: skip
    try:

        def high_watermark(partition: int) -> tuple[int]:
            # librdkafka takes a leaderless partition in its cached Metadata (the node it asked
            # had just started) as final for this query and does not ask again by itself: ask
            # for the topic's Metadata first, and say what it showed if it has no leader.
            known = consumer.list_topics(topic, timeout=5).topics[topic].partitions
            found = known.get(partition)
            if found is None or found.leader < 0:
                raise AssertionError(f"{topic}-{partition} in Metadata: {found}")
            low_high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
            return (int(low_high[1]),)

        ends = [
            wait_until(lambda p=p: high_watermark(p), timeout_s, f"{topic}-{p} high watermark")[0]
            for p in range(partitions)
        ]
        return _read_to(consumer, topic, ends, timeout_s)
    finally:
        consumer.close()


def _read_to(
    consumer: Consumer, topic: str, ends: list[int], timeout_s: float
) -> dict[tuple[int, int], bytes]:
    consumer.assign([TopicPartition(topic, p, 0) for p in range(len(ends))])
    records: dict[tuple[int, int], bytes] = {}
    done = {p for p, end in enumerate(ends) if end <= 0}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(ends):
        assert time.monotonic() < deadline, (
            f"read of {topic} unfinished after {timeout_s}s: ends {ends}, done {sorted(done)}, "
            f"{len(records)} records"
        )
        for message in consumer.consume(500, 0.2):
            partition = message.partition()
            error = message.error()
            if error is not None:
                assert error.code() == -191, error  # _PARTITION_EOF
                if message.offset() >= ends[partition]:
                    done.add(partition)
                continue
            if message.offset() < ends[partition]:
                key = (partition, message.offset())
                assert key not in records, f"{topic} {key} read twice"
                records[key] = message.value()
            if message.offset() + 1 >= ends[partition]:
                done.add(partition)
    return records


def assert_acknowledged_once(
    acknowledged: list[tuple[int, int | None, bytes]], stored: dict[tuple[int, int], bytes]
) -> None:
    """Every acknowledged (partition, offset, value) is stored at that offset, and no value
    is stored twice (the producers write each value once: a duplicate is a resend that the
    idempotent producer's broker side should have dropped). An offset of None is an
    acknowledgement without one: librdkafka's implicit ack (a request whose answer was lost,
    then a later request of the same producer acknowledged, which proves the first was
    appended); that value must be in its partition."""
    in_partition = {(p, v) for (p, _), v in stored.items()}
    missing = [
        (p, o, v)
        for p, o, v in acknowledged
        if (stored.get((p, o)) != v if o is not None else (p, v) not in in_partition)
    ]
    shown = [(p, o, v, None if o is None else stored.get((p, o))) for p, o, v in missing[:10]]
    assert not missing, f"{len(missing)} acknowledged records not at their offsets: {shown}"
    positions: dict[bytes, list[tuple[int, int]]] = {}
    for key, value in stored.items():
        positions.setdefault(value, []).append(key)
    twice = {v: k for v, k in positions.items() if len(k) > 1}
    assert not twice, f"{len(twice)} values stored more than once: {list(twice.items())[:10]}"


# Load ----------------------------------------------------------------------------------------

_LOAD_RUN_LIMIT_S = 120.0  # a load thread stops by itself after this, by default
_LOAD_RATE_PER_S = 400.0  # records offered per second by default: 3 nodes share the cores
_LOAD_FLUSH_TIMEOUT_S = 60.0  # what is in flight when the load stops, delivered


class Load:
    """A producer thread writing `00000000`, `00000001`, ... round-robin over the partitions
    (so every partition gets a steady stream) with acks=all, recording every acknowledgement:
    `acknowledged` (partition, offset, value) and `acks` (monotonic time, partition, offset).
    Subclasses drive one client library (`_run`: produce until `stopping` is set, then flush).
    `with Load(...) as load:` starts it; leaving the block stops it and waits for the flush,
    failing if a record was refused or left undelivered. `rate_per_s`: records offered per
    second at most; `run_limit_s`: the thread stops producing by itself after this long."""

    client = "?"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate_per_s: float = _LOAD_RATE_PER_S,
        run_limit_s: float = _LOAD_RUN_LIMIT_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate_per_s = rate_per_s
        self.run_limit_s = run_limit_s
        self.acknowledged: list[tuple[int, int | None, bytes]] = []  # None: offset unknown
        self.acks: list[tuple[float, int, int]] = []
        self.errors: list[str] = []
        self.sent = 0
        self.undelivered = 0  # left when the flush gave up
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._guarded_run, name=f"load-{self.client}")
        self._crash: BaseException | None = None

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._thread.join(timeout=_LOAD_FLUSH_TIMEOUT_S + 30)
        assert not self._thread.is_alive(), f"{self.client} load did not stop"
        if exc[0] is None:
            assert self._crash is None, f"{self.client} load crashed: {self._crash!r}"
            assert not self.errors, f"{self.client}: {len(self.errors)} refused: {self.errors[:5]}"
            assert self.undelivered == 0, f"{self.client}: {self.undelivered} undelivered"
        print(f"{self.client}: sent {self.sent}, acknowledged {len(self.acknowledged)}")

    def record(self, sequence: int) -> tuple[int, bytes]:
        """The partition and value of the `sequence`th record."""
        return sequence % self.partitions, f"{sequence:08d}".encode()

    def acknowledge(self, partition: int, offset: int | None, value: bytes) -> None:
        self.acknowledged.append((partition, offset, value))
        if offset is not None:  # an implicit acknowledgement has no offset to time
            self.acks.append((time.monotonic(), partition, offset))

    def pause_s(self, started: float) -> float:
        """How long to sleep so that no more than `rate_per_s` records are offered per second
        since `started`."""
        return max(0.0, self.sent / self.rate_per_s - (time.monotonic() - started))

    def running_out(self, started: float) -> bool:
        return self.stopping.is_set() or time.monotonic() - started > self.run_limit_s

    def wait_acks(self, count: int, timeout_s: float = 60.0) -> None:
        """Until `count` records in all are acknowledged."""
        wait_until(lambda: len(self.acknowledged) >= count or self._crash, timeout_s,
                   f"{count} acknowledgements from {self.client}")  # fmt: skip
        assert self._crash is None, f"{self.client} load crashed: {self._crash!r}"

    def last_offset(self, partition: int) -> int:
        return max((o for _, p, o in list(self.acks) if p == partition), default=-1)

    def wait_ack_after(
        self, partition: int, since: float, above: int, timeout_s: float = 60.0
    ) -> float:
        """When the first acknowledgement on `partition` of an offset above `above` arrived
        after `since` (monotonic), waiting for one up to `timeout_s`."""

        def first() -> float | None:
            times = [t for t, p, o in list(self.acks) if p == partition and o > above
                     and t > since]  # fmt: skip
            return min(times) if times else None

        return wait_until(first, timeout_s, f"{self.topic}-{partition} acknowledged again "
                                            f"({self.client})", every_s=0.02)  # fmt: skip

    def first_ack_at_or_above(self, partition: int, offset: int) -> float | None:
        """When the first acknowledgement of an offset at or above `offset` arrived."""
        times = [t for t, p, o in list(self.acks) if p == partition and o >= offset]
        return min(times, default=None)

    def longest_gap_s(self, partition: int, since: float, until: float) -> float:
        """The longest time between consecutive acknowledgements on `partition` that
        arrived between `since` and `until` (monotonic), the ends counting as arrivals."""
        times = sorted(t for t, p, _ in list(self.acks) if p == partition and since < t < until)
        edges = [since, *times, until]
        return max(b - a for a, b in zip(edges, edges[1:], strict=False))

    def print_recovery(
        self, partition: int, since: float, new_leader_offset: int | None, event: str
    ) -> None:
        """Print how long `partition` went without acknowledgements after `event` (at
        `since`): until the first acknowledgement of a record the new leader wrote (its first
        offset in a later epoch), and the longest pause between acknowledgements up to it.
        Acknowledgements just after `since` may be answers the old leader sent before it."""
        back_at = None
        if new_leader_offset is not None:
            back_at = self.first_ack_at_or_above(partition, new_leader_offset)
        if back_at is None:
            print(f"{self.client}: {self.topic}-{partition}: no acknowledgement of a record "
                  f"the new leader wrote (its first offset: {new_leader_offset})")  # fmt: skip
            return
        print(f"{self.client}: {self.topic}-{partition} after {event}: first acknowledgement "
              f"of a record the new leader wrote (offset {new_leader_offset}) "
              f"{back_at - since:.2f}s later; longest pause between acknowledgements "
              f"{self.longest_gap_s(partition, since, back_at + 0.001):.2f}s")  # fmt: skip

    def _guarded_run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by __exit__ and wait_acks
            self._crash = e

    def _run(self) -> None:
        raise NotImplementedError


class ConfluentLoad(Load):
    """The load through confluent-kafka (librdkafka), idempotent unless told otherwise."""

    client = "confluent-kafka"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate_per_s: float = _LOAD_RATE_PER_S,
        run_limit_s: float = _LOAD_RUN_LIMIT_S,
        **conf: Any,
    ) -> None:
        super().__init__(bootstrap, topic, partitions, rate_per_s, run_limit_s)
        self.conf = {
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 60_000, "request.timeout.ms": 10_000,
            **conf,
        }  # fmt: skip

    def _on_delivery(self, err: Any, message: Any) -> None:
        if err is None:
            self.acknowledge(message.partition(), message.offset(), message.value())
        else:
            self.errors.append(f"{message.partition()}: {message.value()!r}: {err}")

    def _run(self) -> None:
        producer = Producer(self.conf)
        started = time.monotonic()
        while not self.running_out(started):
            partition, value = self.record(self.sent)
            try:
                producer.produce(self.topic, value=value, partition=partition,
                                 on_delivery=self._on_delivery)  # fmt: skip
                self.sent += 1
            except BufferError:
                producer.poll(0.01)  # the client's queue is full: let it drain
            producer.poll(0)
            time.sleep(self.pause_s(started))
        self.undelivered = producer.flush(_LOAD_FLUSH_TIMEOUT_S)


def cluster_fixture(root: Path, *extra_args: str, link_proxies: bool = False,
                    size: int = 3) -> Iterator[Cluster]:
    """Body of a fixture: a started cluster of `size` nodes (with a link proxy per ordered
    node pair if asked), killed in teardown with its log tails printed."""
    cluster = Cluster(root, size, 1, *extra_args, link_proxies=link_proxies)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        cluster.print_log_tails()
