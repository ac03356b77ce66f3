"""The node's listening sockets, taken by the supervisor before any shard starts.

A node refuses to start when one of its ports is taken (DESIGN.md §10), by anything: another
node, or any other program. Each socket is bound here, in the supervisor, and handed to the
shard that serves it, so a shard never finds its port gone and the refusal is one line:

- Kafka: one listening socket per shard that accepts connections, all with SO_REUSEPORT so the
  kernel spreads connections over the shards. SO_REUSEPORT alone would let a second node join
  the group and take half the clients, so first a probe socket *without* it is bound: it fails
  if anything at all listens there (a socket without SO_REUSEPORT conflicts with every other).
- The Spark reader: one socket, handed to shard 0's ZeroMQ ROUTER (`ZMQ_USE_FD`).
- The admin HTTP endpoint: served by the supervisor itself (shards/admin.py).
- Node RPC, in a cluster only: one socket per shard on rpc_port + shard, each handed to its
  shard's ZeroMQ PULL socket (`ZMQ_USE_FD`, shards/node_mesh.py).

`PortTaken` carries the one-line message the CLI prints.
"""

from __future__ import annotations

import errno
import socket

from shards import limits

__all__ = ["PortTaken", "bind_exclusive", "kafka_listeners", "listen_socket",
           "node_rpc_listeners"]


class PortTaken(Exception):
    """A port of this node is in use (or cannot be bound): the message is one line."""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _describe(what: str, address: tuple[str, int], error: OSError) -> PortTaken:
    host, port = address
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if error.errno == errno.EADDRINUSE:
        return PortTaken(f"{what} address {where} is already in use")
    return PortTaken(f"cannot bind the {what} address {where}: {error.strerror or error}")


def listen_socket(
    what: str, address: tuple[str, int], *, reuse_port: bool = False, backlog: int = 0
) -> socket.socket:
    """A bound, listening TCP socket (SO_REUSEADDR: a restart need not wait for TIME_WAIT)."""
    host, port = address
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog or limits.listen_backlog)
    except OSError as e:
        sock.close()
        raise _describe(what, address, e) from None
    return sock


def bind_exclusive(what: str, address: tuple[str, int]) -> None:
    """Fail if anything listens on `address` (a probe that holds nothing afterwards)."""
    host, port = address
    probe = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as e:
        raise _describe(what, address, e) from None
    finally:
        probe.close()


def kafka_listeners(address: tuple[str, int], count: int) -> list[socket.socket]:
    """`count` listening sockets sharing the Kafka port, one per accepting shard."""
    bind_exclusive("Kafka", address)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(listen_socket("Kafka", address, reuse_port=True))
    except PortTaken:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def node_rpc_listeners(address: tuple[str, int], shards: int) -> list[socket.socket]:
    """One listening socket per shard for node RPC: shard k's on the port + k."""
    host, port = address
    sockets: list[socket.socket] = []
    try:
        for shard in range(shards):
            sockets.append(listen_socket("node RPC", (host, port + shard)))
    except PortTaken:
        for sock in sockets:
            sock.close()
        raise
    return sockets
