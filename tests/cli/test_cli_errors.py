"""`krill` as a user runs it: every mistake is one `krill: error:` line and a non-zero exit.

Each case runs `python -m shards.cli` in a subprocess, so argparse, the exit code and
whatever librdkafka might print to stderr are all part of what is checked.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.cli import krill

pytestmark = pytest.mark.timeout(60)

UNREACHABLE_DEADLINE_S = 15  # the brief: fail within ~10 s, plus interpreter start-up


def timed_krill(*args: str, stdin: str = "", env: dict[str, str] | None = None):
    """`krill ARGS` and the seconds it took."""
    started = time.monotonic()
    result = krill(*args, stdin=stdin, env=env, timeout_s=50)
    return result, time.monotonic() - started


def assert_one_error_line(result, code: int | None = None) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("krill: error: "), lines[0]
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def dead_broker() -> str:
    """host:port where nothing listens: bind a free port, then close it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    "args, expected",
    [
        ((), "required"),
        (("bogus",), "invalid choice: 'bogus'"),
        (("start", "--bad-flag"), "unrecognized arguments: --bad-flag"),
        (("start", "--smp", "0"), "smp must be at least 1"),
        (("start", "--smp", "999999"), "usable core"),
        (("start", "--smp", "two"), "invalid int value"),
        (("start", "--listen", "nonsense"), "--listen must be host:port"),
        (("start", "--listen", "127.0.0.1:70000"), "bad port"),
        (("start", "--log-level", "loud"), "invalid choice: 'loud'"),
        (("start", "--config", "/nonexistent/krill.yaml"), "config file '/nonexistent/krill.yaml'"),
        (("topic",), "required"),
        (("topic", "create"), "required: NAME"),
        (("topic", "create", "t", "-p", "zero"), "argument -p/--partitions"),
        (("topic", "create", "t", "-c", "novalue"), "expected key=value"),
        (("topic", "list", "-b", "nonsense"), "broker must be host:port"),
        (("topic", "consume", "t", "--offset", "middle"), "expected start, end or an offset"),
        (("topic", "consume", "t", "--format", "%q"), "unknown %q"),
        (("topic", "consume", "t", "-n", "0"), "must be at least 1"),
        (("topic", "produce", "t", "--acks", "2"), "invalid choice: '2'"),
        (("topic", "produce", "t", "-z", "brotli"), "invalid choice: 'brotli'"),
    ],
)
def test_usage_mistakes(args, expected):
    result, _ = timed_krill(*args)
    line = assert_one_error_line(result, code=2)
    assert expected in line


def test_bad_config_file_is_named(tmp_path):
    path = tmp_path / "krill.yaml"
    path.write_text("listen: 127.0.0.1:9092\nlisten_prot: 1\n")
    result, _ = timed_krill("start", "--config", str(path))
    assert "unknown key 'listen_prot'" in assert_one_error_line(result, code=2)


def test_bad_environment_is_named():
    result, _ = timed_krill("start", env={"KRILL_LISTEN": "nowhere"})
    assert "KRILL_LISTEN must be host:port" in assert_one_error_line(result, code=2)


def test_help_still_prints_full_help():
    result, _ = timed_krill("topic", "consume", "--help")
    assert result.returncode == 0
    assert "usage: krill topic consume" in result.stdout
    assert "--offset" in result.stdout and "--brokers" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("topic", "list"),
        ("topic", "create", "t"),
        ("topic", "describe", "t"),
        ("topic", "delete", "t"),
        ("topic", "add-partitions", "t", "-n", "1"),
        ("topic", "produce", "t"),
        ("topic", "consume", "t"),
    ],
)
def test_unreachable_broker_fails_fast(dead_broker, args):
    result, elapsed = timed_krill(*args, "-b", dead_broker, stdin="a\nb\n")
    line = assert_one_error_line(result, code=1)
    assert f"cannot reach broker at {dead_broker}" in line
    assert elapsed < UNREACHABLE_DEADLINE_S


def test_brokers_from_environment(dead_broker):
    result, _ = timed_krill("topic", "list", env={"KRILL_BROKERS": dead_broker})
    assert f"cannot reach broker at {dead_broker}" in assert_one_error_line(result, code=1)


class FakeMessage:
    """The parts of confluent_kafka.Message that --format reads."""

    def __init__(self, key: bytes | None, value: bytes | None, headers=None) -> None:
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 41

    def timestamp(self) -> tuple[int, int]:
        return (1, 1700000000000)

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self):
        return self._headers


def test_consume_format_templates():
    from shards.topic_io_cli import record_format as _record_format

    message = FakeMessage(b"k1", b"\xffbinary", [("h", b"v"), ("n", None)])
    assert _record_format("%v\\n")(message) == b"\xffbinary\n"
    assert _record_format("%t/%p@%o %k=%v %T [%h]%%\\t")(message) == (
        b"orders/2@41 k1=\xffbinary 1700000000000 [h=v,n=]%\t"
    )
    assert _record_format("%k|%v")(FakeMessage(None, None)) == b"|"


def test_consume_format_json_replaces_bad_utf8():
    import json

    from shards.topic_io_cli import record_format as _record_format

    line = _record_format("json")(FakeMessage(None, b"ok\xff", [("h", b"v")]))
    assert line.endswith(b"\n")
    assert json.loads(line) == {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "timestamp": 1700000000000,
        "key": None,
        "value": "ok\ufffd",
        "headers": [{"key": "h", "value": "v"}],
    }
