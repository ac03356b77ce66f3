"""Cluster metadata as a replicated state machine, and what goes with it (DESIGN.md §7).

The controller Raft group's log holds commands (`commands`: nodes, topics with their
replicas, configs, producer-id blocks); every seed node applies them in order to a
`ClusterState` (`state`) and serves immutable `ClusterView`s of it. Placement (`placement`)
and turning requests into commands (`proposals`) happen on the proposer, before a command is
proposed, so applying stays deterministic. Partition leaders are soft state outside the log
(`leaders`). Topic-name rules both controllers share are in `topic_names`; limits in `limits`.
All pure: no I/O, actors or clocks.
"""

from actors.cluster.commands import (
    FORMAT,
    Address,
    AllocateProducerIdBlock,
    AlterTopicConfigs,
    Command,
    CommandError,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    NodeInfo,
    RegisterNode,
    Replicas,
    decode,
    encode,
)
from actors.cluster.leaders import LeaderTable, LeaderUpdate
from actors.cluster.placement import Load, PlacementError, assign_shards, place_replicas
from actors.cluster.proposals import (
    propose_create_partitions,
    propose_create_topic,
    propose_delete_topic,
)
from actors.cluster.state import (
    Applied,
    ClusterState,
    ClusterView,
    PlacedTopic,
    ProducerIdBlock,
)

__all__ = [
    "FORMAT", "Address", "AllocateProducerIdBlock", "AlterTopicConfigs", "Applied",
    "ClusterState", "ClusterView", "Command", "CommandError", "CreatePartitions", "CreateTopic",
    "DeleteTopic", "LeaderTable", "LeaderUpdate", "Load", "NodeInfo", "PlacedTopic",
    "PlacementError", "ProducerIdBlock", "RegisterNode", "Replicas", "assign_shards", "decode",
    "encode", "place_replicas", "propose_create_partitions", "propose_create_topic",
    "propose_delete_topic",
]
