"""The call layer's wire forms (shards/calls/): every header and answer crosses msgpack as the
pipes carry it and comes back equal; the registry numbers each call once; a header the
Router cannot read breaks the pipe."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from actors.controller import (
    AlterTopicConfigs,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    TopicSpec,
)
from actors.raft import Membership, Message, MsgType, Range
from actors.services import TopicInfo, TopicTable
from actors.topic_config import Operation
from shards.calls import (
    SERVE,
    controller,
    delete_records,
    epoch_end,
    group,
    info,
    list_offset,
    produce,
    raft,
    read,
    segments,
    topics,
    txn_marker,
    watch,
)
from shards.calls.base import BATCH, REPLY
from shards.pipes import PipeBroken
from shards.router import Router


def crossed(value: Any) -> Any:
    """`value` as the other end of a pipe unpacks it."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False,
                           strict_map_key=False)


@pytest.mark.parametrize(
    "header",
    [
        produce.ProduceCall("t", 3, -1, 4096, 700),
        produce.ProduceCall("t", 3, 0, -1, 0),
        produce.ProduceAnswer(produce.PHASE_ONE),
        produce.ProduceAnswer(produce.PHASE_ONE | produce.PHASE_TWO, 0, 42, -1, 7, None),
        produce.ProduceAnswer(produce.PHASE_TWO, 87, message="over max.message.bytes"),
        produce.ProduceAnswer(produce.PHASE_TWO, 87, message="2 record errors",
                              record_errors=[[0, "no key"], [3, "no key"]]),
        read.ReadCall("t", 0, 10, 1 << 20, -1, 1 << 20, 0, True, False),
        read.ReadCall("t", 0, 10, 1 << 20, -1, 1 << 20, 0, False, True),
        read.ReadAnswer(0, 12, 0, ["/data/t-0/00000000000000000000.log", 0, 300, 2, 99], 12,
                        None),
        read.ReadAnswer(0, 12, 0, None, 7, [[1000, 3], [1001, 5]]),
        read.ReadAnswer(6, -1, -1, None, -1, None),
        watch.WatchCall("t", 1, 12),
        watch.WatchAnswer(-1),
        list_offset.ListOffsetCall("t", 0, -2, -1, False),
        list_offset.ListOffsetCall("t", 0, -1, -1, True),
        list_offset.ListOffsetAnswer(0, -1, 0, 0),
        epoch_end.EpochEndCall("t", 0, 3, 3),
        epoch_end.EpochEndAnswer(0, 3, 120),
        delete_records.DeleteRecordsCall("t", 0, -1),
        delete_records.DeleteRecordsAnswer(0, 40),
        info.InfoCall("t", 0),
        info.InfoAnswer({"next_offset": 5, "high_watermark": 5}),
        info.InfoAnswer(None),
        segments.ForgetSegmentsCall(["/data/t-0/00000000000000000000.log"]),
        topics.TopicsCall(),
        txn_marker.TxnMarkerCall("t", 2, 1000, 3, True, 7),
        txn_marker.TxnMarkerAnswer(47),
    ],
    ids=lambda h: type(h).__name__,
)
def test_a_header_crosses_as_its_fields(header: Any) -> None:
    assert type(header)._make(crossed(header)) == header


@pytest.mark.parametrize(
    "message",
    [
        CreateTopics([TopicSpec("t", 3, 1, [(0, [1]), (1, [1])], {"cleanup.policy": "compact"}),
                      TopicSpec("u", -1, -1, [], {"retention.ms": None})], False, print),
        DeleteTopics(["t", None], [None, b"\x01" * 16], print),
        CreatePartitions([("t", 6)], True, print),
        AlterTopicConfigs([("t", [Operation("retention.ms", 0, "1000")])], False, False, print),
    ],
    ids=lambda m: type(m).__name__,
)
def test_a_controller_message_crosses_whole(message: Any) -> None:
    header = controller._HEADER_OF[type(message)]._make(message[:-1])
    call = controller.ControllerCall(controller._HEADERS.index(type(header)), header)
    body = controller.ControllerCall._make(crossed(call))
    assert controller._HEADERS[body.op].from_wire(body.header).message(print) == message


@pytest.mark.parametrize(
    "message",
    [
        Message(MsgType.MsgApp, (2, 0), (1, 3), 7, 99, 4,
                (Range(100, 149, 6), Range(150, 150, 7)), 120, log_start=50,
                payload=b"batches"),
        Message(MsgType.MsgAppResp, (1, 3), (2, 0), 7, 99, 0, reject=True, hint=99,
                log_start=100),
        Message(MsgType.MsgHeartbeat, (2, 0), (1, 3), 7, commit=150, quiesce=True,
                log_start=60),
        Message(MsgType.MsgHeartbeatResp, (1, 3), (2, 0), 7, log_start=60),
        Message(MsgType.MsgVote, (2, 0), (1, 3), 8, 150, 7, transfer=True),
        Message(MsgType.MsgApp, (2, 0), (1, 3), 7, 99, 4, (Range(100, 100, 7),), 99,
                payload=b"change", confs=((100, Membership(
                    frozenset({(1, 3), (3, 0)}), frozenset({(1, 3), (2, 0), (3, 0)}),
                    frozenset({(4, 1)}))),)),
        Message(MsgType.MsgSnap, (2, 0), (1, 3), 7, 49, 5, (Range(50, 52, 6),), 60,
                confs=((49, Membership(frozenset({(1, 3), (2, 0)}))),)),
    ],
    ids=lambda m: str(m.type),
)
def test_a_raft_message_crosses_as_its_fields(message: Message) -> None:
    frames: list[Any] = []
    wire = raft._to_wire(message, frames)
    assert len(frames) == (message.payload is not None)
    assert raft._from_wire(crossed(wire), frames) == message


def test_a_topic_table_crosses_whole() -> None:
    table = TopicTable(
        {"t": TopicInfo("t", b"\x02" * 16, 3, {"segment.bytes": "1024"}),
         "__consumer_offsets": TopicInfo("__consumer_offsets", b"\x03" * 16, 50, {}, True)},
        7,
    )
    assert topics.table_from_wire(topics.table_to_wire(table)) == table


def test_every_call_has_a_kind_of_its_own() -> None:
    kinds = [m.KIND for m in (produce, read, watch, list_offset, epoch_end, delete_records,
                              info, controller, topics, segments, group, txn_marker)]
    assert len(set(kinds)) == len(kinds) and not {REPLY, BATCH} & set(kinds)
    assert set(kinds) <= set(SERVE)


@pytest.mark.parametrize(
    "header",
    [
        {"t": "produce", "id": 7},  # the dict form of an older version
        [99, 1, []],  # a kind no call has
        ["produce", 1, []],
        [2, 1],
    ],
)
def test_a_header_the_router_cannot_read_breaks_the_pipe(header: Any) -> None:
    router = Router(None, None)  # type: ignore[arg-type]  # neither is reached
    with pytest.raises(PipeBroken):
        router.on_message(1, crossed(header), [])
