"""CreatePartitions (key 37), versions 0-3.

v1 same as v0; v2 flexible; v3 same as v2. Grows a topic to `count` partitions (never shrinks:
INVALID_PARTITIONS). Explicit assignments must name this node.
"""

from __future__ import annotations

from typing import Any

from actors.controller import CreatePartitions, TopicResult
from wire.messages.create_partitions import CreatePartitionsRequest, CreatePartitionsResponse

CreatePartitionsTopicResult = CreatePartitionsResponse.CreatePartitionsTopicResult

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3
REQUEST = CreatePartitionsRequest


def handle(ctx: Any, request: CreatePartitionsRequest) -> None:
    counts = [(t.name, t.count) for t in request.topics]

    def done(results: list[TopicResult]) -> None:
        ctx.respond(
            CreatePartitionsResponse(
                throttle_time_ms=0,
                results=[
                    CreatePartitionsTopicResult(
                        name=r.name, error_code=r.error, error_message=r.message
                    )
                    for r in results
                ],
            )
        )

    ctx.services.controller().tell(CreatePartitions(counts, request.validate_only, done))
