"""`krill topic produce` and `krill topic consume`: stdin lines in, formatted records out."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from shards.cli_client import (
    Client,
    CommandError,
    request_timeout_s,
    topic_metadata,
)

__all__ = ["consume", "produce", "record_format"]

flush_timeout_s = 30.0  # produce: how long to wait for the last deliveries
consume_poll_s = 0.2  # one Consumer.consume() wait; bounds Ctrl-C and timeout latency
consume_batch_max = 500  # records taken per Consumer.consume() call


# ---------------------------------------------------------------------------------------------
# Produce


def produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    client = Client(args.brokers)
    client.check_reachable()
    producer = Producer(
        client.config(
            **{
                "acks": args.acks if args.acks != "all" else -1,
                "compression.type": args.compression,
                "linger.ms": 5,
                "message.timeout.ms": int(flush_timeout_s * 1000),
            }
        )
    )
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
        raise CommandError(
            f"{remaining} of {tally.sent} records to {args.name!r} "
            f"were not acknowledged within {flush_timeout_s:g}s"
        )
    print(f"krill: {tally.summary(args.name, args.acks)}", file=sys.stderr)
    return 0


def _topic_metadata_for_produce(client: Client, producer: Any, name: str) -> Any:
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
        retriable = (
            topic.error is not None and topic.error.code() == KafkaError.LEADER_NOT_AVAILABLE
        )
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
        parts = [
            f"partition {p} offsets {low}-{high}" for p, (low, high) in sorted(self.ranges.items())
        ]
        return f"{text}: {'; '.join(parts)}"


# ---------------------------------------------------------------------------------------------
# Consume

_TEMPLATE_FIELDS = "tpokvTh"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}

RecordFormat = Callable[[Any], bytes]


def record_format(text: str) -> RecordFormat:
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
                f"unknown {c}{nxt} in format {text!r} (fields: %t %p %o %k %v %T %h)"
            )
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

    client = Client(args.brokers)
    client.check_reachable()
    consumer = Consumer(
        client.config(
            **{
                "group.id": f"krill-cli-{uuid.uuid4()}",  # throwaway: we assign, never join
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest" if args.offset != "end" else "latest",
            }
        )
    )
    try:
        return _consume(client, consumer, args)
    finally:
        consumer.close()


def _consume(client: Client, consumer: Any, args: argparse.Namespace) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

    topic = topic_metadata(client, consumer, args.name)
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
                    TopicPartition(args.name, p), timeout=request_timeout_s
                )
            except Exception as e:  # KafkaException
                raise client.failure(e, args.name) from None
            first = low if start == OFFSET_BEGINNING else max(low, int(start))
            if first < high:
                ends[p] = high
        if not ends:
            return 0
    consumer.assign([TopicPartition(args.name, p, start) for p in partitions])
    return _consume_loop(client, consumer, args, ends)


def _consume_loop(
    client: Client, consumer: Any, args: argparse.Namespace, ends: dict[int, int] | None
) -> int:
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
