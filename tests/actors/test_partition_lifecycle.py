"""A partition deleted, or its shard stopped, while an fdatasync is in flight; and a log
start that retention or DeleteRecords moved, across a restart.

The flush runs on the I/O pool with the log's fds, so the log may close only once it has
returned: before, the delete tripped `close() with a flush ticket outstanding` and left the
directory and its fds behind. Here the flushes are held by the test and released by hand.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.metrics import ShardMetrics
from actors.partition import Partition
from actors.partition_messages import Delete, DeleteRecords, PartitionInfo, Produce, ProduceResult
from actors.services import BrokerSettings
from actors.topic_config import TopicSettings
from actors.watermarks import Watermarks
from shards.watch import WatchService
from storage import DiskLog, LogConfig
from tests.storage.batches import make_batch, make_records
from tests.support.actor_loop import actor_loop, settle
from tests.support.io_pool import pool_call
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to

pytestmark = pytest.mark.timeout(30)


class HeldServices:
    """What a Partition needs of its shard, with every blocking call held until released."""

    def __init__(self, data_dir: Path) -> None:
        self.settings = BrokerSettings(0, "127.0.0.1", 9092, str(data_dir), "cluster")
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = ShardMetrics()
        self.disk_space = None  # no free-space guard
        self.chunks = None  # buffered mode
        self.held: list[Callable[[], None]] = []

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self.held.append(pool_call(fn, done))

    read_blocking = run_blocking  # one held list: the tests release in order
    clean_blocking = run_blocking

    def segments_removed(self, paths: list[str]) -> None:
        pass  # no other shards here

    def release(self) -> None:
        held, self.held = self.held, []
        for run in held:
            run()

    @property
    def table(self) -> Watermarks:
        return self.long_polls.table


loop = pytest.fixture(actor_loop)


def open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def start(tmp_path: Path) -> tuple[Any, HeldServices, Path]:
    """A partition, started: its start's jobs (the recovery sync, the producer state) are
    let through at once."""
    services = HeldServices(tmp_path)
    directory = tmp_path / "t-0"
    settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
    ref = Partition.start("t", 0, TOPIC_ID, directory, settings, services)
    services.release()
    return ref, services, directory


def produce(ref: Any, answers: list[ProduceResult]) -> None:
    batch = build_batch([(None, b"value", [])])
    ref.tell(Produce(memoryview(batch), iter_batches(batch), -1, answers.append))


def test_delete_while_a_flush_runs_waits_for_it_then_removes_everything(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    ref, services, directory = start(tmp_path)
    answers: list[ProduceResult] = []
    produce(ref, answers)
    settle(loop, lambda: len(services.held) == 1)  # its fdatasync is out
    assert any(str(directory) in path for path in open_fds())
    trash = tmp_path / "t-0.x-delete"
    os.rename(directory, trash)  # as the shard does before telling Delete
    ref.tell(Delete(trash))
    produce(ref, answers)  # queued behind the delete
    settle(loop, lambda: len(answers) == 2)
    gone = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert [a.error for a in answers] == [gone, gone]  # never acknowledged
    assert ref.is_alive()  # waits for its flush before it closes the log
    services.release()  # the flush returns: the log closes, removal goes to the pool
    settle(loop, lambda: not ref.is_alive() and len(services.held) == 1)
    services.release()  # the removal itself
    assert not trash.exists()
    assert not any(str(trash) in path for path in open_fds())
    assert services.table.high_watermark(("t", 0)) is None


def test_stop_while_a_flush_runs_closes_the_log_when_it_returns(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    ref, services, directory = start(tmp_path)
    answers: list[ProduceResult] = []
    produce(ref, answers)
    settle(loop, lambda: len(services.held) == 1)
    ref.stop(block=False)
    settle(loop, lambda: not ref.is_alive())
    assert [a.error for a in answers] == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert any(str(directory) in path for path in open_fds())  # the flush still holds them
    services.release()
    assert not any(str(directory) in path for path in open_fds())
    # The flush that came back after the stop still counted.
    assert sum(services.metrics.fdatasync_latency.counts) == 1
    # Nothing was lost: the data is on disk and a new partition reads it back.
    again, services2, _ = start(tmp_path)
    infos: list[dict[str, int]] = []
    again.tell(PartitionInfo(infos.append))
    settle(loop, lambda: bool(infos))
    assert infos[0]["next_offset"] == 1 and infos[0]["high_watermark"] == 1


def test_a_flush_that_returns_behind_the_stop_still_closes_the_log(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The flush's answer is told while the actor is alive, queued behind its stop, and
    dropped: the log must close all the same (it stayed open for that flush)."""
    ref, services, directory = start(tmp_path)
    produce(ref, [])
    settle(loop, lambda: len(services.held) == 1)
    ref.stop(block=False)  # queued first
    services.release()  # its answer is told now, behind the stop
    settle(loop, lambda: not ref.is_alive())
    assert not any(str(directory) in path for path in open_fds())


def test_delete_while_removed_segments_wait_their_delay_closes_them(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    services = HeldServices(tmp_path)
    services.settings = BrokerSettings(0, "127.0.0.1", 9092, str(tmp_path), "cluster",
                                       log_cleanup_interval_ms=20)
    directory = tmp_path / "t-0"
    settings = TopicSettings(segment_bytes=200, segment_ms=1 << 40, max_message_bytes=1 << 20,
                             log_append_time=False, write_caching=False, retention_bytes=100,
                             file_delete_delay_ms=60_000)
    ref = Partition.start("t", 0, TOPIC_ID, directory, settings, services)
    answers: list[ProduceResult] = []
    for _ in range(8):
        produce(ref, answers)
    for _ in range(20):  # flushes, then retention's renames, one held job at a time
        renamed = any(name.endswith(".deleted") for name in os.listdir(directory))
        if renamed and len(answers) == 8:
            break  # (retention may rename before the last answers are in: wait for both)
        settle(loop, lambda r=renamed: bool(services.held) or (r and len(answers) == 8))
        services.release()
    assert [a.error for a in answers] == [ErrorCode.NONE] * 8
    assert any(name.endswith(".log.deleted") for name in os.listdir(directory))
    # The topic goes while the removed segments wait out file.delete.delay.ms (60 s).
    trash = tmp_path / "t-0.x-delete"
    os.rename(directory, trash)
    ref.tell(Delete(trash))
    for _ in range(5):
        settle(loop, lambda: bool(services.held) or not ref.is_alive())
        services.release()
    settle(loop, lambda: not ref.is_alive())
    services.release()
    assert not any(str(trash) in path for path in open_fds())


def epochs_log(directory: Path) -> int:
    """A log of three segments, one an epoch (3, 4, 5; a new epoch rolls a segment), of
    three 2-record batches each: offsets 0-5, 6-11 and 12-17. The active segment's size."""
    log = DiskLog.open(directory, LogConfig())
    for epoch in (3, 3, 3, 4, 4, 4, 5, 5, 5):
        records, headers = make_records(make_batch([1000, 1001]))
        log.append(records, headers, epoch, 0)
    log.flush()
    assert log.segment_base_offsets == [0, 6, 12]
    size = log.summaries()[-1].size
    log.close()
    return size


@pytest.mark.parametrize("how", ["retention", "delete_records"])
def test_the_epoch_before_a_moved_log_start_survives_a_restart(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, how: str
) -> None:
    """Issue 26, item 5: retention removed the head segments and moved the log start, but
    only DeleteRecords wrote it down with the epoch before it; reopened, the log started at
    its first segment left and that epoch was lost (a Raft follower read it as 0)."""
    directory = tmp_path / "t-0"
    active_bytes = epochs_log(directory)
    services = HeldServices(tmp_path)
    services.settings = BrokerSettings(0, "127.0.0.1", 9092, str(tmp_path), "cluster",
                                       log_cleanup_interval_ms=20)
    settings = TopicSettings(segment_bytes=1 << 20, segment_ms=1 << 40,
                             max_message_bytes=1 << 20, log_append_time=False,
                             write_caching=False, file_delete_delay_ms=0,
                             retention_bytes=active_bytes if how == "retention" else -1)
    ref = Partition.start("t", 0, TOPIC_ID, directory, settings, services)
    replies: list[tuple[ErrorCode, int]] = []
    if how == "delete_records":
        ref.tell(DeleteRecords(12, replies.append))  # a segment boundary: the head goes whole
    for _ in range(20):  # retention's or DeleteRecords' jobs, one held job at a time
        settle(loop, lambda: bool(services.held))
        services.release()
        if not any(name.endswith(".log") and not name.startswith("00000000000000000012")
                   for name in os.listdir(directory)):
            break
    assert replies == ([(ErrorCode.NONE, 12)] if how == "delete_records" else [])
    ref.stop(block=False)
    settle(loop, lambda: not ref.is_alive())
    services.release()
    reopened = DiskLog.open(directory, LogConfig())
    assert reopened.segment_base_offsets == [12]
    assert (reopened.log_start_offset, reopened.epoch_before_start) == (12, 4)
    reopened.close()
