"""SyncGroup (key 14), versions 0-5.

v1 throttle time; v2 same; v3 GroupInstanceId; v4 flexible; v5 ProtocolType and
ProtocolName in request and response (checked against the group's when given). The leader's
request carries every member's assignment; each member's answer is its own, relayed as the
bytes the leader's assignor wrote.
"""

from __future__ import annotations

from typing import Any

from actors.group.events import Sync, SyncResult
from actors.handlers.group_common import tell_coordinator
from wire.errors import ErrorCode
from wire.messages.sync_group import SyncGroupRequest, SyncGroupResponse

API_KEY = 14
MIN_VERSION = 0
MAX_VERSION = 5
REQUEST = SyncGroupRequest


def handle(ctx: Any, request: SyncGroupRequest) -> None:
    version = ctx.version

    def reply(result: SyncResult) -> None:
        ctx.respond(
            SyncGroupResponse(
                throttle_time_ms=0,
                error_code=result.error,
                protocol_type=result.protocol_type,
                protocol_name=result.protocol_name,
                assignment=result.assignment,
            )
        )

    event = Sync(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if version >= 3 else None,
        generation_id=request.generation_id,
        protocol_type=request.protocol_type if version >= 5 else None,
        protocol_name=request.protocol_name if version >= 5 else None,
        assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, event):
        reply(SyncResult(ErrorCode.NOT_COORDINATOR))
