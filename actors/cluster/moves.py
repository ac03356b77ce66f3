"""Partition moves (Kafka's reassignments) as the controller's state keeps them.

A move takes a partition from the replicas it has (`origin`) to `target` (other nodes, more
or fewer of them: a replication factor changes the same way). The controller only records it;
the partition's Raft leader carries it out through its group's membership
(actors/partition_replication.py), then proposes `CompleteMove`:

    MovePartitions(orders, [(0, [4, 2, 3])])     replicas [4,2,3,1]   move {origin [1,2,3],
                                                                       target [4,2,3]}
        the leader adds 4 as a learner; once it has caught up, voters {1,2,3} -> {2,3,4}
        (a joint configuration when more than one voter changes), then leaves the joint one
    CompleteMove(orders, 0, [4, 2, 3])           replicas [4,2,3]     no move
        node 1's shard stops its replica and removes its data

While the move is under way the partition's replicas are the target's, then those of every
replica the partition had since the move began that the target leaves out (Kafka's order:
the target's first replica is the preferred leader), so that every node that may still be a
member of the group keeps its replica until the move completes. A second MovePartitions
redirects a move under way (its origin stays); a cancel is a move back to the origin. Both
may leave nodes in the replicas that the new target does not hold: they leave at completion.

Krill moves replicas between nodes: a node both before and after keeps its shard (the
proposer keeps it, and the state refuses a target that changes it). A partition of
replication factor 1 has no Raft group (its LoneLeader), so a move to or from one replica is
refused: not built.
"""

from __future__ import annotations

from actors.cluster.commands import Move, Replicas

__all__ = ["adding", "removing", "replicas_during"]


def replicas_during(current: Replicas, target: Replicas) -> Replicas:
    """The replicas while moving to `target` from `current` (the partition's replicas now):
    the target's, then the rest of `current` in its order."""
    nodes = {node for node, _ in target}
    return target + tuple(r for r in current if r[0] not in nodes)


def adding(move: Move) -> list[int]:
    """The nodes the move adds (ListPartitionReassignments' adding_replicas)."""
    before = {node for node, _ in move.origin}
    return [node for node, _ in move.target if node not in before]


def removing(move: Move, replicas: Replicas) -> list[int]:
    """The nodes that leave once the move completes (removing_replicas)."""
    after = {node for node, _ in move.target}
    return [node for node, _ in replicas if node not in after]
