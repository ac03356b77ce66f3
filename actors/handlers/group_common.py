"""What the consumer-group handlers (keys 8-16, 42, 47) share: finding a group's
coordinator and describing the client to it."""

from __future__ import annotations

from typing import Any

from actors.handlers.join import send

__all__ = ["client_host", "tell_coordinator"]


def client_host(ctx: Any) -> str:
    """The client's address as Kafka reports it in DescribeGroups ("/127.0.0.1")."""
    peer = str(getattr(ctx.connection, "_peer", ""))
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host


def tell_coordinator(ctx: Any, group_id: str, message: Any) -> bool:
    """Send `message` to `group_id`'s coordinator; False if there is none to reach (the
    caller answers COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR)."""
    ref = ctx.services.group_coordinator(group_id)
    return ref is not None and send(ref, message)
