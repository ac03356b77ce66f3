"""DescribeGroups (key 15), versions 0-5.

v1 throttle time; v2 same; v3 IncludeAuthorizedOperations (no ACLs here: every group
operation is allowed, see `authorized_operations`); v4 GroupInstanceId per member; v5
flexible. A group that does not exist is described as Dead with no error, as Kafka does.
Member metadata and assignments are given only in Stable.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import DescribeGroups, GroupDescription
from actors.handlers.authorized_operations import GROUP_OPERATIONS, authorized_operations
from actors.handlers.group_common import tell_coordinator
from actors.handlers.join import Join
from wire.errors import ErrorCode
from wire.messages.describe_groups import DescribeGroupsRequest, DescribeGroupsResponse

DescribedGroup = DescribeGroupsResponse.DescribedGroup
DescribedGroupMember = DescribeGroupsResponse.DescribedGroupMember

API_KEY = 15
MIN_VERSION = 0
MAX_VERSION = 5
REQUEST = DescribeGroupsRequest


def handle(ctx: Any, request: DescribeGroupsRequest) -> None:
    group_ids = list(request.groups)
    operations = authorized_operations(
        ctx.version >= 3 and request.include_authorized_operations, GROUP_OPERATIONS
    )

    def done(results: list[tuple[ErrorCode, GroupDescription | None]]) -> None:
        groups = []
        for group_id, (error, d) in zip(group_ids, results, strict=True):
            if d is None:
                groups.append(
                    DescribedGroup(
                        error_code=error,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=[],
                        authorized_operations=operations,
                    )
                )
                continue
            groups.append(
                DescribedGroup(
                    error_code=ErrorCode.NONE,
                    group_id=d.group_id,
                    group_state=d.state,
                    protocol_type=d.protocol_type,
                    protocol_data=d.protocol_name,
                    members=[
                        DescribedGroupMember(
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in d.members
                    ],
                    authorized_operations=operations,
                )
            )
        ctx.respond(DescribeGroupsResponse(throttle_time_ms=0, groups=groups))

    join = Join(len(group_ids), done)
    for index, group_id in enumerate(group_ids):
        slot = join.slot(index)
        message = DescribeGroups([group_id], _first(slot))
        if not tell_coordinator(ctx, group_id, message):
            slot((ErrorCode.NOT_COORDINATOR, None))


def _first(slot: Any) -> Any:
    def first(described: list[Any]) -> None:
        if not described:  # refused (its waiting queue full): retriable
            slot((ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None))
            return
        d = described[0]
        slot((d.error, d if d.error == ErrorCode.NONE else None))
    return first
