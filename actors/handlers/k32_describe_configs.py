"""DescribeConfigs (key 32), versions 0-4.

v1 adds synonyms and ConfigSource (replacing IsDefault); v2 same as v1; v3 config type and
documentation; v4 flexible. Resource types: 2 topic, 4 broker. Topic configs are every known
key with its effective value and where it comes from: TOPIC_CONFIG (set on the topic),
STATIC_BROKER_CONFIG (a node setting, e.g. retention.ms from the node's log.retention.ms) or
DEFAULT_CONFIG; with IncludeSynonyms, each key's synonyms from the strongest to the weakest
(actors/handlers/configs.py). Broker configs are the node's static settings, read-only.
Documentation is not sent (null).
"""

from __future__ import annotations

from typing import Any

from actors.handlers.configs import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    ConfigEntry,
    broker_entries,
    config_entries,
)
from wire.errors import ErrorCode
from wire.messages.describe_configs import DescribeConfigsRequest, DescribeConfigsResponse

DescribeConfigsResourceResult = DescribeConfigsResponse.DescribeConfigsResourceResult
DescribeConfigsResult = DescribeConfigsResponse.DescribeConfigsResult
DescribeConfigsSynonym = DescribeConfigsResponse.DescribeConfigsSynonym

API_KEY = 32
MIN_VERSION = 0
MAX_VERSION = 4
REQUEST = DescribeConfigsRequest


def handle(ctx: Any, request: DescribeConfigsRequest) -> None:
    settings = ctx.services.settings
    table = ctx.services.topics()
    results = []
    for resource in request.resources:
        error, message, entries = ErrorCode.NONE, None, []
        if resource.resource_type == RESOURCE_TOPIC:
            info = table.topics.get(resource.resource_name)
            if info is None:
                error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic"
            else:
                entries = config_entries(info.configs, settings)
        elif resource.resource_type == RESOURCE_BROKER:
            if resource.resource_name not in ("", str(settings.node_id)):
                error, message = ErrorCode.INVALID_REQUEST, "no such broker"
            else:
                entries = broker_entries(settings)
        else:
            error = ErrorCode.INVALID_REQUEST
            message = f"resource type {resource.resource_type} is not supported"
        keys = resource.configuration_keys
        if keys is not None:
            entries = [e for e in entries if e.name in keys]
        results.append(
            DescribeConfigsResult(
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=[_entry(e, request.include_synonyms) for e in entries],
            )
        )
    ctx.respond(DescribeConfigsResponse(throttle_time_ms=0, results=results))


def _entry(entry: ConfigEntry, include_synonyms: bool) -> DescribeConfigsResourceResult:
    synonyms = [
        DescribeConfigsSynonym(name=s.name, value=s.value, source=s.source)
        for s in entry.synonyms
    ] if include_synonyms else []
    return DescribeConfigsResourceResult(
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        is_default=entry.is_default,
        config_source=entry.source,
        is_sensitive=False,
        synonyms=synonyms,
        config_type=int(entry.type),
        documentation=None,
    )
