"""The shard's Raft liveness for quiesced groups (shards/raft_host.py): one keepalive per peer
shard per tick, only to those this shard sent nothing to, and `lost` naming the peers not
heard from for an election timeout. On a real event loop, the ticks driven by the test; the
Router and the node mesh are stand-ins that record calls (the transport itself is tested in
test_node_mesh.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actors.partition_replication import GroupKey
from actors.raft import Message, MsgType
from shards.calls import leaders as leaders_call
from shards.calls import raft as raft_call
from shards.calls.base import Request
from shards.raft_host import RaftHost

pytestmark = pytest.mark.timeout(30)

TICK_S = 0.02
ELECTION_TICKS = 5  # an election timeout of 0.1 s


class _Router:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, int, list[Any]]] = []

        self.sent_now: list[Any] = []  # what was pushed out before the Router's end of turn

    def call(self, to: Any, kind: int, body: Any, frames: list[Any], _on_answer: Any) -> None:
        self.calls.append((to, kind, body.groups))

    def send_now(self, to: Any) -> None:
        self.sent_now.append(to)

    def keepalives(self) -> list[Any]:
        calls, self.calls = self.calls, []
        return sorted(to for to, kind, groups in calls if kind == raft_call.KIND and not groups)


class _Mesh:
    node_id = 1
    peers = {2: ("127.0.0.1", 1), 3: ("127.0.0.1", 2)}

    def address(self, node: int, shard: int) -> Any:
        return shard if node == self.node_id else (node, shard)


def _host(tmp_path: Path) -> tuple[RaftHost, _Router]:
    """A shard's RaftHost on the running loop, bound to the stand-ins, its timers stopped:
    the test ticks (`_keep_alive` is the tick's first step)."""
    def run_io(fn: Any, done: Any) -> None:
        done(fn(), None)

    host = RaftHost(1, 0, asyncio.get_running_loop(), str(tmp_path), run_io,
                    ELECTION_TICKS, 1, TICK_S)
    router = _Router()
    host.bind(router, _Mesh(), lambda _node: 1)  # type: ignore[arg-type]
    host.close()
    return host, router


T0, T1 = GroupKey("t", 0, b"\0" * 16), GroupKey("t", 1, b"\0" * 16)


def test_keepalives_go_to_each_peer_shard_not_sent_to_and_lost_names_the_silent(
        tmp_path: Path) -> None:
    async def main() -> None:
        host, router = _host(tmp_path)
        host.register(T0, lambda: None, ((1, 0), (2, 0), (3, 0)))
        host.register(T1, lambda: None, ((1, 0), (2, 0), (3, 0)))
        host._keep_alive()
        assert router.keepalives() == [(2, 0), (3, 0)]  # one each, for two groups

        # A turn in which a group sent to node 2: at the next tick only node 3 gets one.
        host.send(T0, [Message(MsgType.MsgHeartbeat, (2, 0), (1, 0), 1)])
        await asyncio.sleep(0)  # the turn's sends leave
        host._keep_alive()
        assert router.keepalives() == [(3, 0)]

        # Node 2 keeps talking, node 3 is silent: after an election timeout it is lost.
        await asyncio.sleep(TICK_S * ELECTION_TICKS / 2)
        host.heard_from((2, 0))
        host._keep_alive()
        assert (2, 0) not in host.lost
        await asyncio.sleep(TICK_S * ELECTION_TICKS * 0.75)
        host.heard_from((2, 0))
        host._keep_alive()
        assert host.lost == {(3, 0)}
        host.heard_from((3, 0))
        host._keep_alive()
        assert host.lost == frozenset()

        # Peers count per group: node 3 stays one until its last group goes.
        host.unregister(T0)
        router.calls.clear()
        host._keep_alive()
        assert router.keepalives() == [(2, 0), (3, 0)]
        host.unregister(T1)
        host._keep_alive()
        assert router.keepalives() == [] and host.lost == frozenset()

    asyncio.run(main())


def test_a_heartbeat_after_an_append_within_a_tick_is_dropped_but_never_a_quiesce(
        tmp_path: Path) -> None:
    async def main() -> None:
        host, router = _host(tmp_path)
        host.register(T0, lambda: None, ((1, 0), (2, 0), (3, 0)))

        def sent() -> list[tuple[Any, int]]:
            calls, router.calls = router.calls, []
            return sorted((to, m[0]) for to, _, groups in calls for g in groups for m in g[3:])

        def heartbeat(to: int, quiesce: bool = False) -> Message:
            return Message(MsgType.MsgHeartbeat, (to, 0), (1, 0), 1, quiesce=quiesce)

        host.send(T0, [Message(MsgType.MsgApp, (2, 0), (1, 0), 1)])
        host.send(T0, [heartbeat(2), heartbeat(3), heartbeat(2, quiesce=True)])
        await asyncio.sleep(0)
        app, hb = int(MsgType.MsgApp), int(MsgType.MsgHeartbeat)
        # Node 2 had an append: its plain heartbeat is dropped, the quiesce one is not.
        assert sent() == [((2, 0), app), ((2, 0), hb), ((3, 0), hb)]
        await asyncio.sleep(TICK_S * 1.5)
        host.send(T0, [heartbeat(2)])
        await asyncio.sleep(0)
        assert sent() == [((2, 0), hb)]  # a tick later it goes

    asyncio.run(main())


def test_the_readies_of_a_turn_leave_as_their_callback_ends_one_call_per_shard(
        tmp_path: Path) -> None:
    """What the Replicas' Readies send (in `_run_due`) is handed to the Router and pushed
    out in that same callback: a leader's appends leave before the flush it starts next,
    not a loop turn or two later."""
    async def main() -> None:
        host, router = _host(tmp_path)
        host.register(T0, lambda: None, ((1, 0), (2, 0)))
        host.register(T1, lambda: None, ((1, 0), (2, 0)))
        seen: list[Any] = []

        def ready(key: GroupKey) -> Callable[[], None]:
            return lambda: host.send(key, [Message(MsgType.MsgApp, (2, 0), (1, 0), 1)])

        host.schedule(ready(T0))
        host.schedule(ready(T1))
        host.schedule(lambda: seen.append(list(router.calls)))  # still gathering
        asyncio.get_running_loop().call_soon(lambda: seen.append(list(router.calls)))
        await asyncio.sleep(0)
        assert seen[0] == [], "sent before the turn's Readies were all in"
        [(to, kind, groups)] = seen[1]  # the very next callback: sent, one call
        assert to == (2, 0) and kind == raft_call.KIND and [g[:2] for g in groups] == [
            ["t", 0], ["t", 1]]
        assert router.sent_now == [(2, 0)]

    asyncio.run(main())


class _Recorder:
    """A Router stand-in that keeps every call whole."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, int, Any]] = []

    def call(self, to: Any, kind: int, body: Any, frames: list[Any], _on_answer: Any) -> None:
        self.calls.append((to, kind, body))

    def send_now(self, to: Any) -> None:
        pass


def test_a_starting_shard_asks_every_peer_shard_and_a_leader_answers_what_it_leads(
        tmp_path: Path) -> None:
    async def main() -> None:
        def run_io(fn: Any, done: Any) -> None:
            done(fn(), None)

        host = RaftHost(1, 0, asyncio.get_running_loop(), str(tmp_path), run_io,
                        ELECTION_TICKS, 1, TICK_S)
        router = _Recorder()
        host.bind(router, _Mesh(), lambda node: 2 if node == 1 else 1)  # type: ignore[arg-type]
        host.close()

        host.ask_leaders()  # every other shard, this node's shard 1 too; nothing told yet
        asked = sorted(((to,) if type(to) is int else to) for to, kind, body in router.calls
                       if kind == leaders_call.KIND and body.ask and not body.updates)
        assert asked == [(1,), (2, 0), (3, 0)], router.calls
        router.calls.clear()

        host.tell_led((2, 0))  # leads nothing yet: nothing to send
        assert router.calls == []
        replicas = ((1, 0), (2, 0), (3, 0))
        # It leads t-0: everyone is told.
        host.leader_changed(GroupKey("t", 0, b"\1" * 16), (1, 0), 4, replicas)
        router.calls.clear()
        host.tell_led((2, 0))
        [(to, kind, body)] = router.calls
        assert (to, kind, body.ask) == ((2, 0), leaders_call.KIND, False)
        [update] = body.updates
        assert update[:5] == ["t", b"\1" * 16, 0, [1, 0], 4]

        # The serving side: a call that asks is answered with what the shard leads.
        class _Shard:
            def __init__(self) -> None:
                self.heard: list[Any] = []
                self.asked: list[Any] = []

            def leaders_heard(self, updates: list[Any]) -> None:
                self.heard.extend(updates)

            def leaders_asked(self, source: Any) -> None:
                self.asked.append(source)

        shard = _Shard()
        request = Request(SimpleNamespace(shard=shard), (3, 0), 7)  # type: ignore[arg-type]
        leaders_call.serve(request, [[], True], [])
        leaders_call.serve(request, [body.updates], [])  # a report: told, nothing asked
        assert shard.asked == [(3, 0)]
        assert [u.leader for u in shard.heard] == [(1, 0)]

    asyncio.run(main())


def test_a_raft_call_names_each_group_by_topic_id_and_carries_its_payload() -> None:
    """What crosses to a peer shard names the incarnation: the receiving shard gives the
    messages only to a replica of the same topic id (shards/shard_cluster.py, raft_receive)."""
    router = _Recorder()
    old, new = GroupKey("t", 0, b"\1" * 16), GroupKey("t", 0, b"\2" * 16)
    append = Message(MsgType.MsgApp, (2, 0), (1, 0), 3, offset=9, log_term=2,
                     payload=b"batches")
    raft_call.send(router, (2, 0), [(old, [append]), (new, [Message(
        MsgType.MsgHeartbeat, (2, 0), (1, 0), 1)])])
    [(to, kind, body)] = router.calls
    assert (to, kind) == ((2, 0), raft_call.KIND)

    class _Shard:
        def __init__(self) -> None:
            self.received: list[tuple[GroupKey, list[Message]]] = []

        def raft_heard_from(self, _source: Any) -> None:
            pass

        def raft_receive(self, key: GroupKey, messages: list[Message]) -> None:
            self.received.append((key, messages))

    shard = _Shard()
    request = Request(SimpleNamespace(shard=shard), (1, 0), 0)  # type: ignore[arg-type]
    raft_call.serve(request, body, [b"batches"])
    assert [key for key, _ in shard.received] == [old, new]
    [(_, [got])] = shard.received[:1]
    assert got == append
