"""The values the group state machine takes and gives: its states, the events fed to it, the
results its replies carry, the effects it asks for, and the snapshot it persists.

Plain frozen records with no behaviour (pykka's habit for messages); the theory is in
`actors.group.state`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from wire.errors import ErrorCode

__all__ = [
    "GroupState",
    "Join",
    "Sync",
    "Heartbeat",
    "Leave",
    "JoinResult",
    "SyncResult",
    "HeartbeatResult",
    "LeaveResult",
    "JoinedMember",
    "Reply",
    "Persist",
    "SetTimer",
    "Effect",
    "GroupSnapshot",
    "MemberSnapshot",
    "MemberDescription",
]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    group_id: str
    member_id: str  # "" for a new member
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), most preferred first
    require_known_member_id: bool = False  # JoinGroup v4+: answer MEMBER_ID_REQUIRED first
    reply: Any = None  # opaque to the state machine: returned in Reply.to


@dataclass(frozen=True, slots=True)
class Sync:
    group_id: str
    member_id: str
    group_instance_id: str | None
    generation_id: int
    protocol_type: str | None  # v5+; None: not checked
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]  # only the leader's carries any
    reply: Any = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    group_id: str
    member_id: str
    group_instance_id: str | None
    generation_id: int
    reply: Any = None


@dataclass(frozen=True, slots=True)
class Leave:
    group_id: str
    members: tuple[tuple[str, str | None], ...]  # (member id or "", group instance id)
    reply: Any = None


# Results (what Reply carries) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveResult:
    error: ErrorCode
    members: tuple[tuple[str, str | None, ErrorCode], ...] = ()


# Effects --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    to: Any
    result: Any


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the member's metadata for the chosen protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """What survives a restart: Kafka's GroupMetadataValue."""

    protocol_type: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    state_timestamp_ms: int
    members: tuple[MemberSnapshot, ...]


@dataclass(frozen=True, slots=True)
class Persist:
    snapshot: GroupSnapshot


@dataclass(frozen=True, slots=True)
class SetTimer:
    deadline_ms: int | None  # None: no timer needed


Effect = Reply | Persist | SetTimer


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes
