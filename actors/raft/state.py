"""What the role modules (follower.py, leader.py) see of the Raft machine: the fields they read
and move, and `send`. `RaftMachine` (machine.py) is the one implementation; the roles take it
as this Protocol so that they never import machine.py, which imports them. Nothing here runs.
"""

from __future__ import annotations

from typing import Protocol

from actors.raft.config import BatchReader, Config
from actors.raft.log import LogView
from actors.raft.messages import LogWrite, Message, NodeId
from actors.raft.progress import Progress
from actors.raft.quorum import Membership

__all__ = ["RaftState"]


class RaftState(Protocol):
    config: Config
    id: NodeId
    peers: tuple[NodeId, ...]
    membership: Membership
    batch_reader: BatchReader | None
    term: int
    log: LogView
    commit: int
    leader: NodeId | None
    election_elapsed: int
    progress: dict[NodeId, Progress]
    transferee: NodeId | None
    quiesced: bool
    # follower (follower.py)
    leader_match: int
    ack_pending: int
    ack_due: bool
    ack_sent: int
    leader_log_start: int
    # output, gathered until ready()
    log_writes: list[LogWrite]
    want_append: dict[NodeId, bool]
    unwritten_from: int | None

    def send(self, m: Message) -> None: ...
