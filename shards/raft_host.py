"""One shard's Raft services: the ticker, the hard-state table, sends, and who leads what.

Every replicated partition on a shard (actors/partition_replication.py), and on shard 0 the
controller group (actors/cluster_controller.py), is a Raft group driven from here:

- The ticker: one timer per shard, every `raft_heartbeat_interval_ms`, ticks every group of
  the shard (a call on the loop; a group's Ready is then taken once that turn).
- Liveness, for quiesced groups (actors/raft/machine.py): an idle group stops ticking, its
  followers' leases held open, so something else must say that a peer is gone. Each tick
  this shard sends an empty call to every peer shard of its groups that it sent nothing to
  since the last tick (a keepalive: one message per shard pair, however many groups), and
  notes when it last heard from each. `lost` is the peers not heard from for an election
  timeout; a quiet group whose leader, or whose quorum, is among them is woken.
- The hard-state table (actors/hard_state.py): every group's term and vote in one file under
  `<data_dir>/_krill/shard-N/`, one atomic write per loop turn for every group that changed.
- Groups are named by `GroupKey` (topic, index, topic id: actors/partition_replication.py)
  in every table here and in every message: a topic deleted and created again under its
  name is another group, and one replica's cleanup never touches the other's clock, report
  or term. A message that finds no replica of its group on the receiving shard, or one of
  another incarnation, is dropped and counted (`dropped`, krill_raft_messages_dropped).
- Sends: a group's messages go to each replica's shard, `(node, shard)`, through the Router
  (shards/calls/raft.py): this node's shards over the pipes, other nodes' over node RPC, and
  a loop turn's messages to one shard leave as one message. The Readies of a turn are taken
  in one callback (`schedule`), and what they sent is pushed out as it ends, past the
  Router's own end-of-turn gathering: a leader's appends leave before the I/O pool is handed
  the flush its produce started in the same turn, and a follower's answers do not wait a
  loop turn more. A heartbeat to a peer that had
  an append of the group within the last tick is dropped: the append reset the follower's
  election clock and carried the commit, and its answer marks the follower active (a
  heartbeat marked quiesce always goes).
- Leaders: a replica's leadership changes, and a leader's in-sync replicas each time they
  change (actors/isr.py, a new version of its report), go into this shard's `LeaderTable`
  (Metadata, coordinators) and, from the leader, to every shard of every node
  (shards/calls/leaders.py; a partition of replication factor 1 has no group and reports
  itself the same way), again every `leader_refresh_interval_s` for the partitions it leads,
  so a node that missed a report learns every leader within that long; a shard that starts
  asks every peer shard for what it leads once it has its first topic table (`ask_leaders`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from actors.cluster.leaders import LeaderTable, LeaderUpdate
from actors.hard_state import HardStateStore
from actors.partition_replication import GroupKey
from actors.raft import Message, MsgType
from actors.recovery_throttle import RecoveryThrottle
from shards import limits
from shards.calls import leaders as leaders_call
from shards.calls import raft as raft_call

if TYPE_CHECKING:
    from shards.node_mesh import NodeMesh
    from shards.router import Router

__all__ = ["RaftHost"]

log = logging.getLogger(__name__)

Address = tuple[int, int]


class RaftHost:
    """actors.partition_replication.RaftServices for one shard."""

    def __init__(self, node_id: int, shard_id: int, loop: asyncio.AbstractEventLoop,
                 data_dir: str, run_io: Any, election_ticks: int, heartbeat_ticks: int,
                 tick_s: float, recovery_rate_bytes: float = 0) -> None:
        """`recovery_rate_bytes`: this shard's share of the node's learner recovery rate, bytes
        per second (0: not throttled)."""
        self.address: Address = (node_id, shard_id)
        self.node_id = node_id
        self.shard_id = shard_id
        self.loop = loop
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.tick_s = tick_s
        directory = Path(data_dir) / "_krill" / f"shard-{shard_id}"
        directory.mkdir(parents=True, exist_ok=True)
        self.hard_states = HardStateStore(directory, run_io, loop.call_soon)
        self.leaders = LeaderTable()
        self._ticks: dict[GroupKey, Callable[[], None]] = {}
        self._group_peers: dict[GroupKey, tuple[Address, ...]] = {}
        # When each group last sent an append to each peer (loop time): its heartbeats to
        # that peer within a tick are dropped (module docstring).
        self._appended: dict[GroupKey, dict[Any, float]] = {}
        # Liveness (module docstring): the peers of this shard's groups, how many groups each
        # is a peer in, and when each was last heard from (loop time).
        self._peers: collections.Counter[Address] = collections.Counter()
        self._heard: dict[Address, float] = {}
        self._sent: set[Any] = set()  # the router addresses sent to since the last tick
        self.lost: frozenset[Address] = frozenset()
        self.election_timeout_s = election_ticks * tick_s
        self.recovery: RecoveryThrottle | None = None
        if recovery_rate_bytes > 0:
            self.recovery = RecoveryThrottle(
                recovery_rate_bytes, max(recovery_rate_bytes * limits.recovery_burst_s,
                                         limits.recovery_burst_bytes_min), loop.time)
        self._due: list[Callable[[], None]] = []  # Replicas' work for the end of the turn
        self._running_due = False  # inside `_run_due`: its sends leave as it ends
        # This turn's messages: target shard -> group -> messages, in send order.
        self._outbox: dict[Any, dict[GroupKey, list[Message]]] = {}
        self._led: dict[GroupKey, LeaderUpdate] = {}
        self._versions: dict[GroupKey, int] = {}
        # Raft messages that found no replica of their group here, by why (module docstring).
        self.dropped = {"no_replica": 0, "other_incarnation": 0}
        self._router: Router | None = None
        self._mesh: NodeMesh | None = None
        self._shards_of: Callable[[int], int] = lambda _node: 1
        self._timer: asyncio.TimerHandle | None = None
        self._refresh: asyncio.TimerHandle | None = None
        # Told of every change of a local replica's role (the shard: coordinators follow).
        self.on_role_change: Callable[[str, int], None] = lambda _topic, _index: None

    def bind(self, router: Router, mesh: NodeMesh, shards_of: Callable[[int], int]) -> None:
        """Start ticking, sending through `router`; `shards_of(node)`: that node's shard count
        (who to tell of leaders)."""
        self._router, self._mesh, self._shards_of = router, mesh, shards_of
        self._timer = self.loop.call_later(self.tick_s, self._tick)
        self._refresh = self.loop.call_later(limits.leader_refresh_interval_s, self._refresh_all)

    def close(self) -> None:
        for timer in (self._timer, self._refresh):
            if timer is not None:
                timer.cancel()
        self._timer = self._refresh = None

    # RaftServices ----------------------------------------------------------------------------

    def register(self, key: GroupKey, tick: Callable[[], None],
                 replicas: tuple[Address, ...] = ()) -> None:
        """Tick this group; `replicas`: its replicas, whose shards this one keeps alive."""
        self._forget_peers(key)
        self._ticks[key] = tick
        now = self.loop.time()
        peers = tuple(a for a in replicas if a != self.address)
        self._group_peers[key] = peers
        for peer in peers:
            self._peers[peer] += 1
            self._heard.setdefault(peer, now)  # a timeout's grace from the first group

    def unregister(self, key: GroupKey) -> None:
        self._ticks.pop(key, None)
        self._led.pop(key, None)
        self._appended.pop(key, None)
        self._forget_peers(key)

    def _forget_peers(self, key: GroupKey) -> None:
        for peer in self._group_peers.pop(key, ()):
            self._peers[peer] -= 1
            if not self._peers[peer]:
                del self._peers[peer]
                self._heard.pop(peer, None)

    def heard_from(self, source: Any) -> None:
        """A Raft call came in from `source` (a shard of this node, or a (node, shard))."""
        address = (self.node_id, source) if type(source) is int else tuple(source)
        if address in self._peers:
            self._heard[address] = self.loop.time()

    def schedule(self, fn: Callable[[], None]) -> None:
        """Run `fn` once this loop turn's input is in (a Replica's Ready): every group's in
        one loop callback, not one each (a thousand groups' heartbeats arrive together)."""
        if not self._due:
            self.loop.call_soon(self._run_due)
        self._due.append(fn)

    def _run_due(self) -> None:
        due, self._due = self._due, []
        self._running_due = True
        try:
            for fn in due:
                try:
                    fn()
                except Exception:  # one group's bug must not stop the others' work
                    log.exception("a Raft group's work failed")
        finally:
            self._running_due = False
        self._flush()  # what the Readies sent leaves now, not a loop turn later

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.loop.call_later(delay_s, fn)

    def send(self, key: GroupKey, messages: list[Message]) -> None:
        """Gathered per target shard until the end of the loop turn (of `_run_due`, where
        the Readies send): one call carries every group's messages to it (calls/raft.py)."""
        mesh = self._mesh
        if mesh is None:
            return
        outbox = self._outbox
        if not outbox and not self._running_due:
            self.loop.call_soon(self._flush)
        appended = self._appended.get(key)
        now = self.loop.time()
        for m in messages:
            if m.type is MsgType.MsgApp:
                if appended is None:
                    appended = self._appended[key] = {}
                appended[m.to] = now
            elif m.type is MsgType.MsgHeartbeat and not m.quiesce and appended is not None:
                last = appended.get(m.to)
                if last is not None and now - last < self.tick_s:
                    continue
            node, shard = cast(Address, m.to)
            groups = outbox.setdefault(mesh.address(node, shard), {})
            groups.setdefault(key, []).append(m)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        router = self._router
        if router is None:
            return
        for target, groups in outbox.items():
            raft_call.send(router, target, list(groups.items()))
            router.send_now(target)  # not held for the Router's own end of turn
            self._sent.add(target)

    def leader_changed(self, key: GroupKey, leader: Address | None, epoch: int,
                       isr: tuple[Address, ...]) -> None:
        """A replica here saw its group's leader change, or (leading) its in-sync replicas
        `isr`: a leader's report goes out as the next version of its epoch's. The report
        carries the replica's own topic id: one of a deleted topic's, not yet stopped, is
        ignored everywhere (actors/cluster/leaders.py), never taken for the new topic's."""
        topic, index, topic_id = key
        if leader == self.address:
            version = self._versions.get(key, 0) + 1
            self._versions[key] = version
            update = LeaderUpdate(topic, topic_id, index, leader, epoch, isr, version)
            self._led[key] = update
            self._tell_everyone([update])
        else:
            self._led.pop(key, None)
            self._versions.pop(key, None)
            update = LeaderUpdate(topic, topic_id, index, leader, epoch)
        self.leaders.update(update)
        self.on_role_change(topic, index)

    # Leaders -------------------------------------------------------------------------------------

    def heard(self, updates: list[LeaderUpdate]) -> None:
        for update in updates:
            self.leaders.update(update)

    def _tell_everyone(self, updates: list[LeaderUpdate], ask: bool = False) -> None:
        """A leaders call to every other shard of every node."""
        router, mesh = self._router, self._mesh
        if router is None or mesh is None:
            return
        for node in {self.node_id, *mesh.peers}:
            for shard in range(self._shards_of(node)):
                if (node, shard) != self.address:
                    leaders_call.send(router, mesh.address(node, shard), updates, ask)

    def ask_leaders(self) -> None:
        """This shard has just started: every shard of every node sends what it leads."""
        self._tell_everyone([], ask=True)

    def tell_led(self, to: Any) -> None:
        """Send `to` (a router address) the reports of every partition this shard leads."""
        router = self._router
        if router is None:
            return
        for chunk in self._led_chunks():
            leaders_call.send(router, to, chunk)

    def _led_chunks(self) -> list[list[LeaderUpdate]]:
        """What this shard leads, `leader_updates_per_message_max` reports a message."""
        updates, step = list(self._led.values()), limits.leader_updates_per_message_max
        return [updates[start:start + step] for start in range(0, len(updates), step)]

    def _refresh_all(self) -> None:
        self._refresh = self.loop.call_later(limits.leader_refresh_interval_s, self._refresh_all)
        for chunk in self._led_chunks():
            self._tell_everyone(chunk)

    # The ticker ---------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._timer = self.loop.call_later(self.tick_s, self._tick)
        self._keep_alive()
        for tick in list(self._ticks.values()):
            try:
                tick()
            except Exception:  # one group's bug must not stop every other group's clock
                log.exception("a Raft group's tick failed")

    def _keep_alive(self) -> None:
        """Liveness (module docstring): who has gone quiet, and an empty call to each peer
        shard this one sent nothing to since the last tick."""
        now = self.loop.time()
        heard, timeout = self._heard, self.election_timeout_s
        self.lost = frozenset(a for a in self._peers if now - heard.get(a, now) > timeout)
        router, mesh = self._router, self._mesh
        if router is None or mesh is None:
            return
        sent, self._sent = self._sent, set()
        for node, shard in self._peers:
            target = mesh.address(node, shard)
            if target not in sent:
                raft_call.send(router, target, [])
