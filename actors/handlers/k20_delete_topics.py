"""DeleteTopics (key 20), versions 0-6.

v1 throttle time; v4 flexible; v5 error messages; v6 topics named by name or by id.
Deleting a topic removes it from the topic table first (so no new request reaches it), then
each partition fails its waiting requests, closes its log and removes its directory.
"""

from __future__ import annotations

from typing import Any

from actors.controller import DeleteTopics, TopicResult
from wire.messages.delete_topics import DeleteTopicsRequest, DeleteTopicsResponse

DeletableTopicResult = DeleteTopicsResponse.DeletableTopicResult

API_KEY = 20
MIN_VERSION = 0
MAX_VERSION = 6
REQUEST = DeleteTopicsRequest

_ZERO_ID = bytes(16)


def handle(ctx: Any, request: DeleteTopicsRequest) -> None:
    if ctx.version >= 6:
        names = [t.name for t in request.topics]
        ids = [t.topic_id if t.name is None else None for t in request.topics]
    else:
        names = list(request.topic_names)
        ids = [None] * len(names)

    def deleted(results: list[TopicResult]) -> None:
        ctx.respond(
            DeleteTopicsResponse(
                throttle_time_ms=0,
                responses=[
                    DeletableTopicResult(
                        name=r.name,
                        topic_id=r.info.topic_id if r.info is not None else _ZERO_ID,
                        error_code=r.error,
                        error_message=r.message,
                    )
                    for r in results
                ],
            )
        )

    ctx.services.controller().tell(DeleteTopics(names, ids, deleted))
