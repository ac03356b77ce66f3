"""Every limit of the cluster metadata, as a named constant with its unit last.

The topic limits the single-node controller enforces (`topic_name_chars_max`,
`partitions_per_topic_max`, `producer_id_block_size`) stay in actors/limits.py and are used
from there, so both controllers refuse the same things.
"""

from __future__ import annotations

# Nodes the cluster may register: every node's entry is in every snapshot and every
# Metadata answer, and placement looks at each of them for every partition it places.
nodes_max = 1024
# Shards one node may declare (shard k listens on RPC port + k; a core each).
shards_per_node_max = 1024
# Replicas of one partition: a Raft group larger than this is slower to commit than it is
# safer (Kafka's own limit is a short; nobody runs more than 5 or 7).
replication_factor_max = 16
# Bytes of one encoded command (a record in the controller group's log). The largest is a
# CreateTopic of `partitions_per_topic_max` partitions at 3 replicas: ~1.3 MB.
command_bytes_max = 8 * 1024 * 1024
# Bytes of one snapshot: the whole cluster's metadata, read back whole at start-up.
snapshot_bytes_max = 512 * 1024 * 1024
# The largest producer id (a Java long); blocks past it are refused.
producer_id_max = 2**63 - 1
# Leader reports about a topic this node's table does not have yet (a new topic's first
# elections race the table's way to this shard): kept, newest last, and applied when the
# table brings the topic; past this many the oldest is dropped (the leader's periodic
# refresh, shards/limits.leader_refresh_interval_s, sends it again).
early_leader_reports_max = 4096
