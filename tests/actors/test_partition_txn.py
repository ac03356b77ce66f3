"""A Partition actor's side of transactions, on a real log: transactional produces open a
transaction, `WriteTxnMarker` appends COMMIT or ABORT and answers once it is committed,
read_committed reads stop at the last stable offset and list aborted transactions, and a
restart rebuilds all of it from the log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.group import OFFSETS_TOPIC
from actors.group.messages import TxnOffsetsMarker
from actors.partition import Partition
from actors.partition_messages import (
    LATEST_TIMESTAMP,
    DeleteRecords,
    FetchBudget,
    ListOffset,
    ListOffsetResult,
    PartitionInfo,
    Produce,
    ProduceResult,
    Read,
    ReadResult,
    WriteTxnMarker,
)
from actors.services import BrokerSettings
from actors.topic_config import TopicSettings
from actors.txn_state import ABORT, COMMIT, marker_type
from actors.watermarks import Waiter
from shards.watch import WatchService
from storage import FileSlice
from tests.support.actor_loop import actor_loop, settle
from tests.support.io_pool import pool_call
from wire.errors import ErrorCode
from wire.record_batch import iter_batches
from wire.records import build_batch

TOPIC_ID = bytes(range(16))  # the topic incarnation these partitions belong to

pytestmark = pytest.mark.timeout(30)

PID = 4000


class Services:
    """What a Partition needs of its shard: blocking calls run on the next loop turn."""

    def __init__(self, data_dir: Path) -> None:
        self.settings = BrokerSettings(0, "127.0.0.1", 9092, str(data_dir), "cluster")
        self.long_polls = WatchService(0, lambda _topic, _index: 0)
        self.metrics = None
        self.disk_space = None
        self.chunks = None  # buffered mode

    def run_blocking(self, fn: Callable[[], Any], done: Callable[[Any, Any], None]) -> None:
        asyncio.get_event_loop().call_soon(pool_call(fn, done))

    read_blocking = clean_blocking = run_blocking

    def segments_removed(self, paths: list[str]) -> None:
        pass

    def local_group_coordinator(self) -> Any:
        return self.coordinator

    coordinator: Any = None


loop = pytest.fixture(actor_loop)


class Harness:
    def __init__(self, loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
        self.loop = loop
        self.services = Services(tmp_path)
        self.directory = tmp_path / "t-0"
        self.ref = self.start()

    topic = "t"

    def start(self) -> Any:
        settings = TopicSettings(1 << 30, 1 << 40, 1 << 20, False, False)
        return Partition.start(self.topic, 0, TOPIC_ID, self.directory, settings, self.services)

    def restart(self) -> None:
        ref = self.ref
        ref.stop(block=False)
        settle(self.loop, lambda: not ref.is_alive())
        self.ref = self.start()

    def ask(self, make: Callable[[Callable[[Any], None]], Any]) -> Any:
        answers: list[Any] = []
        self.ref.tell(make(answers.append))
        settle(self.loop, lambda: bool(answers))
        return answers[0]

    def produce(self, values: list[bytes], *, pid: int = PID, epoch: int = 0, sequence: int = 0,
                transactional: bool = True) -> ProduceResult:
        batch = build_batch([(None, v, []) for v in values], producer_id=pid,
                            producer_epoch=epoch, base_sequence=sequence,
                            transactional=transactional)
        result: ProduceResult = self.ask(
            lambda reply: Produce(memoryview(batch), iter_batches(batch), -1, reply))
        return result

    def coordinator_produce(self, *, epoch: int, from_coordinator: bool = True
                            ) -> ProduceResult:
        """A transactional batch with no sequence, as the group coordinator appends a
        TxnOffsetCommit's offsets."""
        batch = build_batch([(b"k", b"v", [])], producer_id=PID, producer_epoch=epoch,
                            transactional=True)
        result: ProduceResult = self.ask(lambda reply: Produce(
            memoryview(batch), iter_batches(batch), -1, reply,
            from_coordinator=from_coordinator))
        return result

    def marker(self, commit: bool, *, pid: int = PID, epoch: int = 0,
               coordinator_epoch: int = 5) -> ErrorCode:
        error: ErrorCode = self.ask(
            lambda reply: WriteTxnMarker(pid, epoch, commit, coordinator_epoch, reply))
        return error

    def read(self, offset: int, committed: bool) -> ReadResult:
        result: ReadResult = self.ask(lambda reply: Read(
            offset, 1 << 20, -1, FetchBudget(1 << 20), reply, committed=committed))
        return result

    def latest(self, committed: bool) -> int:
        result: ListOffsetResult = self.ask(
            lambda reply: ListOffset(LATEST_TIMESTAMP, -1, reply, committed))
        return result.offset

    def info(self) -> dict[str, int]:
        info: dict[str, int] = self.ask(PartitionInfo)
        return info


def batches(result: ReadResult) -> list[Any]:
    return iter_batches(bytearray(read_bytes(result)))


def read_bytes(result: ReadResult) -> bytes:
    records = result.records
    if records is None:
        return b""
    return records.read() if isinstance(records, FileSlice) else bytes(records)


@pytest.fixture
def partition(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Harness:
    return Harness(loop, tmp_path)


def test_read_committed_stops_at_an_open_transaction_until_its_commit(
        partition: Harness) -> None:
    assert partition.produce([b"plain"], pid=1, transactional=False).base_offset == 0
    assert partition.produce([b"a", b"b"]).base_offset == 1
    uncommitted, committed = partition.read(0, False), partition.read(0, True)
    assert uncommitted.high_watermark == 3 and uncommitted.last_stable_offset == 1
    assert [b.base_offset for b in batches(uncommitted)] == [0, 1]
    assert [b.base_offset for b in batches(committed)] == [0]  # whole batches below the LSO
    assert committed.aborted_transactions == [] and uncommitted.aborted_transactions is None
    assert partition.read(1, True).records is None
    assert partition.latest(True) == 1 and partition.latest(False) == 3

    assert partition.marker(commit=True) == ErrorCode.NONE  # answered once committed
    result = partition.read(0, True)
    assert result.high_watermark == result.last_stable_offset == 4
    marker = batches(result)[-1]
    assert (marker.base_offset, marker.is_control, marker.producer_id) == (3, True, PID)
    assert result.aborted_transactions == []
    assert partition.latest(True) == 4
    assert partition.info()["open_transactions"] == 0


def test_an_aborted_transaction_is_listed_for_read_committed(partition: Harness) -> None:
    partition.produce([b"x"])
    partition.produce([b"y"], pid=PID + 1)
    partition.produce([b"z"], sequence=1)
    assert partition.marker(commit=False) == ErrorCode.NONE  # at offset 3
    result = partition.read(0, True)
    assert result.last_stable_offset == 1  # PID + 1's is open at 1
    assert result.aborted_transactions == [(PID, 0)]
    assert partition.marker(commit=True, pid=PID + 1) == ErrorCode.NONE
    result = partition.read(0, True)
    assert result.last_stable_offset == result.high_watermark == 5
    assert result.aborted_transactions == [(PID, 0)]
    assert partition.read(4, True).aborted_transactions == []  # ended before offset 4
    assert partition.info()["aborted_transactions"] == 1


def test_markers_fence_older_epochs_and_bump_newer_ones(partition: Harness) -> None:
    partition.produce([b"x"], epoch=2)
    assert partition.marker(commit=False, epoch=1) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert partition.marker(commit=False, epoch=3) == ErrorCode.NONE  # the coordinator fenced
    assert partition.produce([b"late"], epoch=2, sequence=1).error == (
        ErrorCode.INVALID_PRODUCER_EPOCH)
    assert partition.produce([b"new"], epoch=3, sequence=0).error == ErrorCode.NONE
    assert partition.read(0, True).aborted_transactions == [(PID, 0)]


def test_markers_of_an_older_coordinator_are_fenced(partition: Harness) -> None:
    """Kafka's checkCoordinatorEpoch: a marker whose coordinator epoch (the leader epoch of
    the transaction's `__consumer_offsets` partition) is older than the last marker's for
    that producer comes from a coordinator since replaced; it is refused, and the epoch is
    read back from the log on start."""
    partition.produce([b"x"])
    assert partition.marker(commit=True, coordinator_epoch=5) == ErrorCode.NONE
    partition.produce([b"y"], sequence=1)
    assert partition.marker(commit=False, coordinator_epoch=4) == (
        ErrorCode.TRANSACTION_COORDINATOR_FENCED)
    assert partition.info()["open_transactions"] == 1  # nothing was written
    assert partition.marker(commit=True, pid=PID + 1, coordinator_epoch=0) == ErrorCode.NONE
    partition.restart()
    assert partition.marker(commit=False, coordinator_epoch=4) == (
        ErrorCode.TRANSACTION_COORDINATOR_FENCED)
    assert partition.marker(commit=False, epoch=0, coordinator_epoch=5) == ErrorCode.NONE
    assert partition.info()["open_transactions"] == 0
    # A producer epoch older than the producer's is fenced first, whatever the coordinator.
    partition.produce([b"z"], epoch=1, sequence=0)
    assert partition.marker(commit=True, epoch=0, coordinator_epoch=9) == (
        ErrorCode.INVALID_PRODUCER_EPOCH)
    assert partition.marker(commit=True, epoch=1, coordinator_epoch=6) == ErrorCode.NONE


def test_the_coordinators_batches_have_no_sequence_and_keep_epoch_fencing(
        partition: Harness) -> None:
    assert partition.coordinator_produce(epoch=1).error == ErrorCode.NONE
    assert partition.coordinator_produce(epoch=1).error == ErrorCode.NONE  # never a duplicate
    assert partition.info()["open_transactions"] == 1
    assert partition.coordinator_produce(epoch=0).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert partition.marker(commit=True, epoch=1) == ErrorCode.NONE
    assert partition.coordinator_produce(epoch=1, from_coordinator=False).error == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)  # a client's batch needs its sequence
    partition.restart()  # rebuilt from the log: the epoch still fences
    assert partition.coordinator_produce(epoch=0).error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_an_offsets_partition_tells_its_coordinator_of_committed_markers(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    told: list[Any] = []

    class Coordinator:
        def tell(self, message: Any) -> None:
            told.append(message)

    Harness.topic = OFFSETS_TOPIC
    try:
        offsets = Harness(loop, tmp_path)
    finally:
        Harness.topic = "t"
    offsets.services.coordinator = Coordinator()
    assert offsets.coordinator_produce(epoch=0).error == ErrorCode.NONE
    assert offsets.marker(commit=True) == ErrorCode.NONE
    assert offsets.marker(commit=False, epoch=1) == ErrorCode.NONE
    assert told == [TxnOffsetsMarker(0, PID, True, 1), TxnOffsetsMarker(0, PID, False, 2)]

    plain = Harness(loop, tmp_path / "plain")  # another topic's markers tell no coordinator
    plain.services.coordinator = Coordinator()
    plain.produce([b"x"])
    assert plain.marker(commit=True) == ErrorCode.NONE
    assert len(told) == 2


def test_a_marker_without_a_transaction_is_written_and_lists_nothing(
        partition: Harness) -> None:
    assert partition.marker(commit=False) == ErrorCode.NONE
    result = partition.read(0, True)
    assert [b.is_control for b in batches(result)] == [True]
    assert result.aborted_transactions == [] and result.last_stable_offset == 1


def test_a_plain_batch_inside_an_open_transaction_is_refused(partition: Harness) -> None:
    partition.produce([b"x"])
    refused = partition.produce([b"y"], sequence=1, transactional=False)
    assert refused.error == ErrorCode.INVALID_TXN_STATE
    assert partition.produce([b"y"], sequence=1).error == ErrorCode.NONE  # still in order


def test_a_retried_transactional_batch_is_a_duplicate(partition: Harness) -> None:
    first = partition.produce([b"x", b"y"])
    again = partition.produce([b"x", b"y"])
    assert again.error == ErrorCode.NONE and again.base_offset == first.base_offset
    assert partition.info()["next_offset"] == 2


def test_a_restart_rebuilds_open_and_aborted_transactions(partition: Harness) -> None:
    partition.produce([b"a"])  # 0, aborted below
    partition.produce([b"b"], pid=PID + 1)  # 1, left open
    partition.marker(commit=False)  # 2
    partition.produce([b"c"], pid=PID + 2)  # 3
    partition.marker(commit=True, pid=PID + 2)  # 4
    before = partition.read(0, True)
    partition.restart()
    after = partition.read(0, True)
    assert after.last_stable_offset == before.last_stable_offset == 1
    assert after.aborted_transactions == before.aborted_transactions == [(PID, 0)]
    assert partition.info()["open_transactions"] == 1
    # The rebuilt epoch still fences, and the open transaction still ends.
    assert partition.marker(commit=True, pid=PID + 1) == ErrorCode.NONE
    assert partition.read(0, True).last_stable_offset == 6
    data = read_bytes(partition.read(0, False))
    kinds = [marker_type(data[h.position:h.position + h.size])
             for h in iter_batches(bytearray(data))]
    assert kinds == [None, None, ABORT, None, COMMIT, COMMIT]


def test_log_start_past_an_aborted_transaction_forgets_it(partition: Harness) -> None:
    partition.produce([b"a"])
    partition.marker(commit=False)
    partition.produce([b"b"], pid=1, transactional=False)
    error, low = partition.ask(lambda reply: DeleteRecords(2, reply))
    assert (error, low) == (ErrorCode.NONE, 2)
    assert partition.read(2, True).aborted_transactions == []
    assert partition.info()["aborted_transactions"] == 0


def test_a_read_committed_long_poll_wakes_when_a_marker_commits(partition: Harness) -> None:
    partition.produce([b"x"])
    at_lso = partition.read(0, True)
    assert at_lso.records is None and at_lso.last_stable_offset == 0
    woken: list[bool] = []
    watching = partition.services.long_polls.watch(
        ("t", 0), at_lso.high_watermark, Waiter(lambda: woken.append(True)))
    assert watching  # nothing moved since the read
    assert partition.marker(commit=True) == ErrorCode.NONE
    settle(partition.loop, lambda: bool(woken))
    assert [b.base_offset for b in batches(partition.read(0, True))] == [0, 1]
