"""Which node's reader serves a partition, and going to another when one fails.

Every node serves a reader endpoint, but a node answers only for the partitions it has a
replica of. Each partition is read from its leader (`krill.readFrom=leader`, the default) or,
with `replica`, from one of its in-sync replicas (any replica answers up to the high
watermark it knows, `any_replica` in PROTOCOL.md), spread over them by partition index so a
topic's reads fall on every replica:

    isr of t-0 [1, 2, 3], t-1 [1, 2, 3]    replica: t-0 from node 1, t-1 from node 2
    leaders    [2, 3]                      leader:  t-0 from node 2, t-1 from node 3

A node that stops answering (`ReaderTimeout`: down, its connection dropped mid-request, or
stuck), or answers that it does not serve the partition now (NOT_LEADER_OR_FOLLOWER after
its leadership moved, an election under way, BUSY, a failed segment read: `RETRIABLE`), is
not the end of a read: `Failover` waits a little (a new leader takes about one election
timeout, 1 s by default), asks metadata again from any reader it knows (the bootstrap list
first, then every node metadata named, those that failed last) and tries the node metadata
names now, avoiding the ones that failed. After `attempts_max` tries it raises
`ReplicasUnavailable`, naming the partition and the last errors.

`choose` is pure; `Failover` does I/O (ReaderClient) and sleeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from wire.errors import ErrorCode
from wire.spark import protocol
from wire.spark.client import Metadata, ReaderClient, ReaderTimeout
from wire.spark.protocol import ReaderError

__all__ = [
    "RETRIABLE",
    "Failover",
    "ReplicasUnavailable",
    "attempts_max",
    "choose",
]

log = logging.getLogger(__name__)

# Tries at one piece of work (a partition's read, a query's offsets) before it fails, and the
# waits between them: 0.1 s doubling up to 1 s, ~4.5 s in all besides the tries themselves,
# enough for an election (1 s election timeout by default) and a metadata round.
attempts_max = 8
backoff_s_first = 0.1
backoff_s_max = 1.0
# Errors kept for the message of a read that ran out of tries.
_errors_shown = 3

# Errors that another replica, or the same one a moment later, may not give.
RETRIABLE = frozenset(int(code) for code in (
    ErrorCode.UNKNOWN_SERVER_ERROR,  # a failed segment read
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.OFFSET_NOT_AVAILABLE,  # a new leader not ready to say its high watermark
)) | {protocol.ERROR_BUSY}


class ReplicasUnavailable(RuntimeError):
    """No replica served the work within `attempts_max` tries."""


def choose(
    metadata: Metadata, topic: str, partition: int, read_from: str,
    avoid: Iterable[str] = (),
) -> str | None:
    """The reader address to ask for the partition: its leader, or (`replica`) an in-sync
    replica by partition index, the next one when that is in `avoid` (all avoided: the
    first). None when metadata knows no such node now (no leader elected yet, a node with no
    reader address)."""
    leaders = metadata.topics.get(topic)
    if leaders is None or not 0 <= partition < len(leaders):
        return None
    if read_from == "leader":
        candidates = [leaders[partition]]
    else:
        in_sync = metadata.isr.get(topic, [])
        isr = sorted(set(in_sync[partition])) if partition < len(in_sync) else []
        isr = isr or [leaders[partition]]
        first = partition % len(isr)
        candidates = isr[first:] + isr[:first]
    addresses = [metadata.nodes[n] for n in candidates if n >= 0 and n in metadata.nodes]
    avoided = set(avoid)
    fresh = [a for a in addresses if a not in avoided]
    return next(iter(fresh or addresses), None)


def backoff_s(attempt: int) -> float:
    """The wait before try `attempt` + 1 (attempt >= 1)."""
    return min(backoff_s_max, backoff_s_first * 2 ** (attempt - 1))


class Failover:
    """The tries at one piece of work: the readers known, those that failed it, the errors."""

    def __init__(
        self,
        what: str,
        known: Iterable[str],
        topics: list[str] | None,
        read_from: str,
        timeout_s: float,
        connect_timeout_s: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.what = what  # "t-3 at offset 120", for messages
        self.read_from = read_from
        self.attempts = 0
        self.failed: set[str] = set()
        self._known = list(dict.fromkeys(known))  # bootstrap first, then what metadata named
        self._topics = topics
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._errors: list[str] = []
        self._sleep = sleep

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(self._known)

    @property
    def last_try(self) -> bool:
        """Whether the next failure is the last one allowed."""
        return self.attempts + 1 >= attempts_max

    def client(self, address: str) -> ReaderClient:
        return ReaderClient(address, self._timeout_s, self._connect_timeout_s)

    def choose(self, metadata: Metadata, topic: str, partition: int) -> str | None:
        return choose(metadata, topic, partition, self.read_from, self.failed)

    def failure(self, reason: str, addresses: Iterable[str] = ()) -> None:
        """A try failed (at `addresses`): wait before the next, or raise ReplicasUnavailable
        when it was the last."""
        self.attempts += 1
        self.failed.update(addresses)
        self._errors.append(reason)
        log.info("krill: %s: try %d of %d failed: %s", self.what, self.attempts, attempts_max,
                 reason)
        if self.attempts >= attempts_max:
            raise ReplicasUnavailable(
                f"krill: {self.what}: no replica served it in {attempts_max} tries "
                f"(krill.readFrom={self.read_from}; readers known: {', '.join(self._known)}); "
                f"last errors: {'; '.join(self._errors[-_errors_shown:])}")
        self._sleep(backoff_s(self.attempts))

    def metadata(self) -> Metadata | None:
        """Metadata from the first known reader that answers (those that failed last), which
        adds the nodes it names to the known; None when none answers."""
        order = sorted(self._known, key=lambda address: address in self.failed)
        for address in order:
            try:
                with self.client(address) as client:
                    metadata = client.metadata(self._topics)
            except (ReaderTimeout, ReaderError) as exc:
                self._errors.append(f"metadata from {address}: {exc}")
                self.failed.add(address)
                continue
            self._known += [a for a in metadata.nodes.values() if a not in self._known]
            return metadata
        return None

    def first_metadata(self) -> Metadata:
        """Metadata from a bootstrap reader, or ReplicasUnavailable when none answers."""
        metadata = self.metadata()
        if metadata is None:
            raise ReplicasUnavailable(
                f"krill: no reader of krill.bootstrap answered metadata "
                f"({', '.join(self._known)}): {'; '.join(self._errors[-_errors_shown:])}")
        return metadata
