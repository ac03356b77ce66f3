"""`krill cluster partitions move` and `move-status`: partition moves (Kafka's reassignments)
from the command line (actors/cluster/moves.py says how a cluster carries them out).

    krill cluster partitions move orders/0 orders/1 --replicas 4,2,3   start, or redirect
    krill cluster partitions move orders/0 --cancel                     back where it began
    krill cluster partitions move-status [--format json]                the moves under way

`move` answers once the controller has recorded the moves (they run on in the background,
as `kafka-reassign-partitions.sh --execute` does); a partition refused is one line each, and
the exit code 1. `move-status` lists each move under way: its replicas now, the nodes it adds
and those leaving, and how far each node it adds is behind its leader (offsets, from the
leader's `/v1/partitions` on the admin API, read twice a second apart for a rate and an
ETA); nothing under way prints so and exits 0.

These speak AlterPartitionReassignments and ListPartitionReassignments through kafka-python's
admin client (librdkafka, behind the other commands, has neither), so they work against any
Kafka broker too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from shards.cli_client import (
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
from shards.cluster_cli import ask_all_quiet, follower_lags

__all__ = ["add_partition_commands", "move", "move_status"]

RATE_SAMPLE_S = 1.0  # move-status reads the followers' progress twice, this far apart
RETRY_S = 0.5  # a controller gone or changing: asked again this much later


def add_partition_commands(commands: Any) -> argparse.ArgumentParser:
    partitions = commands.add_parser("partitions", help="move partitions between nodes")
    sub = partitions.add_subparsers(dest="partitions_command", metavar="COMMAND",
                                    required=True)
    p = sub.add_parser("move", help="move partitions to other nodes (or cancel a move)",
                       description="Start, redirect or cancel moves of partitions; answers "
                                   "once the controller has recorded them.")
    p.add_argument("partitions", nargs="+", metavar="TOPIC/PARTITION", type=_topic_partition)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--replicas", type=_node_ids, metavar="N,N,...",
                      help="the node ids to hold the replicas, the preferred leader first")
    what.add_argument("--cancel", action="store_true", help="cancel the move under way")
    p.set_defaults(func=move)
    p = sub.add_parser("move-status", help="the moves under way and how far along they are")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=move_status)
    for parser in (partitions, *sub.choices.values()):
        brokers_argument(parser)
        admin_argument(parser)
    return partitions


def _topic_partition(text: str) -> tuple[str, int]:
    topic, sep, index = text.rpartition("/")
    if not sep or not topic or not index.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not TOPIC/PARTITION (e.g. orders/0)")
    return topic, int(index)


def _node_ids(text: str) -> list[int]:
    try:
        nodes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of node ids (e.g. 4,2,3)"
                                         ) from None
    if any(n < 0 for n in nodes):
        raise argparse.ArgumentTypeError(f"{text!r}: node ids are not negative")
    return nodes


def _ask_controller(brokers: str, what: str, ask: Callable[[Any], Any]) -> Any:
    """`ask(admin client)`, against the controller its Metadata names; a controller that is
    gone, or no longer leads, is asked again after fresh Metadata (a new admin client), until
    `request_timeout_s` has passed."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaConnectionError, KafkaError, NodeNotReadyError

    retriable = (KafkaConnectionError, NodeNotReadyError)
    deadline = time.monotonic() + request_timeout_s
    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=brokers.split(","),
                                     request_timeout_ms=int(request_timeout_s * 1000),
                                     client_id="krill-cli")
            try:
                return ask(admin)
            finally:
                admin.close()
        except KafkaError as e:
            if not (isinstance(e, retriable) or getattr(e, "retriable", False)) \
                    or time.monotonic() >= deadline:
                raise CommandError(f"{what}: {type(e).__name__}: {e}") from None
        time.sleep(RETRY_S)


def move(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    from kafka import TopicPartition

    wanted = None if args.cancel else args.replicas
    results = _ask_controller(
        args.brokers, "the move was not recorded",
        lambda admin: admin.alter_partition_reassignments(
            {TopicPartition(topic, index): wanted for topic, index in args.partitions}))
    failed = 0
    for topic, index in args.partitions:
        error = results.get(TopicPartition(topic, index), "no answer for it")
        if error is None:
            what = "cancelled" if wanted is None else "moving to " + _nodes(wanted)
            out.write(f"{topic}/{index}: {what}\n")
        else:
            failed += 1
            name = getattr(error, "__name__", str(error))
            out.write(f"{topic}/{index}: refused: {name}\n")
    return 1 if failed else 0


def move_status(args: argparse.Namespace, out: IO[str] = sys.stdout) -> int:
    moves = _ask_controller(args.brokers, "cannot list the moves",
                            lambda admin: admin.list_partition_reassignments())
    addresses = admin_addresses(args)
    if moves and not args.admin:  # every broker's admin API (as `krill cluster info`)
        client = Client(args.brokers)
        hosts = [b.host for b in cluster_metadata(client, client.admin()).brokers.values()]
        addresses = list(dict.fromkeys(addresses + default_admin_addresses(hosts)))
    rows = []
    first = second = {}
    if moves:
        first = follower_lags(list(ask_all_quiet(addresses, "/v1/partitions")[0].values()))
        time.sleep(RATE_SAMPLE_S)
        second = follower_lags(list(ask_all_quiet(addresses, "/v1/partitions")[0].values()))
    for tp, move in sorted(moves.items(), key=lambda item: (item[0].topic, item[0].partition)):
        key = (tp.topic, tp.partition)
        behind = {}
        for node in move["adding_replicas"]:
            now, before = second.get(key, {}).get(str(node)), first.get(key, {}).get(str(node))
            rate = (before - now) / RATE_SAMPLE_S if now is not None and before is not None \
                else None
            eta = now / rate if now is not None and rate and rate > 0 else None
            behind[str(node)] = {"offsets_behind": now, "offsets_per_s": rate, "eta_s": eta}
        rows.append({"topic": tp.topic, "partition": tp.partition,
                     "replicas": move["replicas"], "adding": move["adding_replicas"],
                     "removing": move["removing_replicas"], "catching_up": behind})
    if args.format == "json":
        json.dump({"moves": rows}, out, indent=1)
        out.write("\n")
        return 0
    if not rows:
        out.write("no partition is being moved\n")
        return 0
    print_table([["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING", "BEHIND", "ETA"]] + [
        [r["topic"], r["partition"], _nodes(r["replicas"]), _nodes(r["adding"]),
         _nodes(r["removing"]),
         ",".join(f"{n}:{_or_dash(b['offsets_behind'])}" for n, b in r["catching_up"].items())
         or "-",
         ",".join(f"{n}:{_seconds(b['eta_s'])}" for n, b in r["catching_up"].items()) or "-"]
        for r in rows], out)
    return 0


def _nodes(nodes: list[int]) -> str:
    return ",".join(map(str, nodes)) or "-"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"
