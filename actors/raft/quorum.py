"""Who decides in a Raft group: its `Membership`, after etcd-io/raft's ConfState and quorum
package. Pure: the machine asks it, and nothing here knows about terms, logs or messages.

    voters     decide: elections, commits, check-quorum (a majority of them)
    outgoing   in a joint configuration (a voter change under way, Raft's joint consensus),
               the voters before it: a decision then needs a majority of each set
    learners   receive the log and count for nothing (a replica catching up before it is
               made a voter, or one that only serves reads)

A node is in at most one of voters+outgoing (both are voters) and learners.

    m = Membership({1, 2, 3}, outgoing={1, 2, 4}, learners={5})
    m.committed({1: 9, 2: 7, 3: 4, 4: 2, 5: 9})   # 7: {1,2,3} reach 7, {1,2,4} reach 7
    m.vote_result({1: True, 3: True})             # PENDING: {1,2,4} has one yes of three
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from actors.raft.messages import NodeId

__all__ = ["Membership", "VoteResult", "is_step", "majority_offset"]


class VoteResult(enum.Enum):
    WON = "won"
    LOST = "lost"
    PENDING = "pending"


def majority_offset(voters: Iterable[NodeId], match: Mapping[NodeId, int]) -> int:
    """The largest offset that a majority of `voters` reach (a voter `match` does not name
    reaches nothing: -1). No voters: no constraint."""
    offsets = sorted((match.get(v, -1) for v in voters), reverse=True)
    if not offsets:
        return 1 << 62
    return offsets[len(offsets) // 2]


def _vote_result(voters: frozenset[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    if not voters:
        return VoteResult.WON
    yes = sum(1 for v in voters if votes.get(v) is True)
    no = sum(1 for v in voters if votes.get(v) is False)
    need = len(voters) // 2 + 1
    if yes >= need:
        return VoteResult.WON
    if no > len(voters) - need:
        return VoteResult.LOST
    return VoteResult.PENDING


@dataclass(frozen=True, slots=True)
class Membership:
    voters: frozenset[NodeId]
    outgoing: frozenset[NodeId] = field(default_factory=frozenset)
    learners: frozenset[NodeId] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "voters", frozenset(self.voters))
        object.__setattr__(self, "outgoing", frozenset(self.outgoing))
        object.__setattr__(self, "learners", frozenset(self.learners))
        assert self.voters, "a group has at least one voter"
        assert not self.learners & (self.voters | self.outgoing), self

    @property
    def joint(self) -> bool:
        return bool(self.outgoing)

    @property
    def all_voters(self) -> frozenset[NodeId]:
        return self.voters | self.outgoing

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.outgoing | self.learners

    def is_voter(self, node: NodeId) -> bool:
        return node in self.voters or node in self.outgoing

    def committed(self, match: Mapping[NodeId, int]) -> int:
        """The largest offset a majority reaches: of each set, in a joint configuration."""
        offset = majority_offset(self.voters, match)
        if self.outgoing:
            offset = min(offset, majority_offset(self.outgoing, match))
        return offset

    def vote_result(self, votes: Mapping[NodeId, bool]) -> VoteResult:
        """An election's state from the votes counted so far (only voters' count)."""
        incoming = _vote_result(self.voters, votes)
        if not self.outgoing:
            return incoming
        outgoing = _vote_result(self.outgoing, votes)
        if VoteResult.LOST in (incoming, outgoing):
            return VoteResult.LOST
        if incoming == outgoing == VoteResult.WON:
            return VoteResult.WON
        return VoteResult.PENDING

    def active(self, heard: Iterable[NodeId]) -> bool:
        """Whether the nodes `heard` from hold a majority (of each set, when joint)."""
        votes = {node: True for node in heard}
        return self.vote_result(votes) == VoteResult.WON

    def describe(self) -> str:
        def ids(nodes: frozenset[NodeId]) -> str:
            return " ".join(sorted(map(str, nodes)))

        out = f"voters=({ids(self.voters)})"
        if self.outgoing:
            out += f"&&({ids(self.outgoing)})"
        if self.learners:
            out += f" learners=({ids(self.learners)})"
        return out


def is_step(old: Membership, new: Membership) -> bool:
    """Whether `new` may follow `old` directly in a group's log (etcd's ConfChangeV2 rules):
    from a joint configuration only leaving it (its incoming voters alone; learners as they
    are to be); else entering a joint configuration whose outgoing voters are `old`'s, or a
    change of at most one voter (one server at a time, Raft's simple rule), learners as they
    are to be. Two majorities of a one-voter change always overlap, so it needs no joint
    step; any larger change does."""
    if new == old:
        return False
    if old.joint:
        return not new.joint and new.voters == old.voters
    if new.joint:
        return new.outgoing == old.voters and new.voters != old.voters
    return len(old.voters ^ new.voters) <= 1
