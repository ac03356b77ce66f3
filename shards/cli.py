"""The `krill` command: `krill start` runs a node, `krill topic ...` talks to one.

Every user mistake ends in exactly one stderr line, `krill: error: <what>`, and exit code 2
for a usage or configuration mistake or 1 for a runtime failure (broker unreachable, topic
missing). argparse's multi-line usage dump is replaced by that one line; `--help` still
prints the full help. Tracebacks are for our own bugs only.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from shards.cli_client import CLIENT_FLAGS_GIVEN, admin_argument, brokers_argument
from shards.cluster_cli import add_cluster_commands
from shards.config import LOG_LEVELS, STORAGE_MODES, ConfigError, load_config
from shards.group_cli import add_group_commands
from shards.move_cli import add_partition_commands
from shards.topic_cli import CommandError, add_topic_commands

__all__ = ["main"]

PROG = "krill"
EXIT_RUNTIME = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command-line mistake found by argparse; exit code 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised rather than printed."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')".replace("\n", " "))


def build_parser(
    more_commands: Callable[[argparse._SubParsersAction], None] | None = None,
) -> argparse.ArgumentParser:
    """The whole command line; `more_commands` adds those of a layer above shards (the
    `krill` script is `scenarios.cli:main`, which adds `scenario` and `bench`)."""
    parser = _Parser(prog=PROG, description="Krill: a Kafka-API streaming broker.")
    brokers_argument(parser, root=True)  # client commands' -b, wherever it is on the line
    admin_argument(parser, root=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    start = commands.add_parser("start", help="run a node in the foreground")
    start.add_argument("--data-dir", metavar="DIR", help="data directory (default ./data)")
    start.add_argument("--listen", metavar="HOST:PORT",
                       help="Kafka API address (default 127.0.0.1:9092)")
    start.add_argument("--advertise", metavar="HOST:PORT",
                       help="address given to clients (default: the listen address)")
    start.add_argument("--node-id", type=int, metavar="N", help="this node's id (default 0)")
    start.add_argument("--smp", type=int, metavar="N",
                       help="shard processes, one per core (default: all usable cores)")
    start.add_argument("--reader-listen", metavar="HOST:PORT",
                       help="Spark reader address (default 127.0.0.1:9093)")
    start.add_argument("--admin-port", type=int, metavar="PORT",
                       help="admin HTTP port: /metrics, /v1/status/ready (default 9644)")
    start.add_argument("--admin-listen", metavar="HOST:PORT",
                       help="admin HTTP address (default 127.0.0.1:9644)")
    start.add_argument("--disable-metrics", action="store_const", const=True,
                       help="record no metrics and serve no /metrics")
    start.add_argument("--rpc-port", type=int, metavar="PORT",
                       help="node RPC port of shard 0, shard k on PORT + k (default 33145)")
    start.add_argument("--rpc-listen", metavar="HOST:PORT",
                       help="node RPC address of shard 0 (default 127.0.0.1:33145)")
    start.add_argument("--seeds", metavar="[ID@]HOST:PORT,...",
                       help="RPC addresses of the cluster's nodes, this one included; without "
                            "ID@ the i-th is node i (default: none, a node of its own)")
    start.add_argument("--default-replicas", type=int, metavar="N",
                       help="replicas of topics created without a count (default 1; at most "
                            "the seeds)")
    start.add_argument("--default-partitions", type=int, metavar="N",
                       help="partitions of topics created without a count (default 1)")
    start.add_argument("--raft-election-timeout-ms", type=int, metavar="MS",
                       help="a follower without a leader campaigns after a random [MS, 2 MS) "
                            "(default 1000)")
    start.add_argument("--raft-heartbeat-interval-ms", type=int, metavar="MS",
                       help="the leader's heartbeat, the Raft tick (default 300)")
    start.add_argument("--replica-lag-time-max-ms", type=int, metavar="MS",
                       help="a follower not caught up with its leader for this long leaves "
                            "the in-sync replicas (Kafka's replica.lag.time.max.ms, default "
                            "30000)")
    start.add_argument("--learner-recovery-rate-bytes", type=int, metavar="BYTES",
                       help="bytes/s the node's Raft leaders send a partition move's new "
                            "replicas, its shards sharing it (0: unthrottled; default 32 MiB)")
    start.add_argument("--config", metavar="FILE",
                       help="YAML node config (env KRILL_CONFIG); flags and KRILL_* win")
    start.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                       help="default info")
    start.add_argument("--offsets-topic-partitions", type=int, metavar="N",
                       help="partitions of __consumer_offsets (default 50)")
    start.add_argument("--group-initial-rebalance-delay-ms", type=int, metavar="MS",
                       help="wait for more members before a new group's first rebalance "
                            "(default 3000)")
    start.add_argument("--log-retention-ms", type=int, metavar="MS",
                       help="retention.ms of topics that set none (default 7 days; -1: keep)")
    start.add_argument("--retention-bytes", type=int, metavar="BYTES",
                       help="retention.bytes of topics that set none (default -1: no limit)")
    start.add_argument("--log-cleanup-interval-ms", type=int, metavar="MS",
                       help="how often retention and compaction look (default 10000)")
    start.add_argument("--storage-min-free-bytes", type=int, metavar="BYTES",
                       help="refuse produces while the data disk has less free than this "
                            "(default 1 GiB; 0: no guard)")
    start.add_argument("--storage-mode", choices=STORAGE_MODES,
                       help="buffered: writes through the page cache (default); direct: "
                            "O_DIRECT writes from the shard's own memory, off the loop")
    start.add_argument("--direct-memory-bytes", type=int, metavar="BYTES",
                       help="direct mode: each shard's write memory and cache of recent "
                            "batches (default 64 MiB)")
    start.add_argument("--enable-failure-injection", action="store_const", const=True,
                       help="allow the admin API's /v1/failure-probes (tests, scenarios)")
    start.add_argument("--loop-stall-threshold-ms", type=int, metavar="MS",
                       help="log a shard loop turn this long with its stack, and count it "
                            "(default 10; 0: no watchdog)")
    start.add_argument("--trace-produce-every", type=int, metavar="N",
                       help="time one produce request in N stage by stage "
                            "(krill_produce_stage_seconds; default 0: none)")
    start.set_defaults(func=start_command)

    tuning = commands.add_parser(
        "tune", help="check the kernel settings a node's latency depends on (--apply: set them)")
    tuning.add_argument("--data-dir", metavar="DIR", default="data",
                        help="the node's data directory: its disk is checked (default ./data)")
    tuning.add_argument("--storage-mode", choices=STORAGE_MODES, default="buffered",
                        help="the node's storage mode: buffered adds vm.dirty_* (default)")
    tuning.add_argument("--apply", action="store_true",
                        help="set what is off, where this machine lets us; say what it did not")
    tuning.add_argument("--sysroot", metavar="DIR", default="/",
                        help="where /sys and /proc are (default /; tests use a tree of theirs)")
    tuning.set_defaults(func=tune_command)

    add_topic_commands(commands)
    add_group_commands(commands)
    add_partition_commands(add_cluster_commands(commands))
    if more_commands is not None:
        more_commands(commands)
    return parser


def start_command(args: argparse.Namespace) -> int:
    given = getattr(args, CLIENT_FLAGS_GIVEN, None)
    if given:  # a node is told where to listen, not which brokers to reach
        raise UsageError(
            f"{'/'.join(given)} is for client commands; a node takes --listen and "
            "--admin-listen (see 'krill start --help')"
        )
    config_file = args.config or os.environ.get("KRILL_CONFIG") or None
    try:
        config = load_config(args, os.environ, config_file)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from shards import supervisor  # the node runtime: heavy, and only `start` needs it

    return supervisor.run(config)


def tune_command(args: argparse.Namespace) -> int:
    """One line per setting; exit 1 while one is off (after --apply: one it could not set)."""
    from pathlib import Path

    from shards import tune

    root = Path(args.sysroot)
    if not (root / "proc").is_dir() or not (root / "sys").is_dir():
        raise UsageError(f"--sysroot {root} has no proc/ and sys/")
    data_dir = Path(args.data_dir).absolute()
    check = tune.apply_all if args.apply else tune.check_all
    results = check(data_dir, args.storage_mode, root)
    for result in results:
        print(tune.format_result(result))
    return EXIT_RUNTIME if any(r.ok is False for r in results) else 0


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def main(
    argv: Sequence[str] | None = None,
    more_commands: Callable[[argparse._SubParsersAction], None] | None = None,
) -> int:
    parser = build_parser(more_commands)
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except CommandError as e:
        return _fail(str(e), EXIT_RUNTIME)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader went away (`krill topic consume t | head`): stop quietly. Point stdout
        # at devnull so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
