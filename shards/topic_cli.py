"""`krill topic ...`: create, list, describe, delete topics, alter their configs and trim
their partitions (DeleteRecords); the commands' arguments.

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


def _trim_offset(text: str) -> int:
    if text == "-1" or text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected an offset or -1, not {text!r}")


def _timeout_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def add_topic_commands(subparsers: Any) -> None:
    topic = subparsers.add_parser(
        "topic", help="create, list, describe, alter-config, delete, produce, consume"
    )
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

    p = commands.add_parser(
        "alter-config", help="set or delete topic configs (IncrementalAlterConfigs)"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "-s",
        "--set",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a topic config, repeatable",
    )
    p.add_argument(
        "-d",
        "--delete",
        action="append",
        default=[],
        metavar="KEY",
        help="delete a topic config (back to its default), repeatable",
    )
    p.set_defaults(func=alter_config, usage_error=p.error)

    p = commands.add_parser(
        "trim-prefix", help="delete a partition's records below an offset (DeleteRecords)"
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "-p", "--partitions", type=_partition_list, metavar="P[,P...]",
        help="partitions to trim (default: all)",
    )
    p.add_argument(
        "-o", "--offset", type=_trim_offset, required=True,
        help="the new log start offset; -1: the high watermark (everything so far)",
    )
    p.set_defaults(func=trim_prefix)

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


def trim_prefix(args: argparse.Namespace) -> int:
    """DeleteRecords: move each partition's log start to --offset; print where each starts."""
    from confluent_kafka import TopicPartition

    client = Client(args.brokers)
    admin = client.admin()
    count = len(topic_metadata(client, admin, args.name).partitions)
    partitions = args.partitions if args.partitions is not None else list(range(count))
    missing = [p for p in partitions if p >= count]
    if missing:
        raise CommandError(f"{args.name} has no partition {missing[0]} (it has {count})")
    futures = admin.delete_records(
        [TopicPartition(args.name, p, args.offset) for p in partitions],
        request_timeout=request_timeout_s, operation_timeout=request_timeout_s,
    )
    rows: list[list[object]] = [["PARTITION", "LOG-START"]]
    errors = []
    for tp, future in sorted(futures.items(), key=lambda item: item[0].partition):
        try:
            rows.append([tp.partition, wait(client, future, args.name).low_watermark])
        except CommandError as e:
            errors.append(f"partition {tp.partition}: {e}")
    if len(rows) > 1:
        print_table(rows, sys.stdout)
    return _report(errors)


def alter_config(args: argparse.Namespace) -> int:
    """Apply --set and --delete in one IncrementalAlterConfigs, then print the keys named as
    the broker now reports them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    if not args.set and not args.delete:
        args.usage_error("give at least one --set KEY=VALUE or --delete KEY")
    keys = [key for key, _ in args.set] + list(args.delete)
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        args.usage_error(f"config {twice[0]!r} is named more than once")
    operations = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        for key, value in args.set
    ] + [
        ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
        for key in args.delete
    ]
    client = Client(args.brokers)
    admin = client.admin()
    resource = ConfigResource(ResourceType.TOPIC, args.name, incremental_configs=operations)
    try:
        futures = admin.incremental_alter_configs([resource], request_timeout=request_timeout_s)
    except Exception as e:  # KafkaException or ValueError raised before a future existed
        raise CommandError(describe_error(e, client.brokers, args.name)) from None
    wait(client, next(iter(futures.values())), args.name)
    configs, configs_error = _describe_configs(client, admin, args.name)
    if configs is None:
        raise CommandError(f"altered, but cannot read the configs back: {configs_error}")
    rows: list[list[object]] = [["KEY", "VALUE", "SOURCE"]]
    rows += [[c["name"], c["value"], c["source"]] for c in configs if c["name"] in keys]
    print_table(rows, sys.stdout)
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
