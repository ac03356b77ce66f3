"""A Partition's start and its producer-state rebuilds, with its shard's I/O pools held by hand.

What recovery keeps after a kill -9 may be only in the page cache: the partition advertises
nothing (no high watermark, no Raft machine that would acknowledge its log, no answer to a
client) until its recovery sync, every segment file fdatasync'd on the I/O pool, is back
(issue #26, defect 4). Its producer state is rebuilt off the loop, on the read pool, from the
last producer-state snapshot and the batch headers after it, on start and after a cut, while
client messages wait (defect 9).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import actors.partition_producers as producers_module
from actors.hard_state import HardStateStore
from actors.partition import Partition
from actors.partition_messages import PartitionInfo, Produce, ProduceResult
from actors.producer_rebuild import Rebuilt
from actors.services import BrokerSettings
from actors.topic_config import TopicSettings
from shards.watch import WatchService
from storage import DiskLog, LogConfig, probes
from storage.header_scan import HeaderScan
from tests.support.actor_loop import actor_loop, settle
from tests.support.io_pool import pool_call
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to

pytestmark = pytest.mark.timeout(60)

KEY = ("t", 0)
PID = 77
SMALL = TopicSettings(segment_bytes=400, segment_ms=1 << 40, max_message_bytes=1 << 20,
                      log_append_time=False, write_caching=False)

loop = pytest.fixture(actor_loop)


class HeldIo:
    """A shard's Services for one Partition, its I/O pool's calls and its read pool's calls
    held in two lists (or run at once on the loop, `immediate`)."""

    def __init__(self, data_dir: Path, immediate: bool = False) -> None:
        self.settings = BrokerSettings(1, "127.0.0.1", 9092, str(data_dir), "cluster")
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = None
        self.disk_space = None
        self.chunks = None  # buffered mode
        self.immediate = immediate
        self.io: list[Callable[[], None]] = []
        self.reads: list[Callable[[], None]] = []

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self._hold(self.io, pool_call(fn, done))

    def read_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        self._hold(self.reads, pool_call(fn, done))

    clean_blocking = run_blocking

    def _hold(self, calls: list[Callable[[], None]], call: Callable[[], None]) -> None:
        if self.immediate:
            asyncio.get_event_loop().call_soon(call)
        else:
            calls.append(call)

    def segments_removed(self, paths: list[str]) -> None:
        pass

    @staticmethod
    def release(calls: list[Callable[[], None]]) -> None:
        while calls:
            calls.pop(0)()

    def published(self) -> int | None:
        return self.long_polls.table.high_watermark(KEY)


def idempotent(sequence: int) -> bytearray:
    return build_batch([(None, b"record %d" % sequence, [])], producer_id=PID,
                       producer_epoch=0, base_sequence=sequence)


def write_unsynced_log(directory: Path, batches: int, epoch: int = 0) -> int:
    """Append `batches` idempotent batches over several segments and close without a flush
    (what a kill -9 leaves: the bytes in the page cache only); the log's end."""
    log = DiskLog.open(directory, LogConfig(segment_bytes=400))
    for sequence in range(batches):
        batch = idempotent(sequence)
        log.append(batch, iter_batches(batch), epoch, 1000 + sequence)
    end = log.next_offset
    assert len(log.segment_base_offsets) > 1
    log.close()
    return end


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The files the partition log fdatasyncs, by path, in order."""
    paths: list[str] = []
    real = probes.fdatasync

    def fdatasync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(probes, "fdatasync", fdatasync)
    yield paths


def turns(loop: asyncio.AbstractEventLoop) -> None:
    """Let the loop run whatever is due (nothing the test holds)."""
    loop.run_until_complete(asyncio.sleep(0.02))


def ask(loop: asyncio.AbstractEventLoop, ref: Any, make: Callable[[Any], Any]) -> Any:
    answers: list[Any] = []
    ref.tell(make(answers.append))
    settle(loop, lambda: bool(answers))
    return answers[0]


def produce(loop: asyncio.AbstractEventLoop, ref: Any, sequence: int) -> ProduceResult:
    batch = idempotent(sequence)
    result: ProduceResult = ask(loop, ref, lambda reply: Produce(
        memoryview(batch), iter_batches(batch), -1, reply))
    return result


# Defect 4: the recovery sync comes before anything is advertised ---------------------------------


def test_a_recovered_log_is_synced_before_its_high_watermark_or_any_answer(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, synced: list[str]
) -> None:
    directory = tmp_path / "t-0"
    end = write_unsynced_log(directory, 20)
    services = HeldIo(tmp_path)
    ref = Partition.start("t", 0, TOPIC_ID, directory, SMALL, services)
    infos: list[dict[str, int]] = []
    ref.tell(PartitionInfo(infos.append))
    services.release(services.reads)  # the producer state comes back first
    turns(loop)
    assert synced == []
    assert services.published() is None, "a high watermark before the recovery sync"
    assert infos == [], "an answer before the recovery sync"
    services.release(services.io)  # the recovery sync
    settle(loop, lambda: bool(infos))
    segments = {str(p) for p in directory.glob("*.log")}
    assert segments <= set(synced), sorted(segments - set(synced))
    assert infos[0]["flushed_offset"] == infos[0]["high_watermark"] == end
    assert services.published() == end
    services.immediate = True
    assert produce(loop, ref, 20).base_offset == end  # and it serves


class FakeRaft:
    """The shard's RaftServices for one replica, recording what the partition starts."""

    election_ticks = 10
    heartbeat_ticks = 1

    def __init__(self, loop: asyncio.AbstractEventLoop, directory: Path,
                 run_io: Callable[[Any, Any], None]) -> None:
        self.address = (1, 0)
        self.lost: frozenset[Any] = frozenset()
        self.loop = loop
        self.hard_states = HardStateStore(directory, run_io, loop.call_soon)
        self.registered: list[Any] = []
        self.sent: list[Any] = []

    def send(self, key: Any, messages: list[Any]) -> None:
        self.sent.extend(messages)

    def register(self, key: Any, tick: Callable[[], None],
                 replicas: tuple[Any, ...] = ()) -> None:
        self.registered.append(key)

    def unregister(self, key: Any) -> None:
        pass

    def schedule(self, fn: Callable[[], None]) -> None:
        self.loop.call_soon(fn)

    recovery = None

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.loop.call_later(delay_s, fn)

    def leader_changed(self, *args: Any) -> None:
        pass


def test_a_restarted_replica_starts_its_raft_machine_only_once_its_log_is_synced(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, synced: list[str]
) -> None:
    # A Raft machine takes the log it starts with as synced (actors/raft/log.py): a restarted
    # follower would acknowledge its recovered tail at once, a leader count it as flushed.
    directory = tmp_path / "t-0"
    write_unsynced_log(directory, 20, epoch=3)
    services = HeldIo(tmp_path)
    raft = FakeRaft(loop, tmp_path / "raft", services.run_blocking)
    services.raft = raft  # type: ignore[attr-defined]
    Partition.start("t", 0, TOPIC_ID, directory, SMALL, services, ((1, 0), (2, 0), (3, 0)))
    services.release(services.reads)
    turns(loop)
    assert raft.registered == [] and raft.sent == [], "Raft ran before the recovery sync"
    assert synced == []
    services.release(services.io)
    settle(loop, lambda: bool(raft.registered))
    assert {str(p) for p in directory.glob("*.log")} <= set(synced)


def test_a_failed_recovery_sync_cuts_nothing_and_is_tried_again_while_clients_wait(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    end = write_unsynced_log(directory, 10)
    services = HeldIo(tmp_path)
    ref = Partition.start("t", 0, TOPIC_ID, directory, SMALL, services)
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", True)
    services.release(services.io)
    monkeypatch.setattr(probes.PROBES, "fdatasync_error", False)
    services.release(services.reads)
    answers: list[ProduceResult] = []
    batch = idempotent(10)
    ref.tell(Produce(memoryview(batch), iter_batches(batch), -1, answers.append))
    turns(loop)
    assert answers == [] and services.published() is None
    settle(loop, lambda: bool(services.io))  # the sync again, a while later
    services.immediate = True
    services.release(services.io)
    settle(loop, lambda: bool(answers))
    assert answers[0].base_offset == end  # nothing was cut
    assert services.published() == end + 1


# Defect 9: producer state rebuilt off the loop, from a snapshot --------------------------------


class Rebuilds:
    """What the partition's producer-state rebuilds did: the threads that read batch headers
    from the log, and what each rebuild gave."""

    def __init__(self) -> None:
        self.readers: list[int] = []
        self.results: list[Rebuilt] = []

    def clear(self) -> None:
        self.readers.clear()
        self.results.clear()

    def on_the_loop(self) -> bool:
        return threading.get_ident() in self.readers  # this thread runs the loop


@pytest.fixture
def rebuilds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rebuilds]:
    seen = Rebuilds()

    def recorded(real: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def headers(self: Any, from_offset: int = 0) -> Iterator[Any]:
            seen.readers.append(threading.get_ident())
            yield from real(self, from_offset)

        return headers

    # What a rebuild reads the log with: the scan off the loop, and the log itself (how the
    # partition read it before: every header since the log start, on the loop).
    monkeypatch.setattr(HeaderScan, "headers", recorded(HeaderScan.headers))
    monkeypatch.setattr(DiskLog, "iter_batch_headers", recorded(DiskLog.iter_batch_headers))
    real_rebuild = getattr(producers_module, "rebuild", None)
    if real_rebuild is not None:
        def rebuild(dir_fd: int, scan: HeaderScan, name: str) -> Rebuilt:
            result: Rebuilt = real_rebuild(dir_fd, scan, name)
            seen.results.append(result)
            return result

        monkeypatch.setattr(producers_module, "rebuild", rebuild)
    yield seen


def run_in_a_thread(calls: list[Callable[[], None]]) -> None:
    """Run the held pool calls as a pool thread would (their answers hop onto the loop)."""
    while calls:
        worker = threading.Thread(target=calls.pop(0))
        worker.start()
        worker.join()


def test_producer_state_is_rebuilt_on_the_read_pool_from_the_last_snapshot(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, rebuilds: Rebuilds
) -> None:
    directory = tmp_path / "t-0"
    first = Partition.start("t", 0, TOPIC_ID, directory, SMALL, HeldIo(tmp_path, immediate=True))
    offsets = [produce(loop, first, sequence).base_offset for sequence in range(30)]
    first.stop(block=False)
    settle(loop, lambda: not first.is_alive())
    assert len(list(directory.glob("*.snapshot"))) >= 2  # written at the rolls
    rebuilds.clear()
    services = HeldIo(tmp_path)
    ref = Partition.start("t", 0, TOPIC_ID, directory, SMALL, services)
    services.release(services.io)
    infos: list[dict[str, int]] = []
    ref.tell(PartitionInfo(infos.append))
    turns(loop)
    assert not rebuilds.on_the_loop(), "the producer state was read on the loop"
    assert infos == [], "an answer before the producer state was rebuilt"
    run_in_a_thread(services.reads)
    settle(loop, lambda: bool(infos))
    assert rebuilds.readers and not rebuilds.on_the_loop()
    ((rebuilt),) = rebuilds.results
    assert rebuilt.snapshot_offset is not None and rebuilt.replayed < 10, rebuilt
    assert infos[0]["producers"] == 1
    # The state is whole: a retry of the last batch is a duplicate, with its first offset.
    assert produce(loop, ref, 29).base_offset == offsets[29]
    assert produce(loop, ref, 28).base_offset == offsets[28]
    assert produce(loop, ref, 31).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_cut_rebuilds_off_the_loop_from_the_snapshot_below_it_while_clients_wait(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, rebuilds: Rebuilds
) -> None:
    directory = tmp_path / "t-0"
    lone = Partition.start("t", 0, TOPIC_ID, directory, SMALL, HeldIo(tmp_path, immediate=True))
    offsets = [produce(loop, lone, sequence).base_offset for sequence in range(30)]
    lone.stop(block=False)
    settle(loop, lambda: not lone.is_alive())
    snapshots = sorted(int(p.name.split(".")[0]) for p in directory.glob("*.snapshot"))
    assert len(snapshots) >= 3
    newest, older = snapshots[-1], snapshots[-2]
    cut = next(o for o in reversed(offsets) if older < o < newest)
    # The same log as a follower's (it never campaigns: it is not the preferred replica).
    services = HeldIo(tmp_path, immediate=True)
    services.raft = FakeRaft(loop, tmp_path / "raft", services.run_blocking)  # type: ignore[attr-defined]
    services.raft.address = (2, 0)  # type: ignore[attr-defined]
    ref = Partition.start("t", 0, TOPIC_ID, directory, SMALL, services, ((1, 0), (2, 0), (3, 0)))
    ask(loop, ref, PartitionInfo)
    # The cut its Replica makes (actors/replica.py) for a divergent tail.
    actor = ref._actor_weakref()  # noqa: SLF001 - the Replica's calls are the partition's own
    assert actor is not None and actor._log is not None  # noqa: SLF001
    services.immediate = False
    ticket = actor._log.truncate_to(cut)  # noqa: SLF001
    rebuilds.clear()
    actor.log_rewritten()
    ticket.run()
    actor._log.cut_complete(ticket)  # noqa: SLF001
    answers: list[ProduceResult] = []
    batch = idempotent(0)
    ref.tell(Produce(memoryview(batch), iter_batches(batch), -1, answers.append))
    turns(loop)
    assert not rebuilds.on_the_loop(), "the producer state was read on the loop"
    assert answers == [], "a client answered before the producer state was rebuilt"
    services.release(services.io)  # the snapshots above the cut go
    run_in_a_thread(services.reads)
    settle(loop, lambda: bool(answers))
    assert answers[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER  # a follower's answer
    assert rebuilds.readers and not rebuilds.on_the_loop()
    ((rebuilt),) = rebuilds.results
    assert rebuilt.snapshot_offset == older, (rebuilt, snapshots, cut)
    kept = offsets.index(cut) - 1  # the sequence of the last batch the cut kept
    duplicate = actor._producer_state.producers.check(PID, 0, kept, 0).duplicate  # noqa: SLF001
    assert duplicate is not None and duplicate.first_offset == offsets[kept]
    assert actor._producer_state.producers.check(PID, 0, kept + 2, 0).error is not None  # noqa: SLF001
    assert max(int(p.name.split(".")[0]) for p in directory.glob("*.snapshot")) <= cut
