"""Three ClusterControllers on one loop: real actors, real Raft machines driven by real
Replicas, real controller logs in temporary directories, real fdatasyncs on a thread, hard
states in their real table; only the node RPC between them is a dictionary with link cuts.

What must hold: a replica whose log is cut applies the committed entries that came with the
cut, without waiting for another controller write; a producer-id block is handed to callers
once, even when the node that took it loses its controller log's tail to a power loss (the
entry granting the block cut from its log) and replays the grant from the leader. A
controller restarted on entries a kill -9 left unsynced says nothing of them until its
recovery sync has made them durable; and however a flush ends, the log closes with the
actor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors import limits
from actors.cluster.commands import AllocateProducerIdBlock, NodeInfo
from actors.cluster.state import FIRST_PRODUCER_ID
from actors.cluster_controller import ClusterController
from actors.controller import (
    AllocateProducerId,
    CreateTopics,
    TopicResult,
    TopicSpec,
    metadata_dir,
)
from actors.hard_state import HardStateStore
from actors.limits import producer_id_block_size
from actors.partition_messages import RaftReceive
from actors.raft import Message, MsgType
from actors.runtime import actor_of
from actors.services import BrokerSettings, TopicTable
from tests.support.actor_loop import actor_loop
from tests.support.cluster import controller_commands, whole_batches
from wire.errors import ErrorCode

pytestmark = pytest.mark.timeout(60)

NODES = (1, 2, 3)
TICK_S = 0.01
ELECTION_TICKS = 10  # 100-200 ms
WAIT_S = 20.0  # what a step may wait for, at most (a loaded machine)

loop = pytest.fixture(actor_loop)


class Net:
    """Node RPC between the controllers: Raft messages and forwarded requests, each told to
    the target's actor on a later turn; `cut` nodes send and receive nothing."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.cut: set[int] = set()
        self.sent: list[tuple[int, Message]] = []  # (source node, message), every one sent

    def down(self, a: int, b: int) -> bool:
        return a in self.cut or b in self.cut or not self.nodes[b].running

    def send(self, source: int, messages: list[Message]) -> None:
        by_node: dict[int, list[Message]] = {}
        self.sent.extend((source, m) for m in messages)
        for m in messages:
            to: Any = m.to  # (node, 0): the controller's address on every node
            by_node.setdefault(to[0], []).append(m)
        for target, batch in by_node.items():
            if not self.down(source, target):
                self.nodes[target].ref.tell(RaftReceive(batch))

    def forward(self, source: int, target: int, message: Any) -> None:
        if self.down(source, target):
            reply = message.reply  # the router's expiry of an unanswered call
            if isinstance(message, AllocateProducerId):
                reply(-1)
            elif isinstance(message, CreateTopics):
                reply([TopicResult(s.name, ErrorCode.REQUEST_TIMED_OUT) for s in message.specs])
            else:
                reply(ErrorCode.REQUEST_TIMED_OUT)
            return
        self.nodes[target].ref.tell(message)


class Node:
    """One node's shard 0 as the controller sees it (its ControllerHost)."""

    def __init__(self, n: int, root: Path, net: Net) -> None:
        self.n, self.root, self.net = n, root / f"node-{n}", net
        self.loop = asyncio.get_event_loop()
        self.settings = BrokerSettings(n, "127.0.0.1", 9092 + n, str(self.root), "cluster")
        self.fatal_reasons: list[str] = []
        self.ref: Any = None
        self.running = False
        # While a list: every I/O call (fdatasyncs, hard-state writes) waits here, unrun, as
        # on a disk that has not synced yet when the power goes.
        self.held: list[tuple[Callable[[], Any], Callable[[Any, Any], None]]] | None = None

    def start(self) -> None:
        store = HardStateStore(self.root, self.run_blocking, self.loop.call_soon)
        me = NodeInfo(self.n, "127.0.0.1", 9092 + self.n, "127.0.0.1", 33000 + 10 * self.n, 1,
                      1000)
        self.ref = ClusterController.start(self.settings, me, NODES, self, store,
                                           ELECTION_TICKS, 1, len(NODES))
        self.running = True

    @property
    def controller(self) -> ClusterController:
        actor = actor_of(self.ref)
        assert isinstance(actor, ClusterController)
        return actor

    def stop(self) -> None:
        self.running = False
        self.ref.stop(block=False)

    async def lose_power(self) -> None:
        """The node stops; what no fdatasync covered is gone from its controller log (the
        fdatasyncs it waited for fail, unrun)."""
        controller = self.controller
        synced = controller._log.flushed_offset  # type: ignore[union-attr]  # noqa: SLF001
        self.stop()
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        held, self.held = self.held or [], None
        for _fn, done in held:
            done(None, OSError("the power went"))
        await until(lambda: controller._log is None, "the controller's log closed")  # noqa: SLF001
        for segment in sorted(self.log_dir().glob("*.log")):
            data = segment.read_bytes()
            kept = [p + h.size for p, h in whole_batches(data) if h.last_offset < synced]
            with open(segment, "r+b") as f:
                f.truncate(max(kept, default=0))

    async def kill9(self) -> None:
        """The process dies: its files keep what it wrote (the page cache), synced or not.
        What its I/O calls would have answered never matters again: they end as done, so
        the old actor lets go of its log."""
        controller = self.controller
        self.stop()
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        self.release(run=False)
        await until(lambda: controller._log is None, "the controller's log closed")  # noqa: SLF001

    def release(self, run: bool = True, error: BaseException | None = None) -> None:
        """Let the held I/O calls end: run (or not), then answered done or `error`; I/O is no
        longer held."""
        held, self.held = self.held or [], None
        for fn, done in held:
            if run and error is None:
                self.run_blocking(fn, done)
            else:
                done(None, error)

    def log_dir(self) -> Path:
        return metadata_dir(self.settings.data_dir) / "controller"

    def tell(self, message: Any) -> None:
        self.ref.tell(message)

    # ControllerHost
    def publish(self, table: TopicTable, done: Callable[[], None]) -> None:
        done()

    def nodes_changed(self, view: Any) -> None:
        pass

    def forward(self, leader_node: int, message: Any) -> None:
        self.net.forward(self.n, leader_node, message)

    def send_raft(self, messages: list[Message]) -> None:
        self.net.send(self.n, messages)

    def run_blocking(self, fn: Callable[[], Any],
                     done: Callable[[Any, BaseException | None], None]) -> None:
        if self.held is not None:
            self.held.append((fn, done))
            return
        future = self.loop.run_in_executor(None, fn)

        def finished(f: asyncio.Future[Any]) -> None:
            error = f.exception()
            done(None if error is not None else f.result(), error)

        future.add_done_callback(finished)

    def schedule(self, fn: Callable[[], None]) -> None:
        self.loop.call_soon(fn)

    def later(self, delay_s: float, fn: Callable[[], None]) -> Any:
        return self.loop.call_later(delay_s, fn)

    def live_nodes(self) -> set[int]:
        return set(NODES)

    def fatal(self, reason: str) -> None:
        self.fatal_reasons.append(reason)


async def ticking(net: Net) -> None:
    while True:
        for node in net.nodes.values():
            if node.running and node.controller._replica is not None:  # noqa: SLF001
                node.controller.tick()
        await asyncio.sleep(TICK_S)


async def until(done: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
    for _ in range(int(seconds / 0.005)):
        value = done()
        if value:
            return value
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {seconds}s: {what}")


def leader(net: Net, excluding: frozenset[int] = frozenset()) -> Node | None:
    leading = [n for n in net.nodes.values() if n.running and n.n not in excluding
               and n.controller.is_leader()]
    return max(leading, key=lambda n: n.controller.status()["term"]) if leading else None


def topics(node: Node) -> set[str]:
    return set(node.controller.view().table.topics)


def log_end(node: Node) -> int:
    log_ = node.controller._log  # noqa: SLF001
    return -1 if log_ is None else log_.next_offset


@pytest.fixture
def net(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Iterator[Net]:
    net = Net()
    net.nodes = {n: Node(n, tmp_path, net) for n in NODES}
    for node in net.nodes.values():
        node.start()
    yield net
    for node in net.nodes.values():
        assert not node.fatal_reasons, (node.n, node.fatal_reasons)


def run(loop: asyncio.AbstractEventLoop, net: Net, main: Callable[[], Any]) -> None:
    async def body() -> None:
        ticker = asyncio.ensure_future(ticking(net))
        try:
            await until(lambda: leader(net) is not None, "a controller leader")
            await until(lambda: all(len(n.controller.view().nodes) == len(NODES)
                                    for n in net.nodes.values()), "every node registered")
            await main()
        finally:
            ticker.cancel()

    loop.run_until_complete(body())


async def create_topic(node: Node, name: str) -> list[TopicResult]:
    answers: list[list[TopicResult]] = []
    node.tell(CreateTopics([TopicSpec(name, 1, 3, [], {})], False, answers.append))
    return (await until(lambda: answers, f"{name} created via node {node.n}"))[0]


async def producer_id(node: Node) -> int:
    answers: list[int] = []
    node.tell(AllocateProducerId(answers.append))
    answer = (await until(lambda: answers, f"a producer id from node {node.n}"))[0]
    assert answer >= 0, f"node {node.n} refused a producer id"
    return answer


# 1. A cut that comes with committed entries ------------------------------------------------


def test_a_replica_whose_uncommitted_tail_is_cut_applies_what_came_with_the_cut(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    """The old leader's log is cut and the new leader's entries are appended behind the cut,
    with the commit that covers them in the same Ready: they must be applied once the cut is
    durable, not at the next controller write (on an idle cluster, never)."""
    async def main() -> None:
        old = leader(net)
        assert old is not None
        net.cut = {old.n}  # alone: what it proposes now never commits
        ghost: list[list[TopicResult]] = []
        old.tell(CreateTopics([TopicSpec("ghost", 1, 3, [], {})], False, ghost.append))
        await until(lambda: log_end(old) > old.controller.status()["applied"],
                    "the old leader's proposal in its log, uncommitted")
        new = await until(lambda: leader(net, frozenset({old.n})), "a new leader")
        (created,) = await create_topic(new, "kept")
        assert created.error == ErrorCode.NONE, created
        others = [n for n in net.nodes.values() if n is not old]
        await until(lambda: all("kept" in topics(n) for n in others), "kept on the majority")

        net.cut = set()  # healed: the old leader's tail is cut, the new entries come with it
        await until(lambda: log_end(old) == log_end(new)
                    and old.controller.leader_node == new.n, "the old leader caught up")
        try:
            await until(lambda: "kept" in topics(old), "the old leader applies what it caught "
                        "up", seconds=1.0)
        except AssertionError:
            machine = old.controller._replica.machine  # type: ignore[union-attr]  # noqa: SLF001
            raise AssertionError(
                f"the old leader's commit: {machine.commit}, applied to "
                f"{old.controller.status()['applied']}, log end {log_end(old)}") from None
        assert "ghost" not in topics(old)
        assert ghost and ghost[0][0].error != ErrorCode.NONE, ghost

    run(loop, net, main)


# 2. Producer-id blocks ---------------------------------------------------------------------


def grant_offsets(node: Node, of_node: int) -> list[int]:
    """The offsets of the grants of a block to `of_node` in the node's controller log files
    (what they hold: the page cache's view, synced or not)."""
    return [offset for offset, c in controller_commands(node.root)
            if isinstance(c, AllocateProducerIdBlock) and c.node == of_node]


def test_a_block_whose_grant_a_power_loss_cut_from_the_log_is_not_handed_out_again(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    """A follower hands out ids from a block granted to it while its disk has not synced the
    grant (so it has not acknowledged it: the leader and the other follower committed it),
    loses power, and replays the grant from the leader after its restart: the ids it hands
    out then are new ones."""
    async def main() -> None:
        first = leader(net)
        assert first is not None
        node = next(n for n in net.nodes.values() if n is not first)
        node.held = []
        handed = [await producer_id(node) for _ in range(3)]
        assert len(set(handed)) == 3
        (offset,) = await until(lambda: grant_offsets(first, node.n), "the grant, on the leader")
        await until(lambda: node.controller.status()["applied"] > offset,
                    "the grant applied on the node")

        await node.lose_power()
        assert not grant_offsets(node, node.n), "the grant is past what the node had synced"
        node.start()
        await until(lambda: grant_offsets(node, node.n)
                    and node.controller.status()["applied"] > offset,
                    "the restarted node replayed the grant from the leader")

        again = [await producer_id(node) for _ in range(3)]
        first_block = range(min(handed), min(handed) + producer_id_block_size)
        assert not [i for i in again if i in first_block], (
            f"handed out again after the power loss: {again} (before: {handed}; the grant "
            f"at offset {offset})")
        assert len(set(again)) == 3

    run(loop, net, main)


def test_every_node_hands_out_ids_from_a_block_of_its_own(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    async def main() -> None:
        ids = {n: [await producer_id(node) for _ in range(2)]
               for n, node in net.nodes.items()}
        every = [i for handed in ids.values() for i in handed]
        assert len(set(every)) == len(every), ids
        blocks = {n: {(i - FIRST_PRODUCER_ID) // producer_id_block_size for i in handed}
                  for n, handed in ids.items()}
        assert all(len(b) == 1 for b in blocks.values()), blocks
        assert len(set.union(*blocks.values())) == len(NODES), f"one block per node: {ids}"

    run(loop, net, main)


# 3. A restart on entries a kill -9 left unsynced ---------------------------------------------


def test_a_controller_restarted_on_unsynced_entries_says_nothing_of_them_until_synced(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    """A follower writes entries its disk never syncs, is killed -9 and restarts: its log
    still holds them (the page cache), but a power loss could take them yet. Until its
    recovery sync has made them durable it must not acknowledge them (a leader would count
    them toward a commit) nor campaign on them; after, it acknowledges and applies them."""
    async def main() -> None:
        first = leader(net)
        assert first is not None
        node = next(n for n in net.nodes.values() if n is not first)
        synced_end = log_end(node)
        node.held = []  # from here its fdatasyncs never run
        (created,) = await create_topic(first, "unsynced")
        assert created.error == ErrorCode.NONE, created
        await until(lambda: log_end(node) == log_end(first) > synced_end,
                    "the entry in the follower's log, unsynced")
        end = log_end(first)

        await node.kill9()
        node.held = []  # the restarted node's recovery sync waits
        sent_before = len(net.sent)
        node.start()
        await asyncio.sleep(TICK_S * ELECTION_TICKS * 5)  # heartbeats, appends, elections
        said = [m for source, m in net.sent[sent_before:] if source == node.n]
        acked = [m for m in said if m.type == MsgType.MsgAppResp and not m.reject
                 and m.offset >= synced_end]
        assert not acked, f"acknowledged unsynced entries: {acked}"
        campaigns = [m for m in said if m.type in (MsgType.MsgPreVote, MsgType.MsgVote)]
        assert not campaigns, f"campaigned on unsynced entries: {campaigns}"
        pr = first.controller._replica.machine.progress[(node.n, 0)]  # type: ignore[union-attr]  # noqa: SLF001
        assert pr.match < synced_end, pr.describe()

        node.release()  # the recovery sync completes: it acknowledges and applies them
        await until(lambda: pr.match >= end - 1, "the follower acknowledged after its sync")
        await until(lambda: "unsynced" in topics(node), "the follower applied the topic")

    run(loop, net, main)


# 4. However a flush ends, the log closes -----------------------------------------------------


def caught(loop: asyncio.AbstractEventLoop) -> list[Any]:
    """What the loop's callbacks raise from now on."""
    errors: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(
        context.get("exception", context.get("message"))))
    return errors


async def a_flush_out(net: Net) -> tuple[Node, ClusterController]:
    """A follower with a flush of a new entry held."""
    first = leader(net)
    assert first is not None
    node = next(n for n in net.nodes.values() if n is not first)
    node.held = []
    (created,) = await create_topic(first, f"t{len(topics(first))}")
    assert created.error == ErrorCode.NONE, created
    controller = node.controller
    await until(lambda: controller._flushing, "a flush out")  # noqa: SLF001
    return node, controller


@pytest.mark.parametrize("error", [None, OSError(5, "Input/output error")])
def test_a_flush_that_ends_after_the_actor_stopped_closes_the_log(
        loop: asyncio.AbstractEventLoop, net: Net, error: BaseException | None) -> None:
    errors = caught(loop)

    async def main() -> None:
        node, controller = await a_flush_out(net)
        node.stop()
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        assert controller._log is not None  # noqa: SLF001  # the ticket holds its fds
        node.release(error=error)
        await until(lambda: controller._log is None, "the log closed")  # noqa: SLF001

    run(loop, net, main)
    assert errors == []


def test_a_flush_whose_answer_comes_behind_the_stop_closes_the_log(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    """The flush's answer is told while the actor lives, behind its stop: it is dropped."""
    errors = caught(loop)

    async def main() -> None:
        node, controller = await a_flush_out(net)
        node.stop()  # queued first
        node.release(run=False)  # its answer, queued behind the stop
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        await until(lambda: controller._log is None, "the log closed")  # noqa: SLF001

    run(loop, net, main)
    assert errors == []


def test_a_failed_flush_stops_the_node_and_the_log_closes(
        loop: asyncio.AbstractEventLoop, net: Net) -> None:
    errors = caught(loop)

    async def main() -> None:
        node, controller = await a_flush_out(net)
        node.release(error=OSError(5, "Input/output error"))
        await until(lambda: node.fatal_reasons, "the node told to stop")
        assert controller._replica is not None and controller._replica.closed  # noqa: SLF001
        node.fatal_reasons.clear()
        node.stop()
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        assert controller._log is None  # noqa: SLF001

    run(loop, net, main)
    assert errors == []


def test_a_recovery_sync_that_fails_is_tried_again_and_never_cuts_the_log(
        loop: asyncio.AbstractEventLoop, net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "recovery_sync_retry_ms", 50)

    async def main() -> None:
        first = leader(net)
        assert first is not None
        (created,) = await create_topic(first, "kept")
        node = next(n for n in net.nodes.values() if n is not first)
        await until(lambda: "kept" in topics(node), "applied on the follower")
        await node.kill9()
        stored = controller_commands(node.root)

        node.held = []
        node.start()
        await until(lambda: node.held, "the recovery sync out")
        node.release(error=OSError(5, "Input/output error"))  # fails: tried again
        node.held = []
        await until(lambda: node.held, "the recovery sync tried again")
        assert node.controller._replica is None  # noqa: SLF001
        controller = node.controller
        node.stop()  # and fails again after the stop: the log closes, uncut
        await until(lambda: controller.actor_stopped.is_set(), "the controller stopped")
        node.release(error=OSError(5, "Input/output error"))
        await until(lambda: controller._log is None, "the log closed")  # noqa: SLF001
        assert controller_commands(node.root) == stored

        node.start()  # and a sync that works starts the machine
        await until(lambda: "kept" in topics(node) and node.controller.leader_node == first.n,
                    "the restarted follower follows")

    run(loop, net, main)
