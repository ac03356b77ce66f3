"""The log start is replicated (issue 26, item 8): what DeleteRecords removed on a leader stays
removed on every replica, through a kill -9 of that leader.

Before, DeleteRecords moved only the leader's log start: after a failover the new leader
served the deleted records again and ListOffsets EARLIEST went back to 0. Each node is asked
directly: the partition's leader over Kafka's ListOffsets and Fetch (the raw client, so no
client library picks the broker), every replica over the reader endpoint with `any_replica`
(the Spark reader's read from a follower).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from tests.support.cluster import (
    Cluster,
    ClusterNode,
    cluster_fixture,
    stored_batches,
    wait_until,
    whole_batches,
)
from tests.support.raw_client import RawClient, fetch_request
from wire.errors import ErrorCode
from wire.messages.list_offsets import ListOffsetsRequest
from wire.records import iter_records
from wire.spark.client import ReaderClient
from wire.spark.protocol import EARLIEST, ERROR_OFFSET_OUT_OF_RANGE, ReaderError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ELECTION_TIMEOUT_MS = 1000
TOPIC = "trimmed"
RECORDS = 100
START = 50


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(
        tmp_path / "cluster", "--raft-election-timeout-ms", str(ELECTION_TIMEOUT_MS)
    )


def produce(cluster: Cluster, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "linger.ms": 5, "enable.idempotence": True})  # fmt: skip
    errors: list[object] = []

    def on_delivery(err: object, _message: object) -> None:
        if err is not None:
            errors.append(err)

    for i in range(count):
        producer.produce(TOPIC, value=b"v%d" % i, partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:5]


def leader_earliest(node: ClusterNode) -> int:
    """ListOffsets EARLIEST, answered by `node` (the leader)."""
    Request = ListOffsetsRequest
    with RawClient(node.bootstrap) as client:
        answer = client.call(2, 7, Request(replica_id=-1, topics=[Request.ListOffsetsTopic(
            name=TOPIC, partitions=[Request.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=EARLIEST)])]))
    found = answer.topics[0].partitions[0]
    assert found.error_code == ErrorCode.NONE, found
    return int(found.offset)


def leader_fetch_error(node: ClusterNode, offset: int) -> int:
    with RawClient(node.bootstrap) as client:
        answer = client.call(1, 12, fetch_request(TOPIC, offset))
    return int(answer.responses[0].partitions[0].error_code)


def replica_view(node: ClusterNode) -> tuple[int, int, int]:
    """What `node`'s replica answers any_replica: (EARLIEST, the error and the log start of a
    fetch at offset 0)."""
    with ReaderClient(f"127.0.0.1:{node.reader_port}", timeout_s=5) as reader:
        ((error, earliest),) = reader.offsets([(TOPIC, 0, EARLIEST)], any_replica=True)
        assert error == 0, error
        try:
            fetched = reader.fetch(TOPIC, 0, 0, any_replica=True)
        except ReaderError as e:
            return earliest, e.code, int(e.details.get("log_start", -1))
        return earliest, 0, fetched.log_start


def test_records_delete_records_removed_stay_removed_after_the_leader_is_killed(
    cluster: Cluster,
) -> None:
    cluster.create_topic(TOPIC, 1)
    produce(cluster, RECORDS)
    leader = cluster.wait_leader(TOPIC, 0)
    admin = cluster.admin()  # held: a client collected meanwhile fails its requests
    futures = admin.delete_records([TopicPartition(TOPIC, 0, START)])
    assert [f.result(30).low_watermark for f in futures.values()] == [START]

    cluster[leader].kill9()
    new_leader = cluster[cluster.wait_leader(TOPIC, 0, not_on=leader)]
    assert wait_until(lambda: leader_earliest(new_leader), 30,
                      "the new leader answers ListOffsets") == START
    assert leader_fetch_error(new_leader, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert leader_fetch_error(new_leader, START) == ErrorCode.NONE
    out_of_range = (START, ERROR_OFFSET_OUT_OF_RANGE, START)
    for node in cluster.running():
        assert replica_view(node) == out_of_range, node

    # The killed leader comes back as a follower: its own start was durable before the
    # answer, and it never serves below it either.
    cluster.restart(leader)
    assert wait_until(lambda: replica_view(cluster[leader]), 30,
                      f"node {leader}'s replica answers") == out_of_range

    # A follower down does not hold DeleteRecords up once its node is known down (Kafka
    # counts live brokers only); back, it takes the leader's start.
    leader = cluster.wait_leader(TOPIC, 0)
    follower = next(n for n in cluster.running() if n.node_id != leader)
    follower.kill9()
    admin = cluster.admin(*(n.node_id for n in cluster.running()))
    futures = admin.delete_records([TopicPartition(TOPIC, 0, START + 10)])
    assert [f.result(30).low_watermark for f in futures.values()] == [START + 10]
    cluster.restart(follower.node_id)
    moved = (START + 10, ERROR_OFFSET_OUT_OF_RANGE, START + 10)
    wait_until(lambda: replica_view(follower) == moved, 30,
               f"node {follower.node_id}'s replica starts at {START + 10}")


# A log start inside a batch ----------------------------------------------------------------------

BATCH = 10  # records a batch
INSIDE = 45  # inside the batch 40..49


def produce_batches(cluster: Cluster, first: int, batches: int) -> None:
    """`batches` batches of BATCH records each: every batch's records are queued before the
    linger ends, then flushed as one."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all",
                         "linger.ms": 5000, "enable.idempotence": True})  # fmt: skip
    errors: list[object] = []

    def on_delivery(err: object, _message: object) -> None:
        if err is not None:
            errors.append(err)

    for b in range(first, first + batches):
        for i in range(BATCH):
            producer.produce(TOPIC, value=b"v%d" % (b * BATCH + i), partition=0,
                             on_delivery=on_delivery)
        assert producer.flush(60) == 0 and not errors, errors[:5]


def batch_spans(node: ClusterNode) -> list[tuple[int, int]]:
    """(base offset, last offset) of each batch in `node`'s segment files."""
    spans = []
    for _base, _epoch, data in stored_batches(node.data_dir, TOPIC, 0):
        ((_, header),) = whole_batches(data)
        spans.append((header.base_offset, header.last_offset))
    return spans


def replica_records(node: ClusterNode, start: int, end: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of `node`'s replica's records from `start` to `end`, read with
    any_replica."""
    found: list[tuple[int, bytes | None]] = []
    with ReaderClient(f"127.0.0.1:{node.reader_port}", timeout_s=5) as reader:
        offset = start
        while offset < end:
            fetched = reader.fetch(TOPIC, 0, offset, any_replica=True)
            records = list(iter_records(fetched.records, start_offset=offset))
            assert records, (node, offset, fetched.high_watermark)
            found.extend((r.offset, r.value) for r in records)
            offset = records[-1].offset + 1
    return found


def log_end(node: ClusterNode) -> int:
    replicas = node.replicas() or {}
    replica = replicas.get((TOPIC, 0))
    return -1 if replica is None else int(replica["log_end"])


def test_a_follower_away_while_the_start_moved_inside_a_batch_catches_up(
    cluster: Cluster,
) -> None:
    """DeleteRecords to an offset inside a batch while a follower is down: back, the follower
    needs an install at that start and then the batch holding it, whole. Before, its log
    refused a batch that began below its end, and the follower stayed where the install
    left it for good (NotContiguous at every heartbeat)."""
    cluster.create_topic(TOPIC, 1)
    produce_batches(cluster, 0, 2)  # 0..19 everywhere
    leader = cluster.wait_leader(TOPIC, 0)
    away = next(n for n in cluster.running() if n.node_id != leader)
    away.kill9()
    produce_batches(cluster, 2, 5)  # 20..69 without it
    end = 7 * BATCH
    assert (40, 49) in batch_spans(cluster[leader])  # the start falls inside this batch
    admin = cluster.admin(*(n.node_id for n in cluster.running()))
    futures = admin.delete_records([TopicPartition(TOPIC, 0, INSIDE)])
    assert [f.result(30).low_watermark for f in futures.values()] == [INSIDE]

    cluster.restart(away.node_id)
    wait_until(lambda: log_end(away) == end, 30,
               f"node {away.node_id}'s replica reaches the high watermark {end}")
    out_of_range = (INSIDE, ERROR_OFFSET_OUT_OF_RANGE, INSIDE)
    wait_until(lambda: replica_view(away) == out_of_range, 30,
               f"node {away.node_id}'s replica starts at {INSIDE}")
    assert batch_spans(away)[0] == (40, 49)  # its log restarted at the batch's base
    expected = [(o, b"v%d" % o) for o in range(INSIDE, end)]
    assert replica_records(away, INSIDE, end) == expected

    cluster[leader].kill9()
    new_leader = cluster[cluster.wait_leader(TOPIC, 0, not_on=leader)]
    assert wait_until(lambda: leader_earliest(new_leader), 30,
                      "the new leader answers ListOffsets") == INSIDE
    assert leader_fetch_error(new_leader, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
    for node in cluster.running():
        assert replica_view(node) == out_of_range, node
        assert replica_records(node, INSIDE, end) == expected, node
