"""A Raft machine's fixed inputs: its `Config` and the `BatchReader` its orchestrator may hand
it. A module of their own so that the machine (machine.py) and its role modules (follower.py,
leader.py, through state.py) can all name them without importing each other; it holds no
state and decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.raft import limits
from actors.raft.messages import NodeId

__all__ = ["BatchReader", "Config"]

# (first offset, last offset, bytes max) -> (end offset, bytes): the end of the longest run of
# whole batches from `first` that ends at or before `last` and fits `bytes max` (always at least
# one batch), and its size. The orchestrator's in-memory index answers it, asked only about
# what its log holds (never the Ready's own writes, which appends name whole, unsized).
# Without one an append names everything from `first` on, and the in-flight window counts
# messages only.
BatchReader = Callable[[int, int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Config:
    id: NodeId
    peers: tuple[NodeId, ...]  # every voter (this one, unless a learner); the send order
    election_ticks: int = limits.election_ticks_default
    heartbeat_ticks: int = limits.heartbeat_ticks_default
    pre_vote: bool = True
    check_quorum: bool = True
    inflight_messages_max: int = limits.inflight_messages_max
    inflight_bytes_max: int = limits.inflight_bytes_max
    append_bytes_max: int = limits.append_bytes_max
    quiesce: bool = False  # an idle group stops ticking (module docstring)
    # Replicas that receive the log and do not vote (actors/raft/quorum.py); sent to after
    # the voters, in this order.
    learners: tuple[NodeId, ...] = ()

    def __post_init__(self) -> None:
        members = self.peers + self.learners
        assert self.id in members and len(set(members)) == len(members) and self.peers, self
        assert 0 < self.heartbeat_ticks < self.election_ticks, self
