"""`krill topic ...`: create, list, describe, delete, produce to and consume from topics.

These commands are plain Kafka clients (confluent-kafka, i.e. librdkafka), so they work
against any Kafka-API broker. librdkafka retries forever and logs to stderr by default; here
every client gets short timeouts, a silent logger and an `error_cb`, and a TCP pre-flight
check turns "nothing listens there" into one clear line within seconds. Every failure is a
`CommandError` with a one-line message; `shards.cli.main` prints it and exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import IO, Any

from shards.config import ConfigError, parse_host_port

__all__ = ["CommandError", "add_topic_commands", "brokers_argument"]

DEFAULT_BROKERS = "127.0.0.1:9092"
BROKERS_ENV = "KRILL_BROKERS"

connect_timeout_s = 3.0  # the pre-flight TCP connect, per bootstrap broker
request_timeout_s = 10.0  # any one admin request or metadata call
flush_timeout_s = 30.0  # produce: how long to wait for the last deliveries
consume_poll_s = 0.2  # one Consumer.consume() wait; bounds Ctrl-C and timeout latency
consume_batch_max = 500  # records taken per Consumer.consume() call


class CommandError(Exception):
    """A runtime failure to report as one line (`krill: error: <message>`), exit code 1."""


# ---------------------------------------------------------------------------------------------
# Arguments


def _brokers_type(text: str) -> str:
    try:
        for part in text.split(","):
            parse_host_port(part.strip(), "broker")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ",".join(part.strip() for part in text.split(","))


def brokers_argument(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(BROKERS_ENV) or DEFAULT_BROKERS
    parser.add_argument(
        "-b", "--brokers", type=_brokers_type, default=default, metavar="HOST:PORT[,...]",
        help=f"bootstrap brokers (env {BROKERS_ENV}, default {DEFAULT_BROKERS})")


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
    p.add_argument("-p", "--partitions", type=_count_or_default, default=-1,
                   help="partitions per topic (default: the broker's default)")
    p.add_argument("-r", "--replicas", type=_count_or_default, default=-1,
                   help="replication factor (default: the broker's default)")
    p.add_argument("-c", "--config", type=_key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="topic config, repeatable")
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
    p.add_argument("-n", "--num", type=_positive_int, required=True,
                   help="number of partitions to add")
    p.set_defaults(func=add_partitions)

    p = commands.add_parser("produce", help="produce one record per stdin line")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-k", "--key", help="key for every record")
    p.add_argument("-H", "--header", type=_key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="record header, repeatable")
    p.add_argument("-p", "--partition", type=int, help="partition (default: by key)")
    p.add_argument("--acks", choices=("all", "1", "0"), default="all")
    p.add_argument("-z", "--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                   default="none")
    p.add_argument("--key-delimiter", metavar="STR",
                   help="split each line into key and value at the first STR")
    p.set_defaults(func=produce)

    p = commands.add_parser("consume", help="print records")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--offset", type=_start_offset, default="start",
                   help="start, end or an offset (default: start)")
    p.add_argument("-n", "--num", type=_positive_int, help="stop after N records")
    p.add_argument("-p", "--partitions", type=_partition_list, metavar="P[,P...]",
                   help="partitions to read (default: all)")
    p.add_argument("--format", type=_record_format, default=_record_format("%v\\n"),
                   metavar="FMT", help="json, or a template: %%t %%p %%o %%k %%v %%T %%h, "
                   "\\n \\t escapes (default: %%v\\n)")
    p.add_argument("--timeout", type=_timeout_seconds, metavar="SECONDS",
                   help="stop after SECONDS without a record")
    p.set_defaults(func=consume)

    for leaf in commands.choices.values():
        brokers_argument(leaf)


# ---------------------------------------------------------------------------------------------
# Clients and errors


def _silent_logger() -> logging.Logger:
    logger = logging.getLogger("krill.librdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class _Client:
    """Common client settings plus a record of the errors librdkafka reported."""

    def __init__(self, brokers: str) -> None:
        self.brokers = brokers
        self.all_down_since: float | None = None  # monotonic time of _ALL_BROKERS_DOWN

    def config(self, **extra: Any) -> dict[str, Any]:
        settings = {
            "bootstrap.servers": self.brokers,
            "socket.timeout.ms": int(request_timeout_s * 1000),
            "socket.connection.setup.timeout.ms": int(connect_timeout_s * 1000),
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
            "logger": _silent_logger(),
        }
        settings.update(extra)
        return settings

    def _on_error(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        if error.code() == KafkaError._ALL_BROKERS_DOWN and self.all_down_since is None:
            self.all_down_since = time.monotonic()

    def check_still_up(self) -> None:
        """Fail once every broker has been down for a request timeout (a restart is not)."""
        if self.all_down_since is None:
            return
        if time.monotonic() - self.all_down_since < request_timeout_s:
            return
        self.check_reachable()  # raises when nothing listens any more
        self.all_down_since = None

    def check_reachable(self) -> None:
        """Fail fast, in one line, when no bootstrap broker accepts a TCP connection."""
        for address in self.brokers.split(","):
            host, port = parse_host_port(address, "broker")
            try:
                socket.create_connection((host, port), timeout=connect_timeout_s).close()
                return
            except OSError:
                continue
        raise CommandError(f"cannot reach broker at {self.brokers}")

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        self.check_reachable()
        return AdminClient(self.config())

    def failure(self, error: Any, topic: str | None = None) -> CommandError:
        return CommandError(describe_error(error, self.brokers, topic))


def describe_error(error: Any, brokers: str, topic: str | None = None) -> str:
    """One line for a KafkaError, a KafkaException or a timed-out future."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(error, FutureTimeoutError):
        return f"timed out waiting for broker at {brokers}"
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else error
    if not isinstance(error, KafkaError):
        return str(error) or type(error).__name__
    code = error.code()
    subject = f"topic {topic!r}" if topic is not None else "topic"
    if code == KafkaError.TOPIC_ALREADY_EXISTS:
        return f"{subject} already exists"
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return f"{subject} does not exist"
    if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE):
        return f"cannot reach broker at {brokers}"
    if code in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT):
        return f"timed out waiting for broker at {brokers}"
    text = error.str() or error.name()
    prefix = f"{subject}: " if topic is not None else ""
    return f"{prefix}{text} ({error.name()})".replace("\n", " ")


def _metadata(client: _Client, handle: Any, topic: str | None = None) -> Any:
    try:
        return handle.list_topics(timeout=request_timeout_s)
    except Exception as e:  # KafkaException, or a runtime error from librdkafka
        raise client.failure(e, topic) from None


def _topic_metadata(client: _Client, handle: Any, name: str) -> Any:
    """The topic's metadata from a full listing (asking for one topic may auto-create it)."""
    topic = _metadata(client, handle, name).topics.get(name)
    if topic is None:
        raise CommandError(f"topic {name!r} does not exist")
    if topic.error is not None:
        raise client.failure(topic.error, name)
    return topic


def _wait(client: _Client, future: Any, topic: str | None) -> Any:
    try:
        return future.result(timeout=request_timeout_s + 5)
    except Exception as e:  # KafkaException, or the future's TimeoutError
        raise client.failure(e, topic) from None


def _print_table(rows: Iterable[Iterable[object]], out: IO[str]) -> None:
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


# ---------------------------------------------------------------------------------------------
# Admin commands


def create(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic

    client = _Client(args.brokers)
    admin = client.admin()
    topics = [NewTopic(name, num_partitions=args.partitions, replication_factor=args.replicas,
                       config=dict(args.config)) for name in args.names]
    futures = admin.create_topics(topics, request_timeout=request_timeout_s,
                                  operation_timeout=request_timeout_s)
    rows: list[list[str]] = [["TOPIC", "STATUS"]]
    errors = []
    for name in args.names:
        try:
            _wait(client, futures[name], name)
            rows.append([name, "OK"])
        except CommandError as e:
            errors.append(str(e))
    if len(rows) > 1:
        _print_table(rows, sys.stdout)
    return _report(errors)


def _report(errors: list[str]) -> int:
    """Every error but the last on its own line; the last is raised for main to print."""
    for message in errors[:-1]:
        print(f"krill: error: {message}", file=sys.stderr)
    if errors:
        raise CommandError(errors[-1])
    return 0


def delete(args: argparse.Namespace) -> int:
    client = _Client(args.brokers)
    admin = client.admin()
    futures = admin.delete_topics(args.names, request_timeout=request_timeout_s,
                                  operation_timeout=request_timeout_s)
    rows: list[list[str]] = [["TOPIC", "STATUS"]]
    errors = []
    for name in args.names:
        try:
            _wait(client, futures[name], name)
            rows.append([name, "OK"])
        except CommandError as e:
            errors.append(str(e))
    if len(rows) > 1:
        _print_table(rows, sys.stdout)
    return _report(errors)


def add_partitions(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewPartitions

    client = _Client(args.brokers)
    admin = client.admin()
    current = len(_topic_metadata(client, admin, args.name).partitions)
    futures = admin.create_partitions([NewPartitions(args.name, current + args.num)],
                                      request_timeout=request_timeout_s,
                                      operation_timeout=request_timeout_s)
    _wait(client, futures[args.name], args.name)
    print(f"{args.name}: {current} -> {current + args.num} partitions")
    return 0


def list_topics(args: argparse.Namespace) -> int:
    client = _Client(args.brokers)
    metadata = _metadata(client, client.admin())
    rows: list[list[object]] = [["NAME", "PARTITIONS", "REPLICAS"]]
    for name in sorted(metadata.topics):
        if name.startswith("__") and not args.internal:
            continue
        partitions = metadata.topics[name].partitions.values()
        replicas = max((len(p.replicas) for p in partitions), default=0)
        rows.append([name, len(partitions), replicas])
    _print_table(rows, sys.stdout)
    return 0


def describe(args: argparse.Namespace) -> int:
    client = _Client(args.brokers)
    admin = client.admin()
    topic = _topic_metadata(client, admin, args.name)
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


def _add_watermarks(client: _Client, name: str, partitions: list[dict[str, Any]]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(client.config(**{"group.id": f"krill-cli-{uuid.uuid4()}",
                                         "enable.auto.commit": False}))
    try:
        for p in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(name, p["partition"]), timeout=request_timeout_s)
            except Exception as e:  # KafkaException: one partition failed; report it
                p["offsets_error"] = describe_error(e, client.brokers, name)
                continue
            p["log_start_offset"], p["high_watermark"] = low, high
    finally:
        consumer.close()


def _add_shards(client: _Client, admin: Any, name: str, partitions: list[dict[str, Any]]) -> None:
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
                entries = _wait(client, next(iter(futures.values())), name)
                counts[leader] = int(entries["krill.shards"].value)
            except Exception:  # not a Krill node, or it did not answer: no shard column
                pass
        shards = counts[leader]
        p["shard"] = None if shards is None else shard_of(name, p["partition"], shards)


def _describe_configs(
    client: _Client, admin: Any, name: str
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The topic's configs, or None and why (DescribeConfigs is optional for a describe)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, name)
    try:
        futures = admin.describe_configs([resource], request_timeout=request_timeout_s)
        entries = _wait(client, next(iter(futures.values())), name)
    except CommandError as e:
        return None, str(e)
    except Exception as e:  # KafkaException raised before a future existed
        return None, describe_error(e, client.brokers, name)
    return [
        {"name": entry.name, "value": None if entry.is_sensitive else entry.value,
         "source": _config_source(entry.source), "default": bool(entry.is_default)}
        for entry in sorted(entries.values(), key=lambda e: e.name)
    ], None


def _config_source(source: Any) -> str:
    from confluent_kafka.admin import ConfigSource

    try:
        return ConfigSource(source).name
    except ValueError:
        return str(source)


def _print_describe_text(summary: dict[str, Any], partitions: list[dict[str, Any]],
                         configs: list[dict[str, Any]] | None, configs_error: str | None,
                         out: IO[str]) -> None:
    out.write("SUMMARY\n=======\n")
    _print_table([[key.upper(), value] for key, value in summary.items()], out)
    out.write("\nCONFIGS\n=======\n")
    if configs is None:
        out.write(f"(unavailable: {configs_error})\n")
    elif configs:
        _print_table([["KEY", "VALUE", "SOURCE"]]
                     + [[c["name"], c["value"], c["source"]] for c in configs], out)
    out.write("\nPARTITIONS\n==========\n")
    rows: list[list[object]] = [
        ["PARTITION", "LEADER", "SHARD", "REPLICAS", "LOG-START-OFFSET", "HIGH-WATERMARK"]]
    for p in partitions:
        rows.append([p["partition"], p["leader"], _or_dash(p.get("shard")),
                     ",".join(map(str, p["replicas"])),
                     _or_dash(p["log_start_offset"]), _or_dash(p["high_watermark"])])
    _print_table(rows, out)


def _or_dash(value: object) -> object:
    return "-" if value is None else value


# ---------------------------------------------------------------------------------------------
# Produce


def produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    client = _Client(args.brokers)
    client.check_reachable()
    producer = Producer(client.config(**{
        "acks": args.acks if args.acks != "all" else -1,
        "compression.type": args.compression,
        "linger.ms": 5,
        "message.timeout.ms": int(flush_timeout_s * 1000),
    }))
    topic = _topic_metadata_for_produce(client, producer, args.name)
    if args.partition is not None and args.partition not in topic.partitions:
        raise CommandError(f"topic {args.name!r} has no partition {args.partition}")
    tally = _ProduceTally()
    headers = [(key, value.encode()) for key, value in args.header] or None
    fixed_key = args.key.encode() if args.key is not None else None
    delimiter = args.key_delimiter.encode() if args.key_delimiter else None
    for line in sys.stdin.buffer:
        value = line[:-1] if line.endswith(b"\n") else line
        key = fixed_key
        if delimiter is not None:
            key, _, value = value.partition(delimiter)
        kwargs: dict[str, Any] = {"key": key, "headers": headers, "on_delivery": tally.delivered}
        if args.partition is not None:
            kwargs["partition"] = args.partition
        try:
            _produce_one(producer, args.name, value, kwargs)
        except KafkaException as e:
            raise client.failure(e, args.name) from None
        tally.sent += 1
        if tally.error is not None:
            break
    remaining = producer.flush(flush_timeout_s)
    if tally.error is not None:
        raise CommandError(f"producing to {args.name!r} failed: {tally.error}")
    if remaining:
        raise CommandError(f"{remaining} of {tally.sent} records to {args.name!r} "
                           f"were not acknowledged within {flush_timeout_s:g}s")
    print(f"krill: {tally.summary(args.name, args.acks)}", file=sys.stderr)
    return 0


def _topic_metadata_for_produce(client: _Client, producer: Any, name: str) -> Any:
    """Ask for this one topic: from a producer that lets the broker auto-create it, as
    producing to a new topic does with Kafka. A new topic's leader may take a moment."""
    from confluent_kafka import KafkaError

    deadline = time.monotonic() + request_timeout_s
    while True:
        try:
            topic = producer.list_topics(topic=name, timeout=request_timeout_s).topics.get(name)
        except Exception as e:  # KafkaException
            raise client.failure(e, name) from None
        if topic is None:
            raise CommandError(f"topic {name!r} does not exist")
        retriable = (topic.error is not None
                     and topic.error.code() == KafkaError.LEADER_NOT_AVAILABLE)
        if topic.error is not None and not retriable:
            raise client.failure(topic.error, name)
        if topic.partitions and not retriable:
            return topic
        if time.monotonic() >= deadline:
            raise CommandError(f"topic {name!r} has no leader yet")
        time.sleep(0.2)


def _produce_one(producer: Any, topic: str, value: bytes, kwargs: dict[str, Any]) -> None:
    while True:
        try:
            producer.produce(topic, value, **kwargs)
            producer.poll(0)
            return
        except BufferError:  # the local queue is full: serve deliveries, then retry
            producer.poll(0.1)


class _ProduceTally:
    """Delivery reports folded into per-partition offset ranges."""

    def __init__(self) -> None:
        self.sent = 0
        self.delivered_count = 0
        self.ranges: dict[int, tuple[int, int]] = {}
        self.error: str | None = None

    def delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            if self.error is None:
                self.error = f"{error.str()} ({error.name()})"
            return
        self.delivered_count += 1
        offset = message.offset()
        if offset is None or offset < 0:  # acks=0: no response, so no offset
            return
        low, high = self.ranges.get(message.partition(), (offset, offset))
        self.ranges[message.partition()] = (min(low, offset), max(high, offset))

    def summary(self, topic: str, acks: str) -> str:
        text = f"{self.delivered_count} records produced to {topic}"
        if acks == "0":
            return f"{text} (acks=0: offsets unknown)"
        if not self.ranges:
            return text
        parts = [f"partition {p} offsets {low}-{high}"
                 for p, (low, high) in sorted(self.ranges.items())]
        return f"{text}: {'; '.join(parts)}"


# ---------------------------------------------------------------------------------------------
# Consume

_TEMPLATE_FIELDS = "tpokvTh"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}

RecordFormat = Callable[[Any], bytes]


def _record_format(text: str) -> RecordFormat:
    """Compile `json` or a `%v\\n`-style template into record -> bytes."""
    if text == "json":
        return _format_json
    pieces: list[bytes | str] = []  # literal bytes, or a one-letter field
    i = 0
    while i < len(text):
        c = text[i]
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if c == "%" and nxt in _TEMPLATE_FIELDS and nxt:
            pieces.append(nxt)
        elif c == "%" and nxt == "%":
            pieces.append(b"%")
        elif c == "\\" and nxt in _ESCAPES and nxt:
            pieces.append(_ESCAPES[nxt].encode())
        elif c in "%\\":
            raise argparse.ArgumentTypeError(
                f"unknown {c}{nxt} in format {text!r} (fields: %t %p %o %k %v %T %h)")
        else:
            pieces.append(c.encode())
            i += 1
            continue
        i += 2

    def render(message: Any) -> bytes:
        return b"".join(p if isinstance(p, bytes) else _field(message, p) for p in pieces)

    return render


def _field(message: Any, letter: str) -> bytes:
    if letter == "t":
        return message.topic().encode()
    if letter == "p":
        return str(message.partition()).encode()
    if letter == "o":
        return str(message.offset()).encode()
    if letter == "k":
        return message.key() or b""
    if letter == "v":
        return message.value() or b""
    if letter == "T":
        return str(message.timestamp()[1]).encode()
    assert letter == "h", letter
    headers = message.headers() or []
    return b",".join(k.encode() + b"=" + (v or b"") for k, v in headers)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _format_json(message: Any) -> bytes:
    record = {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": message.timestamp()[1],
        "key": _text(message.key()),
        "value": _text(message.value()),
        "headers": [{"key": k, "value": _text(v)} for k, v in (message.headers() or [])],
    }
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


def consume(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer

    client = _Client(args.brokers)
    client.check_reachable()
    consumer = Consumer(client.config(**{
        "group.id": f"krill-cli-{uuid.uuid4()}",  # throwaway: we assign, never join
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest" if args.offset != "end" else "latest",
    }))
    try:
        return _consume(client, consumer, args)
    finally:
        consumer.close()


def _consume(client: _Client, consumer: Any, args: argparse.Namespace) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

    topic = _topic_metadata(client, consumer, args.name)
    partitions = args.partitions if args.partitions is not None else sorted(topic.partitions)
    missing = [p for p in partitions if p not in topic.partitions]
    if missing:
        raise CommandError(f"topic {args.name!r} has no partition {missing[0]}")
    start = {"start": OFFSET_BEGINNING, "end": OFFSET_END}.get(args.offset, args.offset)
    # Drain mode: read up to the high watermarks seen now, then stop, so `consume` ends.
    ends: dict[int, int] | None = None
    if args.num is None and args.offset != "end":
        ends = {}
        for p in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(args.name, p), timeout=request_timeout_s)
            except Exception as e:  # KafkaException
                raise client.failure(e, args.name) from None
            first = low if start == OFFSET_BEGINNING else max(low, int(start))
            if first < high:
                ends[p] = high
        if not ends:
            return 0
    consumer.assign([TopicPartition(args.name, p, start) for p in partitions])
    return _consume_loop(client, consumer, args, ends)


def _consume_loop(client: _Client, consumer: Any, args: argparse.Namespace,
                  ends: dict[int, int] | None) -> int:
    from confluent_kafka import KafkaError

    out = sys.stdout.buffer
    printed = 0
    last_record = time.monotonic()
    while True:
        messages = consumer.consume(num_messages=consume_batch_max, timeout=consume_poll_s)
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if ends is not None:
                        ends.pop(message.partition(), None)
                    continue
                raise client.failure(error, args.name)
            partition = message.partition()
            if ends is not None and message.offset() >= ends.get(partition, -1):
                continue  # past the watermark seen at start, or a finished partition
            out.write(args.format(message))
            printed += 1
            last_record = time.monotonic()
            client.all_down_since = None
            if ends is not None and message.offset() + 1 >= ends[partition]:
                del ends[partition]
            if args.num is not None and printed >= args.num:
                out.flush()
                return 0
        out.flush()
        if ends is not None and not ends:
            return 0
        client.check_still_up()
        if args.timeout is not None and time.monotonic() - last_record >= args.timeout:
            return 0
