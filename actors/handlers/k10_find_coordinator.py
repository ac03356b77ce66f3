"""FindCoordinator (key 10), versions 0-4.

v1 adds KeyType (0 group, 1 transaction), throttle time and an error message; v2 same as v1;
v3 flexible; v4 batches keys (CoordinatorKeys in, Coordinators out; kafka-python 3 uses it as
it takes the broker's max). A group key is answered once its coordinator has
`__consumer_offsets` created and loaded, so the client's next request finds it ready. The
coordinator lives on the node (and shard) that owns the group's offsets partition.

A transaction key (KeyType 1) is answered exactly as a group key: a transactional id's
coordinator is the GroupCoordinator that owns `offsets_partition(transactional_id, N)`, its
state kept in the same partitions (actors/group/transactions.py). Any other key type is an
INVALID_REQUEST, as in Kafka.
"""

from __future__ import annotations

from typing import Any

from actors.group import OFFSETS_TOPIC
from actors.group.messages import EnsureReady
from actors.handlers.group_common import tell_coordinator
from actors.handlers.join import Join
from wire.errors import ErrorCode
from wire.messages.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

Coordinator = FindCoordinatorResponse.Coordinator

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = FindCoordinatorRequest

_GROUP_KEY = 0
_TRANSACTION_KEY = 1


def handle(ctx: Any, request: FindCoordinatorRequest) -> None:
    batched = ctx.version >= 4
    keys = list(request.coordinator_keys) if batched else [request.key]
    key_type = request.key_type if ctx.version >= 1 else _GROUP_KEY
    services = ctx.services

    def done(errors: list[ErrorCode]) -> None:
        coordinators = []
        for key, error in zip(keys, errors, strict=True):
            found = services.coordinator_node(key) if error == ErrorCode.NONE else None
            if found is None and error == ErrorCode.NONE:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE  # an election is on
            node_id, host, port = found if found is not None else (-1, "", -1)
            coordinators.append(Coordinator(
                key=key, node_id=node_id, host=host, port=port, error_code=error,
                error_message=_message(error)))
        if batched:
            ctx.respond(FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators))
            return
        c = coordinators[0]
        ctx.respond(
            FindCoordinatorResponse(
                throttle_time_ms=0,
                error_code=c.error_code,
                error_message=c.error_message,
                node_id=c.node_id,
                host=c.host,
                port=c.port,
            )
        )

    join = Join(len(keys), done)
    for index, key in enumerate(keys):
        if key_type not in (_GROUP_KEY, _TRANSACTION_KEY):
            join.fill(index, ErrorCode.INVALID_REQUEST)
        elif services.cluster and OFFSETS_TOPIC in services.topics().topics:
            join.fill(index, ErrorCode.NONE)  # its leader coordinates (done, above)
        elif not tell_coordinator(ctx, key, EnsureReady(join.slot(index))):
            join.fill(index, ErrorCode.COORDINATOR_NOT_AVAILABLE)


def _message(error: ErrorCode) -> str | None:
    if error == ErrorCode.NONE:
        return None
    return error.name
