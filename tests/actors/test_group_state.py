"""The pure group state machine: every event in every state (a table), then whole scenarios
(initial delay, MEMBER_ID_REQUIRED, session and rebalance timeouts, static members,
protocol choice, persist-before-send, restore), and the offsets-log record layouts."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from actors.group import java_string_hash, offsets_partition
from actors.group.events import (
    GroupState,
    Heartbeat,
    Join,
    Leave,
    Persist,
    Reply,
    SetTimer,
    Sync,
)
from actors.group.log_records import (
    GroupKey,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from actors.group.state import Group
from wire.errors import ErrorCode as E

DELAY_MS = 100
SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = (("range", b"r-meta"),)

S = GroupState


def new_group() -> Group:
    ids = itertools.count(1)
    return Group("g", DELAY_MS, new_member_id=lambda client: f"{client}-{next(ids)}")


def join(
    member_id: str = "",
    *,
    client: str = "c",
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = RANGE,
    protocol_type: str = "consumer",
    session_ms: int = SESSION_MS,
    require: bool = False,
    tag: str = "join",
) -> Join:
    return Join(
        "g",
        member_id,
        instance,
        client,
        "/127.0.0.1",
        session_ms,
        REBALANCE_MS,
        protocol_type,
        protocols,
        require,
        tag,
    )


def sync(
    member_id: str,
    generation: int,
    assignments: tuple[tuple[str, bytes], ...] = (),
    *,
    instance: str | None = None,
    protocol_name: str | None = None,
    tag: str = "sync",
) -> Sync:
    return Sync("g", member_id, instance, generation, None, protocol_name, assignments, tag)


def heartbeat(member_id: str, generation: int, instance: str | None = None) -> Heartbeat:
    return Heartbeat("g", member_id, instance, generation, "hb")


def replies(effects: list[Any]) -> dict[Any, Any]:
    return {e.to: e.result for e in effects if isinstance(e, Reply)}


# Groups in each state: (group, leader member id, clock) ---------------------------------------


def in_empty() -> tuple[Group, str, int]:
    return new_group(), "", 0


def in_preparing() -> tuple[Group, str, int]:
    g = new_group()
    g.join(join(), 0)
    return g, "c-1", 0


def in_completing() -> tuple[Group, str, int]:
    g, member, _ = in_preparing()
    g.tick(DELAY_MS)
    return g, member, DELAY_MS


def in_stable() -> tuple[Group, str, int]:
    g, member, now = in_completing()
    g.sync(sync(member, 1, ((member, b"assignment"),)), now)
    return g, member, now


def in_dead() -> tuple[Group, str, int]:
    g = new_group()
    assert g.delete() == E.NONE
    return g, "", 0


STATES: dict[GroupState, Callable[[], tuple[Group, str, int]]] = {
    S.EMPTY: in_empty,
    S.PREPARING_REBALANCE: in_preparing,
    S.COMPLETING_REBALANCE: in_completing,
    S.STABLE: in_stable,
    S.DEAD: in_dead,
}


def test_the_builders_reach_their_states() -> None:
    for state, build in STATES.items():
        assert build()[0].state == state


# The table: (state, event, the reply's error (None: no reply yet), state after) --------------

M = "<member>"  # replaced by the group's member id
GEN = -99  # replaced by the group's generation


def _fill(value: Any, member: str, generation: int) -> Any:
    return member if value == M else generation if value == GEN else value


TABLE = [
    # JoinGroup
    (S.EMPTY, ("join", ""), None, S.PREPARING_REBALANCE),
    (S.EMPTY, ("join_required", ""), E.MEMBER_ID_REQUIRED, S.EMPTY),
    (S.EMPTY, ("join", "stranger"), E.UNKNOWN_MEMBER_ID, S.EMPTY),
    (S.EMPTY, ("join_no_type", ""), E.INCONSISTENT_GROUP_PROTOCOL, S.EMPTY),
    (S.EMPTY, ("join_short_session", ""), E.INVALID_SESSION_TIMEOUT, S.EMPTY),
    (S.PREPARING_REBALANCE, ("join", ""), None, S.PREPARING_REBALANCE),
    (
        S.PREPARING_REBALANCE,
        ("join_other_type", ""),
        E.INCONSISTENT_GROUP_PROTOCOL,
        S.PREPARING_REBALANCE,
    ),
    (S.COMPLETING_REBALANCE, ("join", M), E.NONE, S.COMPLETING_REBALANCE),
    (S.COMPLETING_REBALANCE, ("join", ""), None, S.PREPARING_REBALANCE),
    (S.STABLE, ("join", ""), None, S.PREPARING_REBALANCE),
    (S.STABLE, ("join", M), E.NONE, S.COMPLETING_REBALANCE),  # the leader rejoins: rebalance
    (S.STABLE, ("join", "stranger"), E.UNKNOWN_MEMBER_ID, S.STABLE),
    (S.STABLE, ("join_other_protocol", ""), E.INCONSISTENT_GROUP_PROTOCOL, S.STABLE),
    (S.STABLE, ("join_other_type", ""), E.INCONSISTENT_GROUP_PROTOCOL, S.STABLE),
    (S.DEAD, ("join", ""), E.COORDINATOR_NOT_AVAILABLE, S.DEAD),
    # SyncGroup
    (S.EMPTY, ("sync", "stranger", 0), E.UNKNOWN_MEMBER_ID, S.EMPTY),
    (S.PREPARING_REBALANCE, ("sync", M, GEN), E.REBALANCE_IN_PROGRESS, S.PREPARING_REBALANCE),
    (S.PREPARING_REBALANCE, ("sync", M, 7), E.ILLEGAL_GENERATION, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, ("sync", M, GEN), E.NONE, S.STABLE),
    (S.COMPLETING_REBALANCE, ("sync", M, 7), E.ILLEGAL_GENERATION, S.COMPLETING_REBALANCE),
    (
        S.COMPLETING_REBALANCE,
        ("sync", "stranger", GEN),
        E.UNKNOWN_MEMBER_ID,
        S.COMPLETING_REBALANCE,
    ),
    (S.STABLE, ("sync", M, GEN), E.NONE, S.STABLE),
    (S.STABLE, ("sync_other_protocol", M, GEN), E.INCONSISTENT_GROUP_PROTOCOL, S.STABLE),
    (S.DEAD, ("sync", "stranger", 0), E.COORDINATOR_NOT_AVAILABLE, S.DEAD),
    # Heartbeat
    (S.EMPTY, ("heartbeat", "stranger", 0), E.UNKNOWN_MEMBER_ID, S.EMPTY),
    (S.PREPARING_REBALANCE, ("heartbeat", M, GEN), E.REBALANCE_IN_PROGRESS, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, ("heartbeat", M, GEN), E.NONE, S.COMPLETING_REBALANCE),
    (S.STABLE, ("heartbeat", M, GEN), E.NONE, S.STABLE),
    (S.STABLE, ("heartbeat", M, 7), E.ILLEGAL_GENERATION, S.STABLE),
    (S.STABLE, ("heartbeat", "stranger", GEN), E.UNKNOWN_MEMBER_ID, S.STABLE),
    (S.DEAD, ("heartbeat", "stranger", 0), E.COORDINATOR_NOT_AVAILABLE, S.DEAD),
    # LeaveGroup (the per-member error)
    (S.EMPTY, ("leave", "stranger"), E.UNKNOWN_MEMBER_ID, S.EMPTY),
    (S.PREPARING_REBALANCE, ("leave", M), E.NONE, S.PREPARING_REBALANCE),  # initial delay runs
    (S.COMPLETING_REBALANCE, ("leave", M), E.NONE, S.EMPTY),
    (S.STABLE, ("leave", M), E.NONE, S.EMPTY),
    (S.STABLE, ("leave", "stranger"), E.UNKNOWN_MEMBER_ID, S.STABLE),
    (S.DEAD, ("leave", "stranger"), E.COORDINATOR_NOT_AVAILABLE, S.DEAD),
    # DeleteGroups
    (S.EMPTY, ("delete",), E.NONE, S.DEAD),
    (S.PREPARING_REBALANCE, ("delete",), E.NON_EMPTY_GROUP, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, ("delete",), E.NON_EMPTY_GROUP, S.COMPLETING_REBALANCE),
    (S.STABLE, ("delete",), E.NON_EMPTY_GROUP, S.STABLE),
    (S.DEAD, ("delete",), E.GROUP_ID_NOT_FOUND, S.DEAD),
    # OffsetCommit's checks
    (S.EMPTY, ("commit", "", -1), E.NONE, S.EMPTY),
    (S.EMPTY, ("commit", "stranger", 3), E.UNKNOWN_MEMBER_ID, S.EMPTY),
    (S.PREPARING_REBALANCE, ("commit", M, GEN), E.NONE, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, ("commit", M, GEN), E.REBALANCE_IN_PROGRESS, S.COMPLETING_REBALANCE),
    (S.STABLE, ("commit", M, GEN), E.NONE, S.STABLE),
    (S.STABLE, ("commit", M, 7), E.ILLEGAL_GENERATION, S.STABLE),
    (S.STABLE, ("commit", "", -1), E.UNKNOWN_MEMBER_ID, S.STABLE),
    (S.DEAD, ("commit", "", -1), E.COORDINATOR_NOT_AVAILABLE, S.DEAD),
]


def _apply(g: Group, now: int, action: tuple[Any, ...]) -> E | None:
    kind, *args = action
    if kind == "delete":
        return g.delete()
    if kind == "commit":
        return g.check_commit(args[0], None, args[1])
    variants: dict[str, Callable[[], Any]] = {
        "join": lambda: g.join(join(args[0]), now),
        "join_required": lambda: g.join(join(args[0], require=True), now),
        "join_no_type": lambda: g.join(join(args[0], protocol_type=""), now),
        "join_other_type": lambda: g.join(join(args[0], protocol_type="connect"), now),
        "join_other_protocol": lambda: g.join(join(args[0], protocols=(("x", b""),)), now),
        "join_short_session": lambda: g.join(join(args[0], session_ms=10), now),
        "sync": lambda: g.sync(sync(args[0], args[1]), now),
        "sync_other_protocol": lambda: g.sync(sync(args[0], args[1], protocol_name="x"), now),
        "heartbeat": lambda: g.heartbeat(heartbeat(args[0], args[1]), now),
        "leave": lambda: g.leave(Leave("g", ((args[0], None),), "leave"), now),
    }
    answered = replies(variants[kind]())
    tag = "hb" if kind == "heartbeat" else kind.split("_")[0]
    if tag not in answered:
        return None
    result = answered[tag]
    if kind == "leave" and result.error == E.NONE:
        return result.members[0][2]
    return result.error


@pytest.mark.parametrize(
    ("state", "action", "error", "after"),
    TABLE,
    ids=[f"{r[0].value}-{'-'.join(map(str, r[1]))}" for r in TABLE],
)
def test_transition(
    state: GroupState, action: tuple[Any, ...], error: E | None, after: GroupState
) -> None:
    g, member, now = STATES[state]()
    action = tuple(_fill(a, member, g.generation_id) for a in action)
    assert _apply(g, now, action) == error
    assert g.state == after


# Scenarios -----------------------------------------------------------------------------------


def test_initial_delay_waits_for_more_members_then_one_rebalance() -> None:
    g = new_group()
    assert replies(g.join(join(client="a"), 0)) == {}
    effects = g.join(join(client="b", tag="b"), 60)  # extends the delay to 160
    assert SetTimer(160) in effects
    assert g.tick(159) == [] and g.state == S.PREPARING_REBALANCE
    answered = replies(g.tick(160))
    assert g.state == S.COMPLETING_REBALANCE and g.generation_id == 1
    leader, follower = answered["join"], answered["b"]
    assert leader.leader_id == "a-1" == leader.member_id
    assert [m.member_id for m in leader.members] == ["a-1", "b-2"]
    assert follower.members == () and follower.protocol_name == "range"


def test_initial_delay_never_passes_the_rebalance_timeout() -> None:
    g = new_group()
    g.join(join(client="a"), 0)
    for t in range(50, REBALANCE_MS + 1000, 50):
        g.join(join(client="x", tag=t), t)
        g.tick(t)
        if g.state != S.PREPARING_REBALANCE:
            break
    assert g.state == S.COMPLETING_REBALANCE
    assert g.state_timestamp_ms <= REBALANCE_MS


def test_member_id_required_then_second_join() -> None:
    g = new_group()
    first = replies(g.join(join(require=True), 0))["join"]
    assert first.error == E.MEMBER_ID_REQUIRED and first.member_id == "c-1"
    assert g.pending_member_ids == ["c-1"]
    g.join(join("c-1"), 10)
    assert g.member_ids == ["c-1"] and g.pending_member_ids == []


def test_pending_member_expires_after_its_session() -> None:
    g = new_group()
    g.join(join(require=True), 0)
    g.tick(SESSION_MS)
    assert g.pending_member_ids == []


def test_session_expiry_removes_a_silent_member() -> None:
    g, member, now = in_stable()
    assert g.deadline_ms() == now + SESSION_MS
    g.heartbeat(heartbeat(member, 1), now + 5000)
    g.tick(now + SESSION_MS)
    assert g.state == S.STABLE  # the heartbeat moved the deadline
    g.tick(now + 5000 + SESSION_MS)
    assert g.state == S.EMPTY and g.member_ids == [] and g.generation_id == 2


def _two_member_stable() -> tuple[Group, int]:
    g = new_group()
    g.join(join(client="a"), 0)
    g.join(join(client="b", tag="b"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("a-1", 1, (("a-1", b"A"), ("b-2", b"B"))), DELAY_MS)
    assert replies(g.sync(sync("b-2", 1), DELAY_MS))["sync"].assignment == b"B"
    return g, DELAY_MS


def test_follower_sync_waits_for_the_leader() -> None:
    g = new_group()
    g.join(join(client="a"), 0)
    g.join(join(client="b", tag="b"), 0)
    g.tick(DELAY_MS)
    assert replies(g.sync(sync("b-2", 1, tag="follower"), DELAY_MS)) == {}
    effects = g.sync(sync("a-1", 1, (("a-1", b"A"), ("b-2", b"B")), tag="leader"), DELAY_MS)
    # Persist before send: the metadata record comes before either answer.
    assert isinstance(effects[0], Persist)
    answered = replies(effects)
    assert answered["follower"].assignment == b"B" and answered["leader"].assignment == b"A"
    assert effects[0].snapshot.generation_id == 1
    assert [m.assignment for m in effects[0].snapshot.members] == [b"A", b"B"]


def test_unload_answers_waiting_joins_and_syncs_not_coordinator() -> None:
    g = new_group()
    g.join(join(client="a", tag="a-join"), 0)  # waits out the initial delay
    effects = g.unload()
    assert replies(effects) == {"a-join": replies(effects)["a-join"]}
    assert replies(effects)["a-join"].error == E.NOT_COORDINATOR
    assert g.state == S.DEAD and SetTimer(None) in effects
    assert replies(g.unload()) == {}  # answered once

    g = new_group()
    g.join(join(client="a"), 0)
    g.join(join(client="b", tag="b"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("b-2", 1, tag="follower"), DELAY_MS)  # waits for the leader's
    answered = replies(g.unload())
    assert answered["follower"].error == E.NOT_COORDINATOR and len(answered) == 1


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    g, now = _two_member_stable()
    g.join(join("b-2", tag="b"), now)  # b's protocols changed? no: a follower's rejoin
    assert g.state == S.STABLE  # same protocols, a follower: answered from this generation
    g.join(join("a-1", tag="a"), now)  # the leader rejoins: a rebalance
    assert g.state == S.PREPARING_REBALANCE
    assert heartbeat_error(g, "b-2", 1, now) == E.REBALANCE_IN_PROGRESS
    answered = replies(g.tick(now + REBALANCE_MS))
    assert answered["a"].error == E.NONE and answered["a"].generation_id == 2
    assert g.member_ids == ["a-1"]


def heartbeat_error(g: Group, member: str, generation: int, now: int) -> E:
    result: E = replies(g.heartbeat(heartbeat(member, generation), now))["hb"].error
    return result


def test_a_member_leaving_a_stable_group_makes_the_others_rejoin() -> None:
    g, now = _two_member_stable()
    left = replies(g.leave(Leave("g", (("b-2", None),), "leave"), now))["leave"]
    assert left.members == (("b-2", None, E.NONE),)
    assert g.state == S.PREPARING_REBALANCE
    answered = replies(g.join(join("a-1"), now))  # everyone left has rejoined: complete
    assert answered["join"].generation_id == 2 and g.state == S.COMPLETING_REBALANCE


def test_sync_in_completing_is_cancelled_by_a_new_rebalance() -> None:
    g = new_group()
    g.join(join(client="a"), 0)
    g.join(join(client="b", tag="b"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("b-2", 1, tag="waiting"), DELAY_MS)
    answered = replies(g.join(join(client="c", tag="c"), DELAY_MS))
    assert answered["waiting"].error == E.REBALANCE_IN_PROGRESS


def test_protocol_with_most_votes_among_those_all_support() -> None:
    g = new_group()
    g.join(join(client="a", protocols=(("range", b""), ("sticky", b""))), 0)
    g.join(join(client="b", protocols=(("sticky", b""), ("range", b""))), 0)
    g.join(join(client="c", protocols=(("roundrobin", b""), ("sticky", b""), ("range", b""))), 0)
    g.tick(DELAY_MS)
    assert g.protocol_name == "sticky"  # roundrobin is not shared; sticky has 2 votes


def test_static_member_rejoins_stable_group_without_rebalance() -> None:
    g = new_group()
    g.join(join(client="a", instance="ia"), 0)
    g.join(join(client="b", instance="ib", tag="b"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("a-1", 1, (("a-1", b"A"), ("b-2", b"B")), instance="ia"), DELAY_MS)
    effects = g.join(join(client="b", instance="ib", tag="again"), 500)
    assert isinstance(effects[0], Persist)  # the new member id is stored first
    again = replies(effects)["again"]
    assert again.error == E.NONE and again.generation_id == 1 and again.member_id == "b-3"
    assert g.state == S.STABLE
    assert replies(g.sync(sync("b-3", 1, instance="ib"), 500))["sync"].assignment == b"B"
    # The old member id is fenced.
    assert heartbeat_error(g, "b-2", 1, 500) == E.UNKNOWN_MEMBER_ID
    fenced = replies(g.heartbeat(heartbeat("b-2", 1, instance="ib"), 500))["hb"]
    assert fenced.error == E.FENCED_INSTANCE_ID
    assert g.check_commit("b-2", "ib", 1) == E.FENCED_INSTANCE_ID


def test_static_leader_rejoining_is_told_to_skip_assignment() -> None:
    g = new_group()
    g.join(join(client="a", instance="ia"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("a-1", 1, (("a-1", b"A"),), instance="ia"), DELAY_MS)
    again = replies(g.join(join(client="a", instance="ia"), 500))["join"]
    assert again.skip_assignment and again.leader_id == again.member_id == "a-2"
    assert g.state == S.STABLE


def test_static_member_with_new_protocols_triggers_a_rebalance() -> None:
    g = new_group()
    g.join(join(client="a", instance="ia"), 0)
    g.tick(DELAY_MS)
    g.sync(sync("a-1", 1, (("a-1", b"A"),), instance="ia"), DELAY_MS)
    g.join(join(client="a", instance="ia", protocols=(("range", b"other"),)), 500)
    assert g.state == S.COMPLETING_REBALANCE and g.generation_id == 2


def test_static_member_leaves_by_instance_id() -> None:
    g = new_group()
    g.join(join(client="a", instance="ia"), 0)
    g.tick(DELAY_MS)
    left = replies(g.leave(Leave("g", (("", "ia"),), "leave"), DELAY_MS))["leave"]
    assert left.members == (("", "ia", E.NONE),)  # as asked: the Java admin matches on it
    assert g.state == S.EMPTY
    fenced = replies(g.leave(Leave("g", (("wrong", "ia"),), "leave"), DELAY_MS))["leave"]
    assert fenced.members[0][2] == E.UNKNOWN_MEMBER_ID  # the instance is gone now


def test_restore_brings_back_a_stable_generation() -> None:
    g, now = _two_member_stable()
    snapshot = g.snapshot(now)
    back = new_group()
    back.restore(snapshot, 1000)
    assert back.state == S.STABLE and back.generation_id == 1 and back.leader_id == "a-1"
    assert back.assignment_of("b-2") == b"B"
    assert heartbeat_error(back, "b-2", 1, 1000) == E.NONE
    assert decode_group_value(encode_group_value(snapshot)) == snapshot


# Record layouts --------------------------------------------------------------------------------


def test_offset_records_round_trip_in_kafkas_layout() -> None:
    key = encode_offset_key("grp", "topic", 7)
    assert key == b"\x00\x01\x00\x03grp\x00\x05topic\x00\x00\x00\x07"
    assert decode_key(key) == OffsetKey("grp", "topic", 7)
    value = OffsetValue(42, 3, "meta", 1_700_000_000_000)
    data = encode_offset_value(value)
    assert data[:2] == b"\x00\x03" and len(data) == 2 + 8 + 4 + 2 + 4 + 8
    assert decode_offset_value(data) == value
    assert decode_key(encode_group_key("grp")) == GroupKey("grp")
    # Version 1 values (with an expire timestamp) read too: epoch unknown.
    v1 = b"\x00\x01" + (42).to_bytes(8, "big") + b"\x00\x00" + (5).to_bytes(8, "big") * 2
    assert decode_offset_value(v1) == OffsetValue(42, -1, "", 5)


def test_java_string_hash_and_partition_for() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert offsets_partition("polygenelubricants", 50) == 0
    assert all(0 <= offsets_partition(f"g{i}", 50) < 50 for i in range(100))
