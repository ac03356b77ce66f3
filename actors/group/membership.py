"""Membership and rebalance, for the GroupCoordinator: the served groups' state machines
(`actors.group.state.Group`), fed the group events (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and the ticks of one timer per group, their effects carried out in order, and the
DescribeGroups and ListGroups answers.

It owns the `Group` objects of the loaded offsets partitions and their timers; it does no I/O
of its own: a group's metadata is appended to `__consumer_offsets` through the `append` the
coordinator hands it (persist before send: replies after a Persist wait for its outcome), and
its timers run on the coordinator's loop through `call_later`. Which partitions are served,
and what their groups' committed offsets are, is not its business (coordinator.py,
offsets.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from actors.group.appends import Append, CallLater, metadata_error
from actors.group.events import GroupSnapshot
from actors.group.log_records import encode_group_key, encode_group_value
from actors.group.messages import DescribeGroups, GroupDescription, GroupListing, ListGroups
from actors.group.state import (
    Group,
    GroupState,
    Heartbeat,
    HeartbeatResult,
    Join,
    Leave,
    LeaveResult,
    Persist,
    Reply,
    SetTimer,
    Sync,
    SyncResult,
)
from actors.services import now_ms
from wire.errors import ErrorCode

__all__ = ["Membership", "not_described"]


class Membership:
    def __init__(self, initial_delay_ms: int, append: Append, call_later: CallLater,
                 stopped: Callable[[], bool]) -> None:
        """`stopped()`: has the coordinator stopped (a timer that fires then does nothing)?"""
        self._initial_delay_ms = initial_delay_ms
        self._append = append
        self._call_later = call_later
        self._stopped = stopped
        self.groups: dict[str, Group] = {}  # of loaded partitions only
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, self._initial_delay_ms)
        return group

    def restore(self, restored: dict[str, GroupSnapshot], now: int) -> None:
        """A load's groups, as their last metadata left them, run from `now` on."""
        for group_id, snapshot in restored.items():
            group = self.group(group_id)
            group.restore(snapshot, now)
            self.run(group, group.tick(now))

    def unload(self, group_id: str) -> None:
        """The group's partition is no longer served: forget it; its waiting joins and syncs
        are answered (NOT_COORDINATOR)."""
        group = self.groups.pop(group_id, None)
        self.set_timer(group_id, None)
        if group is not None:
            for effect in group.unload():
                if isinstance(effect, Reply):
                    effect.to(effect.result)

    def remove(self, group_id: str) -> None:
        """The group is gone (deleted, or expired): its timer with it."""
        del self.groups[group_id]
        self.set_timer(group_id, None)

    def event(self, e: Join | Sync | Heartbeat | Leave) -> None:
        now = now_ms()
        if isinstance(e, Join):
            group = self.group(e.group_id)
            self.run(group, group.join(e, now))
            return
        existing = self.groups.get(e.group_id)
        if existing is None:
            unknown = ErrorCode.UNKNOWN_MEMBER_ID
            if isinstance(e, Sync):
                e.reply(SyncResult(unknown))
            elif isinstance(e, Heartbeat):
                e.reply(HeartbeatResult(unknown))
            else:
                e.reply(
                    LeaveResult(
                        ErrorCode.NONE, tuple((mid, iid, unknown) for mid, iid in e.members)
                    )
                )
            return
        if isinstance(e, Sync):
            self.run(existing, existing.sync(e, now))
        elif isinstance(e, Heartbeat):
            self.run(existing, existing.heartbeat(e, now))
        else:
            self.run(existing, existing.leave(e, now))

    def run(self, group: Group, effects: list[Any]) -> None:
        """Carry out a step's effects in order; replies after a Persist wait for it."""
        held: list[Reply] | None = None
        for effect in effects:
            if isinstance(effect, Reply):
                if held is None:
                    effect.to(effect.result)
                else:
                    held.append(effect)
            elif isinstance(effect, Persist):
                held = []
                record = (encode_group_key(group.group_id), encode_group_value(effect.snapshot))
                self._append(group.group_id, [record], _release(held))
            elif isinstance(effect, SetTimer):
                self.set_timer(group.group_id, effect.deadline_ms)
            else:
                raise AssertionError(f"unknown effect {effect!r}")

    def set_timer(self, group_id: str, deadline_ms: int | None) -> None:
        handle = self._timers.pop(group_id, None)
        if handle is not None:
            handle.cancel()
        if deadline_ms is None:
            return
        delay_s = max(0, deadline_ms - now_ms() + 1) / 1000
        self._timers[group_id] = self._call_later(delay_s, lambda: self._timer_fired(group_id))

    def _timer_fired(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        group = self.groups.get(group_id)
        if group is None or self._stopped():
            return
        self.run(group, group.tick(now_ms()))

    def describe(self, m: DescribeGroups, serves: Callable[[str], bool]) -> None:
        described = []
        for group_id in m.group_ids:
            if not serves(group_id):
                described.append(not_described(group_id, ErrorCode.NOT_COORDINATOR))
                continue
            group = self.groups.get(group_id)
            if group is None:
                described.append(GroupDescription(group_id, GroupState.DEAD.value, "", "", []))
                continue
            stable = group.state == GroupState.STABLE
            described.append(
                GroupDescription(
                    group_id,
                    group.state.value,
                    group.protocol_type or "",
                    (group.protocol_name or "") if stable else "",
                    group.describe(),
                )
            )
        m.reply(described)

    def list(self, m: ListGroups) -> None:
        m.reply(
            [
                GroupListing(group_id, group.protocol_type or "", group.state.value)
                for group_id, group in self.groups.items()
                if group.state != GroupState.DEAD
            ]
        )


def not_described(group_id: str, error: ErrorCode) -> GroupDescription:
    return GroupDescription(group_id, "", "", "", [], error)


def _release(held: list[Reply]) -> Callable[[ErrorCode], None]:
    """Send replies held behind a Persist; if it failed, each says so instead."""

    def done(error: ErrorCode) -> None:
        failed = metadata_error(error)
        for effect in held:
            result = effect.result
            if error != ErrorCode.NONE and result.error == ErrorCode.NONE:
                result = replace(result, error=failed)
            effect.to(result)

    return done
