"""The topic table on a shard: starting and stopping Partition actors to match it.

Every shard holds the node's topic table (a node of its own: shard 0's Controller sends each
new version to every shard; a cluster: the controller group's committed state, published by
shard 0). A new version starts the partitions this shard owns now (shards/shard_table.py, or
a cluster's placement), tells those whose topic configs changed, stands in for those another
shard of this node owns (shards/remote.py), and deletes what is gone, or what a new
incarnation of a topic name replaced (its directory to trash, storage/partition_dir.py).
A partition whose replicas a move changed (actors/cluster/moves.py) starts its replica on a
node the move adds, is told its new replicas where it stays, and, once the move completes,
stops on a node it left, its data to trash.

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
from actors.partition_messages import Delete, UpdateReplicas, UpdateSettings
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
            if isinstance(previous, PlacedTopic) and isinstance(info, PlacedTopic):
                for index in range(first_new):
                    if (previous.replicas[index] != info.replicas[index]
                            or previous.moves.get(index) != info.moves.get(index)):
                        self._replicas_changed(info, index, settings)
            for index in range(first_new, info.partitions):
                self._start_partition(info, index, settings)
        for name, info in old.topics.items():
            if name not in table.topics:
                self._delete_topic(name, info.partitions)

    def _start_partition(self, info: Any, index: int, settings: TopicSettings) -> None:
        """Start the partition's replica if this shard holds it, or a stand-in for the shard
        of this node that does."""
        name = info.name
        owner = self.owner_of(name, index)
        if owner < 0:
            return  # a cluster's partition with no replica on this node
        if owner != self.shard_id:
            assert self._router is not None
            self._remote_partitions[(name, index)] = RemotePartition(
                self._router, owner, name, index
            )
            return
        directory = Path(self.settings.data_dir) / f"{name}-{index}"
        replicas: tuple[tuple[int, int], ...] = ()
        voters = target = None
        if isinstance(info, PlacedTopic):
            replicas, voters = info.replicas[index], info.voters(index)
            move = info.moves.get(index)
            target = move.target if move is not None else None
        self._partitions[(name, index)] = Partition.start(
            name, index, info.topic_id, directory, settings, self, replicas, voters, target
        )

    def _replicas_changed(self, info: PlacedTopic, index: int, settings: TopicSettings) -> None:
        """A move began, was redirected or completed: start, tell or stop this node's
        replica, or the stand-in for the shard of this node that holds it."""
        key = (info.name, index)
        ref = self._partitions.get(key)
        if self.owner_of(info.name, index) == self.shard_id and ref is not None:
            move = info.moves.get(index)
            ref.tell(UpdateReplicas(info.replicas[index],
                                    move.target if move is not None else None))
            return
        self._remote_partitions.pop(key, None)
        if ref is not None:  # the move completed without this node: its data goes
            del self._partitions[key]
            directory = Path(self.settings.data_dir) / f"{info.name}-{index}"
            ref.tell(Delete(move_to_trash(directory)))
        self._start_partition(info, index, settings)

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
