"""The ClusterController actor: the cluster's metadata as a Raft group over the seed nodes.

A node started with `seeds` runs this on shard 0 instead of actors/controller.py (a node of
its own keeps that one: a topic table in a JSON file). Every seed node holds a replica of the
controller group (DESIGN.md §7), whose log is a partition log of its own under
`<data_dir>/_krill/controller/`: each record's value is one command (actors/cluster/
commands.py), and every node applies the committed records in order to its `ClusterState`
(actors/cluster/state.py), so every node holds the same topics, replicas and nodes.

    request (CreateTopics, ...)     any node's shards -> its shard 0 -> here
       not the leader               forwarded to the leader's controller (shards/calls/
                                    controller.py over node RPC); its answer passed back once
                                    this node has applied what it changed
       the leader                   checked against the state (actors/cluster/proposals.py:
                                    placement of every replica), one batch of commands appended
                                    and proposed; answered as each command applies
    committed (Raft)                applied in log order on every node: the new `TopicTable`
                                    (of `PlacedTopic`s) is published to this node's shards,
                                    which start and stop replicas to match

Applying follows the high watermark Raft reports (`committed`), as far as the log holds it:
the entries that come with a cut of the log (a follower's uncommitted tail replaced by the
leader's) are written only once the cut is durable (actors/replica.py), after the commit that
covers them was reported. So the controller applies again, up to the last high watermark
reported, when a cut completes and after each append; else they would wait for the next
controller write, which an idle cluster never makes.

Each node registers itself (`RegisterNode`: its Kafka address, RPC address, shards) once a
leader is known and again whenever what the state holds differs from its own; Metadata lists
the registered nodes.

Producer ids come in blocks (`AllocateProducerIdBlock`), so any node hands ids out alone. A
node asks the leader for a block; the leader proposes the grant and answers the asker with
the block once the grant is committed and applied (as Kafka's controller answers KIP-730's
AllocateProducerIds). A block's first id is the state's high-water mark where its grant
applies (`ClusterState.next_producer_id`), which every node computes alike from the committed
log, so no two grants overlap; and the mark survives what a minority can lose, for only
committed grants move it, and a committed entry is on a quorum's disks and is never cut. A
node hands out ids only from the blocks it was answered with in this run. Replaying the log
hands out nothing, so no restart, power loss or cut of this node's own log can give a block
twice, whatever that log kept. (It used to take back, on replay, every grant to itself past
its log's end at start-up: a grant that a power loss had cut from its log came back as new.
A per-run nonce in each grant would have worked too, at the cost of a format change; the
answer was there already.) A block whose answer is lost (the asker restarted, the leader
changed) is never used, as a restart skips what was left of its last block.

Reads of the controller log (applying committed records, sending appends to followers) are
plain reads on the loop: the log is small (topics and nodes, not data), written moments
before, and in the page cache.

A reopened log may hold entries a kill -9 left only in the page cache, which a power loss
would still take (storage/log.py), so the Raft machine starts only once the log's first
flush ticket has synced all of it (the recovery sync): a machine takes its log as synced,
and would acknowledge those entries, count them toward a commit as a leader, or win an
election on them. Meanwhile Raft messages are dropped (a lost message: the leader's next
heartbeat, a candidate's next campaign), and requests wait as they wait for a leader. A
recovery sync that fails is tried again: a restart would read the same page cache back.
A flush that fails once the machine runs stops the node (`fatal`); its ticket is settled
first, as it is when the actor stopped while a flush ran, so the log always closes.
"""

from __future__ import annotations

import collections
import logging
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError

from actors import limits
from actors.cluster.commands import (
    AllocateProducerIdBlock,
    Command,
    CommandError,
    NodeInfo,
    RegisterNode,
    Replicas,
    decode,
    encode,
)
from actors.cluster.commands import AlterTopicConfigs as AlterTopicConfigsCommand
from actors.cluster.commands import CompleteMove as CompleteMoveCommand
from actors.cluster.commands import MovePartitions as MovePartitionsCommand
from actors.cluster.proposals import (
    propose_create_partitions,
    propose_create_topic,
    propose_delete_topic,
    propose_moves,
)
from actors.cluster.state import Applied, ClusterState, ClusterView, ProducerIdBlock
from actors.controller import (
    AllocateProducerId,
    AlterTopicConfigs,
    CompleteMove,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    MovePartitions,
    PartitionResult,
    TopicResult,
    metadata_dir,
    refuse_moves,
    topic_names_of,
)
from actors.group import OFFSETS_TOPIC
from actors.hard_state import HardStateStore
from actors.partition_messages import RaftReceive, RaftUnreachable
from actors.partition_replication import log_state
from actors.raft import Config, Message, RaftMachine, Role, SoftState
from actors.replica import Replica, log_batch_reader
from actors.replica_memberships import recovered
from actors.runtime import LoopActor
from actors.services import BrokerSettings, TopicTable, now_ms
from storage import DiskLog
from storage.log import Log
from wire.errors import ErrorCode
from wire.record_batch import BatchHeader, iter_batches
from wire.records import build_batch, decode_batch

__all__ = ["ClusterController", "ControllerHost", "RegisterSelf"]

log = logging.getLogger(__name__)

Address = tuple[int, int]
GROUP = "controller"
# How long a forwarded answer waits for this node to apply what the leader applied.
_CATCH_UP_S = 2.0
_CATCH_UP_STEP_S = 0.02
# How often a node looks whether it must register (again), and asks for producer ids.
_REGISTER_EVERY_S = 0.5


class RegisterSelf(NamedTuple):
    """A node's registration, forwarded to the leader; replies the error code."""

    info: NodeInfo
    reply: Callable[[ErrorCode], None]


class ProducerIdBlockFor(NamedTuple):
    """Ask the leader to give `node` a block of producer ids; replies the block once the
    grant is committed and applied, or the error code."""

    node: int
    reply: Callable[[ProducerIdBlock | ErrorCode], None]


class _Tick(NamedTuple):
    pass


class _RegisterTick(NamedTuple):
    pass


class _Flushed(NamedTuple):
    ticket: Any
    term: int | None
    error: BaseException | None


class ControllerHost(Protocol):
    """What the shard gives the controller (shards/shard_cluster.py's ControllerHost)."""

    def publish(self, table: TopicTable, done: Callable[[], None]) -> None: ...
    def nodes_changed(self, view: ClusterView) -> None: ...
    def forward(self, leader_node: int, message: Any) -> None: ...
    def send_raft(self, messages: list[Message]) -> None: ...
    def run_blocking(self, fn: Callable[[], Any],
                     done: Callable[[Any, BaseException | None], None]) -> None: ...
    def schedule(self, fn: Callable[[], None]) -> None: ...
    def later(self, delay_s: float, fn: Callable[[], None]) -> Any: ...
    def live_nodes(self) -> set[int]: ...
    def fatal(self, reason: str) -> None:
        """Stop the node: the controller cannot go on (its log's durability is unknown)."""


class ClusterController(LoopActor):
    def __init__(self, settings: BrokerSettings, me: NodeInfo, seeds: tuple[int, ...],
                 host: ControllerHost, hard_states: HardStateStore, election_ticks: int,
                 heartbeat_ticks: int, default_replicas: int) -> None:
        super().__init__()
        self.settings = settings
        self.me = me
        self.seeds = seeds
        self.host = host
        self._hard_states = hard_states
        self._election_ticks = election_ticks
        self._heartbeat_ticks = heartbeat_ticks
        self.default_replicas = default_replicas
        self.state = ClusterState()
        self._log: DiskLog | None = None
        self._replica: Replica | None = None
        self._applied = 0  # the end offset applied
        self._commit_target = 0  # the high watermark Raft last reported; applied up to it
        self._flushing = False
        self._sync_failures = 0  # the recovery sync's, in a row (module docstring)
        self._waiters: dict[int, Callable[[Applied], None]] = {}  # offset -> its answer
        self._waiting: collections.deque[Any] = collections.deque()  # before a leader is known
        self._producer_ids: collections.deque[tuple[int, int]] = collections.deque()
        self._producer_id_waiters: collections.deque[AllocateProducerId] = collections.deque()
        self._asking_block = False
        self._registering = False
        self._timer: Any = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            CreateTopics: self._create_topics,
            DeleteTopics: self._delete_topics,
            CreatePartitions: self._create_partitions,
            AlterTopicConfigs: self._alter_configs,
            AllocateProducerId: self._allocate_producer_id,
            RegisterSelf: self._register_self,
            ProducerIdBlockFor: self._block_for,
            MovePartitions: self._move_partitions,
            CompleteMove: self._complete_move,
            RaftReceive: self._raft_receive,
            RaftUnreachable: self._raft_unreachable,
            _Tick: self._tick,
            _RegisterTick: self._register_tick,
            _Flushed: self._flushed,
        }

    def __str__(self) -> str:
        return f"ClusterController(node {self.me.node})"

    # Lifecycle ----------------------------------------------------------------------------

    def on_start(self) -> None:
        directory = Path(metadata_dir(self.settings.data_dir)) / "controller"
        self._log = DiskLog.open(directory)
        self._log.serve()
        self._schedule_register()
        self._flush()  # the recovery sync: the machine starts once it is back (_flushed)
        if not self._flushing:  # an empty log: nothing to sync
            self._start_machine()

    def _start_machine(self) -> None:
        log_ = self._log
        assert log_ is not None and log_.flushed_offset == log_.next_offset, log_
        address = (self.me.node, 0)
        peers = tuple((node, 0) for node in self.seeds)
        confs, exact = recovered(log_)
        machine = RaftMachine(
            Config(address, peers, election_ticks=self._election_ticks,
                   heartbeat_ticks=self._heartbeat_ticks),
            random.Random(), hard_state=self._hard_states.get(GROUP),
            log=log_state(log_, confs), committed=log_.log_start_offset - 1,
            batch_reader=log_batch_reader(log_))
        self._replica = Replica(GROUP, machine, self, self._hard_states, self.host.schedule,
                                confs_saved=exact)

    def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._replica is not None:
            self._replica.close()
        for reply in self._waiters.values():
            reply(Applied(ErrorCode.REQUEST_TIMED_OUT, "the controller stopped"))
        self._waiters.clear()
        if self._log is not None and not self._flushing:
            self._log.close()
            self._log = None

    def on_dropped(self, message: Any) -> None:
        if isinstance(message, _Flushed):  # told as the actor stopped: on_stop left the log
            self._close_after(message.ticket, message.error)

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            return super().on_receive(message)
        return handler(message)

    def tick(self) -> None:
        """The shard's Raft ticker (a call on the loop, not a message)."""
        if self._replica is not None and not self._replica.closed:
            self._replica.tick()

    def _tick(self, _m: _Tick) -> None:
        self.tick()

    # What the shard asks ---------------------------------------------------------------------

    @property
    def leader_node(self) -> int | None:
        if self._replica is None:
            return None
        leader = self._replica.machine.leader
        return leader[0] if isinstance(leader, tuple) else None

    def is_leader(self) -> bool:
        return self._replica is not None and self._replica.machine.role == Role.Leader

    def transfer_leadership(self) -> None:
        """Hand the controller's leadership to another seed (a clean stop)."""
        replica = self._replica
        if replica is None or replica.machine.role != Role.Leader:
            return
        progress = replica.machine.progress
        peers = [p for p in progress if p != replica.machine.id]
        if peers:
            replica.transfer_leadership(max(peers, key=lambda p: progress[p].match))

    def view(self) -> ClusterView:
        return self.state.view()

    def status(self) -> dict[str, Any]:
        machine = self._replica.machine if self._replica is not None else None
        return {
            "leader": -1 if self.leader_node is None else self.leader_node,
            "term": machine.term if machine is not None else 0,
            "role": machine.role.name.lower() if machine is not None else "follower",
            "applied": self._applied,
            "nodes": sorted(self.state.view().nodes),
        }

    # Raft (ReplicaHost) -----------------------------------------------------------------------

    def _raft_receive(self, m: RaftReceive) -> None:
        if self._replica is not None and not self._replica.closed:
            for message in m.messages:
                self._replica.receive(message)

    def _raft_unreachable(self, m: RaftUnreachable) -> None:
        if self._replica is not None and not self._replica.closed:
            self._replica.unreachable(m.peer)

    def replica_log(self) -> Log:
        assert self._log is not None
        return self._log

    def appended(self, last_offset: int, headers: list[BatchHeader],
                 data: bytes | bytearray | memoryview) -> None:
        self._flush()
        self._apply_to(self._commit_target)

    def log_rewritten(self) -> None:
        pass  # only what is not committed is ever cut, and only committed records are applied

    def advance_log_start(self, offset: int) -> None:
        pass  # no retention here: a controller leader's log start never moves past ours

    def cut_complete(self) -> None:
        self._flush()
        self._apply_to(self._commit_target)

    def writes_resumed(self) -> None:
        pass  # a proposal refused meanwhile (NOT_CONTROLLER) is retried by its asker

    def committed(self, high_watermark: int) -> None:
        self._commit_target = max(self._commit_target, high_watermark)
        self._apply_to(self._commit_target)

    def role_changed(self, soft: SoftState, term: int) -> None:
        leader = soft.leader[0] if isinstance(soft.leader, tuple) else None
        log.info("controller: node %s leads in term %d", leader, term)
        if soft.role != Role.Leader:
            for reply in self._waiters.values():
                reply(Applied(ErrorCode.REQUEST_TIMED_OUT, "the controller lost its leadership"))
            self._waiters.clear()
        if leader is not None:
            waiting, self._waiting = self._waiting, collections.deque()
            for message in waiting:
                self._handlers[type(message)](message)
        self.host.nodes_changed(self.state.view())

    def send(self, messages: list[Message]) -> None:
        self.host.send_raft(messages)

    def run_io(self, fn: Callable[[], Any],
               done: Callable[[Any, BaseException | None], None]) -> None:
        self.host.run_blocking(fn, done)

    def read_io(self, fn: Callable[[], Any],
                done: Callable[[Any, BaseException | None], None]) -> None:
        self.host.run_blocking(fn, done)

    def now_ms(self) -> int:
        return now_ms()

    def leader_change_ids(self) -> tuple[int, list[int]]:
        return self.me.node, list(self.seeds)

    def _flush(self) -> None:
        log_ = self._log
        if self._flushing or log_ is None or log_.cut_pending:
            return
        ticket = log_.flush_prepare()
        if ticket is None:
            return
        self._flushing = True
        term = log_.term_at(ticket.offset - 1)
        ref = self.actor_ref

        def done(_result: Any, error: BaseException | None) -> None:
            try:
                ref.tell(_Flushed(ticket, term, error))
            except ActorDeadError:
                self._close_after(ticket, error)

        self.host.run_blocking(ticket.run, done)

    def _close_after(self, ticket: Any, error: BaseException | None) -> None:
        """The actor stopped while a flush ran: end its ticket (the log closes no fd a
        ticket still holds), then close the log."""
        log_ = self._log
        if log_ is None:
            return
        self._log = None
        try:
            if error is None:
                log_.flush_complete(ticket)
            elif self._replica is None:  # the recovery sync: nothing is known durable
                log_.flush_abandoned(ticket)
            else:
                log_.flush_failed(ticket)  # cuts what was not synced, as a restart would
        finally:
            log_.close()

    def _flushed(self, m: _Flushed) -> None:
        self._flushing = False
        log_ = self._log
        if log_ is None:
            return
        if m.error is not None:
            self._flush_failed(log_, m)
            return
        log_.flush_complete(m.ticket)
        if self._replica is None:
            if self._sync_failures:
                log.warning("controller: the recovery sync works after %d failures",
                            self._sync_failures)
            self._start_machine()
        elif m.term is not None:
            self._replica.flushed(log_.flushed_offset - 1, m.term)
        if log_.written_offset > log_.flushed_offset:
            self._flush()

    def _flush_failed(self, log_: DiskLog, m: _Flushed) -> None:
        """What the controller log holds on disk is unknown. Before the machine starts (the
        recovery sync) that is tried again; after, this node must not vote or acknowledge on
        it: it answers no more and stops; a restart recovers the log and Raft repairs it."""
        log_.flush_abandoned(m.ticket)  # nothing moves; the log closes with the actor
        if self._replica is None:
            self._sync_failures += 1
            if self._sync_failures == 1:
                log.error("controller: the recovery sync failed: %r; tried again every %d ms",
                          m.error, limits.recovery_sync_retry_ms)
            self.call_later(limits.recovery_sync_retry_ms / 1000, self._retry_sync)
            return
        self._replica.close()
        self.host.fatal(f"controller log fdatasync failed: {m.error!r}")

    def _retry_sync(self) -> None:
        if not self.actor_stopped.is_set() and self._replica is None:
            self._flush()

    # Applying ------------------------------------------------------------------------------------

    def _apply_to(self, high_watermark: int) -> None:
        log_ = self._log
        if log_ is None or high_watermark <= self._applied:
            return
        before = self.state.view()
        while self._applied < high_watermark:
            data = log_.read_bytes(self._applied, 1 << 20, high_watermark)
            if not data:
                break
            for header in iter_batches(bytearray(data), check_crc=False):
                self._apply_batch(data, header)
                self._applied = header.last_offset + 1
        after = self.state.view()
        if after.table is not before.table:
            self.host.publish(after.table, lambda: None)
        if after.nodes != before.nodes:
            self.host.nodes_changed(after)
        self._grant_producer_ids()

    def _apply_batch(self, data: bytes, header: BatchHeader) -> None:
        if header.is_control:
            for offset in range(header.base_offset, header.last_offset + 1):
                self.state.skip(offset)
            return
        batch = memoryview(data)[header.position:header.position + header.size]
        _, records = decode_batch(batch, check_crc=False)
        for record in records:
            offset = record.offset
            try:
                command = decode(record.value or b"")
            except CommandError as e:
                log.error("controller: record at %d is not a command (%s); skipped", offset, e)
                self.state.skip(offset)
                continue
            result = self.state.apply(command, offset)
            waiter = self._waiters.pop(offset, None)
            if waiter is not None:
                waiter(result)

    # Proposing (the leader) ---------------------------------------------------------------

    def _propose(self, commands: list[Command], replies: list[Callable[[Applied], None]]) -> None:
        """Append one batch of `commands` and propose it; each reply runs once its command is
        applied (or the leadership is lost first)."""
        replica, log_ = self._replica, self._log
        assert replica is not None and log_ is not None
        replica.before_append()
        machine = replica.machine
        if (machine.role != Role.Leader or machine.transferee is not None or log_.cut_pending
                or replica.writes_waiting):  # Raft's own write (a membership) comes first
            for reply in replies:
                reply(Applied(ErrorCode.NOT_CONTROLLER, "not the controller now"))
            return
        batch = build_batch([(None, encode(c), []) for c in commands],
                            base_timestamp=self.now_ms())
        headers = iter_batches(batch, check_crc=False)
        result = log_.append(batch, headers, machine.term, self.now_ms())
        proposed = replica.propose(len(commands))
        assert proposed is not None and proposed.base == result.base_offset, proposed
        for i, reply in enumerate(replies):
            self._waiters[result.base_offset + i] = reply
        self._flush()

    def _forward_or_wait(self, message: Any) -> bool:
        """True if `message` was forwarded to the leader or queued until one is known."""
        if self.is_leader():
            return False
        leader = self.leader_node
        if leader is None:
            if len(self._waiting) < limits.controller_requests_waiting_max:
                self._waiting.append(message)
            else:
                _refuse(message, ErrorCode.NOT_CONTROLLER)
            return True
        self.host.forward(leader, _caught_up(self, message))
        return True

    def _live(self) -> set[int]:
        return self.host.live_nodes()

    def _decide(self, name: str, proposal: Command | Applied,
                validate_only: bool = False) -> TopicResult | Command:
        """One entry of a request: answered now (refused, or only validated), or the
        command to propose (checked against the state now; applying checks it again)."""
        if isinstance(proposal, Applied):
            return TopicResult(name, proposal.error, proposal.message)
        checked = self.state.check(proposal)
        if checked.error != ErrorCode.NONE or validate_only:
            return TopicResult(name, checked.error, checked.message, checked.topic)
        return proposal

    def _create_topics(self, m: CreateTopics) -> None:
        if self._forward_or_wait(m):
            return
        view = self.state.view()
        entries: list[TopicResult | Command] = []
        names: set[str] = set()
        for spec in m.specs:
            if spec.name in names:
                entries.append(TopicResult(spec.name, ErrorCode.INVALID_REQUEST, "named twice"))
                continue
            names.add(spec.name)
            default_factor = self.default_replicas
            if spec.name == OFFSETS_TOPIC:
                default_factor = min(3, len(view.nodes))
            proposal = propose_create_topic(
                view, spec.name, spec.partitions, spec.replication_factor, spec.assignments,
                spec.configs, topic_id=uuid.uuid4().bytes, live=self._live(),
                default_partitions=self.settings.default_partitions,
                default_replication_factor=min(default_factor, max(1, len(view.nodes))),
                start=random.randrange(1 << 16))
            entries.append(self._decide(spec.name, proposal, m.validate_only))
        self._propose_for(entries, m.reply)

    def _delete_topics(self, m: DeleteTopics) -> None:
        if self._forward_or_wait(m):
            return
        view = self.state.view()
        self._propose_for([self._decide(name or "", propose_delete_topic(view, name, topic_id))
                           for name, topic_id in zip(m.names, m.ids, strict=True)], m.reply)

    def _create_partitions(self, m: CreatePartitions) -> None:
        if self._forward_or_wait(m):
            return
        view = self.state.view()
        self._propose_for([
            self._decide(name, propose_create_partitions(
                view, name, count, None, live=self._live(), start=random.randrange(1 << 16)),
                m.validate_only)
            for name, count in m.counts], m.reply)

    def _alter_configs(self, m: AlterTopicConfigs) -> None:
        if self._forward_or_wait(m):
            return
        self._propose_for([
            self._decide(name, AlterTopicConfigsCommand(name, tuple(operations), m.replace),
                         m.validate_only)
            for name, operations in m.changes], m.reply)

    def _propose_for(self, entries: list[TopicResult | Command],
                     reply: Callable[[list[TopicResult]], None]) -> None:
        """Propose the entries that are commands, as one batch; `reply` every entry's result,
        in order, once the last command is applied."""
        results: list[TopicResult | None] = [
            e if isinstance(e, TopicResult) else None for e in entries]
        proposed = [(i, e) for i, e in enumerate(entries) if not isinstance(e, TopicResult)]
        if not proposed:
            reply([r for r in results if r is not None])
            return
        left = len(proposed)

        def applied_at(slot: int, name: str) -> Callable[[Applied], None]:
            def applied(a: Applied) -> None:
                nonlocal left
                results[slot] = TopicResult(name, a.error, a.message, a.topic)
                left -= 1
                if left == 0:
                    reply([r for r in results if r is not None])
            return applied

        self._propose([c for _, c in proposed],
                      [applied_at(i, getattr(c, "name", "")) for i, c in proposed])

    # Partition moves (actors/cluster/moves.py) ---------------------------------------------------

    def _move_partitions(self, m: MovePartitions) -> None:
        """One command per topic, of the partitions whose moves can be made; each partition is
        answered with its refusal now, or once its topic's command is applied."""
        if self._forward_or_wait(m):
            return
        view = self.state.view()
        results: list[PartitionResult | None] = []
        commands: list[Command] = []
        replies: list[Callable[[Applied], None]] = []
        for topic, moves in m.moves:
            proposals = propose_moves(view, topic, moves, start=random.randrange(1 << 16))
            info = view.table.topics.get(topic)
            taken: list[tuple[int, Replicas | None]] = []
            slots: list[int] = []
            for index, proposal in proposals:
                if isinstance(proposal, Applied):
                    results.append(PartitionResult(topic, index, proposal.error,
                                                   proposal.message))
                    continue
                assert info is not None
                command = MovePartitionsCommand(topic, info.topic_id, ((index, proposal),))
                checked = self.state.check(command)
                if checked.error != ErrorCode.NONE:
                    results.append(PartitionResult(topic, index, checked.error,
                                                   checked.message))
                    continue
                taken.append((index, proposal))
                slots.append(len(results))
                results.append(None)
            if taken:
                assert info is not None
                commands.append(MovePartitionsCommand(topic, info.topic_id, tuple(taken)))
                replies.append(self._moves_applied(topic, taken, slots, results, m))
        if not commands:
            m.reply([r for r in results if r is not None])
            return
        self._propose(commands, replies)

    @staticmethod
    def _moves_applied(topic: str, taken: list[tuple[int, Replicas | None]], slots: list[int],
                       results: list[PartitionResult | None], m: MovePartitions
                       ) -> Callable[[Applied], None]:
        def applied(a: Applied) -> None:
            for (index, _), slot in zip(taken, slots, strict=True):
                results[slot] = PartitionResult(topic, index, a.error, a.message)
            if all(r is not None for r in results):
                m.reply([r for r in results if r is not None])
        return applied

    def _complete_move(self, m: CompleteMove) -> None:
        if self._forward_or_wait(m):
            return
        command = CompleteMoveCommand(m.topic, m.topic_id, m.partition, m.target)
        checked = self.state.check(command)
        if checked.error != ErrorCode.NONE:
            m.reply(checked.error)
            return
        self._propose([command], [lambda a: m.reply(a.error)])

    # Nodes and producer ids ---------------------------------------------------------------------

    def _schedule_register(self) -> None:
        self._timer = self.host.later(_REGISTER_EVERY_S, self._register_soon)

    def _register_soon(self) -> None:
        try:
            self.actor_ref.tell(_RegisterTick())
        except ActorDeadError:
            return

    def _register_self(self, m: RegisterSelf) -> None:
        if self._forward_or_wait(m):
            return
        command = RegisterNode(m.info)
        checked = self.state.check(command)
        if checked.error != ErrorCode.NONE:
            m.reply(checked.error)
            return
        self._propose([command], [lambda a: m.reply(a.error)])

    def _register_tick(self, _m: Any) -> None:
        self._schedule_register()
        if self.leader_node is None or self._registering:
            return
        if self.state.view().nodes.get(self.me.node) == self.me:
            return
        self._registering = True

        def registered(error: ErrorCode) -> None:
            self._registering = False
            if error != ErrorCode.NONE:
                log.debug("registering node %d: %s", self.me.node, error.name)

        self._register_self(RegisterSelf(self.me, registered))

    def _block_for(self, m: ProducerIdBlockFor) -> None:
        if self._forward_or_wait(m):
            return

        def applied(a: Applied) -> None:
            m.reply(a.block if a.error == ErrorCode.NONE and a.block is not None else a.error)

        self._propose([AllocateProducerIdBlock(m.node)], [applied])

    def _allocate_producer_id(self, m: AllocateProducerId) -> None:
        if len(self._producer_id_waiters) >= limits.controller_requests_waiting_max:
            m.reply(-1)
            return
        self._producer_id_waiters.append(m)
        self._grant_producer_ids()

    def _grant_producer_ids(self) -> None:
        waiters, blocks = self._producer_id_waiters, self._producer_ids
        while waiters and blocks:
            start, end = blocks[0]
            waiters.popleft().reply(start)
            if start + 1 < end:
                blocks[0] = (start + 1, end)
            else:
                blocks.popleft()
        if not waiters or self._asking_block or self.leader_node is None:
            return
        self._asking_block = True

        def given(answer: ProducerIdBlock | ErrorCode) -> None:
            self._asking_block = False
            if isinstance(answer, ProducerIdBlock) and answer.node == self.me.node:
                self._producer_ids.append((answer.start, answer.start + answer.size))
                self._grant_producer_ids()
                return
            log.debug("node %d: no producer-id block: %r", self.me.node, answer)
            for waiter in self._producer_id_waiters:
                waiter.reply(-1)
            self._producer_id_waiters.clear()

        self._block_for(ProducerIdBlockFor(self.me.node, given))



def _refuse(message: Any, error: ErrorCode) -> None:
    if isinstance(message, AllocateProducerId):
        message.reply(-1)
    elif isinstance(message, RegisterSelf | ProducerIdBlockFor | CompleteMove):
        message.reply(error)
    elif isinstance(message, MovePartitions):
        refuse_moves(message, error, "no controller leader yet")
    else:
        message.reply([TopicResult(name or "", error, "no controller leader yet")
                       for name in topic_names_of(message)])


def _caught_up(controller: ClusterController, message: Any) -> Any:
    """`message` with its reply held until this node has applied what the leader's answer
    names (a client told "created" then asks this node's Metadata), for at most
    `_CATCH_UP_S`."""
    if not isinstance(message, CreateTopics | DeleteTopics | CreatePartitions):
        return message
    reply = message.reply
    deadline = time.monotonic() + _CATCH_UP_S

    def settled(results: list[TopicResult]) -> bool:
        topics = controller.state.view().table.topics
        for r in results:
            if r.error != ErrorCode.NONE:
                continue
            present = topics.get(r.name)
            if isinstance(message, DeleteTopics):
                if present is not None and r.info is not None \
                        and present.topic_id == r.info.topic_id:
                    return False
            elif present is None or (r.info is not None
                                     and present.partitions < r.info.partitions):
                return False
        return True

    def answer(results: list[TopicResult]) -> None:
        if settled(results) or time.monotonic() >= deadline:
            reply(results)
            return
        controller.host.later(_CATCH_UP_STEP_S, lambda: answer(results))

    return message._replace(reply=answer)
