"""IncrementalAlterConfigs (key 44), versions 0-1.

v1 is flexible. Each config carries an operation (KIP-339): SET (0) a value, DELETE (1) the
explicit value (the key returns to its default), APPEND (2) or SUBTRACT (3) items of a
list-valued key (cleanup.policy; any other key: INVALID_CONFIG), applied in order to the
topic's explicit keys; the result is checked as CreateTopics checks configs (INVALID_CONFIG,
one line naming the key). A key named twice, an unknown operation or a null value to set is
INVALID_REQUEST. Topics only (resource type 2); a broker (4) is refused with INVALID_REQUEST,
dynamic broker configs not being supported. An unknown topic gets UNKNOWN_TOPIC_OR_PARTITION;
`validate_only` checks and changes nothing. The Controller writes the new table and every
shard has it before the answer.
"""

from __future__ import annotations

from typing import Any

from actors.handlers.configs import alter_resources, alter_responder
from actors.topic_config import Operation
from wire.messages.incremental_alter_configs import (
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

AlterConfigsResourceResponse = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse

API_KEY = 44
MIN_VERSION = 0
MAX_VERSION = 1
REQUEST = IncrementalAlterConfigsRequest


def handle(ctx: Any, request: IncrementalAlterConfigsRequest) -> None:
    resources = [
        (
            r.resource_type,
            r.resource_name,
            [Operation(c.name, c.config_operation, c.value) for c in r.configs],
        )
        for r in request.resources
    ]

    respond = alter_responder(ctx, IncrementalAlterConfigsResponse, AlterConfigsResourceResponse)
    alter_resources(ctx, resources, False, request.validate_only, respond)
