"""JSON Schemas (draft 2020-12) of what a simulated scenario adds: its steps and its faults.

The scenario file's own schema (scenarios/spec.py) embeds these: `SIM_STEP_SCHEMA` is one
item of `steps` when the cluster says `mode: simulated`, `SIM_FAULTS_SCHEMA` the optional
top-level `faults:` section. Every key is documented in README-section.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SIM_FAULTS_SCHEMA", "SIM_STEP_SCHEMA", "SIM_ACTIONS"]

_ONE = r"\s*\d+(\.\d+)?\s*(ms|s|m|min|h)?\s*"
_DURATION: dict[str, Any] = {
    "description": "2s, 500ms, 1.5m, or a number of seconds",
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": f"^{_ONE}$"},
    ],
}
_AT: dict[str, Any] = {
    "description": "a duration, or a range (2s..5s) drawn from the seed",
    "anyOf": [*_DURATION["anyOf"], {"type": "string", "pattern": f"^{_ONE}\\.\\.{_ONE}$"}],
}
_SHARD: dict[str, Any] = {"type": "integer", "minimum": 0}
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 1}
_TARGET: dict[str, Any] = {
    "description": "'shard N' or 'node' (every shard)",
    "type": "string", "pattern": r"^(shard \d+|node( 0)?)$",
}


def _pipe(required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A pipe, `from` shard `to` shard, and what else the action takes."""
    return {
        "type": "object",
        "properties": {"from": _SHARD, "to": _SHARD, **extra},
        "required": ["from", "to", *required],
        "additionalProperties": False,
    }


_MS: dict[str, Any] = {"type": "number", "minimum": 0}
_COMPARED: dict[str, Any] = {
    "description": "a value, or bounds",
    "anyOf": [
        {"type": ["integer", "string"]},
        {"type": "object", "properties": {"at_least": {"type": "integer"},
                                          "at_most": {"type": "integer"}},
         "additionalProperties": False, "minProperties": 1},
    ],
}
_EXPECT: dict[str, Any] = {
    "type": "object",
    "oneOf": [
        {"properties": {
            "partition": {"type": "string", "pattern": r"^.+/\d+$",
                          "description": "topic/partition"},
            "high_watermark": _COMPARED, "log_end_offset": _COMPARED,
            "flushed_offset": _COMPARED, "written_offset": _COMPARED,
            "log_start_offset": _COMPARED},
         "required": ["partition"], "minProperties": 2, "additionalProperties": False},
        {"properties": {"acked": _COMPARED}, "required": ["acked"],
         "additionalProperties": False},
        {"properties": {"held": _pipe(), "count": _COMPARED}, "required": ["held", "count"],
         "additionalProperties": False},
        {"properties": {"group": {"type": "string"}, "state": _COMPARED,
                        "members": _COMPARED},
         "required": ["group"], "minProperties": 2, "additionalProperties": False},
    ],
}

# Each action: the schema of its value.
SIM_ACTIONS: dict[str, dict[str, Any]] = {
    "hold": _pipe(),
    "deliver": _pipe(count=_COUNT),
    "discard": _pipe(count=_COUNT),
    "drop": _pipe(count=_COUNT),
    "delay": _pipe(("ms",), ms=_MS, count=_COUNT),
    "fsync_error": {"type": "object", "properties": {"shard": _SHARD, "count": _COUNT},
                    "required": ["shard"], "additionalProperties": False},
    "slow_disk": {"type": "object", "properties": {"ms": {"type": "number", "minimum": 0}},
                  "required": ["ms"], "additionalProperties": False},
    "crash": _TARGET,
    "restart": _TARGET,
    "expect": _EXPECT,
}

_CONDITION: dict[str, Any] = {
    "type": "object",
    "oneOf": [
        {"properties": {"acked": {"type": "integer", "minimum": 0}}, "required": ["acked"]},
        {"properties": {"produce_requests": {"type": "integer", "minimum": 0}},
         "required": ["produce_requests"]},
        {"properties": {"held": _pipe(count=_COUNT)}, "required": ["held"]},
        {"properties": {"step": {"type": "integer", "minimum": 0}}, "required": ["step"]},
    ],
    "minProperties": 1, "maxProperties": 1,
}

SIM_STEP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "one step of a simulated scenario",
    "type": "object",
    "properties": {
        "at": _AT,
        "after": _CONDITION,
        "for": {**_DURATION, "description": "undo the fault this long after (hold, "
                "slow_disk, crash)"},
        "name": {"type": "string"},
        **SIM_ACTIONS,
    },
    "oneOf": [{"required": ["at"]}, {"required": ["after"]}],
    "allOf": [{"oneOf": [{"required": [action]} for action in SIM_ACTIONS]}],
    "additionalProperties": False,
}

_RATE: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
_MS_RANGE: dict[str, Any] = {
    "description": "[low, high] milliseconds, uniform; or one number",
    "anyOf": [{"type": "number", "minimum": 0},
              {"type": "array", "items": {"type": "number", "minimum": 0},
               "minItems": 2, "maxItems": 2}],
}

SIM_FAULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "seeded faults of a simulated scenario",
    "type": "object",
    "properties": {
        "pipe_drop": {**_RATE, "description": "chance each pipe message is lost"},
        "pipe_delay": {**_RATE, "description": "chance each pipe message is delayed"},
        "pipe_delay_ms": {**_MS_RANGE, "description": "how long a delayed message waits"},
        "fsync_ms": {**_MS_RANGE, "description": "every fdatasync's latency (default 0.1-2)"},
        "fsync_fail": {**_RATE, "description": "chance each fdatasync fails (EIO)"},
        "fsync_lies": {**_RATE, "description": "chance a sync reports success and keeps "
                       "nothing (a volatile write cache): acknowledged data a crash loses"},
        "crash_every_s": {"type": "number", "exclusiveMinimum": 0,
                          "description": "mean seconds between crashes of a random shard"},
        "restart_after_ms": {**_MS_RANGE, "description": "a crashed shard restarts after"},
    },
    "additionalProperties": False,
}
