"""DeleteGroups (key 42), versions 0-2.

v1 same as v0; v2 flexible. Only an Empty group can be deleted (NON_EMPTY_GROUP otherwise,
GROUP_ID_NOT_FOUND for none); its metadata and every committed offset get tombstones in
`__consumer_offsets` before the answer.
"""

from __future__ import annotations

from typing import Any

from actors.group.messages import DeleteGroups
from actors.handlers.group_common import tell_coordinator
from actors.handlers.join import Join
from wire.errors import ErrorCode
from wire.messages.delete_groups import DeleteGroupsRequest, DeleteGroupsResponse

DeletableGroupResult = DeleteGroupsResponse.DeletableGroupResult

API_KEY = 42
MIN_VERSION = 0
MAX_VERSION = 2
REQUEST = DeleteGroupsRequest


def handle(ctx: Any, request: DeleteGroupsRequest) -> None:
    group_ids = list(request.groups_names)

    def done(errors: list[ErrorCode]) -> None:
        ctx.respond(
            DeleteGroupsResponse(
                throttle_time_ms=0,
                results=[
                    DeletableGroupResult(group_id=group_id, error_code=error)
                    for group_id, error in zip(group_ids, errors, strict=True)
                ],
            )
        )

    join = Join(len(group_ids), done)
    for index, group_id in enumerate(group_ids):
        slot = join.slot(index)
        if not tell_coordinator(ctx, group_id, DeleteGroups([group_id], _first(slot))):
            slot(ErrorCode.NOT_COORDINATOR)


def _first(slot: Any) -> Any:
    return lambda errors: slot(errors[0])
