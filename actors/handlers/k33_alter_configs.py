"""AlterConfigs (key 33), versions 0-2.

v1 is v0 (throttling after the response); v2 is flexible. Kafka's older way to change
configs: the keys given become the resource's whole set of explicit keys, and every key left
out returns to its default (a null value leaves its key unset). Topics only (resource type 2);
a broker (4) is refused with INVALID_REQUEST, dynamic broker configs not being supported.
Checked as CreateTopics checks configs (INVALID_CONFIG, one line naming the key); an unknown
topic gets UNKNOWN_TOPIC_OR_PARTITION; `validate_only` checks and changes nothing. The
Controller writes the new table and every shard has it before the answer.
"""

from __future__ import annotations

from typing import Any

from actors.handlers.configs import alter_resources, alter_responder
from actors.topic_config import OP_SET, Operation
from wire.messages.alter_configs import AlterConfigsRequest, AlterConfigsResponse

AlterConfigsResourceResponse = AlterConfigsResponse.AlterConfigsResourceResponse

API_KEY = 33
MIN_VERSION = 0
MAX_VERSION = 2
REQUEST = AlterConfigsRequest


def handle(ctx: Any, request: AlterConfigsRequest) -> None:
    resources = [
        (r.resource_type, r.resource_name, [Operation(c.name, OP_SET, c.value) for c in r.configs])
        for r in request.resources
    ]

    alter_resources(ctx, resources, True, request.validate_only,
                    alter_responder(ctx, AlterConfigsResponse, AlterConfigsResourceResponse))
