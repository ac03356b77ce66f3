"""Who leads each partition, as this node last heard: soft state for Metadata and coordinators.

Leaders are not in the controller's log: each partition elects its own in its own Raft group,
and writing every election through the controller would make the controller a bottleneck
for every failover. So each node keeps a `LeaderTable`, filled from what its own partitions'
Raft machines report and from what peers report about theirs (that is how a node learns the
leaders of partitions it does not host), and it answers Metadata from it. An entry is a
`LeaderUpdate`: leader `(node, shard)` or None, the leader epoch (the partition's Raft term)
and the replicas in sync.

Reports travel by many paths and may arrive late or twice, so each is ordered, and only a
newer one replaces an entry:

    newer = (epoch, version, leader known) greater, compared in that order

- A later term wins: Raft has at most one leader per term, and terms only grow.
- Within a term, `version` orders one leader's own reports (its ISR grew or shrank, it
  stepped down): the leader counts them up; followers, which know the leader but not the
  ISR, report version 0 with an empty ISR.
- At the same term and version, a report that names the leader beats one that does not.

The table is bounded by the partitions that exist: it holds a reference to the current
`TopicTable`, ignores reports about anything else (partition out of range, a topic id from
before the topic was deleted and created again, a leader or ISR member that is not a replica),
and `set_topics` forgets entries whose topic went away, so a re-created topic, whose terms
start again from zero, is not hidden behind its predecessor's epochs. A report about a topic
id, or a partition, the table does not have yet is kept aside (`early_leader_reports_max` of
them, the oldest dropped first) and taken when `set_topics` brings it: a new topic's leaders
are elected while its table is still on its way to the other nodes, and their reports would
otherwise wait for the leader's next refresh.

While an election is on, the table remembers the leader before it (`last_named`): Metadata
names that one rather than none, as Kafka's brokers do until the controller's news arrives
(librdkafka takes a leaderless partition as final for some calls, ListOffsets among them, and
asks again only at its next periodic refresh; a stale leader answers NOT_LEADER_OR_FOLLOWER,
which makes every client ask again at once).

Coordinators follow: a consumer group's coordinator is the leader of its `__consumer_offsets`
partition (Kafka's rule, `actors.group.offsets_partition`), so it moves with that leader.

    table = LeaderTable(view.table)
    table.update(LeaderUpdate("orders", id, 0, (2, 1), 7, ((2, 1), (3, 0)), 1))  -> True
    table.update(LeaderUpdate("orders", id, 0, (3, 0), 6, (), 0))                -> False: older
    table.coordinator("my-group")  -> the leader of __consumer_offsets-N, or None
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from actors.cluster import limits
from actors.cluster.commands import Address
from actors.cluster.state import PlacedTopic
from actors.group import OFFSETS_TOPIC, offsets_partition
from actors.services import TopicTable

__all__ = ["LeaderTable", "LeaderUpdate"]


class LeaderUpdate(NamedTuple):
    """One report of one partition's leadership."""

    topic: str
    topic_id: bytes
    partition: int
    leader: Address | None  # None: no leader known in this epoch (an election is on)
    epoch: int  # the partition's Raft term: Kafka's leader epoch
    isr: tuple[Address, ...] = ()  # as the leader sees them; (): not known (a follower)
    version: int = 0  # the leader's count of its reports in this epoch; followers send 0

    def order(self) -> tuple[int, int, bool]:
        return (self.epoch, self.version, self.leader is not None)


class LeaderTable:
    """This node's view of every partition's leader. One owner (a shard's loop)."""

    def __init__(self, topics: TopicTable | None = None) -> None:
        self._topics = topics if topics is not None else TopicTable()
        self._entries: dict[tuple[str, int], LeaderUpdate] = {}
        # The newest report of each partition that named a leader: while an election is on,
        # Metadata names this one (`last_named`).
        self._named: dict[tuple[str, int], LeaderUpdate] = {}
        # Reports about topic ids the table does not know yet, oldest first (module docstring).
        self._early: dict[tuple[bytes, int], LeaderUpdate] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def set_topics(self, topics: TopicTable) -> None:
        """The cluster's topics changed: forget what no longer exists."""
        self._topics = topics
        for entries in (self._entries, self._named):
            gone = [key for key, u in entries.items() if not self._exists(u)]
            for key in gone:
                del entries[key]
        known = {info.topic_id: info.partitions for info in topics.topics.values()}
        for early in [(i, p) for i, p in self._early if p < known.get(i, 0)]:
            self.update(self._early.pop(early))

    def update(self, u: LeaderUpdate) -> bool:
        """Take `u` if it is about a partition that exists and newer than what is known; True
        if it was taken (worth passing on to peers)."""
        if not self._exists(u):
            info = self._topics.topics.get(u.topic)
            if info is None or info.topic_id != u.topic_id or u.partition >= info.partitions:
                self._keep_early(u)  # maybe a topic, or partitions, not here yet
            return False
        key = (u.topic, u.partition)
        known = self._entries.get(key)
        if known is not None and u.order() <= known.order():
            return False
        self._entries[key] = u
        if u.leader is not None:
            self._named[key] = u
        return True

    def _keep_early(self, u: LeaderUpdate) -> None:
        key = (u.topic_id, u.partition)
        known = self._early.pop(key, None)
        if known is not None and u.order() <= known.order():
            u = known
        self._early[key] = u  # newest last
        if len(self._early) > limits.early_leader_reports_max:
            del self._early[next(iter(self._early))]

    def get(self, topic: str, partition: int) -> LeaderUpdate | None:
        return self._entries.get((topic, partition))

    def leader(self, topic: str, partition: int) -> Address | None:
        entry = self._entries.get((topic, partition))
        return entry.leader if entry is not None else None

    def last_named(self, topic: str, partition: int) -> LeaderUpdate | None:
        """The newest report that named the partition's leader (the current one, or while an
        election is on, the leader before it), or None if none ever did."""
        return self._named.get((topic, partition))

    def entries(self) -> Iterator[LeaderUpdate]:
        """Everything known, to send a peer that starts or catches up."""
        return iter(self._entries.values())

    def coordinator_partition(self, group_id: str) -> int | None:
        """The `__consumer_offsets` partition that holds `group_id`, or None without it."""
        info = self._topics.topics.get(OFFSETS_TOPIC)
        if info is None or info.partitions <= 0:
            return None
        return offsets_partition(group_id, info.partitions)

    def coordinator(self, group_id: str) -> Address | None:
        """The group's coordinator: its offsets partition's leader, or None if not known."""
        partition = self.coordinator_partition(group_id)
        return None if partition is None else self.leader(OFFSETS_TOPIC, partition)

    def _exists(self, u: LeaderUpdate) -> bool:
        info = self._topics.topics.get(u.topic)
        if info is None or info.topic_id != u.topic_id or not 0 <= u.partition < info.partitions:
            return False
        if not isinstance(info, PlacedTopic):
            return True  # a single-node table names no replicas: nothing more to check
        replicas = info.replicas[u.partition]
        return (u.leader is None or u.leader in replicas) and all(a in replicas for a in u.isr)
