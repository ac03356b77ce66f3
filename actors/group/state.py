"""The classic consumer-group state machine: events in, effects out, no I/O, time passed in.

One `Group` per group id. The coordinator actor feeds it events (`Join`, `Sync`, `Heartbeat`,
`Leave`, `tick(now_ms)`) and carries out the effects each step returns, in order: `Reply`
(answer a waiting request), `Persist` (append the group's metadata to `__consumer_offsets`;
replies after it in the same list are sent only once it is durable: persist before send) and
`SetTimer` (the next instant `tick` must run, or None). The same shape as h11 and etcd raft.

States and transitions (Kafka's GroupCoordinator, classic protocol):

    Empty ──join──> PreparingRebalance ──all members joined / timeout──> CompletingRebalance
      ^                 ^        │                                         │ leader's sync
      │                 │        └── nobody left ──> Empty                 v
      │                 └──── join, leave, session expiry ────────────── Stable
      └── last member leaves or expires (via PreparingRebalance)
    Empty ──delete──> Dead (terminal: every request answers COORDINATOR_NOT_AVAILABLE)

PreparingRebalance waits for every known member to (re)join. When the group was Empty it is
the *initial* rebalance: it waits `initial_rebalance_delay_ms` (Kafka's 3 s default), extended
by the same delay whenever another member arrives, never past the rebalance timeout, so a
consumer group starting together gets one rebalance instead of one per member. Otherwise it
completes as soon as all members have joined, or at the largest member rebalance timeout,
dropping members that did not rejoin. Then the generation id goes up, the protocol is chosen
(the one all members support with the most first-choice votes), the leader receives every
member's metadata and the others an empty list; in CompletingRebalance the leader's SyncGroup
carries the assignments, which are relayed as bytes (assignors stay on the client).

Static membership (KIP-345): a member with a `group.instance.id` keeps its place across
restarts. A known instance joining with a new member id replaces the old id (whose pending
requests get FENCED_INSTANCE_ID); when the group is Stable and its protocols are unchanged it
gets the current generation and its old assignment without a rebalance. A request naming an
instance with another member id is fenced.

A member's session expires `session_timeout_ms` after its last join, sync or heartbeat unless a
join or sync of it is waiting (a waiting request keeps it alive, as Kafka does). Members asked
for a second join (MEMBER_ID_REQUIRED, JoinGroup v4+) are *pending* and expire the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from actors.group import limits
from actors.group.events import (
    Effect,
    GroupSnapshot,
    GroupState,
    Heartbeat,
    HeartbeatResult,
    Join,
    JoinedMember,
    JoinResult,
    Leave,
    LeaveResult,
    MemberDescription,
    MemberSnapshot,
    Persist,
    Reply,
    SetTimer,
    Sync,
    SyncResult,
)
from wire.errors import ErrorCode

__all__ = ["Group"]  # its events and effects are in actors.group.events


# The group -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    expires_at_ms: int
    assignment: bytes = b""
    join_reply: Any = None  # set while its JoinGroup waits
    sync_reply: Any = None  # set while its SyncGroup waits
    awaiting_join: bool = False

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


def _new_member_id(client_id: str) -> str:
    return f"{client_id}-{uuid.uuid4()}"


class Group:
    """One consumer group's membership; see the module docstring for the theory."""

    def __init__(
        self,
        group_id: str,
        initial_rebalance_delay_ms: int,
        *,
        new_member_id: Callable[[str], str] = _new_member_id,
    ) -> None:
        self.group_id = group_id
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.state = GroupState.EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.state_timestamp_ms = -1
        self._new_member_id = new_member_id
        self._members: dict[str, _Member] = {}  # in join order: the first is the next leader
        self._pending: dict[str, int] = {}  # member id -> expiry, awaiting its second join
        self._static: dict[str, str] = {}  # group instance id -> member id
        self._join_deadline_ms: int | None = None
        self._initial_join_limit_ms: int | None = None  # set during an initial rebalance
        self._effects: list[Effect] = []
        self._timer_ms: int | None = None

    # Queries ----------------------------------------------------------------------------------

    @property
    def member_ids(self) -> list[str]:
        return list(self._members)

    @property
    def member_count(self) -> int:
        return len(self._members)

    @property
    def pending_member_ids(self) -> list[str]:
        return list(self._pending)

    def is_empty(self) -> bool:
        return not self._members

    def has_member(self, member_id: str) -> bool:
        return member_id in self._members

    def assignment_of(self, member_id: str) -> bytes:
        return self._members[member_id].assignment

    def static_member_id(self, group_instance_id: str) -> str | None:
        return self._static.get(group_instance_id)

    def describe(self) -> list[MemberDescription]:
        with_metadata = self.state == GroupState.STABLE  # as Kafka's GroupMetadata.summary
        return [
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(self.protocol_name) if with_metadata else b"",
                m.assignment if with_metadata else b"",
            )
            for m in self._members.values()
        ]

    def subscriptions(self) -> list[bytes]:
        """Every member's metadata for the chosen protocol (to find subscribed topics)."""
        return [m.metadata(self.protocol_name) for m in self._members.values()]

    def deadline_ms(self) -> int | None:
        """The next instant `tick` has work to do, or None."""
        deadlines = list(self._pending.values())
        deadlines.extend(
            m.expires_at_ms
            for m in self._members.values()
            if not m.awaiting_join and m.sync_reply is None
        )
        if self.state == GroupState.PREPARING_REBALANCE and self._join_deadline_ms is not None:
            deadlines.append(self._join_deadline_ms)
        return min(deadlines, default=None)

    def check_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """May this member commit offsets now? (Kafka's doCommitOffsets checks, in order.)"""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id < 0 and self.state == GroupState.EMPTY:
            return ErrorCode.NONE  # a standalone consumer, not using group management
        if self.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def check_txn_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """May a transactional producer commit offsets for this member now? (Kafka's
        doTxnCommitOffsets checks, in order: TxnOffsetCommit v3 names the consumer's member
        and generation; before v3, "" and -1 skip them.)"""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id and member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id >= 0 and generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # Events ----------------------------------------------------------------------------------

    def join(self, e: Join, now_ms: int) -> list[Effect]:
        self._join(e, now_ms)
        return self._flush()

    def sync(self, e: Sync, now_ms: int) -> list[Effect]:
        self._sync(e, now_ms)
        return self._flush()

    def heartbeat(self, e: Heartbeat, now_ms: int) -> list[Effect]:
        self._reply(e.reply, HeartbeatResult(self._heartbeat(e, now_ms)))
        return self._flush()

    def leave(self, e: Leave, now_ms: int) -> list[Effect]:
        self._leave(e, now_ms)
        return self._flush()

    def tick(self, now_ms: int) -> list[Effect]:
        """Expire sessions and pending members, and end a join phase whose time is up."""
        for member_id, expiry in list(self._pending.items()):
            if expiry <= now_ms:
                del self._pending[member_id]
                self._maybe_complete_join(now_ms)
        for member in list(self._members.values()):
            if (
                member.member_id in self._members
                and member.expires_at_ms <= now_ms
                and not member.awaiting_join
                and member.sync_reply is None
            ):
                self._remove_member(member, now_ms)
        if (
            self.state == GroupState.PREPARING_REBALANCE
            and self._join_deadline_ms is not None
            and self._join_deadline_ms <= now_ms
        ):
            self._complete_join(now_ms)
        return self._flush()

    def delete(self) -> ErrorCode:
        """DeleteGroups: only an Empty group may go (to Dead, terminal)."""
        if self.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.state != GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        self.state = GroupState.DEAD
        return ErrorCode.NONE

    def unload(self) -> list[Effect]:
        """The coordinator no longer owns the group (its offsets partition moved): answer the
        JoinGroup and SyncGroup requests still waiting with NOT_COORDINATOR, so the members
        look the coordinator up again, and go Dead (Kafka's onGroupUnloaded)."""
        for member in self._members.values():
            if member.join_reply is not None:
                reply, member.join_reply = member.join_reply, None
                self._reply(reply, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
            if member.sync_reply is not None:
                reply, member.sync_reply = member.sync_reply, None
                self._reply(reply, SyncResult(ErrorCode.NOT_COORDINATOR))
        self.state = GroupState.DEAD
        self._members.clear()
        self._static.clear()
        self._pending.clear()
        self._join_deadline_ms = None
        return self._flush()

    def restore(self, snapshot: GroupSnapshot, now_ms: int) -> None:
        """Load a persisted generation: Stable with its members, or Empty."""
        assert self.state == GroupState.EMPTY and not self._members, "restore into a used group"
        self.protocol_type = snapshot.protocol_type or None
        self.generation_id = snapshot.generation_id
        self.protocol_name = snapshot.protocol_name
        self.leader_id = snapshot.leader_id
        self.state_timestamp_ms = snapshot.state_timestamp_ms
        for s in snapshot.members:
            protocols = ((snapshot.protocol_name or "", s.subscription),)
            member = _Member(
                s.member_id,
                s.group_instance_id,
                s.client_id,
                s.client_host,
                s.session_timeout_ms,
                s.rebalance_timeout_ms,
                snapshot.protocol_type,
                protocols,
                now_ms + s.session_timeout_ms,
                s.assignment,
            )
            self._members[s.member_id] = member
            if s.group_instance_id is not None:
                self._static[s.group_instance_id] = s.member_id
        self.state = GroupState.STABLE if self._members else GroupState.EMPTY

    # JoinGroup -------------------------------------------------------------------------------

    def _join(self, e: Join, now_ms: int) -> None:
        error = self._check_join(e)
        if error is not None:
            self._reply(e.reply, JoinResult(error, member_id=e.member_id))
            return
        if e.member_id == "":
            if e.group_instance_id is not None:
                self._join_static_new(e, now_ms)
            else:
                self._join_new(e, now_ms)
        else:
            self._join_known(e, now_ms)

    def _check_join(self, e: Join) -> ErrorCode | None:
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not e.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if not (
            limits.session_timeout_ms_min <= e.session_timeout_ms <= limits.session_timeout_ms_max
        ):
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if not self._supports(e.protocol_type, e.protocols):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _supports(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        if not protocol_type or not protocols:
            return False
        if not self._members:
            return True
        if protocol_type != self.protocol_type:
            return False
        return bool(self._candidates() & {name for name, _ in protocols})

    def _candidates(self) -> set[str]:
        """Protocols every member supports."""
        sets = [set(m.protocol_names()) for m in self._members.values()]
        return set.intersection(*sets) if sets else set()

    def _join_new(self, e: Join, now_ms: int) -> None:
        if len(self._members) + len(self._pending) >= limits.members_per_group_max:
            self._reply(e.reply, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED))
            return
        member_id = self._new_member_id(e.client_id)
        if e.require_known_member_id:
            # KIP-394: the member must come back with this id, so a retried first join
            # cannot leave an orphan member behind.
            self._pending[member_id] = now_ms + e.session_timeout_ms
            self._reply(e.reply, JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id))
            return
        self._add_member(e, member_id, now_ms)

    def _join_static_new(self, e: Join, now_ms: int) -> None:
        assert e.group_instance_id is not None
        old_id = self._static.get(e.group_instance_id)
        if old_id is None:
            self._add_member(e, self._new_member_id(e.client_id), now_ms)
            return
        old = self._members[old_id]
        unchanged = old.protocols == e.protocols and old.protocol_type == e.protocol_type
        member = self._replace_static(old, e, now_ms)
        if self.state == GroupState.STABLE and unchanged:
            # KIP-345: same protocols, so the current assignment still fits: no rebalance.
            # The leader gets the member list but must not reassign (skipAssignment, v9).
            leader = member.member_id == self.leader_id
            self._persist(now_ms)
            self._reply(
                e.reply, self._join_result(member, with_members=leader, skip_assignment=leader)
            )
            return
        member.protocols, member.protocol_type = e.protocols, e.protocol_type
        member.awaiting_join, member.join_reply = True, e.reply
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)

    def _replace_static(self, old: _Member, e: Join, now_ms: int) -> _Member:
        """Give instance `e.group_instance_id` a new member id, fencing the old one."""
        fenced = JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old.member_id)
        if old.join_reply is not None:
            self._reply(old.join_reply, fenced)
        if old.sync_reply is not None:
            self._reply(old.sync_reply, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        new_id = self._new_member_id(e.client_id)
        member = replace(
            old,
            member_id=new_id,
            client_id=e.client_id,
            client_host=e.client_host,
            session_timeout_ms=e.session_timeout_ms,
            rebalance_timeout_ms=e.rebalance_timeout_ms,
            expires_at_ms=now_ms + e.session_timeout_ms,
            join_reply=None,
            sync_reply=None,
            awaiting_join=False,
        )
        # Keep its place in join order (the leader stays the leader).
        self._members = {
            (new_id if k == old.member_id else k): (member if k == old.member_id else v)
            for k, v in self._members.items()
        }
        assert e.group_instance_id is not None
        self._static[e.group_instance_id] = new_id
        if self.leader_id == old.member_id:
            self.leader_id = new_id
        return member

    def _join_known(self, e: Join, now_ms: int) -> None:
        if e.member_id in self._pending:
            del self._pending[e.member_id]
            self._add_member(e, e.member_id, now_ms)
            return
        if self._fenced(e.member_id, e.group_instance_id):
            self._reply(e.reply, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=e.member_id))
            return
        member = self._members.get(e.member_id)
        if member is None or self.state == GroupState.EMPTY:
            self._reply(e.reply, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=e.member_id))
            return
        unchanged = member.protocols == e.protocols
        if self.state == GroupState.COMPLETING_REBALANCE and unchanged:
            # Its join response was lost: answer it again from the current generation.
            self._reply(e.reply, self._join_result(member, with_members=self._leads(member)))
            return
        if self.state == GroupState.STABLE and unchanged and not self._leads(member):
            self._touch(member, now_ms)
            self._reply(e.reply, self._join_result(member, with_members=False))
            return
        if member.join_reply is not None:
            self._reply(
                member.join_reply,
                JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id),
            )
        member.protocols = e.protocols
        member.session_timeout_ms = e.session_timeout_ms
        member.rebalance_timeout_ms = e.rebalance_timeout_ms
        member.awaiting_join, member.join_reply = True, e.reply
        if self.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)

    def _add_member(self, e: Join, member_id: str, now_ms: int) -> None:
        member = _Member(
            member_id,
            e.group_instance_id,
            e.client_id,
            e.client_host,
            e.session_timeout_ms,
            e.rebalance_timeout_ms,
            e.protocol_type,
            e.protocols,
            now_ms + e.session_timeout_ms,
            awaiting_join=True,
            join_reply=e.reply,
        )
        if not self._members:
            self.protocol_type = e.protocol_type
        self._members[member_id] = member
        if e.group_instance_id is not None:
            self._static[e.group_instance_id] = member_id
        if self.leader_id is None:
            self.leader_id = member_id
        if self.state == GroupState.PREPARING_REBALANCE and self._initial_join_limit_ms is not None:
            # Another member arrived during the initial delay: wait one more delay.
            self._join_deadline_ms = min(
                now_ms + self.initial_rebalance_delay_ms, self._initial_join_limit_ms
            )
        elif self.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)

    # Rebalance -------------------------------------------------------------------------------

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state == GroupState.COMPLETING_REBALANCE:
            self._fail_syncs(ErrorCode.REBALANCE_IN_PROGRESS)
        rebalance_timeout_ms = max(
            (m.rebalance_timeout_ms for m in self._members.values()), default=0
        )
        if self.state == GroupState.EMPTY:
            self._initial_join_limit_ms = now_ms + rebalance_timeout_ms
            self._join_deadline_ms = min(
                now_ms + self.initial_rebalance_delay_ms, self._initial_join_limit_ms
            )
        else:
            self._initial_join_limit_ms = None
            self._join_deadline_ms = now_ms + rebalance_timeout_ms
        self._become(GroupState.PREPARING_REBALANCE, now_ms)

    def _maybe_complete_join(self, now_ms: int) -> None:
        """Complete the join phase once every member has rejoined (not during the initial
        delay, which always runs its course)."""
        if self.state != GroupState.PREPARING_REBALANCE or self._initial_join_limit_ms is not None:
            return
        if self._pending or not all(m.awaiting_join for m in self._members.values()):
            return
        self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        for member in list(self._members.values()):
            if not member.awaiting_join:
                self._remove(member)
        self._join_deadline_ms = self._initial_join_limit_ms = None
        self.generation_id += 1
        if not self._members:
            self.protocol_name = None
            self.leader_id = None
            self._become(GroupState.EMPTY, now_ms)
            self._persist(now_ms)
            return
        self.protocol_name = self._select_protocol()
        if self.leader_id not in self._members:
            self.leader_id = next(iter(self._members))
        self._become(GroupState.COMPLETING_REBALANCE, now_ms)
        for member in self._members.values():
            reply, member.join_reply, member.awaiting_join = member.join_reply, None, False
            member.assignment = b""
            self._touch(member, now_ms)
            self._reply(reply, self._join_result(member, with_members=self._leads(member)))

    def _select_protocol(self) -> str:
        """The protocol every member supports with the most first-choice votes; ties go to
        the leader's preference order (Kafka breaks them arbitrarily)."""
        candidates = self._candidates()
        assert candidates, "members without a common protocol"
        votes: dict[str, int] = {}
        for member in self._members.values():
            choice = next(name for name in member.protocol_names() if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        order = self._members[self.leader_id or next(iter(self._members))].protocol_names()
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))

    def _join_result(
        self, member: _Member, *, with_members: bool, skip_assignment: bool = False
    ) -> JoinResult:
        members: tuple[JoinedMember, ...] = ()
        if with_members:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self._members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            member.member_id,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            self.leader_id or "",
            members,
            skip_assignment,
        )

    # SyncGroup -------------------------------------------------------------------------------

    def _sync(self, e: Sync, now_ms: int) -> None:
        error = self._check_member(e.member_id, e.group_instance_id, e.generation_id)
        if error is None and (
            (e.protocol_type is not None and e.protocol_type != self.protocol_type)
            or (e.protocol_name is not None and e.protocol_name != self.protocol_name)
        ):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is None and self.state == GroupState.PREPARING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not None:
            self._reply(e.reply, SyncResult(error))
            return
        member = self._members[e.member_id]
        self._touch(member, now_ms)
        if self.state == GroupState.STABLE:
            self._reply(e.reply, self._sync_result(member))
            return
        assert self.state == GroupState.COMPLETING_REBALANCE, self.state
        if member.sync_reply is not None:
            self._reply(member.sync_reply, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_reply = e.reply
        if member.member_id != self.leader_id:
            return
        assignments = dict(e.assignments)
        for m in self._members.values():
            m.assignment = bytes(assignments.get(m.member_id, b""))
        self._become(GroupState.STABLE, now_ms)
        self._persist(now_ms)
        for m in self._members.values():
            if m.sync_reply is not None:
                reply, m.sync_reply = m.sync_reply, None
                self._touch(m, now_ms)
                self._reply(reply, self._sync_result(m))

    def _sync_result(self, member: _Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment)

    def _check_member(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode | None:
        """The checks SyncGroup and Heartbeat share, in Kafka's order."""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    # Heartbeat and LeaveGroup ----------------------------------------------------------------

    def _heartbeat(self, e: Heartbeat, now_ms: int) -> ErrorCode:
        error = self._check_member(e.member_id, e.group_instance_id, e.generation_id)
        if error is not None:
            return error
        self._touch(self._members[e.member_id], now_ms)
        if self.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS  # how members learn to rejoin
        return ErrorCode.NONE

    def _leave(self, e: Leave, now_ms: int) -> None:
        if self.state == GroupState.DEAD:
            self._reply(e.reply, LeaveResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        results = []
        for asked, instance_id in e.members:
            member_id = asked
            if member_id == "" and instance_id is not None:  # by instance id alone (the admin)
                member_id = self._static.get(instance_id, "")
            if member_id in self._pending:
                del self._pending[member_id]
                self._maybe_complete_join(now_ms)
                error = ErrorCode.NONE
            elif instance_id is not None and self._fenced(member_id, instance_id):
                error = ErrorCode.FENCED_INSTANCE_ID
            elif member_id not in self._members:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            else:
                self._remove_member(self._members[member_id], now_ms)
                error = ErrorCode.NONE
            # The member id as asked, as Kafka answers: the Java AdminClient matches each
            # answer to its request by (member id, instance id).
            results.append((asked, instance_id, error))
        self._reply(e.reply, LeaveResult(ErrorCode.NONE, tuple(results)))

    # Helpers ---------------------------------------------------------------------------------

    def _fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        if group_instance_id is None:
            return False
        known = self._static.get(group_instance_id)
        return known is not None and known != member_id

    def _leads(self, member: _Member) -> bool:
        return member.member_id == self.leader_id

    def _touch(self, member: _Member, now_ms: int) -> None:
        member.expires_at_ms = now_ms + member.session_timeout_ms

    def _remove_member(self, member: _Member, now_ms: int) -> None:
        """A member left or expired: update the group as its state requires."""
        self._remove(member)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        self._maybe_complete_join(now_ms)

    def _remove(self, member: _Member) -> None:
        if member.join_reply is not None:
            self._reply(
                member.join_reply,
                JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id),
            )
        if member.sync_reply is not None:
            self._reply(member.sync_reply, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        del self._members[member.member_id]
        if member.group_instance_id is not None:
            self._static.pop(member.group_instance_id, None)
        if self.leader_id == member.member_id:
            self.leader_id = next(iter(self._members), None)

    def _fail_syncs(self, error: ErrorCode) -> None:
        for member in self._members.values():
            member.assignment = b""
            if member.sync_reply is not None:
                reply, member.sync_reply = member.sync_reply, None
                self._reply(reply, SyncResult(error))

    def _become(self, state: GroupState, now_ms: int) -> None:
        assert self.state != GroupState.DEAD, "a dead group came back"
        self.state = state
        self.state_timestamp_ms = now_ms

    def _persist(self, now_ms: int) -> None:
        self._effects.append(Persist(self.snapshot(now_ms)))

    def snapshot(self, now_ms: int) -> GroupSnapshot:
        return GroupSnapshot(
            self.protocol_type or "",
            self.generation_id,
            self.protocol_name,
            self.leader_id,
            now_ms,
            tuple(
                MemberSnapshot(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(self.protocol_name),
                    m.assignment,
                )
                for m in self._members.values()
            ),
        )

    def _reply(self, to: Any, result: Any) -> None:
        self._effects.append(Reply(to, result))

    def _flush(self) -> list[Effect]:
        deadline = self.deadline_ms()
        if deadline != self._timer_ms:
            self._timer_ms = deadline
            self._effects.append(SetTimer(deadline))
        effects, self._effects = self._effects, []
        return effects
