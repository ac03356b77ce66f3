"""The topic table on a shard: starting and stopping Partition actors to match it.

Every shard holds the node's topic table (a node of its own: shard 0's Controller sends each
new version to every shard; a cluster: the controller group's committed state, published by
shard 0). A new version starts the partitions this shard owns now (shards/shard_table.py, or
a cluster's placement), tells those whose topic configs changed, stands in for those another
shard of this node owns (shards/remote.py), and deletes what is gone, or what a new
incarnation of a topic name replaced (its directory to trash, storage/partition_dir.py).

`Shard` (shards/shard.py) takes these methods from `TopicsShard`; the class names what they
read of the shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pykka import ActorRef

from actors.cluster.state import PlacedTopic
from actors.metrics import ShardMetrics
from actors.partition import Partition
from actors.partition_messages import Delete, UpdateSettings
from actors.services import BrokerSettings, TopicTable
from actors.topic_config import TopicSettings
from shards.raft_host import RaftHost
from shards.remote import RemotePartition
from shards.router import Router
from shards.watch import WatchService
from storage.partition_dir import move_to_trash

__all__ = ["TopicsShard"]


class TopicsShard:
    """The topic table's methods of `Shard`; what they read of it is declared here."""

    settings: BrokerSettings
    shard_id: int
    metrics: ShardMetrics | None
    raft: RaftHost | None
    long_polls: WatchService
    _table: TopicTable
    _partitions: dict[tuple[str, int], ActorRef[Any]]  # owned here
    _remote_partitions: dict[tuple[str, int], RemotePartition]
    _topic_settings: dict[str, TopicSettings]
    _router: Router | None

    if TYPE_CHECKING:
        def owner_of(self, topic: str, index: int) -> int: ...

    def on_topics_changed(self, table: TopicTable) -> None:
        """Start and stop Partition actors so this shard owns exactly its share of the table."""
        old = self._table
        if table.version <= old.version and old.version:
            return  # a copy of the table this shard already has (start-up races)
        self._table = table
        if self.raft is not None:
            self.raft.leaders.set_topics(table)
            if not old.version:  # the first table: ask the peers who leads (calls/leaders.py)
                self.raft.ask_leaders()
        for name, info in table.topics.items():
            settings = TopicSettings.of(info.configs, self.settings)
            previous = old.topics.get(name)
            if previous is not None and previous.topic_id != info.topic_id:
                self._delete_topic(name, previous.partitions)
                previous = None
            if previous is not None and self._topic_settings.get(name) != settings:
                for index in range(previous.partitions):
                    ref = self._partitions.get((name, index))
                    if ref is not None:
                        ref.tell(UpdateSettings(settings))
            self._topic_settings[name] = settings
            first_new = previous.partitions if previous is not None else 0
            for index in range(first_new, info.partitions):
                owner = self.owner_of(name, index)
                if owner < 0:
                    continue  # a cluster's partition with no replica on this node
                if owner != self.shard_id:
                    assert self._router is not None
                    self._remote_partitions[(name, index)] = RemotePartition(
                        self._router, owner, name, index
                    )
                    continue
                directory = Path(self.settings.data_dir) / f"{name}-{index}"
                replicas = info.replicas[index] if isinstance(info, PlacedTopic) else ()
                self._partitions[(name, index)] = Partition.start(
                    name, index, info.topic_id, directory, settings, self, replicas
                )
        for name, info in old.topics.items():
            if name not in table.topics:
                self._delete_topic(name, info.partitions)

    def _delete_topic(self, name: str, partitions: int) -> None:
        self._topic_settings.pop(name, None)
        if self.metrics is not None:  # a topic made again under its name counts from zero
            self.metrics.forget(name)
        for index in range(partitions):
            self._remote_partitions.pop((name, index), None)
            directory = Path(self.settings.data_dir) / f"{name}-{index}"
            ref = self._partitions.pop((name, index), None)
            if ref is not None:
                ref.tell(Delete(move_to_trash(directory)))
            else:
                self.long_polls.gone((name, index))
                if self._router is not None:
                    self._router.segment_files.forget_under(str(directory) + "/")
