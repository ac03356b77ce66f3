"""The cluster state machine (actors/cluster/state.py), its commands' encoding, and the
leadership table: every command applied valid, stale and invalid; logs replayed on fresh
states and from snapshots give the same state byte for byte."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import controller
from actors.cluster import limits, topic_names
from actors.cluster.commands import (
    FORMAT,
    AllocateProducerIdBlock,
    AlterTopicConfigs,
    Command,
    CommandError,
    CompleteMove,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    Move,
    MovePartitions,
    NodeInfo,
    RegisterNode,
    decode,
    decode_snapshot,
    encode,
)
from actors.cluster.leaders import LeaderTable, LeaderUpdate
from actors.cluster.state import FIRST_PRODUCER_ID, Applied, ClusterState, PlacedTopic
from actors.group import OFFSETS_TOPIC, offsets_partition
from actors.limits import producer_id_block_size
from actors.services import TopicInfo, TopicTable
from actors.topic_config import OP_APPEND, OP_DELETE, OP_SET, Operation
from wire.errors import ErrorCode

E = ErrorCode


def node(n: int, shards: int = 2, partitions_max: int = 1000, host: str = "") -> RegisterNode:
    return RegisterNode(NodeInfo(n, host or f"h{n}", 9092, host or f"h{n}", 33145, shards,
                                 partitions_max))


def tid(i: int) -> bytes:
    return bytes([i]) * 16


def create(name: str, i: int, *replicas: tuple[tuple[int, int], ...],
           configs: dict[str, str] | None = None) -> CreateTopic:
    return CreateTopic(name, tid(i), tuple(replicas), configs or {})


class Log:
    """A state and the offset of the next record: what a node applying its log holds."""

    def __init__(self, state: ClusterState | None = None) -> None:
        self.state = state or ClusterState()
        self.offset = self.state.version

    def apply(self, command: Command) -> Applied:
        result = self.state.apply(command, self.offset)
        self.offset += 1
        return result

    def ok(self, command: Command) -> Applied:
        result = self.apply(command)
        assert result.error == E.NONE, result
        return result


@pytest.fixture
def log() -> Log:
    log = Log()
    for n in (1, 2, 3):
        log.ok(node(n))
    return log


R12 = ((1, 0), (2, 0))
R23 = ((2, 1), (3, 0))


# Nodes -------------------------------------------------------------------------------------


def test_register_node_and_come_back_with_new_addresses(log: Log) -> None:
    assert sorted(log.state.view().nodes) == [1, 2, 3]
    log.ok(node(2, host="new-host"))
    assert log.state.view().nodes[2].host == "new-host"
    assert len(log.state.view().nodes) == 3


@pytest.mark.parametrize("info", [
    NodeInfo(-1, "h", 9092, "h", 33145, 1, 10),
    NodeInfo(1, "", 9092, "h", 33145, 1, 10),
    NodeInfo(1, "h", 0, "h", 33145, 1, 10),
    NodeInfo(1, "h", 9092, "h", 65535, 2, 10),  # shard 1 would listen on 65536
    NodeInfo(1, "h", 9092, "h", 33145, 0, 10),
    NodeInfo(1, "h", 9092, "h", 33145, limits.shards_per_node_max + 1, 10),
    NodeInfo(1, "h", 9092, "h", 33145, 1, -1),
    NodeInfo(1, "h", 9092, "h", 33145, 1, 10, None, "h"),  # a reader address with no port
    NodeInfo(1, "h", 9092, "h", 33145, 1, 10, None, "h:70000"),
])
def test_register_node_refuses_nonsense(info: NodeInfo) -> None:
    log = Log()
    assert log.apply(RegisterNode(info)).error == E.INVALID_REQUEST
    assert log.state.view().nodes == {}
    assert log.state.version == 1  # a failed command is still a record applied


def test_a_node_cannot_come_back_without_the_shards_its_replicas_are_on(log: Log) -> None:
    log.ok(create("t", 1, ((1, 1), (2, 0))))
    refused = log.apply(node(1, shards=1))
    assert refused.error == E.INVALID_REQUEST and "shard 1" in (refused.message or "")
    log.ok(node(3, shards=1))  # node 3 hosts nothing: it may shrink
    log.ok(node(1, shards=4))


def test_nodes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "nodes_max", 2)
    log = Log()
    log.ok(node(1))
    log.ok(node(2))
    assert log.apply(node(3)).error == E.INVALID_REQUEST
    log.ok(node(2, host="again"))  # a known node may always come back


# Producer ids ------------------------------------------------------------------------------


def test_producer_id_blocks_are_handed_out_once_each(log: Log) -> None:
    blocks = [log.ok(AllocateProducerIdBlock(n)).block for n in (1, 2, 1, 3)]
    assert [b.node for b in blocks if b] == [1, 2, 1, 3]
    starts = [b.start for b in blocks if b]
    assert starts == [FIRST_PRODUCER_ID + i * producer_id_block_size for i in range(4)]
    assert log.state.next_producer_id == starts[-1] + producer_id_block_size


def test_producer_id_block_for_an_unknown_node_or_when_exhausted(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert log.apply(AllocateProducerIdBlock(9)).error == E.BROKER_NOT_AVAILABLE
    monkeypatch.setattr(limits, "producer_id_max", FIRST_PRODUCER_ID + producer_id_block_size)
    log.ok(AllocateProducerIdBlock(1))
    assert log.apply(AllocateProducerIdBlock(1)).error == E.UNKNOWN_SERVER_ERROR


# Creating topics ---------------------------------------------------------------------------


def test_create_topic_gives_a_topic_table_shards_can_take(log: Log) -> None:
    result = log.ok(create("orders", 1, R12, R23, configs={"retention.ms": "1000"}))
    table = log.state.view().table
    info = table.topics["orders"]
    assert isinstance(table, TopicTable) and isinstance(info, TopicInfo)
    assert isinstance(info, PlacedTopic) and info == result.topic
    assert (info.partitions, info.replicas, info.replication_factor) == (2, (R12, R23), 2)
    assert info.configs == {"retention.ms": "1000"} and not info.internal
    assert table.by_id(tid(1)) is info
    assert table.version == log.state.version == log.offset
    assert log.state.view().replicas("orders", 1) == R23
    assert log.state.view().replicas("orders", 2) is None


def test_internal_follows_the_name(log: Log) -> None:
    log.ok(create(OFFSETS_TOPIC, 1, R12))
    log.ok(create("__mine", 2, R12))
    topics = log.state.view().table.topics
    assert topics[OFFSETS_TOPIC].internal and not topics["__mine"].internal


def test_a_topic_created_twice_concurrently_fails_the_second_time(log: Log) -> None:
    first, second = create("t", 1, R12), create("t", 2, R23)
    assert log.state.check(first).error == log.state.check(second).error == E.NONE
    log.ok(first)
    before = log.state.to_snapshot()
    assert log.apply(second).error == E.TOPIC_ALREADY_EXISTS
    assert log.state.view().table.topics["t"].topic_id == tid(1)
    assert decode_snapshot(log.state.to_snapshot())[1:] == decode_snapshot(before)[1:]


@pytest.mark.parametrize("command, error", [
    (create("a/b", 1, R12), E.INVALID_TOPIC_EXCEPTION),
    (create("", 1, R12), E.INVALID_TOPIC_EXCEPTION),
    (CreateTopic("t", bytes(16), (R12,), {}), E.INVALID_REQUEST),
    (CreateTopic("t", b"short", (R12,), {}), E.INVALID_REQUEST),
    (create("t", 1), E.INVALID_PARTITIONS),
    (create("t", 1, ((1, 0), (9, 0))), E.INVALID_REPLICA_ASSIGNMENT),  # unknown node
    (create("t", 1, ((1, 2),)), E.INVALID_REPLICA_ASSIGNMENT),  # node 1 has shards 0, 1
    (create("t", 1, ((1, -1),)), E.INVALID_REPLICA_ASSIGNMENT),
    (create("t", 1, ((1, 0), (1, 1))), E.INVALID_REPLICA_ASSIGNMENT),  # a node twice
    (create("t", 1, R12, ((3, 0),)), E.INVALID_REPLICA_ASSIGNMENT),  # two factors
    (create("t", 1, ()), E.INVALID_REPLICA_ASSIGNMENT),  # no replicas
    (create("t", 1, R12, configs={"retention.ms": "soon"}), E.INVALID_CONFIG),
    (create("t", 1, R12, configs={"no.such.key": "1"}), E.INVALID_CONFIG),
])
def test_create_topic_refuses(log: Log, command: CreateTopic, error: ErrorCode) -> None:
    before = log.state.to_snapshot()
    assert log.state.check(command).error == error
    assert log.apply(command).error == error
    assert log.state.view().table.topics == {}
    assert decode_snapshot(log.state.to_snapshot())[1:] == decode_snapshot(before)[1:]


def test_create_topic_refuses_an_id_in_use(log: Log) -> None:
    log.ok(create("a", 1, R12))
    result = log.apply(create("b", 1, R12))
    assert result.error == E.TOPIC_ALREADY_EXISTS and "'a'" in (result.message or "")


def test_each_node_hosts_at_most_its_partitions_max(log: Log) -> None:
    log.ok(node(4, partitions_max=3))
    log.ok(create("a", 1, ((4, 0), (1, 0)), ((4, 1), (2, 0))))
    refused = log.apply(create("b", 2, ((1, 0), (4, 0)), ((4, 0), (2, 0))))
    assert refused.error == E.INVALID_PARTITIONS and "node 4 hosts 2" in (refused.message or "")
    log.ok(create("b", 2, ((4, 0), (1, 0))))
    log.ok(DeleteTopic("a", tid(1)))  # room again
    log.ok(create("c", 3, ((4, 0), (3, 0)), ((4, 1), (2, 0))))


# Deleting topics ---------------------------------------------------------------------------


def test_delete_topic(log: Log) -> None:
    log.ok(create("t", 1, R12))
    deleted = log.ok(DeleteTopic("t", tid(1)))
    assert deleted.topic is not None and deleted.topic.name == "t"
    assert log.state.view().table.topics == {}
    assert log.apply(DeleteTopic("t", tid(1))).error == E.UNKNOWN_TOPIC_OR_PARTITION
    log.ok(create("u", 1, R12))  # its id is free again


def test_a_stale_delete_does_not_remove_the_topic_created_again(log: Log) -> None:
    log.ok(create("t", 1, R12))
    stale = DeleteTopic("t", tid(1))
    log.ok(DeleteTopic("t", tid(1)))
    log.ok(create("t", 2, R23))
    assert log.apply(stale).error == E.UNKNOWN_TOPIC_ID
    assert log.state.view().table.topics["t"].topic_id == tid(2)


# Creating partitions -----------------------------------------------------------------------


def test_create_partitions(log: Log) -> None:
    log.ok(create("t", 1, R12))
    grown = log.ok(CreatePartitions("t", tid(1), 3, (R23, ((3, 1), (1, 1)))))
    assert grown.topic is not None and grown.topic.partitions == 3
    info = log.state.view().table.topics["t"]
    assert isinstance(info, PlacedTopic) and info.replicas == (R12, R23, ((3, 1), (1, 1)))


def test_two_concurrent_grows_to_the_same_count_apply_once(log: Log) -> None:
    log.ok(create("t", 1, R12))
    first = CreatePartitions("t", tid(1), 2, (R23,))
    second = CreatePartitions("t", tid(1), 2, (((3, 0), (1, 0)),))
    log.ok(first)
    assert log.apply(second).error == E.INVALID_PARTITIONS
    assert log.state.view().table.topics["t"].partitions == 2


@pytest.mark.parametrize("command, error", [
    (CreatePartitions("nope", tid(1), 2, (R23,)), E.UNKNOWN_TOPIC_OR_PARTITION),
    (CreatePartitions("t", tid(9), 2, (R23,)), E.UNKNOWN_TOPIC_ID),
    (CreatePartitions("t", tid(1), 1, ()), E.INVALID_PARTITIONS),  # not more
    (CreatePartitions("t", tid(1), 3, (R23,)), E.INVALID_PARTITIONS),  # 1 + 1 is not 3
    (CreatePartitions("t", tid(1), 2, (((3, 0),),)), E.INVALID_REPLICA_ASSIGNMENT),  # RF 1
    (CreatePartitions("t", tid(1), 2, (((3, 0), (7, 0)),)), E.INVALID_REPLICA_ASSIGNMENT),
])
def test_create_partitions_refuses(log: Log, command: CreatePartitions, error: ErrorCode) -> None:
    log.ok(create("t", 1, R12))
    assert log.apply(command).error == error
    assert log.state.view().table.topics["t"].partitions == 1


def test_create_partitions_over_a_nodes_room(log: Log) -> None:
    log.ok(node(4, partitions_max=1))
    log.ok(create("t", 1, ((4, 0), (1, 0))))
    assert log.apply(CreatePartitions("t", tid(1), 2, (((4, 1), (2, 0)),))).error == (
        E.INVALID_PARTITIONS)


# Altering configs --------------------------------------------------------------------------


def test_alter_configs_incrementally_and_by_replacing(log: Log) -> None:
    log.ok(create("t", 1, R12, configs={"retention.ms": "1000"}))
    log.ok(AlterTopicConfigs("t", (Operation("cleanup.policy", OP_APPEND, "compact"),), False))
    assert log.state.view().table.topics["t"].configs == {
        "retention.ms": "1000", "cleanup.policy": "delete,compact"}
    log.ok(AlterTopicConfigs("t", (Operation("segment.ms", OP_SET, "5000"),), True))
    assert log.state.view().table.topics["t"].configs == {"segment.ms": "5000"}


def test_two_alterations_from_the_same_configs_both_take_effect(log: Log) -> None:
    log.ok(create("t", 1, R12))
    a = AlterTopicConfigs("t", (Operation("retention.ms", OP_SET, "1"),), False)
    b = AlterTopicConfigs("t", (Operation("segment.ms", OP_SET, "2"),), False)
    assert log.state.check(a).error == log.state.check(b).error == E.NONE
    log.ok(a)
    log.ok(b)
    assert log.state.view().table.topics["t"].configs == {"retention.ms": "1", "segment.ms": "2"}


@pytest.mark.parametrize("name, operations, error", [
    ("nope", (Operation("retention.ms", OP_SET, "1"),), E.UNKNOWN_TOPIC_OR_PARTITION),
    ("t", (Operation("retention.ms", OP_SET, "x"),), E.INVALID_CONFIG),
    ("t", (Operation("retention.ms", 9, "1"),), E.INVALID_REQUEST),
    ("t", (Operation("retention.ms", OP_SET, None),), E.INVALID_REQUEST),
    (OFFSETS_TOPIC, (Operation("cleanup.policy", OP_DELETE, None),), E.INVALID_CONFIG),
])
def test_alter_configs_refuses(
    log: Log, name: str, operations: tuple[Operation, ...], error: ErrorCode
) -> None:
    log.ok(create("t", 1, R12))
    log.ok(create(OFFSETS_TOPIC, 2, R12, configs={"cleanup.policy": "compact"}))
    assert log.apply(AlterTopicConfigs(name, operations, False)).error == error
    assert log.state.view().table.topics["t"].configs == {}
    assert log.state.view().table.topics[OFFSETS_TOPIC].configs == {"cleanup.policy": "compact"}


def test_write_caching_is_refused_on_a_replicated_topic_not_built(log: Log) -> None:
    # Redpanda's meaning (acks=all once a majority holds the batch in memory) is not built:
    # followers acknowledge what they fdatasync'd. Refused, not taken and ignored.
    caching = {"write.caching": "true"}
    refused = log.apply(create("r", 1, R12, configs=caching))
    assert refused.error == E.INVALID_CONFIG and "write.caching" in refused.message
    log.ok(create("one", 2, ((1, 0),), configs=caching))  # one replica: the local meaning
    log.ok(create("r", 3, R12, configs={"write.caching": "false"}))
    turn_on = AlterTopicConfigs("r", (Operation("write.caching", OP_SET, "true"),), False)
    assert log.apply(turn_on).error == E.INVALID_CONFIG
    assert log.state.view().table.topics["r"].configs == {"write.caching": "false"}


# Versions and views ------------------------------------------------------------------------


def test_version_is_the_end_offset_of_what_is_applied() -> None:
    state = ClusterState()
    assert state.version == 0
    state.apply(node(1), 0)
    state.skip(1)  # the leader's no-op
    state.apply(node(2), 5)  # offsets may jump (a batch of several records, compaction)
    assert state.version == state.view().version == state.view().table.version == 6
    with pytest.raises(AssertionError):
        state.apply(node(3), 5)


def test_check_changes_nothing(log: Log) -> None:
    version, view = log.state.version, log.state.view()
    assert log.state.check(create("t", 1, R12)).error == E.NONE
    assert log.state.check(AllocateProducerIdBlock(1)).block is not None
    assert log.state.version == version and log.state.view() is view
    assert log.state.next_producer_id == FIRST_PRODUCER_ID


def test_a_view_is_cached_and_never_changes(log: Log) -> None:
    view = log.state.view()
    assert log.state.view() is view
    log.ok(create("t", 1, R12))
    assert view.table.topics == {} and "t" in log.state.view().table.topics
    log.ok(node(4))
    assert 4 not in view.nodes


def test_view_helpers_for_placement(log: Log) -> None:
    log.ok(node(4, partitions_max=5))
    log.ok(create("t", 1, ((4, 0), (1, 0)), ((4, 1), (2, 0))))
    view = log.state.view()
    assert sorted(view.assignments()) == sorted([((4, 0), (1, 0)), ((4, 1), (2, 0))])
    assert view.shard_counts() == {1: 2, 2: 2, 3: 2, 4: 2}
    assert view.room() == {1: 999, 2: 999, 3: 1000, 4: 3}


def test_shared_checks_moved_out_of_the_controller_stay_importable_from_it() -> None:
    assert controller.check_topic_name is topic_names.check_topic_name
    assert controller.INTERNAL_TOPICS is topic_names.INTERNAL_TOPICS
    assert controller.TRANSACTION_STATE_TOPIC == "__transaction_state"


# Partition moves ---------------------------------------------------------------------------

R123 = ((1, 0), (2, 0), (3, 0))


def test_a_move_keeps_every_replica_until_it_completes(log: Log) -> None:
    log.ok(node(4))
    log.ok(create("t", 1, R123, R123))
    moved = log.ok(MovePartitions("t", tid(1), ((0, ((4, 1), (2, 0), (3, 0))),))).topic
    assert moved is not None
    # The target's replicas first (4 is the preferred leader), then those leaving.
    assert moved.replicas[0] == ((4, 1), (2, 0), (3, 0), (1, 0))
    assert moved.moves == {0: Move(R123, ((4, 1), (2, 0), (3, 0)))}
    assert moved.voters(0) == R123 and moved.voters(1) == R123
    assert moved.replication_factor == 3
    # Redirected: the origin stays, and every node that may be a member stays a replica.
    redirected = log.ok(MovePartitions("t", tid(1), ((0, ((4, 1), (3, 0))),))).topic
    assert redirected is not None
    assert redirected.moves[0] == Move(R123, ((4, 1), (3, 0)))
    assert redirected.replicas[0] == ((4, 1), (3, 0), (2, 0), (1, 0))
    # A completion of the earlier target is stale.
    stale = log.apply(CompleteMove("t", tid(1), 0, ((4, 1), (2, 0), (3, 0))))
    assert stale.error == E.NO_REASSIGNMENT_IN_PROGRESS
    done = log.ok(CompleteMove("t", tid(1), 0, ((4, 1), (3, 0)))).topic
    assert done is not None and done.replicas[0] == ((4, 1), (3, 0)) and not done.moves
    assert log.state.view().room()[1] == 1000 - 1  # node 1 keeps partition 1 only


def test_a_cancelled_move_goes_back_to_where_it_began(log: Log) -> None:
    log.ok(node(4))
    log.ok(create("t", 1, R123))
    log.ok(MovePartitions("t", tid(1), ((0, ((4, 0), (2, 0), (3, 0))),)))
    back = log.ok(MovePartitions("t", tid(1), ((0, None),))).topic
    assert back is not None
    assert back.moves == {0: Move(R123, R123)}
    assert back.replicas[0] == ((1, 0), (2, 0), (3, 0), (4, 0))
    done = log.ok(CompleteMove("t", tid(1), 0, R123)).topic
    assert done is not None and done.replicas == (R123,) and not done.moves
    # Nothing to cancel now; a move to where it is is nothing to do.
    assert log.apply(MovePartitions("t", tid(1), ((0, None),))).error == \
        E.NO_REASSIGNMENT_IN_PROGRESS
    same = log.ok(MovePartitions("t", tid(1), ((0, R123),))).topic
    assert same is not None and not same.moves


@pytest.mark.parametrize(("moves", "error"), [
    (((1, R123),), E.UNKNOWN_TOPIC_OR_PARTITION),
    (((0, ((1, 0), (9, 0))),), E.INVALID_REPLICA_ASSIGNMENT),  # node 9 is unknown
    (((0, ((1, 0), (1, 0))),), E.INVALID_REPLICA_ASSIGNMENT),  # a node twice
    (((0, ((1, 0), (2, 5))),), E.INVALID_REPLICA_ASSIGNMENT),  # node 2 has no shard 5
    (((0, ((1, 1), (2, 0))),), E.INVALID_REPLICA_ASSIGNMENT),  # node 1 keeps shard 0
    (((0, ((1, 0),)),), E.INVALID_REPLICA_ASSIGNMENT),  # to one replica: not built
])
def test_moves_refuse(log: Log, moves: Any, error: ErrorCode) -> None:
    log.ok(create("t", 1, R123))
    assert log.apply(MovePartitions("t", tid(1), moves)).error == error
    assert log.apply(MovePartitions("t", tid(2), ((0, R123),))).error == E.UNKNOWN_TOPIC_ID


def test_a_move_over_a_nodes_room_is_refused(log: Log) -> None:
    log.ok(node(4, partitions_max=0))
    log.ok(create("t", 1, R123))
    refused = log.apply(MovePartitions("t", tid(1), ((0, ((4, 0), (2, 0), (3, 0))),)))
    assert refused.error == E.INVALID_PARTITIONS


# Encoding ----------------------------------------------------------------------------------


EXAMPLES: list[Command] = [
    node(1),
    RegisterNode(NodeInfo(7, "b7.example", 19092, "10.0.0.7", 40000, 16, 32000, "rack-a")),
    RegisterNode(NodeInfo(8, "b8", 19092, "b8", 40000, 1, 10, None, "[::1]:9093")),
    create("orders", 1, R12, R23, configs={"retention.ms": "1000", "cleanup.policy": "compact"}),
    DeleteTopic("orders", tid(1)),
    CreatePartitions("orders", tid(1), 4, (R12, R23)),
    AlterTopicConfigs("orders", (Operation("a", OP_SET, "1"), Operation("b", OP_DELETE, None)),
                      True),
    AllocateProducerIdBlock(3),
    MovePartitions("orders", tid(1), ((0, R23), (1, None))),
    CompleteMove("orders", tid(1), 0, R23),
]


@pytest.mark.parametrize("command", EXAMPLES, ids=lambda c: type(c).__name__)
def test_commands_round_trip(command: Command) -> None:
    data = encode(command)
    assert decode(data) == command
    assert decode(memoryview(data)) == command
    assert msgpack.unpackb(data)[0] == FORMAT  # the format comes first


def test_the_encoding_is_the_documented_array() -> None:
    assert msgpack.unpackb(encode(DeleteTopic("orders", tid(1)))) == [3, 3, "orders", tid(1)]
    assert msgpack.unpackb(encode(create("t", 1, R12))) == [3, 2, "t", tid(1), [[1, 0, 2, 0]], {}]
    assert msgpack.unpackb(encode(node(1))) == [
        3, 1, 1, "h1", 9092, "h1", 33145, 2, 1000, None, None]
    assert msgpack.unpackb(encode(MovePartitions("t", tid(1), ((0, R23), (1, None))))) == [
        3, 7, "t", tid(1), [[0, [2, 1, 3, 0]], [1, None]]]


def test_format_1_still_decodes() -> None:
    # Written before format 2 gave a node its reader address: every command of format 1 still
    # reads, a node with no reader address.
    old_node = _pack([1, 1, 1, "h1", 9092, "h1", 33145, 2, 1000, "r"])
    assert decode(old_node) == RegisterNode(NodeInfo(1, "h1", 9092, "h1", 33145, 2, 1000, "r"))
    assert decode(_pack([1, 3, "orders", tid(1)])) == DeleteTopic("orders", tid(1))
    snapshot = _pack([1, 5, 7, [[1, "h1", 9092, "h1", 33145, 2, 1000, None]], []])
    assert decode_snapshot(snapshot).nodes == (NodeInfo(1, "h1", 9092, "h1", 33145, 2, 1000),)
    with pytest.raises(CommandError):  # format 1 has no reader address field
        decode(_pack([1, 1, 1, "h1", 9092, "h1", 33145, 2, 1000, None, "h1:9093"]))
    with pytest.raises(CommandError):  # format 2 has one
        decode(_pack([2, 1, 1, "h1", 9092, "h1", 33145, 2, 1000, None]))


def _pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",  # never used in msgpack
    encode(AllocateProducerIdBlock(1)) + b"\x00",  # trailing bytes
    encode(AllocateProducerIdBlock(1))[:-1],  # truncated
    _pack({"not": "an array"}),
    _pack([1]),
    _pack([FORMAT + 1, 6, 1]),  # a newer format
    _pack([0, 6, 1]),
    _pack([1, 99, 1]),  # an unknown command
    _pack([1, 6]),  # a field missing
    _pack([1, 6, 1, 2]),  # a field too many
    _pack([1, 6, True]),  # a boolean is no node id
    _pack([1, 6, "1"]),
    _pack([1, 2, "t", "not bytes", [], {}]),
    _pack([1, 2, "t", tid(1), [[1, 0, 2]], {}]),  # half a replica
    _pack([1, 2, "t", tid(1), [[1, 0] * (limits.replication_factor_max + 1)], {}]),
    _pack([1, 2, "t", tid(1), [], {"k": 1}]),
    _pack([1, 5, "t", [["k", 0]], False]),
    _pack([1, 5, "t", [], "no"]),
])
def test_decode_refuses_with_one_error_type(data: bytes) -> None:
    with pytest.raises(CommandError):
        decode(data)


def test_decode_refuses_a_command_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(create("t", 1, R12))
    monkeypatch.setattr(limits, "command_bytes_max", len(data) - 1)
    with pytest.raises(CommandError, match="over the limit"):
        decode(data)


# Random logs: determinism and snapshots ----------------------------------------------------

NAMES = ["a", "b", OFFSETS_TOPIC]
NODES = [1, 2, 3, 4]
OPERATIONS = [
    Operation("retention.ms", OP_SET, "7"), Operation("cleanup.policy", OP_DELETE, None),
    Operation("cleanup.policy", OP_APPEND, "compact"), Operation("segment.ms", OP_SET, "0"),
]
CONFIGS: list[dict[str, str]] = [
    {}, {"retention.ms": "5"}, {"cleanup.policy": "compact"}, {"retention.ms": "bad"},
]


def _replicas(rng: random.Random, factor: int) -> tuple[tuple[int, int], ...]:
    """Mostly good replicas; some on shard 2 (nodes have 1 to 3) or with a node twice."""
    nodes = rng.sample(NODES, factor)
    if rng.random() < 0.05:
        nodes[-1] = nodes[0]
    return tuple((n, 2 if rng.random() < 0.05 else rng.randint(0, 1)) for n in nodes)


def random_command(rng: random.Random) -> Command:
    """A command over a small world (3 names, 2 ids each, 4 nodes), so that logs collide:
    topics created twice, deleted or grown under a stale id, grown past their nodes' room."""
    kind = rng.choice([0, 1, 1, 1, 2, 3, 3, 4, 5, 6, 6, 7])
    name = rng.choice(NAMES)
    topic_id = tid(2 * NAMES.index(name) + rng.randint(1, 2))
    if kind == 0:
        return node(rng.choice(NODES), shards=rng.randint(1, 3), partitions_max=rng.randint(0, 12))
    if kind == 1:
        factor = rng.randint(1, 2)
        replicas = tuple(_replicas(rng, factor) for _ in range(rng.randint(1, 2)))
        return CreateTopic(name, topic_id, replicas, rng.choice(CONFIGS))
    if kind == 2:
        return DeleteTopic(name, topic_id)
    if kind == 3:
        factor = rng.randint(1, 2)
        more = tuple(_replicas(rng, factor) for _ in range(rng.randint(0, 2)))
        return CreatePartitions(name, topic_id, rng.randint(1, 2) + max(1, len(more)), more)
    if kind == 4:
        return AlterTopicConfigs(name, (rng.choice(OPERATIONS),), rng.random() < 0.3)
    if kind == 6:  # (shard 0: a node kept must keep its shard, and most have 0)
        target = None if rng.random() < 0.2 else tuple(
            (n, 0) for n in rng.sample(NODES, rng.randint(2, 3)))
        return MovePartitions(name, topic_id, ((rng.randint(0, 2), target),))
    if kind == 7:
        return CompleteMove(name, topic_id, rng.randint(0, 2), _replicas(rng, rng.randint(2, 3)))
    return AllocateProducerIdBlock(rng.choice(NODES))


commands = st.builds(random_command, st.randoms(use_true_random=False))


def replay(log: list[Command], state: ClusterState | None = None,
           first: int = 0) -> tuple[ClusterState, list[ErrorCode]]:
    state = state or ClusterState()
    errors = [state.apply(c, offset).error for offset, c in enumerate(log) if offset >= first]
    return state, errors


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands, max_size=40), st.data())
def test_snapshot_then_the_rest_equals_the_whole_log(log: list[Command], data: Any) -> None:
    whole, errors = replay(log)
    again, errors_again = replay(log)
    assert whole.to_snapshot() == again.to_snapshot() and errors == errors_again
    cut = data.draw(st.integers(0, len(log)))
    head, head_errors = replay(log[:cut])
    restored = ClusterState.from_snapshot(head.to_snapshot())
    assert restored.to_snapshot() == head.to_snapshot()
    assert restored.version == head.version == cut
    _, tail_errors = replay(log, restored, cut)
    assert head_errors + tail_errors == errors
    assert restored.to_snapshot() == whole.to_snapshot()
    assert restored.view().table.topics == whole.view().table.topics
    assert restored.view().nodes == whole.view().nodes


def test_random_logs_apply_many_commands_and_refuse_many() -> None:
    """The generator above is not a string of refusals: a seeded log of it applies every kind
    of command but CompleteMove (its random targets never match a move; its own tests above)
    and refuses them for many reasons."""
    rng = random.Random(7)
    log = [random_command(rng) for _ in range(1000)]
    state = ClusterState()
    results = [(type(c), state.apply(c, offset).error) for offset, c in enumerate(log)]
    applied = {kind for kind, error in results if error == E.NONE}
    assert len(applied) >= 7 and MovePartitions in applied
    assert len({error for _, error in results}) >= 8
    assert state.view().table.topics and state.next_producer_id > FIRST_PRODUCER_ID


def test_from_snapshot_refuses_bytes_that_are_not_one() -> None:
    for data in (b"", _pack([1, 0, 1, [], []])[:-1], _pack([1, 0, 1, [[1]], []]),
                 _pack([9, 0, 1, [], []]), _pack([1, 0, 1, [], [["t"]]])):
        with pytest.raises(CommandError):
            ClusterState.from_snapshot(data)


# The leadership table ----------------------------------------------------------------------


@pytest.fixture
def leaders(log: Log) -> LeaderTable:
    log.ok(create("t", 1, R12, R23))
    return LeaderTable(log.state.view().table)


def up(leader: tuple[int, int] | None, epoch: int, *isr: tuple[int, int], version: int = 0,
       partition: int = 0, topic: str = "t", i: int = 1) -> LeaderUpdate:
    return LeaderUpdate(topic, tid(i), partition, leader, epoch, tuple(isr), version)


def test_a_newer_epoch_wins_and_a_stale_one_is_ignored(leaders: LeaderTable) -> None:
    assert leaders.update(up((1, 0), 3, (1, 0), (2, 0), version=1))
    assert not leaders.update(up((2, 0), 2))  # an older term, late
    assert not leaders.update(up((1, 0), 3, (1, 0), (2, 0), version=1))  # a duplicate
    assert leaders.leader("t", 0) == (1, 0)
    assert leaders.update(up((2, 0), 4))
    entry = leaders.get("t", 0)
    assert entry is not None and (entry.leader, entry.epoch, entry.isr) == ((2, 0), 4, ())


def test_within_an_epoch_the_leaders_reports_are_ordered(leaders: LeaderTable) -> None:
    assert leaders.update(up(None, 5))  # a follower: an election is on
    assert leaders.update(up((2, 0), 5))  # a follower that knows the leader
    assert not leaders.update(up(None, 5))  # knowing no leader is not news
    assert leaders.update(up((2, 0), 5, (2, 0), (1, 0), version=1))  # the leader: its ISR
    assert leaders.update(up((2, 0), 5, (2, 0), version=2))  # the ISR shrank
    assert not leaders.update(up((2, 0), 5, (2, 0), (1, 0), version=1))  # late
    assert not leaders.update(up((2, 0), 5))  # a follower's report, late
    entry = leaders.get("t", 0)
    assert entry is not None and entry.isr == ((2, 0),)
    assert leaders.update(up(None, 5, version=3))  # the leader stepped down
    assert leaders.leader("t", 0) is None


def test_while_an_election_is_on_the_leader_before_it_is_remembered(
    log: Log, leaders: LeaderTable
) -> None:
    assert leaders.last_named("t", 0) is None  # never heard of one
    assert leaders.update(up((1, 0), 3, (1, 0), (2, 0), version=1))
    assert leaders.update(up(None, 4))  # this node's replica campaigns
    assert leaders.leader("t", 0) is None
    named = leaders.last_named("t", 0)
    assert named is not None and (named.leader, named.epoch, named.isr) == (
        (1, 0), 3, ((1, 0), (2, 0)))
    assert leaders.update(up((2, 0), 4, version=1))  # the election's winner
    named = leaders.last_named("t", 0)
    assert named is not None and (named.leader, named.epoch) == ((2, 0), 4)
    log.ok(DeleteTopic("t", tid(1)))
    leaders.set_topics(log.state.view().table)
    assert leaders.last_named("t", 0) is None  # a deleted topic's leaders are forgotten


@pytest.mark.parametrize("update", [
    up((1, 0), 1, topic="nope"),
    up((1, 0), 1, i=9),  # an id from another incarnation of the topic
    up((1, 0), 1, partition=2),
    up((1, 0), 1, partition=-1),
    up((3, 0), 1),  # not a replica of partition 0
    up((1, 1), 1),  # node 1's replica is on shard 0
    up((1, 0), 1, (1, 0), (3, 0)),  # an ISR member that is no replica
])
def test_reports_about_what_does_not_exist_are_ignored(
    leaders: LeaderTable, update: LeaderUpdate
) -> None:
    assert not leaders.update(update)
    assert len(leaders) == 0


def test_removed_topics_are_forgotten(log: Log, leaders: LeaderTable) -> None:
    assert leaders.update(up((1, 0), 9))
    assert leaders.update(up((3, 0), 2, partition=1))
    log.ok(DeleteTopic("t", tid(1)))
    log.ok(create("t", 2, R23))  # the same name again: its terms start over
    leaders.set_topics(log.state.view().table)
    assert len(leaders) == 0
    assert leaders.update(up((2, 1), 1, i=2))
    assert not leaders.update(up((1, 0), 9))  # the old topic's report, late
    assert [e.leader for e in leaders.entries()] == [(2, 1)]


def test_a_report_that_comes_before_its_topic_is_taken_when_the_table_brings_it(
        log: Log, leaders: LeaderTable) -> None:
    """A new topic's (or partition's) first election is reported while the table that names
    it is still on its way to this shard."""
    assert not leaders.update(up((2, 1), 1, topic="u", i=2))  # topic u: not in the table yet
    assert not leaders.update(up((2, 1), 2, topic="u", i=2))  # a newer report replaces it
    assert not leaders.update(up((3, 0), 1, partition=2))  # t's partition 2: not yet either
    assert len(leaders) == 0
    log.ok(create("u", 2, R23))
    log.ok(CreatePartitions("t", tid(1), 3, (R23,)))
    leaders.set_topics(log.state.view().table)
    entry = leaders.get("u", 0)
    assert entry is not None and (entry.leader, entry.epoch) == ((2, 1), 2)
    assert leaders.leader("t", 2) == (3, 0)


def test_reports_kept_for_topics_not_yet_known_are_bounded(leaders: LeaderTable) -> None:
    kept = limits.early_leader_reports_max
    for partition in range(kept + 10):
        leaders.update(up((1, 0), 1, topic="u", i=2, partition=partition))
    assert len(leaders._early) == kept
    assert min(p for _, p in leaders._early) == 10  # the oldest went first


def test_the_coordinator_is_the_offsets_partitions_leader(log: Log) -> None:
    table = LeaderTable(log.state.view().table)
    assert table.coordinator("g") is None  # no offsets topic yet
    log.ok(create(OFFSETS_TOPIC, 5, *[R12 if p % 2 else R23 for p in range(3)]))
    table.set_topics(log.state.view().table)
    partition = offsets_partition("g", 3)
    assert table.coordinator_partition("g") == partition
    assert table.coordinator("g") is None  # no leader known yet
    replicas = R12 if partition % 2 else R23
    table.update(LeaderUpdate(OFFSETS_TOPIC, tid(5), partition, replicas[1], 1))
    assert table.coordinator("g") == replicas[1]
    table.update(LeaderUpdate(OFFSETS_TOPIC, tid(5), partition, replicas[0], 2))
    assert table.coordinator("g") == replicas[0]  # it moves with the leader


def test_a_single_node_table_is_taken_without_replica_checks() -> None:
    info = TopicInfo("t", tid(1), 2)
    table = LeaderTable(TopicTable({"t": info}, 1))
    assert table.update(LeaderUpdate("t", tid(1), 1, (0, 1), 1))
    assert not table.update(LeaderUpdate("t", tid(1), 2, (0, 1), 1))
