"""`krill cluster health` and `krill cluster info`: how the node is, read from the outside.

`health` reads the admin API (`/v1/cluster/health_overview`, shards/admin.py) as rpk's does
and exits 1 when the cluster is not healthy, so a script can wait on it. `info` reads Kafka
metadata (brokers, controller, topics) like any client, and each node's `/v1/node` and
`/v1/status/ready` from its admin API. The admin address is `--admin`, else each bootstrap
broker's host on port 9644.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request
from typing import IO, Any

from shards.cli_client import (
    Client,
    CommandError,
    admin_addresses,
    admin_argument,
    brokers_argument,
    cluster_metadata,
    print_table,
    request_timeout_s,
)

__all__ = ["add_cluster_commands"]

EXIT_UNHEALTHY = 1


def add_cluster_commands(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="cluster health and information")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    p = commands.add_parser("health", help="healthy or not: nodes down, leaderless partitions")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=health)
    p = commands.add_parser("info", help="brokers, controller, topics; each node's state")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=info)
    for parser in (cluster, *commands.choices.values()):
        brokers_argument(parser)
        admin_argument(parser)


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


def health(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    answers = []
    for address in admin_addresses(args):
        _, overview = _get(address, "/v1/cluster/health_overview")
        if not isinstance(overview, dict):
            raise CommandError(f"the admin API at {address} gave no health overview")
        answers.append(overview)
    overview = answers[0]
    if args.format == "json":
        json.dump(overview, out, indent=1)
        out.write("\n")
    else:
        leaderless = overview["leaderless_partitions"]
        rows = [
            ["Healthy:", str(overview["is_healthy"]).lower()],
            ["Controller ID:", overview["controller_id"]],
            ["All nodes:", overview["all_nodes"]],
            ["Nodes down:", overview["nodes_down"]],
            ["Shards down:", overview["shards_down"]],
            [f"Leaderless partitions ({overview['leaderless_count']}):",
             ", ".join(f"{p['topic']}/{p['partition']}" for p in leaderless) or "[]"],
            [f"Under-replicated partitions ({overview['under_replicated_count']}):", "[]"],
        ]
        out.write("CLUSTER HEALTH OVERVIEW\n=======================\n")
        print_table(rows, out)
    return 0 if overview["is_healthy"] else EXIT_UNHEALTHY


def info(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    client = Client(args.brokers)
    admin = client.admin()
    metadata = cluster_metadata(client, admin)
    nodes = []
    for address in admin_addresses(args):
        status, ready = _get(address, "/v1/status/ready")
        _, node = _get(address, "/v1/node")
        nodes.append({**(node or {}), "admin": address, "ready": status == 200,
                      "status": (ready or {}).get("status")})
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
        }, out, indent=1)
        out.write("\n")
        return 0
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
    return 0
