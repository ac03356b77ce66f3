"""CreateTopics (key 19), versions 0-7.

v1 validateOnly and error messages; v2 throttle time; v4 partitions and replication factor
may be -1 for the broker default; v5 flexible, the result carries partitions, replication
factor and configs; v6 same as v5; v7 returns the topic id.
The controller validates (name, partitions, replication factor, assignments, configs), writes
the topic table atomically, and only then answers.
"""

from __future__ import annotations

from typing import Any

from actors.controller import CreateTopics, TopicResult, TopicSpec
from actors.handlers.configs import config_entries
from wire.errors import ErrorCode
from wire.messages.create_topics import CreateTopicsRequest, CreateTopicsResponse

CreatableTopicConfigs = CreateTopicsResponse.CreatableTopicConfigs
CreatableTopicResult = CreateTopicsResponse.CreatableTopicResult

API_KEY = 19
MIN_VERSION = 0
MAX_VERSION = 7
REQUEST = CreateTopicsRequest

_ZERO_ID = bytes(16)


def handle(ctx: Any, request: CreateTopicsRequest) -> None:
    specs = [
        TopicSpec(
            name=t.name,
            partitions=t.num_partitions,
            replication_factor=t.replication_factor,
            assignments=[(a.partition_index, list(a.broker_ids)) for a in t.assignments],
            configs={c.name: c.value for c in t.configs},
        )
        for t in request.topics
    ]

    def created(results: list[TopicResult]) -> None:
        settings = ctx.services.settings
        ctx.respond(
            CreateTopicsResponse(
                throttle_time_ms=0,
                topics=[_result(r, settings) for r in results],
            )
        )

    validate_only = request.validate_only if ctx.version >= 1 else False
    ctx.services.controller().tell(CreateTopics(specs, validate_only, created))


def _result(result: TopicResult, settings: Any) -> CreatableTopicResult:
    info = result.info
    if result.error != ErrorCode.NONE or info is None:
        return CreatableTopicResult(
            name=result.name,
            topic_id=_ZERO_ID,
            error_code=result.error,
            error_message=result.message,
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
    return CreatableTopicResult(
        name=result.name,
        topic_id=info.topic_id,
        error_code=ErrorCode.NONE,
        error_message=None,
        num_partitions=info.partitions,
        replication_factor=1,
        configs=[
            CreatableTopicConfigs(
                name=entry.name,
                value=entry.value,
                read_only=False,
                config_source=entry.source,
                is_sensitive=False,
            )
            for entry in config_entries(info.configs, settings)
        ],
    )
