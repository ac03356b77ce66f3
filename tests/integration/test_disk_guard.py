"""A full disk, for real: the node's data directory on a small tmpfs of its own.

The node runs in a mount namespace of its own (`unshare --mount`, as root), where a tmpfs of
a few MiB is mounted on its data directory; the test fills and frees that filesystem through
`/proc/<pid>/root/<data dir>`, the node's view of it. With the free-space guard
(`--storage-min-free-bytes`) produces are refused with KAFKA_STORAGE_ERROR before anything is
appended, reads and groups go on, and writes come back by themselves once space does. With
the guard off the disk itself refuses (ENOSPC part way through a write) and the log must not
keep a torn batch.

The tmpfs lives as long as the node's processes, so these tests check the files on disk
rather than restart the node (tests/integration/test_failure_probes.py restarts one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.support.broker import REPO, BrokerProcess, wait_for
from tests.support.kafka import consume, create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1024 * 1024


class TmpfsBroker(BrokerProcess):
    """A node whose data directory is a tmpfs of `size_mib`, in a mount namespace of its own
    (the pid is the node's supervisor: unshare and sh exec it)."""

    def __init__(self, data_dir: Path, size_mib: int, *extra_args: str) -> None:
        super().__init__(data_dir, *extra_args)
        self.size_mib = size_mib

    def start(self) -> TmpfsBroker:
        assert self.process is None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs -o size={self.size_mib}m tmpfs "$0" && exec "$@"',
             str(self.data_dir), sys.executable, "-m", "shards.cli", "start",
             "--listen", self.bootstrap, "--data-dir", str(self.data_dir),
             "--smp", str(self.smp), "--reader-listen", self.reader_address,
             "--admin-port", str(self.admin_port), *self.extra_args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.kill9()
            raise
        return self

    def seen(self, name: str) -> Path:
        """A path in the data directory as the node sees it (its tmpfs)."""
        assert self.process is not None
        return Path(f"/proc/{self.process.pid}/root{self.data_dir}") / name

    def free_bytes(self) -> int:
        stat = os.statvfs(self.seen(""))
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave_bytes: int) -> None:
        """Write a filler file until only about `leave_bytes` are free."""
        size = self.free_bytes() - leave_bytes
        assert size > 0, (self.free_bytes(), leave_bytes)
        with open(self.seen("filler"), "ab") as f:
            chunk = b"\xff" * MiB
            while size > 0:
                f.write(chunk[:size])
                size -= min(size, MiB)

    def free_filler(self) -> None:
        self.seen("filler").unlink()

    def alerts(self) -> list[float]:
        return [v for (name, _), v in self.metrics().items()
                if name == "krill_storage_disk_free_space_alert"]


def _can_mount_tmpfs(directory: Path) -> str | None:
    """None if this machine lets a test mount a tmpfs in a mount namespace; else why not."""
    directory.mkdir()
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=1m tmpfs {directory} && touch {directory}/x"],
        capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return probe.stderr.strip() or f"exit code {probe.returncode}"
    return None


@pytest.fixture
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TmpfsBroker]:
    why = _can_mount_tmpfs(tmp_path / "mount-check")
    assert why is None, (f"these tests need root and `unshare --mount` to give the node a "
                         f"small tmpfs of its own: {why}")
    size_mib, *args = request.param
    node = TmpfsBroker(tmp_path / "data", size_mib, *args).start()
    try:
        yield node
    finally:
        node.kill9()  # its namespace and tmpfs go with it


def _produce_once(broker: BrokerProcess, topic: str, value: bytes) -> KafkaError | None:
    """One record, acks=all, no retries: the broker's own answer."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "retries": 0,
                         "enable.idempotence": False, "message.timeout.ms": 10_000,
                         "message.max.bytes": 2 * MiB})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value=value, partition=0,
                     on_delivery=lambda err, _msg: outcome.append(err))
    assert producer.flush(20) == 0
    return outcome[0]


@pytest.mark.parametrize("small_disk", [(64, "--storage-min-free-bytes", str(16 * MiB))],
                         indirect=True)
def test_under_the_threshold_produces_are_refused_reads_go_on_and_writes_resume(
    small_disk: TmpfsBroker,
) -> None:
    broker = small_disk
    create_topic(broker, "guarded", partitions=2)
    produce(broker, "guarded", [(None, f"v{i}".encode(), None, i % 2) for i in range(50)],
            acks="all")
    assert broker.alerts() and not any(broker.alerts())

    broker.fill(leave_bytes=8 * MiB)  # under the 16 MiB threshold: the next look sees it
    wait_for(lambda: all(broker.alerts()), 10, "every shard's guard sees the full disk")
    public = broker.metrics()[("redpanda_storage_disk_free_space_alert", ())]
    assert public == 2  # Redpanda's "degraded": writes refused
    free_before = broker.free_bytes()
    error = _produce_once(broker, "guarded", b"refused" * 1000)
    assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR, error
    assert broker.free_bytes() == free_before  # nothing was appended
    # Reads go on, and so do groups: a commit goes to __consumer_offsets all the same.
    got = consume(broker, "guarded", 2, 50)
    assert sorted(m.value() for m in got) == sorted(f"v{i}".encode() for i in range(50))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g",
                         "enable.auto.commit": False})
    try:
        committed = consumer.commit(offsets=[TopicPartition("guarded", 0, 25)],
                                    asynchronous=False)
        assert committed is not None and committed[0].error is None, committed
    finally:
        consumer.close()

    broker.free_filler()
    wait_for(lambda: not any(broker.alerts()), 10, "the guards see the room again")
    assert _produce_once(broker, "guarded", b"after") is None
    got = consume(broker, "guarded", 2, 51)
    assert sorted(m.offset() for m in got if m.partition() == 0) == list(range(26))
    log = broker.log()
    assert "is under storage_min_free_bytes" in log and "is back over" in log, log[-3000:]


def _whole_batches(segment: Path) -> bool:
    """Whether the file is a chain of whole batches (length prefixes to its very end)."""
    data = segment.read_bytes()
    position = 0
    while position + 12 <= len(data):
        position += 12 + int.from_bytes(data[position + 8:position + 12], "big")
    return position == len(data)


@pytest.mark.parametrize("small_disk", [(16, "--storage-min-free-bytes", "0")], indirect=True)
def test_enospc_mid_write_leaves_no_torn_batch_and_writes_go_on(small_disk: TmpfsBroker) -> None:
    broker = small_disk
    create_topic(broker, "full")
    for i in range(20):
        assert _produce_once(broker, "full", f"v{i}".encode() * 100) is None
    broker.fill(leave_bytes=64 * 1024)
    error = _produce_once(broker, "full", os.urandom(600 * 1024))  # does not fit
    assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR, error
    segments = sorted(broker.seen("full-0").glob("*.log"))
    assert all(_whole_batches(s) for s in segments), "a torn batch was left on disk"
    errors = [v for (name, _), v in broker.metrics().items()
              if name == "krill_storage_write_errors_total"]
    assert sum(errors) >= 1

    broker.free_filler()
    assert _produce_once(broker, "full", b"after") is None
    got = consume(broker, "full", 1, 21)
    assert [m.offset() for m in got] == list(range(21))
    assert got[-1].value() == b"after"
    assert all(_whole_batches(s) for s in segments)
