"""`krill cluster up`, `health` and `info`: a local cluster to try, and how a cluster is.

`up -n N` starts N local nodes as `krill start` processes, each in its own process group with
ports at the bases plus (i - 1) x 100 and every node a seed, waits until each answers ready
and stays in the foreground; SIGINT/SIGTERM stops them all. A node that exits on its own is
reported and the others keep running.

`health` reads the admin API (`/v1/cluster/health_overview`, shards/admin.py) as rpk's does
and exits 1 when the cluster is not healthy, so a script can wait on it. For a node of its own
that is the node's answer. In a cluster (a node's answer names the controller) it also reads
Kafka Metadata from the nodes it reached: unhealthy when a partition has no leader or fewer
in-sync replicas than replicas, or a node is down (a broker whose admin API does not answer).

`info` reads Kafka metadata (brokers, controller, each partition's leader, replicas and ISR)
like any client, each node's `/v1/node` and `/v1/status/ready`, and each node's
`/v1/partitions` for a leader's view of its followers (lag: the offsets a follower lacks of
the leader's log, its log end less the end of the follower's match; 0 once caught up).

The admin addresses are `--admin` (several, for `up`'s nodes on one host), else each broker's
host on port 9644: the bootstrap brokers', and in a cluster every broker's in Metadata.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shards import limits
from shards.cli_client import (
    CLIENT_FLAGS_GIVEN,
    DEFAULT_ADMIN_PORT,
    Client,
    CommandError,
    admin_addresses,
    admin_argument,
    brokers_argument,
    cluster_metadata,
    default_admin_addresses,
    print_table,
    request_timeout_s,
)

__all__ = ["add_cluster_commands", "ask_all_quiet", "cluster_overview", "follower_lags",
           "partition_rows"]

EXIT_UNHEALTHY = 1

# `cluster up` ------------------------------------------------------------------------------
# Node i's ports are the bases plus (i - 1) x this: room for up to this many shards' RPC ports.
UP_PORT_STEP = 100
# A local cluster for trying things out: a handful of nodes, each a process per shard.
UP_NODES_MAX = 9
# Time every node has to answer /v1/status/ready: interpreter start-up, recovery of a data
# directory used before, the controller's first election.
UP_READY_TIMEOUT_S = 60.0
# Time a node has to stop on SIGTERM before its process group is killed: its supervisor's own
# wait on its shards plus a margin.
UP_STOP_TIMEOUT_S = limits.shard_stop_timeout_s + 10.0
# How often the foreground loop looks at its nodes (a signal wakes it at once).
UP_POLL_S = 0.5
UP_READY_REQUEST_TIMEOUT_S = 2.0  # one /v1/status/ready asked of a node still starting
# Flags `up` sets for each node itself: passing one after `--` is a mistake.
UP_OWN_FLAGS = ("--node-id", "--seeds", "--data-dir", "--listen", "--advertise", "--rpc-port",
                "--rpc-listen", "--admin-port", "--admin-listen", "--reader-listen", "--smp")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def add_cluster_commands(subparsers: Any) -> Any:
    """The `cluster` command and its subcommands; the subcommands' parsers (shards/move_cli.py
    adds `partitions` to them)."""
    cluster = subparsers.add_parser("cluster", help="cluster health and information")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    p = commands.add_parser("health", help="healthy or not: nodes down, leaderless partitions")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=health)
    p = commands.add_parser("info", help="brokers, controller, partitions and lag; each node")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=info)
    for parser in (cluster, *commands.choices.values()):
        brokers_argument(parser)
        admin_argument(parser)
    _add_up(commands)
    return commands


def _add_up(commands: Any) -> None:
    p = commands.add_parser(
        "up", help="start N local nodes in the foreground, for trying it out",
        description="Start N local nodes, each a `krill start` with node id i, data in "
                    "DIR/node-i (log: DIR/node-i/krill.log) and ports at the bases plus "
                    f"(i - 1) x {UP_PORT_STEP}. Settings for every node go after `--`, e.g. "
                    "`krill cluster up -n 3 -- --log-level debug`.")
    p.add_argument("-n", "--nodes", type=functools.partial(_bounded_int, "-n", 1, UP_NODES_MAX),
                   default=3, metavar="N", help="nodes (default 3)")
    p.add_argument("--data-dir", default="./cluster", metavar="DIR",
                   help="one directory per node under it (default ./cluster)")
    for name, default, what in (("kafka", 9092, "Kafka"), ("rpc", 33145, "node RPC"),
                                ("admin", DEFAULT_ADMIN_PORT, "admin HTTP"),
                                ("reader", 9093, "Spark reader")):
        flag = f"--{name}-port"
        p.add_argument(flag, type=functools.partial(_bounded_int, flag, 1, 65535),
                       default=default, metavar="PORT",
                       help=f"node 1's {what} port (default {default})")
    p.add_argument("--smp", type=functools.partial(_bounded_int, "--smp", 1, UP_PORT_STEP),
                   default=1, metavar="N", help="shards per node (default 1)")
    p.add_argument("node_args", nargs="*", metavar="-- NODE SETTINGS",
                   help="flags of `krill start` for every node")
    p.set_defaults(func=functools.partial(up, parser=p))


def _bounded_int(what: str, low: int, high: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{what} must be {low}..{high}, not {value}")
    return value


# `cluster up` --------------------------------------------------------------------------------


@dataclass
class _LocalNode:
    """One node `up` started, and what it printed of it."""

    node_id: int
    data_dir: Path
    kafka: str
    admin: str
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    log_offset: int = 0  # where this run's lines start in its log
    reported: bool = field(default=False)  # its exit was told

    @property
    def log_path(self) -> Path:
        return self.data_dir / "krill.log"

    def last_log_line(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        last = lines[-1].strip() if lines else ""
        return last.removeprefix("krill: error: ")  # a refused start's one line


def up(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    given = getattr(args, CLIENT_FLAGS_GIVEN, None)
    if given:
        parser.error(f"{'/'.join(given)} is for client commands; `cluster up` starts nodes")
    for arg in args.node_args:
        if arg.split("=", 1)[0] in UP_OWN_FLAGS:
            parser.error(f"{arg.split('=', 1)[0]} is set by `cluster up` for each node; use "
                         "its own flags")
    last = (args.nodes - 1) * UP_PORT_STEP
    for name in ("kafka_port", "rpc_port", "admin_port", "reader_port"):
        if getattr(args, name) + last + (args.smp if name == "rpc_port" else 1) - 1 > 65535:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} leaves no room for "
                         f"{args.nodes} nodes' ports (+{UP_PORT_STEP} each)")
    nodes = _plan(args)
    stopping = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for node in nodes:
            _start(node)
        for node in nodes:
            assert node.process is not None
            print(f"node {node.node_id}: kafka {node.kafka}, admin {node.admin}, "
                  f"pid {node.process.pid}, log {node.log_path}", flush=True)
        print(f"bootstrap: {','.join(n.kafka for n in nodes)}", flush=True)
        _wait_ready(nodes, stopping)
        if not stopping.is_set():
            print(f"ready: krill -b {nodes[0].kafka} --admin "
                  f"{','.join(n.admin for n in nodes)} cluster info", flush=True)
        _foreground(nodes, stopping)
        print(f"stopping {len(nodes)} node(s)", flush=True)
    finally:
        _stop(nodes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _plan(args: argparse.Namespace) -> list[_LocalNode]:
    root = Path(args.data_dir).resolve()
    host = "127.0.0.1"
    step = [(i, (i - 1) * UP_PORT_STEP) for i in range(1, args.nodes + 1)]
    seeds = ",".join(f"{i}@{host}:{args.rpc_port + off}" for i, off in step)
    nodes = []
    for i, off in step:
        data_dir = root / f"node-{i}"
        kafka, admin = f"{host}:{args.kafka_port + off}", f"{host}:{args.admin_port + off}"
        command = [
            sys.executable, "-m", "shards.cli", "start", "--node-id", str(i),
            "--data-dir", str(data_dir), "--listen", kafka, "--admin-listen", admin,
            "--rpc-listen", f"{host}:{args.rpc_port + off}",
            "--reader-listen", f"{host}:{args.reader_port + off}", "--smp", str(args.smp),
            "--seeds", seeds, "--default-replicas", str(min(3, args.nodes)), *args.node_args,
        ]  # fmt: skip
        nodes.append(_LocalNode(i, data_dir, kafka, admin, command))
    return nodes


def _start(node: _LocalNode) -> None:
    node.data_dir.mkdir(parents=True, exist_ok=True)
    with open(node.log_path, "ab") as log:
        node.log_offset = log.tell()
        # Its own session: the terminal's ^C reaches `up` alone, which stops the nodes in
        # order; and its whole process group (supervisor and shards) can be killed at once.
        node.process = subprocess.Popen(
            node.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip


def _die_with_parent() -> None:
    """In the child: SIGTERM it when `up` dies, however it dies (kill -9 included)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _exit_words(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _wait_ready(nodes: list[_LocalNode], stopping: threading.Event) -> None:
    """Until every node's admin API answers ready; CommandError (one line) if a node exits
    first or is not ready in time."""
    deadline = time.monotonic() + UP_READY_TIMEOUT_S
    waiting = list(nodes)
    while waiting and not stopping.is_set():
        for node in list(waiting):
            assert node.process is not None
            code = node.process.poll()
            if code is not None:
                why = node.last_log_line()
                raise CommandError(f"node {node.node_id} {_exit_words(code)} at start"
                                   + (f": {why}" if why else f"; see {node.log_path}"))
            if _ready(node.admin):
                waiting.remove(node)
        if waiting and time.monotonic() > deadline:
            raise CommandError(f"node {waiting[0].node_id} was not ready within "
                               f"{UP_READY_TIMEOUT_S:.0f}s; see {waiting[0].log_path}")
        stopping.wait(0.1 if waiting else 0)


def _ready(admin: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{admin}/v1/status/ready",
                                    timeout=UP_READY_REQUEST_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):  # 503 (booting) is an HTTPError, an OSError
        return False


def _foreground(nodes: list[_LocalNode], stopping: threading.Event) -> None:
    while not stopping.wait(UP_POLL_S):
        for node in nodes:
            assert node.process is not None
            code = node.process.poll()
            if code is not None and not node.reported:
                node.reported = True
                left = sum(n.process is not None and n.process.poll() is None for n in nodes)
                print(f"node {node.node_id} (pid {node.process.pid}) {_exit_words(code)}; "
                      f"{left} node(s) keep running; see {node.log_path}", flush=True)
        if all(n.reported for n in nodes):
            raise CommandError("every node has exited")


def _stop(nodes: list[_LocalNode]) -> None:
    """SIGTERM every node, then SIGKILL the process group of any still there after
    UP_STOP_TIMEOUT_S (and of any whose shards outlived it)."""
    started = [n.process for n in nodes if n.process is not None]
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + UP_STOP_TIMEOUT_S
    for process in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group: shards the supervisor left
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()


# `cluster health` and `cluster info` -----------------------------------------------------------


def _get(address: str, path: str) -> tuple[int, Any]:
    """(status, decoded JSON) of GET http://address/path; CommandError if unreachable."""
    url = f"http://{address}{path}"
    try:
        with urllib.request.urlopen(url, timeout=request_timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:  # 503 and friends still carry a JSON body
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, None
    except http.client.HTTPException as e:  # something answers there, but not HTTP
        raise CommandError(
            f"what answers at {address} is not the admin API ({type(e).__name__})"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = " ".join(str(getattr(e, "reason", e)).split())
        raise CommandError(f"cannot reach the admin API at {address}: {reason}") from None


def _ask_all(addresses: list[str], path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """GET `path` of every admin address: ({address: JSON}, {address: why not}). When none
    answers, the first failure is raised as it is."""
    answers: dict[str, Any] = {}
    failures: dict[str, str] = {}
    first: CommandError | None = None
    for address in addresses:
        try:
            status, body = _get(address, path)
        except CommandError as e:
            failures[address] = str(e)
            first = first or e
            continue
        if status != 200 or not isinstance(body, dict):
            failures[address] = f"the admin API at {address} gave no answer to {path}"
            first = first or CommandError(failures[address])
            continue
        answers[address] = body
    if not answers and first is not None:
        raise first
    return answers, failures


def _partitions(metadata: Any) -> list[tuple[str, int, Any]]:
    return sorted((name, index, p) for name, t in metadata.topics.items()
                  for index, p in t.partitions.items())


def health(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    overviews, failures = _ask_all(admin_addresses(args), "/v1/cluster/health_overview")
    if not any("controller" in o for o in overviews.values()):  # a node of its own
        if failures:
            raise CommandError(next(iter(failures.values())))
        overview = next(iter(overviews.values()))
    else:
        overview = _cluster_health(args, overviews, failures)
    if args.format == "json":
        json.dump(overview, out, indent=1)
        out.write("\n")
    else:
        _print_health(overview, out)
    return 0 if overview["is_healthy"] else EXIT_UNHEALTHY


def _cluster_health(
    args: argparse.Namespace, overviews: dict[str, Any], failures: dict[str, str]
) -> dict[str, Any]:
    """Every node's answer and Kafka Metadata (read from the nodes reached) as one overview."""
    nodes, _ = _ask_all(list(overviews), "/v1/node")
    client = Client(",".join(dict.fromkeys(n["kafka"] for n in nodes.values())))
    metadata = cluster_metadata(client, client.admin())
    if not args.admin:  # every broker's host, beyond the bootstrap brokers'
        more = [a for a in default_admin_addresses(b.host for b in metadata.brokers.values())
                if a not in overviews and a not in failures]
        if more:
            extra, extra_failures = ask_all_quiet(more, "/v1/cluster/health_overview")
            overviews.update(extra)
            failures.update(extra_failures)
    return cluster_overview(list(overviews.values()), sorted(failures), metadata)


def cluster_overview(overviews: list[dict[str, Any]], unreachable: list[str],
                     metadata: Any) -> dict[str, Any]:
    """The cluster's health from its nodes' overviews (shards/admin.py), the admin addresses
    that did not answer, and Kafka Metadata (brokers, controller_id, topics' partitions with
    leader, replicas, isrs). A node is down when it is a broker or a registered node and no
    answer says it serves; a partition is leaderless with leader -1 (or when a replica of it
    knows no leader), under-replicated with fewer in-sync replicas than replicas (in Metadata,
    or as its leader's overview says)."""
    registered = {n for o in overviews for n in o.get("all_nodes", ())}
    all_nodes = sorted(set(metadata.brokers) | registered)
    serving = {o["node_id"] for o in overviews if "node_id" in o and not o["nodes_down"]}
    leaderless = {(p["topic"], p["partition"]) for o in overviews
                  for p in o["leaderless_partitions"]}
    under = {(p["topic"], p["partition"]) for o in overviews
             for p in o.get("under_replicated_partitions", ())}
    for topic, index, p in _partitions(metadata):
        if p.leader < 0:
            leaderless.add((topic, index))
        elif len(p.isrs) < len(p.replicas):
            under.add((topic, index))
    listed = limits.health_partitions_listed_max
    nodes_down = [n for n in all_nodes if n not in serving]
    shards_down = sorted({(o["node_id"], s) for o in overviews for s in o["shards_down"]})
    return {
        "is_healthy": not (nodes_down or shards_down or leaderless or under or unreachable)
        and metadata.controller_id >= 0,
        "controller_id": metadata.controller_id,
        "all_nodes": all_nodes,
        "nodes_down": nodes_down,
        "shards_down": [{"node": n, "shard": s} for n, s in shards_down],
        "admin_unreachable": unreachable,
        "leaderless_count": len(leaderless),
        "leaderless_partitions": [{"topic": t, "partition": p}
                                  for t, p in sorted(leaderless)[:listed]],
        "under_replicated_count": len(under),
        "under_replicated_partitions": [{"topic": t, "partition": p}
                                        for t, p in sorted(under)[:listed]],
    }


def ask_all_quiet(addresses: list[str], path: str) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        return _ask_all(addresses, path)
    except CommandError as e:
        return {}, {address: str(e) for address in addresses}


def _print_health(overview: dict[str, Any], out: IO[str]) -> None:
    def names(partitions: list[dict[str, Any]]) -> str:
        return ", ".join(f"{p['topic']}/{p['partition']}" for p in partitions) or "[]"

    shards = overview["shards_down"]
    rows = [
        ["Healthy:", str(overview["is_healthy"]).lower()],
        ["Controller ID:", overview["controller_id"]],
        ["All nodes:", overview["all_nodes"]],
        ["Nodes down:", overview["nodes_down"]],
        ["Shards down:", shards if not shards or isinstance(shards[0], int)
         else ", ".join(f"{s['node']}/{s['shard']}" for s in shards)],
    ]
    if "admin_unreachable" in overview:
        rows.append(["Admin unreachable:", ", ".join(overview["admin_unreachable"]) or "[]"])
    rows += [
        [f"Leaderless partitions ({overview['leaderless_count']}):",
         names(overview["leaderless_partitions"])],
        [f"Under-replicated partitions ({overview['under_replicated_count']}):",
         names(overview["under_replicated_partitions"])],
    ]
    out.write("CLUSTER HEALTH OVERVIEW\n=======================\n")
    print_table(rows, out)


def info(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    client = Client(args.brokers)
    metadata = cluster_metadata(client, client.admin())
    addresses = admin_addresses(args)
    if not args.admin and len(metadata.brokers) > 1:  # a cluster: every broker's host
        addresses = list(dict.fromkeys(
            addresses + default_admin_addresses([b.host for b in metadata.brokers.values()])))
    described, failures = _ask_all(addresses, "/v1/node")
    nodes = []
    for address in addresses:
        if address in failures:
            nodes.append({"admin": address, "ready": False, "status": "unreachable"})
            continue
        status, ready = _get(address, "/v1/status/ready")
        nodes.append({**described[address], "admin": address, "ready": status == 200,
                      "status": (ready or {}).get("status")})
    replicated = ask_all_quiet(list(described), "/v1/partitions")[0]
    partitions = partition_rows(metadata, list(replicated.values()))
    topics = sorted(
        (name, len(t.partitions), len(next(iter(t.partitions.values())).replicas)
         if t.partitions else 0)
        for name, t in metadata.topics.items()
    )
    if args.format == "json":
        json.dump({
            "cluster_id": metadata.cluster_id,
            "controller_id": metadata.controller_id,
            "brokers": [{"id": b.id, "host": b.host, "port": b.port}
                        for b in sorted(metadata.brokers.values(), key=lambda b: b.id)],
            "nodes": nodes,
            "topics": [{"name": n, "partitions": p, "replicas": r} for n, p, r in topics],
            "partitions": partitions,
        }, out, indent=1)
        out.write("\n")
        return 0
    _print_info(metadata, nodes, topics, partitions, out)
    return 0


def partition_rows(metadata: Any, replicated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each partition's leader, replicas and ISR from Metadata; lag per follower (the
    offsets of the leader's log it lacks: the leader's log end, its next offset, less the
    follower's match, its last offset, plus one) from the nodes' /v1/partitions answers (the
    leader of the highest term where two claim it)."""
    lags = follower_lags(replicated)
    rows = []
    for topic, index, p in _partitions(metadata):
        lag = lags.get((topic, index), {})
        rows.append({"topic": topic, "partition": index, "leader": p.leader,
                     "replicas": list(p.replicas), "isr": list(p.isrs), "lag": lag})
    return rows


def follower_lags(replicated: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, int]]:
    """Each replicated partition's followers (node ids as text) and the offsets of its
    leader's log each lacks, from the nodes' /v1/partitions answers (the leader of the
    highest term where two claim it)."""
    leaders: dict[tuple[str, int], dict[str, Any]] = {}
    for answer in replicated:
        for r in answer.get("partitions", ()):
            key = (r["topic"], r["partition"])
            if r["role"] == "leader" and r["term"] >= leaders.get(key, {}).get("term", -1):
                leaders[key] = r
    return {key: {node: max(0, r["log_end"] - (matched + 1))
                  for node, matched in r["followers"].items()}
            for key, r in leaders.items()}


def _print_info(
    metadata: Any, nodes: list[dict[str, Any]], topics: list[tuple[str, int, int]],
    partitions: list[dict[str, Any]], out: IO[str],
) -> None:
    out.write(f"CLUSTER\n=======\n{metadata.cluster_id}\n\nBROKERS\n=======\n")
    print_table([["ID", "HOST", "PORT"]] + [
        [f"{b.id}*" if b.id == metadata.controller_id else b.id, b.host, b.port]
        for b in sorted(metadata.brokers.values(), key=lambda b: b.id)
    ], out)
    out.write("\nNODES\n=====\n")
    print_table([["ID", "ADMIN", "STATUS", "SHARDS", "UPTIME"]] + [
        [n.get("node_id", "?"), n["admin"], n["status"] or "?", n.get("shards", "?"),
         f"{n['uptime_s']:.0f}s" if "uptime_s" in n else "?"]
        for n in nodes
    ], out)
    out.write("\nTOPICS\n======\n")
    print_table([["NAME", "PARTITIONS", "REPLICAS"]] + [list(t) for t in topics], out)
    out.write("\nPARTITIONS\n==========\n")
    print_table([["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "LAG"]] + [
        [p["topic"], p["partition"], p["leader"], ",".join(map(str, p["replicas"])) or "-",
         ",".join(map(str, p["isr"])) or "-",
         ",".join(f"{n}:{lag}" for n, lag in p["lag"].items()) or "-"]
        for p in partitions
    ], out)
