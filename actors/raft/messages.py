"""What goes into the Raft machine and what comes out of it: messages, log ranges, states.

Every message is one immutable `Message` record whose fields mean what its `type` says (the
table below), after etcd-io/raft's one message struct. "Offset" is a Kafka offset: Raft's
index. Offsets start at 0; offset -1 is the empty log's anchor, of term 0. A `Range` is a run
of whole Kafka batches of one term, `base..last` inclusive: the machine never sees bytes, so
an append message names ranges and the orchestrator attaches the batches (its `payload`,
passed through the machine untouched to the follower's `Append` write).

    type               term   offset              log_term      other fields
    MsgHup             0      -                   -             local: campaign now
    MsgTransferLeader  0      -                   -             local: sender = the transferee
    MsgUnreachable     0      -                   -             local: sender = the dead/slow peer
    MsgPreVote         T+1    candidate's last    its term      transfer (never set)
    MsgVote            T      candidate's last    its term      transfer: bypass the lease
    MsgPreVoteResp     T*     -                   -             reject
    MsgVoteResp        T*     -                   -             reject
    MsgApp             T      prev offset         prev term     ranges, commit, payload,
                                                                log_start (the leader's),
                                                                confs: the membership
                                                                changes among the ranges
    MsgAppResp         T      acked (flushed)     hint term     reject: offset = rejected
                              offset                            prev (or the end claimed
                                                                before a failed write),
                                                                hint = hint offset;
                                                                log_start (the follower's)
    MsgHeartbeat       T      -                   -             commit, quiesce: stop
                                                                the election clock (idle),
                                                                log_start (the leader's)
    MsgHeartbeatResp   T      -                   -             log_start (the follower's)
    MsgSnap            T      log start - 1       its term      commit: "restart your log
                                                                here", ranges: its first
                                                                entry (offset, term) if any,
                                                                confs: the membership in
                                                                force at log start - 1
    MsgTimeoutNow      T      -                   -             the transferee campaigns now

    T*: a granted (pre)vote answers with the request's term, a rejection with the voter's.

`log_start` replicates the log start as Kafka's fetches do (its leader's logStartOffset in a
fetch answer, the follower's in the next fetch): a follower moves its own start up to the
leader's (never past its commit: `AdvanceStart`), so records DeleteRecords or retention
removed stay removed after a failover; the leader learns how far each follower's start is
(DeleteRecords answers once every live replica's is past it, Kafka's low watermark). -1: not
said.

Node ids are opaque hashables (ints, `(node, shard)` tuples); `None` means "nobody".
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any, NamedTuple

__all__ = [
    "LEADER_CHANGE", "AdvanceStart", "Append", "ConfChange", "HardState", "InstallStart",
    "LogState", "LogWrite", "Message", "MsgType", "NodeId", "Range", "Ready", "Role",
    "SoftState", "TruncateAfter",
]

NodeId = Hashable


class MsgType(enum.IntEnum):
    """Message kinds, etcd's names (the transcripts read alike)."""

    MsgHup = 0
    MsgTransferLeader = 1
    MsgUnreachable = 2
    MsgPreVote = 3
    MsgPreVoteResp = 4
    MsgVote = 5
    MsgVoteResp = 6
    MsgApp = 7
    MsgAppResp = 8
    MsgHeartbeat = 9
    MsgHeartbeatResp = 10
    MsgSnap = 11
    MsgTimeoutNow = 12

    def __str__(self) -> str:
        return self.name


class Role(enum.IntEnum):
    Follower = 0
    PreCandidate = 1
    Candidate = 2
    Leader = 3

    def __str__(self) -> str:
        return self.name


class Range(NamedTuple):
    """Offsets `base..last` (inclusive) of whole batches written in `term`."""

    base: int
    last: int
    term: int


class Message(NamedTuple):
    """One Raft message (see the module table for what each field means per type)."""

    type: MsgType
    to: NodeId
    sender: NodeId
    term: int
    offset: int = -1
    log_term: int = 0
    ranges: tuple[Range, ...] = ()
    commit: int = -1
    reject: bool = False
    hint: int = -1
    transfer: bool = False
    quiesce: bool = False
    log_start: int = -1
    payload: Any = None  # the batches' bytes, attached and read by the orchestrator only
    confs: tuple[tuple[int, Any], ...] = ()  # (offset, Membership) (the table above)


class HardState(NamedTuple):
    """What must be durable (written atomically, synced) before a Ready's messages are sent."""

    term: int
    vote: NodeId | None


class SoftState(NamedTuple):
    """Who leads, as this node believes, and its own role: volatile, for the orchestrator."""

    leader: NodeId | None
    role: Role


class LogState(NamedTuple):
    """A log as handed to a restarting machine: recovered and synced by the orchestrator.

    `runs` is the epoch cache: (start offset, term) of each term's first batch at or after
    `log_start`, ascending; `prev_term` is the term of the entry at `log_start - 1` (0 for an
    empty log that starts at 0); `confs` the memberships, as the epoch cache's runs."""

    log_start: int
    prev_term: int
    runs: tuple[tuple[int, int], ...]
    last_offset: int
    # (offset, Membership): the one in force at log_start - 1, then each change in the log
    # (log.py); empty: none since the group's Config, which is in force.
    confs: tuple[tuple[int, Any], ...] = ()


# The payload of the no-op a new leader appends: write a Kafka LEADER_CHANGE control batch of
# one record at the Append's offset, in its term.
LEADER_CHANGE: Any = "LEADER_CHANGE"


class Append(NamedTuple):
    """Write these ranges at the log's end. On a follower `payload` is the payload of the
    MsgApp they came in (write its batches from `ranges[0].base` on); on the leader it is what
    `propose()` was given, `LEADER_CHANGE`, or a `ConfChange`. `confs`: the membership
    changes among the ranges, (offset, Membership) (the orchestrator keeps them where a
    restart finds them)."""

    ranges: tuple[Range, ...]
    payload: Any
    confs: tuple[tuple[int, Any], ...] = ()


class TruncateAfter(NamedTuple):
    """Remove every batch after `offset` (a follower's divergent, uncommitted tail)."""

    offset: int


class InstallStart(NamedTuple):
    """Remove every batch and restart the log empty at `log_start`; the entry before it had
    `prev_term` (keep it with the log: the epoch cache's first entry), and `membership` was
    in force there (keep it too: the log's anchor membership). Kafka's follower truncation
    to the leader's log start."""

    log_start: int
    prev_term: int
    membership: Any = None


class ConfChange(NamedTuple):
    """The payload of a membership change the leader appends (`propose_membership`): write
    a control batch of one record carrying `membership` at the Append's offset."""

    membership: Any


class AdvanceStart(NamedTuple):
    """Remove every batch below `offset`, as DeleteRecords or retention would: a follower
    takes its leader's log start (everything below it is committed, so in every log alike;
    never past this log's commit + 1). Kafka's follower moves its logStartOffset up to the
    one in its leader's fetch answers the same way."""

    offset: int


LogWrite = Append | TruncateAfter | InstallStart | AdvanceStart


class Ready(NamedTuple):
    """What the machine asks of its orchestrator; handle it in this order, then `advance()`:

    1. `hard_state`, if not None: persist it atomically and sync it.
    2. `log_writes`, in order: apply them to the local log (written now, synced later: report
       each sync with `flushed(offset, term)`; no message waits for it).
    3. `messages`: send them (only now: after step 1). An append answer is only ever emitted
       for what `flushed()` reported, so nothing here waits for step 2's sync.
    4. `committed`, if not None: the new commit offset (the high watermark is committed + 1).
    5. `soft_state`, if not None: the leader or this node's role changed.
    """

    soft_state: SoftState | None
    hard_state: HardState | None
    log_writes: tuple[LogWrite, ...]
    messages: tuple[Message, ...]
    committed: int | None
