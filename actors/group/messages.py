"""Messages to the GroupCoordinator besides the group events of `actors.group.events`: plain
values and a reply callback each, so a coordinator on another shard differs only by its
ActorRef. Requests for a group id go to `Services.group_coordinator(group_id)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from actors.group.events import MemberDescription
from actors.group.log_records import OffsetValue
from wire.errors import ErrorCode

__all__ = [
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
]


class EnsureReady(NamedTuple):
    """FindCoordinator: reply NONE once the offsets topic exists and is loaded."""

    reply: Callable[[ErrorCode], None]


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


class FetchOffsets(NamedTuple):
    group_id: str
    partitions: list[tuple[str, int]] | None  # None: every committed partition
    reply: Callable[[list[FetchedOffset]], None]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberDescription]


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
