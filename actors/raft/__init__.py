"""Raft for one partition, as a pure state machine (DESIGN.md §7), after etcd-io/raft.

The entries are Kafka batches and the partition log is the Raft log: an offset is a Raft
index, a batch's partitionLeaderEpoch is its term, and the machine sees only `(base, last,
term)` ranges, never bytes. The orchestrator (the Partition actor) drives it:

    m = RaftMachine(Config(id, peers), random.Random(seed), hard_state=..., log=...)
    m.tick()                       every tick of its clock
    m.step(message)                every message from a peer (payload: the batches' bytes)
    m.propose(records, payload)    leader: a batch appended -> its Range, or None
    m.propose_membership(new)      leader: a membership change appended (quorum.py)
    m.flushed(offset, term)        its log is synced up to offset (term: the batch's there)
    m.set_log_start(offset)        retention or DeleteRecords removed what is below offset
    m.log_write_failed(last)       a write it asked for was not made: the log ends at last
    if m.has_ready():
        rd = m.ready()             persist rd.hard_state; apply rd.log_writes; send
        ...                        rd.messages (attach bytes to MsgApp ranges); publish
        m.advance()                rd.committed as the high watermark - 1

Modules: `messages` (what goes in and out), `log` (the epoch cache: offsets and terms),
`progress` (a leader's view of each follower), `quorum` (who decides: voters, a joint
configuration's two sets, learners), `machine` (roles and elections), `leader` and
`follower` (the two halves of replication), `limits`.
"""

from actors.raft.log import LogView
from actors.raft.machine import BatchReader, Config, RaftMachine, Status
from actors.raft.messages import (
    LEADER_CHANGE,
    AdvanceStart,
    Append,
    ConfChange,
    HardState,
    InstallStart,
    LogState,
    LogWrite,
    Message,
    MsgType,
    NodeId,
    Range,
    Ready,
    Role,
    SoftState,
    TruncateAfter,
)
from actors.raft.progress import Progress, ProgressState
from actors.raft.quorum import Membership, VoteResult

__all__ = [
    "LEADER_CHANGE", "AdvanceStart", "Append", "BatchReader", "Config", "ConfChange",
    "HardState",
    "InstallStart", "LogState", "LogView", "LogWrite", "Membership", "Message", "MsgType",
    "NodeId", "Progress", "ProgressState", "RaftMachine", "Range", "Ready", "Role", "SoftState",
    "Status", "TruncateAfter", "VoteResult",
]
