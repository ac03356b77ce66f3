"""Authorized operations (KIP-430) as Metadata and DescribeGroups report them.

A client may ask which operations it is allowed on a topic, a group or the cluster; the
answer is a 32-bit field with bit n set for each allowed operation whose AclOperation code is
n. Krill has no authorizer, and a Kafka broker without one allows every operation that the
resource type supports (AuthHelper.authorizedOperations over AclEntry.supportedOperations), so
each resource type answers a constant. A field the client did not ask for holds INT32_MIN.
"""

from __future__ import annotations

import enum

__all__ = [
    "AclOperation",
    "OPERATIONS_NOT_REQUESTED",
    "TOPIC_OPERATIONS",
    "GROUP_OPERATIONS",
    "CLUSTER_OPERATIONS",
    "authorized_operations",
]

OPERATIONS_NOT_REQUESTED = -(2**31)  # INT32_MIN, the schemas' default


class AclOperation(enum.IntEnum):
    """Kafka's AclOperation codes (UNKNOWN 0, ANY 1 and ALL 2 are never reported)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


def _field(*operations: AclOperation) -> int:
    return sum(1 << op for op in set(operations))


# AclEntry.supportedOperations(TOPIC), (GROUP) and (CLUSTER): 8, 3 and 7 operations.
TOPIC_OPERATIONS = _field(
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DESCRIBE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
)
GROUP_OPERATIONS = _field(AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE)
CLUSTER_OPERATIONS = _field(
    AclOperation.CREATE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
)


def authorized_operations(requested: bool, allowed: int) -> int:
    """The field to answer: `allowed` if the client asked for it, else INT32_MIN."""
    return allowed if requested else OPERATIONS_NOT_REQUESTED
