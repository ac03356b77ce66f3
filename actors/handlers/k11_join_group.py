"""JoinGroup (key 11), versions 0-9.

v1 adds RebalanceTimeoutMs (v0 uses the session timeout for both); v2 throttle time; v3 same;
v4 the broker may answer a first join with MEMBER_ID_REQUIRED and the member id to use
(KIP-394; done here for dynamic members); v5 GroupInstanceId (static membership, KIP-345);
v6 flexible; v7 ProtocolType and ProtocolName in the response; v8 Reason; v9 SkipAssignment
(a static leader rejoining a Stable group must not reassign). The group's state machine
decides everything (actors/group/state.py); this module only translates.
"""

from __future__ import annotations

from typing import Any

from actors.group.events import Join, JoinResult
from actors.handlers.group_common import client_host, tell_coordinator
from wire.errors import ErrorCode
from wire.messages.join_group import JoinGroupRequest, JoinGroupResponse

JoinGroupResponseMember = JoinGroupResponse.JoinGroupResponseMember

API_KEY = 11
MIN_VERSION = 0
MAX_VERSION = 9
REQUEST = JoinGroupRequest


def handle(ctx: Any, request: JoinGroupRequest) -> None:
    version = ctx.version

    def reply(result: JoinResult) -> None:
        ctx.respond(
            JoinGroupResponse(
                throttle_time_ms=0,
                error_code=result.error,
                generation_id=result.generation_id,
                protocol_type=result.protocol_type,
                protocol_name=result.protocol_name or ("" if version < 7 else None),
                leader=result.leader_id,
                skip_assignment=result.skip_assignment,
                member_id=result.member_id,
                members=[
                    JoinGroupResponseMember(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        metadata=m.metadata,
                    )
                    for m in result.members
                ],
            )
        )

    instance_id = request.group_instance_id if version >= 5 else None
    event = Join(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=instance_id,
        client_id=ctx.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=(
            request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        ),
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        require_known_member_id=version >= 4 and not request.member_id and instance_id is None,
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, event):
        reply(JoinResult(ErrorCode.NOT_COORDINATOR, member_id=request.member_id))
