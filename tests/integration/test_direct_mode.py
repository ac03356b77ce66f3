"""A node in direct storage mode (storage/appender.py) with a real client: its segment files
are written with O_DIRECT by its shards, tailing reads come from the chunks in memory, a small
write memory is reused (evictions), and what was acknowledged is there after a restart, read
back with O_DIRECT around the page cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from storage.page_cache import drop_file, file_cached_pages
from tests.support.broker import BrokerProcess
from tests.support.kafka import consume, create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

def _direct_fds(pids: list[int], data_dir: Path) -> list[str]:
    """Segment files the processes hold open with O_DIRECT."""
    found = []
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                flags = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if target.startswith(str(data_dir)) and target.endswith(".log") and (
                    int(flags, 8) & os.O_DIRECT):
                found.append(target)
    return found


def _read_from(node: BrokerProcess, topic: str, partition: int, offset: int,
               count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "tail",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        values: list[bytes] = []
        for _ in range(100):  # bounded: 100 polls of 0.2 s
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) >= count:
                break
        return values
    finally:
        consumer.close()


def _value(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


def test_produce_and_tail_through_the_chunks_then_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    node = BrokerProcess(data, "--storage-mode", "direct", "--direct-memory-bytes",
                         str(2 * 128 * 1024), smp=1).start()
    try:
        create_topic(node, "d", partitions=3)
        records = [(f"k{i}".encode(), os.urandom(700), None, i % 3) for i in range(3000)]
        for start in range(0, 3000, 300):  # ~2 MB through 256 KiB of write memory
            produce(node, "d", records[start:start + 300], acks="all")
        assert _direct_fds(node.shard_pids(), data), "no segment file open with O_DIRECT"
        got = consume(node, "d", 3, 3000)
        assert sorted(m.value() for m in got) == sorted(r[1] for r in records)
        metrics = node.metrics()
        assert _value(metrics, "krill_storage_direct_chunks", state="all") == 2
        assert _value(metrics, "krill_storage_direct_evictions_total") > 0
        assert _value(metrics, "krill_storage_direct_reads_total", result="miss") > 0
        tail = _read_from(node, "d", 0, 995, 5)  # the last batches: still in the chunks
        assert tail == [r[1] for r in records if r[3] == 0][995:]
        metrics = node.metrics()
        assert _value(metrics, "krill_storage_direct_reads_total", result="hit") > 0
        node.restart()
        segments = sorted(data.rglob("d-*/*.log"))
        assert len(segments) >= 3, segments
        for path in segments:  # what start-up read (recovery) goes from the page cache
            drop_file(path)
        again = consume(node, "d", 3, 3000)
        assert sorted(m.value() for m in again) == sorted(r[1] for r in records)
        for p in range(3):
            assert [m.offset() for m in again if m.partition() == p] == list(range(1000))
        # Read from the files with O_DIRECT into the shard's read windows: not one page of
        # them came through the page cache.
        metrics = node.metrics()
        assert _value(metrics, "krill_storage_direct_read_window_fills_total") > 0
        assert _value(metrics, "krill_storage_direct_read_window_fill_bytes_total") >= 2_000_000
        assert sum(file_cached_pages(path) for path in segments) == 0
    finally:
        node.kill9() if node.alive() else node.stop()
