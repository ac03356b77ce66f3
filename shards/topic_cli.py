"""`krill topic ...`: create, list, describe and delete topics; the commands' arguments.

Producing and consuming are in shards/topic_io_cli.py; the client set-up and the one-line
errors every command shares are in shards/cli_client.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import IO, Any

from shards.cli_client import (
    Client,
    CommandError,
    brokers_argument,
    cluster_metadata,
    describe_error,
    print_table,
    request_timeout_s,
    topic_metadata,
    wait,
)
from shards.topic_io_cli import consume, produce, record_format

__all__ = ["CommandError", "add_topic_commands", "brokers_argument"]


# ---------------------------------------------------------------------------------------------
# Arguments


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, not {text!r}")
    return key, value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _count_or_default(text: str) -> int:
    """A partition or replica count, or -1 for the broker's default."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or (value < 1 and value != -1):
        raise argparse.ArgumentTypeError(f"expected a count of at least 1 (or -1), not {text!r}")
    return value


def _partition_list(text: str) -> list[int]:
    try:
        partitions = [int(part) for part in text.split(",") if part.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected partitions like 0,1,2, not {text!r}") from None
    if not partitions or min(partitions) < 0:
        raise argparse.ArgumentTypeError(f"expected partitions like 0,1,2, not {text!r}")
    return sorted(set(partitions))


def _start_offset(text: str) -> str | int:
    if text in ("start", "end"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected start, end or an offset, not {text!r}")


def _timeout_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def add_topic_commands(subparsers: Any) -> None:
    topic = subparsers.add_parser("topic", help="create, list, describe, delete, produce, consume")
    commands = topic.add_subparsers(dest="topic_command", metavar="COMMAND", required=True)

    p = commands.add_parser("create", help="create topics")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument(
        "-p",
        "--partitions",
        type=_count_or_default,
        default=-1,
        help="partitions per topic (default: the broker's default)",
    )
    p.add_argument(
        "-r",
        "--replicas",
        type=_count_or_default,
        default=-1,
        help="replication factor (default: the broker's default)",
    )
    p.add_argument(
        "-c",
        "--config",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, repeatable",
    )
    p.set_defaults(func=create)

    p = commands.add_parser("list", help="list topics")
    p.add_argument("-i", "--internal", action="store_true", help="include internal topics")
    p.set_defaults(func=list_topics)

    p = commands.add_parser("describe", help="partitions, offsets and configs of a topic")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=describe)

    p = commands.add_parser("delete", help="delete topics")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=delete)

    p = commands.add_parser("add-partitions", help="grow a topic to more partitions")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "-n", "--num", type=_positive_int, required=True, help="number of partitions to add"
    )
    p.set_defaults(func=add_partitions)

    p = commands.add_parser("produce", help="produce one record per stdin line")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-k", "--key", help="key for every record")
    p.add_argument(
        "-H",
        "--header",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="record header, repeatable",
    )
    p.add_argument("-p", "--partition", type=int, help="partition (default: by key)")
    p.add_argument("--acks", choices=("all", "1", "0"), default="all")
    p.add_argument(
        "-z", "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none"
    )
    p.add_argument(
        "--key-delimiter", metavar="STR", help="split each line into key and value at the first STR"
    )
    p.set_defaults(func=produce)

    p = commands.add_parser("consume", help="print records")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--offset",
        type=_start_offset,
        default="start",
        help="start, end or an offset (default: start)",
    )
    p.add_argument("-n", "--num", type=_positive_int, help="stop after N records")
    p.add_argument(
        "-p",
        "--partitions",
        type=_partition_list,
        metavar="P[,P...]",
        help="partitions to read (default: all)",
    )
    p.add_argument(
        "--format",
        type=record_format,
        default=record_format("%v\\n"),
        metavar="FMT",
        help="json, or a template: %%t %%p %%o %%k %%v %%T %%h, \\n \\t escapes (default: %%v\\n)",
    )
    p.add_argument(
        "--timeout",
        type=_timeout_seconds,
        metavar="SECONDS",
        help="stop after SECONDS without a record",
    )
    p.set_defaults(func=consume)

    brokers_argument(topic)
    for leaf in commands.choices.values():
        brokers_argument(leaf)


# ---------------------------------------------------------------------------------------------
# Admin commands


def create(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic

    client = Client(args.brokers)
    admin = client.admin()
    topics = [
        NewTopic(
            name,
            num_partitions=args.partitions,
            replication_factor=args.replicas,
            config=dict(args.config),
        )
        for name in args.names
    ]
    futures = admin.create_topics(
        topics, request_timeout=request_timeout_s, operation_timeout=request_timeout_s
    )
    return _report_each(client, futures, args.names)


def _report_each(client: Client, futures: dict[str, Any], names: list[str]) -> int:
    """A TOPIC/STATUS table of the names whose future succeeded; the failures reported."""
    rows: list[list[str]] = [["TOPIC", "STATUS"]]
    errors = []
    for name in names:
        try:
            wait(client, futures[name], name)
            rows.append([name, "OK"])
        except CommandError as e:
            errors.append(str(e))
    if len(rows) > 1:
        print_table(rows, sys.stdout)
    return _report(errors)


def _report(errors: list[str]) -> int:
    """Every error but the last on its own line; the last is raised for main to print."""
    for message in errors[:-1]:
        print(f"krill: error: {message}", file=sys.stderr)
    if errors:
        raise CommandError(errors[-1])
    return 0


def delete(args: argparse.Namespace) -> int:
    client = Client(args.brokers)
    admin = client.admin()
    futures = admin.delete_topics(
        args.names, request_timeout=request_timeout_s, operation_timeout=request_timeout_s
    )
    return _report_each(client, futures, args.names)


def add_partitions(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewPartitions

    client = Client(args.brokers)
    admin = client.admin()
    current = len(topic_metadata(client, admin, args.name).partitions)
    futures = admin.create_partitions(
        [NewPartitions(args.name, current + args.num)],
        request_timeout=request_timeout_s,
        operation_timeout=request_timeout_s,
    )
    wait(client, futures[args.name], args.name)
    print(f"{args.name}: {current} -> {current + args.num} partitions")
    return 0


def list_topics(args: argparse.Namespace) -> int:
    client = Client(args.brokers)
    metadata = cluster_metadata(client, client.admin())
    rows: list[list[object]] = [["NAME", "PARTITIONS", "REPLICAS"]]
    for name in sorted(metadata.topics):
        if name.startswith("__") and not args.internal:
            continue
        partitions = metadata.topics[name].partitions.values()
        replicas = max((len(p.replicas) for p in partitions), default=0)
        rows.append([name, len(partitions), replicas])
    print_table(rows, sys.stdout)
    return 0


def describe(args: argparse.Namespace) -> int:
    client = Client(args.brokers)
    admin = client.admin()
    topic = topic_metadata(client, admin, args.name)
    partitions = [_describe_partition(p) for _, p in sorted(topic.partitions.items())]
    _add_watermarks(client, args.name, partitions)
    _add_shards(client, admin, args.name, partitions)
    configs, configs_error = _describe_configs(client, admin, args.name)
    summary = {
        "name": args.name,
        "partitions": len(partitions),
        "replicas": max((len(p["replicas"]) for p in partitions), default=0),
    }
    if args.format == "json":
        document = {**summary, "partitions": partitions, "configs": configs}
        if configs_error is not None:
            document["configs_error"] = configs_error
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _print_describe_text(summary, partitions, configs, configs_error, sys.stdout)
    return 0


def _describe_partition(p: Any) -> dict[str, Any]:
    return {
        "partition": p.id,
        "leader": p.leader,
        "replicas": list(p.replicas),
        "isr": list(p.isrs),
        "log_start_offset": None,
        "high_watermark": None,
    }


def _add_watermarks(client: Client, name: str, partitions: list[dict[str, Any]]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        client.config(**{"group.id": f"krill-cli-{uuid.uuid4()}", "enable.auto.commit": False})
    )
    try:
        for p in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(name, p["partition"]), timeout=request_timeout_s
                )
            except Exception as e:  # KafkaException: one partition failed; report it
                p["offsets_error"] = describe_error(e, client.brokers, name)
                continue
            p["log_start_offset"], p["high_watermark"] = low, high
    finally:
        consumer.close()


def _add_shards(client: Client, admin: Any, name: str, partitions: list[dict[str, Any]]) -> None:
    """Each partition's owning shard on its leader: shard_of(topic, partition, shards), with
    the leader's shard count from its `krill.shards` broker config (None if unavailable)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from shards.shard_table import shard_of

    counts: dict[int, int | None] = {}
    for p in partitions:
        leader = p["leader"]
        if leader not in counts:
            counts[leader] = None
            resource = ConfigResource(ResourceType.BROKER, str(leader))
            try:
                futures = admin.describe_configs([resource], request_timeout=request_timeout_s)
                entries = wait(client, next(iter(futures.values())), name)
                counts[leader] = int(entries["krill.shards"].value)
            except Exception:  # not a Krill node, or it did not answer: no shard column
                pass
        shards = counts[leader]
        p["shard"] = None if shards is None else shard_of(name, p["partition"], shards)


def _describe_configs(
    client: Client, admin: Any, name: str
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The topic's configs, or None and why (DescribeConfigs is optional for a describe)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, name)
    try:
        futures = admin.describe_configs([resource], request_timeout=request_timeout_s)
        entries = wait(client, next(iter(futures.values())), name)
    except CommandError as e:
        return None, str(e)
    except Exception as e:  # KafkaException raised before a future existed
        return None, describe_error(e, client.brokers, name)
    return [
        {
            "name": entry.name,
            "value": None if entry.is_sensitive else entry.value,
            "source": _config_source(entry.source),
            "default": bool(entry.is_default),
        }
        for entry in sorted(entries.values(), key=lambda e: e.name)
    ], None


def _config_source(source: Any) -> str:
    from confluent_kafka.admin import ConfigSource

    try:
        return ConfigSource(source).name
    except ValueError:
        return str(source)


def _print_describe_text(
    summary: dict[str, Any],
    partitions: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None,
    configs_error: str | None,
    out: IO[str],
) -> None:
    out.write("SUMMARY\n=======\n")
    print_table([[key.upper(), value] for key, value in summary.items()], out)
    out.write("\nCONFIGS\n=======\n")
    if configs is None:
        out.write(f"(unavailable: {configs_error})\n")
    elif configs:
        print_table(
            [["KEY", "VALUE", "SOURCE"]] + [[c["name"], c["value"], c["source"]] for c in configs],
            out,
        )
    out.write("\nPARTITIONS\n==========\n")
    rows: list[list[object]] = [
        ["PARTITION", "LEADER", "SHARD", "REPLICAS", "LOG-START-OFFSET", "HIGH-WATERMARK"]
    ]
    for p in partitions:
        rows.append(
            [
                p["partition"],
                p["leader"],
                _or_dash(p.get("shard")),
                ",".join(map(str, p["replicas"])),
                _or_dash(p["log_start_offset"]),
                _or_dash(p["high_watermark"]),
            ]
        )
    print_table(rows, out)


def _or_dash(value: object) -> object:
    return "-" if value is None else value
