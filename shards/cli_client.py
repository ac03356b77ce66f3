"""What every client-side `krill` command shares: the Kafka client set-up and its errors.

These commands are plain Kafka clients (confluent-kafka, i.e. librdkafka), so they work
against any Kafka-API broker. librdkafka retries forever and logs to stderr by default; here
every client gets short timeouts, a silent logger and an `error_cb`, and a TCP pre-flight
check turns "nothing listens there" into one clear line within seconds. Every failure is a
`CommandError` with a one-line message; `shards.cli.main` prints it and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
from collections.abc import Iterable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import IO, Any

from shards.config import ConfigError, parse_host_port

__all__ = [
    "BROKERS_ENV",
    "Client",
    "admin_addresses",
    "admin_argument",
    "CommandError",
    "brokers_argument",
    "describe_error",
    "cluster_metadata",
    "default_admin_addresses",
    "print_table",
    "request_timeout_s",
    "topic_metadata",
    "wait",
]

DEFAULT_BROKERS = "127.0.0.1:9092"
BROKERS_ENV = "KRILL_BROKERS"
ADMIN_ENV = "KRILL_ADMIN"
DEFAULT_ADMIN_PORT = 9644

connect_timeout_s = 3.0  # the pre-flight TCP connect, per bootstrap broker
request_timeout_s = 10.0  # any one admin request or metadata call


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


class _ClientFlag(argparse.Action):
    """Stores the value and notes the flag as given (`krill start` refuses client flags)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, CLIENT_FLAGS_GIVEN, ()))
        given.add(option_string or self.dest)
        setattr(namespace, CLIENT_FLAGS_GIVEN, sorted(given))


CLIENT_FLAGS_GIVEN = "client_flags_given"  # on the parsed args: the client flags on the line


def brokers_argument(parser: argparse.ArgumentParser, root: bool = False) -> None:
    """`-b/--brokers`. Client flags go anywhere on the line, as rpk's do: the root parser holds
    the default, and every command level below takes the flag too without a default of its
    own (argparse would let a subcommand's default overwrite what was given before it)."""
    default = (os.environ.get(BROKERS_ENV) or DEFAULT_BROKERS) if root else argparse.SUPPRESS
    parser.add_argument(
        "-b",
        "--brokers",
        action=_ClientFlag,
        type=_brokers_type,
        default=default,
        metavar="HOST:PORT[,...]",
        help=f"bootstrap brokers (env {BROKERS_ENV}, default {DEFAULT_BROKERS})",
    )


def admin_argument(parser: argparse.ArgumentParser, root: bool = False) -> None:
    """`--admin`: the admin HTTP address(es), for commands that read health and metrics;
    anywhere on the line, like `-b`."""
    default = os.environ.get(ADMIN_ENV) or None if root else argparse.SUPPRESS
    parser.add_argument(
        "--admin",
        action=_ClientFlag,
        type=_admin_type,
        default=default,
        metavar="HOST:PORT[,...]",
        help=f"admin API (env {ADMIN_ENV}; default: each broker's host, port "
        f"{DEFAULT_ADMIN_PORT})",
    )


def _admin_type(text: str) -> str:
    try:
        for part in text.split(","):
            parse_host_port(part.strip(), "admin address")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ",".join(part.strip() for part in text.split(","))


def admin_addresses(args: argparse.Namespace) -> list[str]:
    """`--admin` if given, else each bootstrap broker's host with the default admin port."""
    if args.admin:
        return str(args.admin).split(",")
    return default_admin_addresses(
        [parse_host_port(b, "broker")[0] for b in str(args.brokers).split(",")])


def default_admin_addresses(hosts: Iterable[str]) -> list[str]:
    """Each host once, on the default admin port."""
    return [f"[{h}]:{DEFAULT_ADMIN_PORT}" if ":" in h else f"{h}:{DEFAULT_ADMIN_PORT}"
            for h in dict.fromkeys(hosts)]


# ---------------------------------------------------------------------------------------------
# Clients and errors


def silent_logger() -> logging.Logger:
    logger = logging.getLogger("krill.librdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class Client:
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
            "logger": silent_logger(),
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


def cluster_metadata(client: Client, handle: Any, topic: str | None = None) -> Any:
    try:
        return handle.list_topics(timeout=request_timeout_s)
    except Exception as e:  # KafkaException, or a runtime error from librdkafka
        raise client.failure(e, topic) from None


def topic_metadata(client: Client, handle: Any, name: str) -> Any:
    """The topic's metadata from a full listing (asking for one topic may auto-create it)."""
    topic = cluster_metadata(client, handle, name).topics.get(name)
    if topic is None:
        raise CommandError(f"topic {name!r} does not exist")
    if topic.error is not None:
        raise client.failure(topic.error, name)
    return topic


def wait(client: Client, future: Any, topic: str | None) -> Any:
    try:
        return future.result(timeout=request_timeout_s + 5)
    except Exception as e:  # KafkaException, or the future's TimeoutError
        raise client.failure(e, topic) from None


def print_table(rows: Iterable[Iterable[object]], out: IO[str]) -> None:
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
