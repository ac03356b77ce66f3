"""A shard's Kafka listener: accepting client connections, up to the shard's share.

The supervisor binds one listening socket per accepting shard (shards/ports.py: SO_REUSEPORT,
so the kernel spreads connections over the shards); the shard hands it here. Each accepted
socket becomes a connection (`start`: a Connection actor), until the shard holds its share of
the node's `kafka_connections_max`; past it a new connection is closed at once (the client
backs off and retries) and counted. Accepts are bounded per loop turn, so a burst of clients
never holds the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from shards import limits
from shards.config import NodeConfig

__all__ = ["Acceptor"]

log = logging.getLogger("shards.shard")  # the shard's lines, as they have always been named


class Acceptor:
    def __init__(self, config: NodeConfig, shard_id: int, shards: int,
                 loop: asyncio.AbstractEventLoop, listen_fd: int,
                 start: Callable[[socket.socket], object]) -> None:
        self.config, self.shard_id, self.shards, self.loop = config, shard_id, shards, loop
        self._start = start
        # The node's kafka_connections_max split over the accepting shards, to the last one.
        accepting = config.kafka_shards or shards
        share, rest = divmod(config.kafka_connections_max, accepting)
        self._connections_max = share + (1 if shard_id < rest else 0)
        self._connection_count = 0
        self.refused = 0  # connections closed at once, over the limit
        self._listener = socket.socket(fileno=listen_fd)
        self._listener.setblocking(False)
        loop.add_reader(self._listener.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(limits.accepts_per_turn_max):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("accept failed: %s", e)
                return
            if self._connection_count >= self._connections_max:
                self._refuse(sock)
                continue
            self._connection_count += 1
            self._start(sock)

    def closed(self) -> None:
        """A connection accepted here has closed."""
        self._connection_count -= 1

    def _refuse(self, sock: socket.socket) -> None:
        """Over the connection limit: close at once (the client backs off and retries)."""
        sock.close()
        self.refused += 1
        if self.refused % limits.refused_connections_log_every == 1:
            log.warning(
                "shard %d: %d connections open, the most it takes (kafka_connections_max "
                "%d over %d shards): refused %d so far",
                self.shard_id, self._connection_count, self.config.kafka_connections_max,
                self.config.kafka_shards or self.shards, self.refused,
            )  # fmt: skip

    def close(self) -> None:
        """Stop accepting (the shard is stopping)."""
        self.loop.remove_reader(self._listener.fileno())
        self._listener.close()
