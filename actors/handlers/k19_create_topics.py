"""CreateTopics (key 19), versions 0-7.

v1 validateOnly and error messages; v2 throttle time; v4 partitions and replication factor
may be -1 for the broker default; v5 flexible, the result carries partitions, replication
factor and configs; v6 same as v5; v7 returns the topic id.
The controller validates (name, partitions, replication factor, assignments, configs), writes
the topic table atomically, and only then answers. On a cluster the answer waits, besides, until
this shard knows a leader of every partition created (each elects its own in its Raft group, at
once where placement put its preferred replica), for at most `create_topics_leaders_wait_s` or
the request's timeout: Kafka's controller names leaders at creation, and a tool that produces
or asks Metadata right after must not find LEADER_NOT_AVAILABLE.

A client may not create a missing internal topic (`__consumer_offsets`, `__transaction_state`):
it gets INVALID_REQUEST, "Creation of internal topic ... is prohibited", Kafka's answer for the
internal topic it guards itself (`__cluster_metadata`, ControllerApis.createTopics). Kafka 3.x
lets a client create `__consumer_offsets` with any layout, which its coordinator then uses as it
is; here only the owner creates it (the group coordinator, with `offsets_topic_partitions`
partitions, compacted). One that exists answers TOPIC_ALREADY_EXISTS as any topic does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from actors import limits
from actors.controller import INTERNAL_TOPICS, CreateTopics, TopicResult, TopicSpec
from actors.handlers.configs import config_entries
from actors.runtime import current_loop
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

    existing = ctx.services.topics().topics
    refused = [spec.name in INTERNAL_TOPICS and spec.name not in existing for spec in specs]

    def created(results: list[TopicResult]) -> None:
        settings = ctx.services.settings
        answers = iter(results)
        ordered = [
            _prohibited(spec.name) if refuse else next(answers)
            for spec, refuse in zip(specs, refused, strict=True)
        ]
        ctx.respond(
            CreateTopicsResponse(
                throttle_time_ms=0,
                topics=[_result(r, settings) for r in ordered],
            )
        )

    validate_only = request.validate_only if ctx.version >= 1 else False
    allowed = [spec for spec, refuse in zip(specs, refused, strict=True) if not refuse]
    if not allowed:
        created([])
        return
    wait_s = min(limits.create_topics_leaders_wait_s, max(0, request.timeout_ms) / 1000)

    def applied(results: list[TopicResult]) -> None:
        if validate_only:
            created(results)
        else:
            _when_led(ctx.services, results, time.monotonic() + wait_s,
                      lambda: created(results))

    ctx.services.controller().tell(CreateTopics(allowed, validate_only, applied))


def _when_led(services: Any, results: list[TopicResult], deadline: float,
              then: Callable[[], None]) -> None:
    """`then()` once this shard has the topics created in its table and knows a leader of
    every partition (on a node of its own the node leads them all), or at `deadline`."""
    def led() -> bool:
        table = services.topics().topics
        for r in results:
            if r.error != ErrorCode.NONE or r.info is None:
                continue
            if r.info.name not in table:
                return False
            for index in range(r.info.partitions):
                leader = services.partition_leader(r.info.name, index)
                if leader is not None and leader[0] < 0:
                    return False
        return True

    if led() or time.monotonic() >= deadline:
        then()
    else:
        current_loop().call_later(limits.create_topics_leaders_step_s, _when_led, services,
                                  results, deadline, then)


def _prohibited(name: str) -> TopicResult:
    return TopicResult(
        name,
        ErrorCode.INVALID_REQUEST,
        f"Creation of internal topic {name} is prohibited: the broker creates it for its own use.",
    )


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
