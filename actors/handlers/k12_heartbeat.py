"""Heartbeat (key 12), versions 0-4.

v1 throttle time; v2 same; v3 GroupInstanceId (static membership); v4 flexible. Answers NONE
in Stable and CompletingRebalance, REBALANCE_IN_PROGRESS while the group prepares a rebalance
(how members learn to rejoin), and the member errors of Kafka otherwise.
"""

from __future__ import annotations

from typing import Any

from actors.group.events import Heartbeat, HeartbeatResult
from actors.handlers.group_common import tell_coordinator
from wire.errors import ErrorCode
from wire.messages.heartbeat import HeartbeatRequest, HeartbeatResponse

API_KEY = 12
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = HeartbeatRequest


def handle(ctx: Any, request: HeartbeatRequest) -> None:
    def reply(result: HeartbeatResult) -> None:
        ctx.respond(HeartbeatResponse(throttle_time_ms=0, error_code=result.error))

    event = Heartbeat(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 3 else None,
        generation_id=request.generation_id,
        reply=reply,
    )
    if not tell_coordinator(ctx, request.group_id, event):
        reply(HeartbeatResult(ErrorCode.NOT_COORDINATOR))
