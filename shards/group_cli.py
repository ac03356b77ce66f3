"""`krill group ...`: list, describe, delete consumer groups and move their committed offsets.

Plain Kafka clients (confluent-kafka's AdminClient and Consumer), so they work against any
Kafka-API broker, with the same short timeouts and one-line errors as `krill topic`.
`seek` rewrites a group's committed offsets and, as Kafka's kafka-consumer-groups tool does,
only when the group has no members (an active member would overwrite them at its next commit).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from shards.cli_client import (
    Client,
    CommandError,
    brokers_argument,
    cluster_metadata,
    print_table,
    request_timeout_s,
    wait,
)

__all__ = ["add_group_commands"]

_SEEKABLE_STATES = ("EMPTY", "DEAD")


def _seek_target(text: str) -> str | int | datetime.datetime:
    """start, end, an offset (a whole number) or a timestamp (ISO 8601, or @milliseconds)."""
    if text in ("start", "end"):
        return text
    if text.isdigit():
        return int(text)
    if text.startswith("@") and text[1:].isdigit():
        return datetime.datetime.fromtimestamp(int(text[1:]) / 1000, datetime.UTC)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected start, end, an offset, an ISO time or @epoch-ms, not {text!r}"
        ) from None
    return moment if moment.tzinfo else moment.astimezone()


def add_group_commands(subparsers: Any) -> None:
    group = subparsers.add_parser("group", help="list, describe, delete, seek consumer groups")
    commands = group.add_subparsers(dest="group_command", metavar="COMMAND", required=True)
    brokers_argument(group)

    p = commands.add_parser("list", help="list consumer groups")
    brokers_argument(p)
    p.set_defaults(func=list_groups)

    p = commands.add_parser("describe", help="members, assignments, committed offsets, lag")
    p.add_argument("name", metavar="GROUP")
    p.add_argument("--format", choices=("text", "json"), default="text")
    brokers_argument(p)
    p.set_defaults(func=describe)

    p = commands.add_parser("delete", help="delete an empty group and its offsets")
    p.add_argument("name", metavar="GROUP")
    brokers_argument(p)
    p.set_defaults(func=delete)

    p = commands.add_parser("seek", help="set an empty group's committed offsets")
    p.add_argument("name", metavar="GROUP")
    p.add_argument(
        "--to",
        type=_seek_target,
        required=True,
        metavar="WHERE",
        help="start, end, an offset, or a time (ISO 8601 or @epoch-ms)",
    )
    p.add_argument(
        "--topic",
        metavar="TOPIC",
        help="only this topic (default: every topic the group has offsets for)",
    )
    brokers_argument(p)
    p.set_defaults(func=seek)


# Reading a group -----------------------------------------------------------------------------


def _describe_group(client: Client, admin: Any, name: str) -> Any:
    futures = admin.describe_consumer_groups([name], request_timeout=request_timeout_s)
    return wait(client, futures[name], None)


def _committed(client: Client, admin: Any, name: str) -> list[Any]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(name)], request_timeout=request_timeout_s
    )
    result = wait(client, futures[name], None)
    return [tp for tp in result.topic_partitions if tp.offset >= 0]


def _state_name(group: Any) -> str:
    state = getattr(group.state, "name", str(group.state))
    return str(state)


def list_groups(args: argparse.Namespace) -> int:
    client = Client(args.brokers)
    admin = client.admin()
    result = wait(client, admin.list_consumer_groups(request_timeout=request_timeout_s), None)
    rows = [("GROUP", "STATE")]
    rows += sorted((g.group_id, _state_name(g)) for g in result.valid)
    if len(rows) > 1:
        print_table(rows, sys.stdout)
    return 0


def describe(args: argparse.Namespace) -> int:
    client = Client(args.brokers)
    admin = client.admin()
    group = _describe_group(client, admin, args.name)
    state = _state_name(group)
    if state == "DEAD":
        raise CommandError(f"group {args.name!r} does not exist")
    owners: dict[tuple[str, int], str] = {}
    members = []
    for m in group.members:
        tps = sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
        for tp in tps:
            owners[tp] = m.member_id
        members.append(
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "group_instance_id": m.group_instance_id,
                "partitions": [f"{t}-{p}" for t, p in tps],
            }
        )
    committed = {(tp.topic, tp.partition): tp.offset for tp in _committed(client, admin, args.name)}
    ends = _end_offsets(client, sorted(set(committed) | set(owners)))
    offsets = []
    for tp in sorted(set(committed) | set(owners)):
        offset, end = committed.get(tp, -1), ends.get(tp, -1)
        lag = end - offset if offset >= 0 and end >= 0 else None
        offsets.append(
            {
                "topic": tp[0],
                "partition": tp[1],
                "committed": offset,
                "end": end,
                "lag": lag,
                "member_id": owners.get(tp),
            }
        )
    summary = {
        "group": args.name,
        "state": state,
        "protocol": group.partition_assignor,
        "coordinator": f"{group.coordinator.host}:{group.coordinator.port}",
        "members": members,
        "offsets": offsets,
    }
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"group {args.name}  state {state}  protocol {group.partition_assignor or '-'}  "
        f"coordinator {summary['coordinator']}"
    )
    if members:
        rows: list[tuple[object, ...]] = [("MEMBER", "CLIENT", "HOST", "PARTITIONS")]
        rows += [
            (m["member_id"], m["client_id"], m["host"], ",".join(m["partitions"]) or "-")
            for m in members
        ]
        print_table(rows, sys.stdout)
    if offsets:
        rows = [("TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER")]
        rows += [
            (
                o["topic"],
                o["partition"],
                _dash(o["committed"]),
                _dash(o["end"]),
                "-" if o["lag"] is None else o["lag"],
                o["member_id"] or "-",
            )
            for o in offsets
        ]
        print_table(rows, sys.stdout)
    return 0


def _dash(value: int) -> object:
    return "-" if value < 0 else value


def _end_offsets(client: Client, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    consumer = _consumer(client)
    try:
        ends = {}
        for topic, partition in partitions:
            ends[(topic, partition)] = _watermarks(client, consumer, topic, partition)[1]
        return ends
    finally:
        consumer.close()


def _consumer(client: Client) -> Any:
    from confluent_kafka import Consumer

    return Consumer(client.config(**{"group.id": "krill-cli", "enable.auto.commit": False}))


def _watermarks(client: Client, consumer: Any, topic: str, partition: int) -> tuple[int, int]:
    from confluent_kafka import TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=request_timeout_s
        )
    except Exception as e:  # KafkaException
        raise client.failure(e, topic) from None
    return int(low), int(high)


# Changing a group ----------------------------------------------------------------------------


def delete(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError, KafkaException

    client = Client(args.brokers)
    admin = client.admin()
    futures = admin.delete_consumer_groups([args.name], request_timeout=request_timeout_s)
    try:
        futures[args.name].result(timeout=request_timeout_s + 5)
    except KafkaException as e:
        code = e.args[0].code() if e.args else None
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            raise CommandError(f"group {args.name!r} does not exist") from None
        if code == KafkaError.NON_EMPTY_GROUP:
            raise CommandError(f"group {args.name!r} has active members") from None
        raise client.failure(e) from None
    except Exception as e:  # the future's TimeoutError
        raise client.failure(e) from None
    print(f"deleted group {args.name}")
    return 0


def seek(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    client = Client(args.brokers)
    admin = client.admin()
    state = _state_name(_describe_group(client, admin, args.name))
    if state not in _SEEKABLE_STATES:
        raise CommandError(
            f"group {args.name!r} is {state.lower()}, not empty: stop its consumers first"
        )
    partitions = _seek_partitions(client, admin, args)
    consumer = _consumer(client)
    try:
        targets = [_target(client, consumer, t, p, args.to) for t, p in partitions]
    finally:
        consumer.close()
    request = ConsumerGroupTopicPartitions(
        args.name,
        [TopicPartition(t, p, offset) for (t, p), offset in zip(partitions, targets, strict=True)],
    )
    futures = admin.alter_consumer_group_offsets([request], request_timeout=request_timeout_s)
    result = wait(client, futures[args.name], None)
    for tp in result.topic_partitions:
        if tp.error is not None:
            raise client.failure(tp.error, tp.topic)
    print_table(
        [("TOPIC", "PARTITION", "OFFSET")]
        + [(t, p, o) for (t, p), o in zip(partitions, targets, strict=True)],
        sys.stdout,
    )
    return 0


def _seek_partitions(client: Client, admin: Any, args: argparse.Namespace) -> list[Any]:
    if args.topic is None:
        found = sorted({(tp.topic, tp.partition) for tp in _committed(client, admin, args.name)})
        if not found:
            raise CommandError(f"group {args.name!r} has no committed offsets: give --topic")
        return found
    topic = cluster_metadata(client, admin, args.topic).topics.get(args.topic)
    if topic is None or topic.error is not None:
        raise CommandError(f"topic {args.topic!r} does not exist")
    return [(args.topic, p) for p in sorted(topic.partitions)]


def _target(client: Client, consumer: Any, topic: str, partition: int, to: Any) -> int:
    from confluent_kafka import TopicPartition

    low, high = _watermarks(client, consumer, topic, partition)
    if to == "start":
        return low
    if to == "end":
        return high
    if isinstance(to, int):
        return min(max(to, low), high)
    wanted = TopicPartition(topic, partition, int(to.timestamp() * 1000))
    try:
        (found,) = consumer.offsets_for_times([wanted], timeout=request_timeout_s)
    except Exception as e:  # KafkaException
        raise client.failure(e, topic) from None
    return int(found.offset) if found.offset >= 0 else high
