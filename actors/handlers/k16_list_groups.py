"""ListGroups (key 16), versions 0-5.

v1 throttle time; v2 same; v3 flexible; v4 StatesFilter (KIP-518: only groups in these
states; empty means all); v5 TypesFilter and GroupType per group (KIP-848: every group here
is "classic"). Every shard's coordinator is asked, and their groups are listed together.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import GroupListing, ListGroups
from actors.handlers.join import Join, send
from wire.errors import ErrorCode
from wire.messages.list_groups import ListGroupsRequest, ListGroupsResponse

ListedGroup = ListGroupsResponse.ListedGroup

API_KEY = 16
MIN_VERSION = 0
MAX_VERSION = 5
REQUEST = ListGroupsRequest

_GROUP_TYPE = "classic"


def handle(ctx: Any, request: ListGroupsRequest) -> None:
    states = {s.lower() for s in request.states_filter} if ctx.version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if ctx.version >= 5 else set()

    def reply(listed: list[GroupListing], error: ErrorCode = ErrorCode.NONE) -> None:
        groups = [
            ListedGroup(
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=_GROUP_TYPE,
            )
            for g in listed
            if (not states or g.state.lower() in states) and (not types or _GROUP_TYPE in types)
        ]
        ctx.respond(ListGroupsResponse(throttle_time_ms=0, error_code=error, groups=groups))

    coordinators = [c for c in ctx.services.group_coordinators() if c is not None]

    def merged(results: list[list[GroupListing]]) -> None:
        reply([g for listed in results for g in listed])

    join = Join(len(coordinators), merged)
    for index, coordinator in enumerate(coordinators):
        slot = join.slot(index)
        if not send(coordinator, ListGroups(slot)):
            slot([])
