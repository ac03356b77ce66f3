"""Messages to the GroupCoordinator besides the group events of `actors.group.events`: plain
values and a reply callback each, so a coordinator on another shard differs only by its
ActorRef. Requests for a group id go to `Services.group_coordinator(group_id)`.

The transaction messages (`InitTransactional`, `AddTxnPartitions`, `AddTxnOffsets`,
`EndTransaction`, `DescribeTxns`, `ListTxns`) go to the coordinator of the transactional id,
found the same way (`Services.group_coordinator(transactional_id)`): it owns the id's
`__consumer_offsets` partition. Their replies carry plain values only (they cross shards
generically). `TxnCommitOffsets` goes to the GROUP's coordinator, as `CommitOffsets` does.

`OffsetsOwnership` and `TxnOffsetsMarker` come from the shard itself rather than from a
client: which `__consumer_offsets` partitions the coordinator owns, as their leadership moves;
and a transaction marker committed on one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from actors.group.events import MemberDescription
from actors.group.log_records import OffsetValue
from wire.errors import ErrorCode

__all__ = [
    "OffsetsOwnership",
    "EnsureReady",
    "CommitOffsets",
    "CommitEntry",
    "FetchOffsets",
    "FetchedOffset",
    "DescribeGroups",
    "GroupDescription",
    "ListGroups",
    "GroupListing",
    "DeleteGroups",
    "DeleteOffsets",
    "InitTransactional",
    "AddTxnPartitions",
    "EndTransaction",
    "AddTxnOffsets",
    "TxnCommitOffsets",
    "TxnOffsetsMarker",
    "TxnDescription",
    "DescribeTxns",
    "TxnListing",
    "ListTxns",
]


class OffsetsOwnership(NamedTuple):
    """From the shard: the whole set of `__consumer_offsets` partitions this coordinator owns
    from now on, sent whenever a local offsets partition gains or loses leadership (the
    partitions whose replica on this shard is the Raft leader).

    Until the first one arrives, the `owns(p)` given at start decides, once and for all (one
    node: the shard that hosts p owns it). The first one replaces `owns` for good. A partition
    named is read from its log start and served once replayed; one left out is forgotten at
    once (its requests are answered NOT_COORDINATOR); one whose load failed is owned again
    only when a later OffsetsOwnership names it again."""

    partitions: frozenset[int]


class EnsureReady(NamedTuple):
    """FindCoordinator and Metadata: reply once `__consumer_offsets` exists (it is created
    now if it does not) and is loaded. With a `group_id`: once that group's partition is
    loaded (NONE), or at once NOT_COORDINATOR if this coordinator does not own it. Without:
    once no partition this coordinator owns is still loading (always NONE)."""

    reply: Callable[[ErrorCode], None]
    group_id: str | None = None


class CommitEntry(NamedTuple):
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


class CommitOffsets(NamedTuple):
    group_id: str
    generation_id: int  # -1: a standalone consumer
    member_id: str
    group_instance_id: str | None
    entries: list[CommitEntry]
    reply: Callable[[list[ErrorCode]], None]  # one per entry


class FetchedOffset(NamedTuple):
    topic: str
    partition: int
    value: OffsetValue | None  # None: nothing committed
    # UNSTABLE_OFFSET_COMMIT: asked with `require_stable` while a transaction holds a pending
    # offset of this partition for the group (value None).
    error: ErrorCode = ErrorCode.NONE


class FetchOffsets(NamedTuple):
    """`reply(error, fetched)` with `with_error`; else the older form `reply(fetched)`, which
    cannot say the coordinator moved (NOT_COORDINATOR is then an empty list): a caller should
    set `with_error`."""

    group_id: str
    partitions: list[tuple[str, int]] | None  # None: every committed partition
    reply: Callable[..., None]
    with_error: bool = False
    require_stable: bool = False  # OffsetFetch v7+ RequireStable


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberDescription]
    error: ErrorCode = ErrorCode.NONE  # NOT_COORDINATOR: the group's partition is not ours


class DescribeGroups(NamedTuple):
    group_ids: list[str]
    reply: Callable[[list[GroupDescription]], None]


class GroupListing(NamedTuple):
    group_id: str
    protocol_type: str
    state: str


class ListGroups(NamedTuple):
    reply: Callable[[list[GroupListing]], None]


class DeleteGroups(NamedTuple):
    group_ids: list[str]
    reply: Callable[[list[ErrorCode]], None]  # one per group id


class DeleteOffsets(NamedTuple):
    group_id: str
    partitions: list[tuple[str, int]]
    reply: Callable[[ErrorCode, list[ErrorCode]], None]  # top-level, one per partition


# Transactions (actors/group/transactions.py) ------------------------------------------------


class InitTransactional(NamedTuple):
    """InitProducerId with a transactional id: `reply(error, producer_id, producer_epoch)`.
    `producer_id`/`producer_epoch`: the producer's current ones (v3+, KIP-360), else -1."""

    transactional_id: str
    timeout_ms: int
    producer_id: int
    producer_epoch: int
    reply: Callable[[ErrorCode, int, int], None]


class AddTxnPartitions(NamedTuple):
    """AddPartitionsToTxn: one error for every partition (`reply(error)`)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: list[tuple[str, int]]
    reply: Callable[[ErrorCode], None]


class EndTransaction(NamedTuple):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    reply: Callable[[ErrorCode], None]


class AddTxnOffsets(NamedTuple):
    """AddOffsetsToTxn: the transaction takes the group's `__consumer_offsets` partition, as
    AddPartitionsToTxn takes a partition (`reply(error)`). Goes to the transactional id's
    coordinator."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    reply: Callable[[ErrorCode], None]


class TxnCommitOffsets(NamedTuple):
    """TxnOffsetCommit: the offsets, pending in the producer's transaction until its marker
    (actors/group/txn_offsets.py). Goes to the GROUP's coordinator. `generation_id` -1 and
    `member_id` "" (before v3): no member checks."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    generation_id: int
    member_id: str
    group_instance_id: str | None
    entries: list[CommitEntry]
    reply: Callable[[list[ErrorCode]], None]  # one per entry


class TxnOffsetsMarker(NamedTuple):
    """From a `__consumer_offsets` Partition leader to its shard's coordinator: the
    producer's COMMIT or ABORT marker at `offset` is committed there; its pending offsets of
    that partition's groups become committed (or are dropped)."""

    partition: int
    producer_id: int
    commit: bool
    offset: int


class TxnDescription(NamedTuple):
    transactional_id: str
    error: ErrorCode  # NOT_COORDINATOR, TRANSACTIONAL_ID_NOT_FOUND, or NONE
    state: str = ""  # Kafka's names: "Ongoing", "CompleteCommit", ...
    timeout_ms: int = 0
    start_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    partitions: list[tuple[str, int]] = []


class DescribeTxns(NamedTuple):
    transactional_ids: list[str]
    reply: Callable[[list[TxnDescription]], None]  # one per id, in order


class TxnListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str


class ListTxns(NamedTuple):
    """Every transactional id of the coordinator, filtered: by state names and producer ids
    (empty: any), and running longer than `min_duration_ms` (-1: any)."""

    states: list[str]
    producer_ids: list[int]
    min_duration_ms: int
    reply: Callable[[list[TxnListing]], None]
