"""The messages a `Partition` actor takes (actors/partition.py), and what it answers.

Each is an immutable record told to the partition's actor, from its own shard or, through
shards/remote.py and shards/router.py, from another; `reply` callbacks run on the partition's
loop. A produce runs in two phases (DESIGN.md §2): `on_dispatched` once its place in the log is
fixed, `reply` once it is durable (acks=1 and acks=all) or refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from actors.topic_config import TopicSettings
from actors.trace import ProduceTrace
from storage import FileSlice
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader

__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "Delete",
    "DeleteRecords",
    "EpochEndOffset",
    "FetchBudget",
    "ListOffset",
    "ListOffsetResult",
    "PartitionInfo",
    "Produce",
    "ProduceResult",
    "Read",
    "RaftReceive",
    "RaftUnreachable",
    "ReadResult",
    "RecordError",
    "TransferLeadership",
    "UpdateReplicas",
    "UpdateSettings",
    "WriteTxnMarker",
    "refuse",
]

# ListOffsets' special timestamps.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4


# DeleteRecords' answer: (error, low watermark: the log start offset after the request)
DeleteRecordsReply = Callable[[tuple[ErrorCode, int]], None]

class RecordError(NamedTuple):
    """A record that made its batch be refused (KIP-467): its index in its batch, and why."""

    batch_index: int
    message: str


class ProduceResult(NamedTuple):
    error: ErrorCode
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: tuple[RecordError, ...] = ()  # with INVALID_RECORD: the records at fault


class Produce(NamedTuple):
    """Append validated batches. `reply` (phase two, "produced") is None for acks=0;
    `on_dispatched` (phase one) runs once the batches are appended or refused, when the order
    is fixed and the bytes are the partition's own (a cross-core produce frees its copy)."""

    records: memoryview  # writable: offsets are patched in place
    headers: list[BatchHeader]
    acks: int
    reply: Callable[[ProduceResult], None] | None
    on_dispatched: Callable[[], None] | None = None
    # The group coordinator's transactional offsets (TxnOffsetCommit) to its own shard's
    # `__consumer_offsets` partition: batches of a client's producer id and epoch with no
    # sequence (Kafka's AppendOrigin.COORDINATOR), checked for the epoch only. Never crosses
    # shards (a coordinator appends only to partitions it leads on its shard).
    from_coordinator: bool = False
    trace: ProduceTrace | None = None  # a sampled request's stage times (actors/trace.py)


class FetchBudget:
    """Bytes left for one fetch response, shared by its partitions in request order."""

    __slots__ = ("remaining", "taken")

    def __init__(self, max_bytes: int) -> None:
        self.remaining = max_bytes
        self.taken = 0


class ReadResult(NamedTuple):
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | memoryview | None = None
    # Where read_committed reads stop (actors/txn_state.py); every read answers it.
    last_stable_offset: int = -1
    # A read_committed read's (producer id, first offset) of the aborted transactions that
    # overlap what it could read (Kafka's FetchResponse AbortedTransactions); None otherwise.
    aborted_transactions: list[tuple[int, int]] | None = None

    @property
    def size(self) -> int:
        records = self.records
        if records is None:
            return 0
        return records.length if isinstance(records, FileSlice) else len(records)


class Read(NamedTuple):
    offset: int
    max_bytes: int
    current_leader_epoch: int
    budget: FetchBudget
    reply: Callable[[ReadResult], None]
    # Any replica may answer, up to the high watermark it knows (the Spark reader's
    # "read from an in-sync replica"; Kafka's Fetch reads from the leader).
    any_replica: bool = False
    # read_committed: whole batches below the last stable offset only, with the aborted
    # transactions listed (Kafka's isolation_level 1).
    committed: bool = False


class ListOffsetResult(NamedTuple):
    error: ErrorCode
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


class ListOffset(NamedTuple):
    timestamp: int
    current_leader_epoch: int
    reply: Callable[[ListOffsetResult], None]
    committed: bool = False  # read_committed: latest is the last stable offset


class EpochEndOffset(NamedTuple):
    """OffsetForLeaderEpoch: the end offset of `leader_epoch`; replies (error, epoch, offset)."""

    leader_epoch: int
    current_leader_epoch: int
    reply: Callable[[tuple[ErrorCode, int, int]], None]


class PartitionInfo(NamedTuple):
    """Replies a dict of offsets (for describe tools and tests)."""

    reply: Callable[[dict[str, int]], None]


class UpdateReplicas(NamedTuple):
    """The partition's replicas changed (a move began, was redirected or completed:
    actors/cluster/moves.py): every replica's (node, shard), and the move's target, None once
    none is under way."""

    replicas: tuple[tuple[int, int], ...]
    target: tuple[tuple[int, int], ...] | None


class Delete(NamedTuple):
    """The topic was deleted: fail waiters, close the log, remove the directory, stop.

    The shard renamed the directory to `trash` before telling (a topic of the same name may
    be created there at once); it is removed on the read pool."""

    trash: Path


class UpdateSettings(NamedTuple):
    settings: TopicSettings


class DeleteRecords(NamedTuple):
    """Move the log start up to `offset` (-1: the high watermark); replies (error, low
    watermark) once the new start is durable (actors/log_lifecycle.py), and a replicated
    partition's leader once its live followers have taken it."""

    offset: int
    reply: DeleteRecordsReply


class RaftReceive(NamedTuple):
    """Raft messages from the partition's peers, in the order they came (shards/calls/raft.py)."""

    messages: list[Any]  # actors.raft.Message


class RaftUnreachable(NamedTuple):
    """Node RPC gave up on a send to `peer` (its queue is full): Raft probes it again later."""

    peer: tuple[int, int]


class TransferLeadership(NamedTuple):
    """Hand leadership to the most caught-up follower (a clean shutdown); replies whether a
    transfer started."""

    reply: Callable[[bool], None]


class WriteTxnMarker(NamedTuple):
    """End a producer's transaction on this partition (Kafka's WriteTxnMarkers, from the
    transaction coordinator): the leader appends a COMMIT or ABORT control batch for
    (`producer_id`, `producer_epoch`) and replies NONE once that batch is committed (below
    the high watermark), or the error that kept it out (NOT_LEADER_OR_FOLLOWER,
    INVALID_PRODUCER_EPOCH for an epoch older than the producer's, ...)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    reply: Callable[[ErrorCode], None]


def refuse(message: Any, error: ErrorCode) -> None:
    """Answer a partition message with `error` (its partition is gone, or not here); a produce
    also gives back its bytes (phase one)."""
    if isinstance(message, Produce):
        if message.on_dispatched is not None:
            message.on_dispatched()
        if message.reply is not None:
            message.reply(ProduceResult(error))
    elif isinstance(message, Read):
        message.reply(ReadResult(error))
    elif isinstance(message, ListOffset):
        message.reply(ListOffsetResult(error))
    elif isinstance(message, EpochEndOffset):
        message.reply((error, -1, -1))
    elif isinstance(message, DeleteRecords):
        message.reply((error, -1))
    elif isinstance(message, TransferLeadership):
        message.reply(False)
    elif isinstance(message, WriteTxnMarker):
        message.reply(error)
    elif isinstance(message, PartitionInfo):
        message.reply({"error": int(error)})
