"""LeaveGroup (key 13), versions 0-5.

v1 throttle time; v2 same; v3 batches members (MemberId and GroupInstanceId per member, a
result per member; KIP-345, a static member may leave by instance id alone); v4 flexible;
v5 a Reason per member. Before v3 the one member's error is the top-level error.
"""

from __future__ import annotations

from typing import Any

from actors.group.events import Leave, LeaveResult
from actors.handlers.group_common import tell_coordinator
from wire.errors import ErrorCode
from wire.messages.leave_group import LeaveGroupRequest, LeaveGroupResponse

MemberResponse = LeaveGroupResponse.MemberResponse

API_KEY = 13
MIN_VERSION = 0
MAX_VERSION = 5
REQUEST = LeaveGroupRequest


def handle(ctx: Any, request: LeaveGroupRequest) -> None:
    batched = ctx.version >= 3
    if batched:
        members = tuple((m.member_id, m.group_instance_id) for m in request.members)
    else:
        members = ((request.member_id, None),)

    def reply(result: LeaveResult) -> None:
        error = result.error
        if not batched and error == ErrorCode.NONE and result.members:
            error = result.members[0][2]
        ctx.respond(
            LeaveGroupResponse(
                throttle_time_ms=0,
                error_code=error,
                members=[
                    MemberResponse(member_id=mid, group_instance_id=iid, error_code=e)
                    for mid, iid, e in result.members
                ],
            )
        )

    if not members:
        reply(LeaveResult(ErrorCode.INVALID_REQUEST))
        return
    event = Leave(group_id=request.group_id, members=members, reply=reply)
    if not tell_coordinator(ctx, request.group_id, event):
        reply(LeaveResult(ErrorCode.NOT_COORDINATOR))
