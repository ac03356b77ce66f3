"""Which names a topic may have, and which topics are internal: checks both controllers share.

Kafka's rules (`Topic.validate`): 1 to 249 characters of ASCII letters, digits, '.', '_' and
'-', and neither "." nor "..". Internal topics are exactly Kafka's (`Topic.isInternal`): a user
topic whose name merely starts with "__" is an ordinary topic.

    check_topic_name("orders")  -> None
    check_topic_name("a/b")     -> "topic name may contain only ASCII letters, ..."
"""

from __future__ import annotations

import re

from actors import limits
from actors.group import OFFSETS_TOPIC

__all__ = ["INTERNAL_TOPICS", "TRANSACTION_STATE_TOPIC", "check_topic_name"]

_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

TRANSACTION_STATE_TOPIC = "__transaction_state"
# Kafka 3.x's internal topics (Topic.INTERNAL_TOPICS); 4.0 adds `__share_group_state`.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def check_topic_name(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None if it is (Kafka's Topic.validate)."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > limits.topic_name_chars_max:
        return f"topic name is longer than {limits.topic_name_chars_max} characters"
    if not _LEGAL_TOPIC_NAME.match(name):
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None
