"""The node's reader endpoint (shards/reader.py) through the reader client, no Spark."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess, free_port
from wire.record_batch import batch_length_at, read_header
from wire.records import iter_records
from wire.spark import protocol
from wire.spark.client import ReaderClient, ReaderTimeout
from wire.spark.protocol import ReaderError

pytestmark = pytest.mark.integration


def test_metadata_offsets_and_fetch_on_every_shard(
    reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name, 4)  # with 2 shards, partitions land on both
    for partition in range(4):
        kafka.values(topic_name, 100 + partition, partition=partition)
    with ReaderClient(reader_broker.reader_address, timeout_s=10) as client:
        metadata = client.metadata([topic_name, "no-such-topic"])
        assert metadata.topics == {topic_name: [0, 0, 0, 0]}
        assert metadata.nodes == {0: reader_broker.reader_address}
        assert topic_name in client.metadata().topics
        queries = [(topic_name, p, ts) for p in range(4) for ts in (-2, -1)]
        results = client.offsets(queries + [("no-such-topic", 0, -1), (topic_name, 0, 0)])
        assert results[:8] == [(0, o) for p in range(4) for o in (0, 100 + p)]
        assert results[8] == (protocol.ERROR_UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert results[9] == (0, 0)  # the first offset with a timestamp >= 0
        for partition in range(4):
            got = client.fetch(topic_name, partition, 10)
            assert (got.log_start, got.high_watermark) == (0, 100 + partition)
            values = [r.value for r in iter_records(got.records, start_offset=10)]
            assert values == [b"v%d" % i for i in range(10, 100 + partition)]
        at_end = client.fetch(topic_name, 0, 100)
        assert len(at_end.records) == 0 and at_end.high_watermark == 100
        with pytest.raises(ReaderError) as info:
            client.fetch(topic_name, 0, 101)
        assert info.value.code == protocol.ERROR_OFFSET_OUT_OF_RANGE
        assert info.value.details["log_start"] == 0
        assert info.value.details["high_watermark"] == 100
        with pytest.raises(ReaderError) as info:
            client.fetch("no-such-topic", 0, 0)
        assert info.value.code == protocol.ERROR_UNKNOWN_TOPIC_OR_PARTITION


def test_large_fetch_is_capped_and_whole_batches(
    reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    kafka.create(topic_name)
    kafka.produce(topic_name, [(None, bytes(1000), []) for _ in range(3000)])
    with ReaderClient(reader_broker.reader_address) as client:
        offset, total = 0, 0
        while offset < 3000:
            got = client.fetch(topic_name, 0, offset, max_bytes=1024 * 1024)
            view = got.records
            assert 0 < len(view) <= 1024 * 1024 + 64 * 1024
            position = 0
            while position < len(view):  # whole batches only, back to back
                size = batch_length_at(view, position)
                assert size is not None and position + size <= len(view)
                offset = read_header(view, position).next_offset
                position += size
            total += len(view)
        assert offset == 3000 and total > 3_000_000


@pytest.mark.parametrize(
    "frames",
    [
        [b"not msgpack \xc1"],
        [msgpack.packb([1, 2, 3])],
        [msgpack.packb({"v": 99, "id": 1, "op": "metadata"})],
        [msgpack.packb({"v": 1, "id": 1, "op": "launch"})],
        [
            msgpack.packb(
                {
                    "v": 1,
                    "id": 1,
                    "op": "fetch",
                    "topic": "t",
                    "partition": -1,
                    "offset": 0,
                    "max_bytes": 1,
                }
            )
        ],
        [msgpack.packb({"v": 1, "id": 1, "op": "offsets", "queries": [["t", 0]]})],
        [msgpack.packb({"v": 1, "id": 1, "op": "metadata"}), b"extra frame"],
    ],
)
def test_malformed_requests_get_an_error_reply_and_the_node_lives_on(
    reader_broker: BrokerProcess, frames: list[bytes]
) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://{reader_broker.reader_address}")
    try:
        socket.send_multipart(frames)
        assert socket.poll(10_000), "no reply to a malformed request"
        reply = msgpack.unpackb(socket.recv(), raw=False, strict_map_key=False)
        assert reply["v"] == protocol.VERSION and reply["error"] != 0 and reply["message"]
    finally:
        socket.close()
        context.term()
    with ReaderClient(reader_broker.reader_address, timeout_s=10) as client:
        client.metadata()
    assert reader_broker.alive()


def test_oversized_request_does_not_kill_the_endpoint(reader_broker: BrokerProcess) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://{reader_broker.reader_address}")
    socket.send(bytes(protocol.request_bytes_max + 1))  # ZeroMQ drops the peer (MAXMSGSIZE)
    socket.close()
    context.term()
    with ReaderClient(reader_broker.reader_address, timeout_s=10) as client:
        assert client.metadata().node == 0


def test_a_dead_node_fails_the_request_in_time() -> None:
    started = time.monotonic()
    with ReaderClient(f"127.0.0.1:{free_port()}", timeout_s=0.5) as client:
        with pytest.raises(ReaderTimeout):
            client.metadata()
    assert time.monotonic() - started < 5


def test_records_deleted_after_planning(reader_broker: BrokerProcess, kafka: Kafka) -> None:
    # The executor's side of failOnDataLoss: a range planned from offset 0, then DeleteRecords
    # moves the log start to 6 before the task reads it.
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from wire.spark.datasource import DataLossError, KrillPartition, read_range
    from wire.spark.offsets import OffsetRange, SourceOptions

    topic = f"deleted-{time.monotonic_ns()}"
    kafka.create(topic)
    kafka.values(topic, 10)
    planned = OffsetRange(topic, 0, 0, 10)
    admin = AdminClient({"bootstrap.servers": reader_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        assert future.result(30).low_watermark == 6

    def task(fail_on_data_loss: bool) -> KrillPartition:
        options = SourceOptions(bootstrap=reader_broker.reader_address,
                                fail_on_data_loss=fail_on_data_loss)
        return KrillPartition(reader_broker.reader_address, planned, options)

    with pytest.raises(DataLossError, match="offsets 0..5 were deleted before they were read"):
        list(read_range(task(True)))
    offsets = [o for batch in read_range(task(False)) for o in batch.column("offset").to_pylist()]
    assert offsets == [6, 7, 8, 9]
