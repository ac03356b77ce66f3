"""Exactly once through the `krill` sink: retried tasks, replayed micro-batches, restarts.

Every task writes into a Kafka transaction the driver commits (wire/spark/sink.py). A
read_committed consumer must see every input row once:
  - after a task's Python worker is killed mid-write (Spark retries it; what the dead
    attempt wrote is aborted, and read_uncommitted shows it was really written);
  - after a micro-batch is replayed whose transactions were already committed (the driver
    died between the sink's commit and Spark's commit log: simulated by removing the
    batch's entry from the checkpoint's commit log);
  - across a query stopped and restarted from its checkpoint with new input between;
  - across a Krill restart in the middle of a streaming write (the query fails and is
    started again from its checkpoint, as a supervisor would).
Batch writes with every codec read back equal to their input.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

_POLL_ROUNDS = 400  # consume() polls of 0.25 s at most: 100 s


def consume_all(broker: BrokerProcess, topic: str, partitions: int, *,
                committed: bool = True, settle_s: float = 1.5) -> list[bytes | None]:
    """Every value in the topic, read from offset 0 until every partition has reached its end
    (its last stable offset, read_committed) and nothing new came for `settle_s` after that
    (a consumer that is slow to start, on a loaded machine, reads nothing for a while)."""
    consumer = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": f"check-{topic}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes | None] = []
    at_end: set[int] = set()
    quiet_since = time.monotonic()
    try:
        for _ in range(_POLL_ROUNDS):
            messages = consumer.consume(1000, timeout=0.25)
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                assert error is None, error
                values.append(message.value())
                quiet_since = time.monotonic()
            if len(at_end) == partitions and time.monotonic() - quiet_since > settle_s:
                break
    finally:
        consumer.close()
    return values


def sink(df: Any, broker: BrokerProcess, topic: str, **options: str) -> Any:
    write = (df.write.format("krill").mode("append").option("krill.bootstrap", broker.bootstrap)
             .option("topic", topic))
    for key, value in options.items():
        write = write.option(key, value)
    return write


def copy_query(spark: Any, broker: BrokerProcess, source: str, target: str, checkpoint: str,
               **trigger: Any) -> Any:
    """A streaming copy of `source` into `target` through the sink, 300 records a batch."""
    return (
        spark.readStream.format("krill").option("krill.bootstrap", broker.reader_address)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 300).load()
        .select("key", "value")
        .writeStream.format("krill").option("krill.bootstrap", broker.bootstrap)
        .option("topic", target).option("checkpointLocation", checkpoint)
        .trigger(**trigger).start()
    )


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_batch_write_every_codec_reads_back_once(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, codec: str
) -> None:
    kafka.create(topic_name, 3)
    df = spark.range(0, 3000, 1, 3).selectExpr(
        "CAST(id AS STRING) AS key",
        "CASE WHEN id % 13 = 0 THEN NULL ELSE CONCAT('value-', id) END AS value")
    sink(df, reader_broker, topic_name, **{"kafka.compression.type": codec}).save()

    got = consume_all(reader_broker, topic_name, 3)
    assert Counter(got) == Counter(
        None if i % 13 == 0 else f"value-{i}".encode() for i in range(3000))
    # The krill reader skips the commit markers between the data.
    rows = (spark.read.format("krill").option("krill.bootstrap", reader_broker.reader_address)
            .option("subscribe", topic_name).load().select("value").collect())
    assert Counter(r.value for r in rows) == Counter(got)


def test_a_task_killed_mid_write_leaves_no_duplicate(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str
) -> None:
    """The task's first attempt has its Python worker killed once the writer has produced
    part of its rows; the retry's transaction replaces the dead attempt's, which is aborted
    (read_uncommitted still shows what the dead attempt wrote)."""
    from pyspark.sql.functions import udf

    kafka.create(topic_name, 2)
    bootstrap = reader_broker.bootstrap

    @udf(returnType="string", useArrow=False)  # a plain Python UDF: no pandas needed
    def value_of(n):  # type: ignore[no-untyped-def]  # (hints would ask for a pandas UDF)
        from pyspark import TaskContext

        if n == 25_000 and TaskContext.get().attemptNumber() == 0:
            _wait_for_records(bootstrap, topic_name, 2)  # the writer has written some rows
            os.kill(os.getpid(), 9)  # then this task's Python worker dies mid-write
        return f"row-{n}"

    df = spark.range(0, 30_000, 1, 1).select(value_of("id").alias("value"))  # one task
    sink(df, reader_broker, topic_name).save()

    expected = Counter(f"row-{n}".encode() for n in range(30_000))
    assert Counter(consume_all(reader_broker, topic_name, 2)) == expected
    uncommitted = Counter(consume_all(reader_broker, topic_name, 2, committed=False))
    assert uncommitted - expected, "the killed attempt wrote nothing before it died"
    assert set(uncommitted) == set(expected)


def _wait_for_records(bootstrap: str, topic: str, partitions: int) -> None:
    """Until the topic holds a record (read_uncommitted: the high watermarks), 30 s at most."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks",
                         "isolation.level": "read_uncommitted"})
    try:
        for _ in range(300):
            if any(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] > 0
                   for p in range(partitions)):
                return
            time.sleep(0.1)
    finally:
        consumer.close()


def test_a_replayed_micro_batch_writes_nothing_twice(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-out"
    kafka.create(source)
    kafka.create(target)
    kafka.values(source, 900)
    query = copy_query(spark, reader_broker, source, target, checkpoint, availableNow=True)
    query.awaitTermination(120)
    query.stop()
    assert query.exception() is None
    commits = sorted(Path(checkpoint, "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert [p.name for p in commits] == ["0", "1", "2"]
    # The driver died after the sink committed batch 2 but before Spark recorded it.
    commits[-1].unlink()
    commits[-1].with_name(".2.crc").unlink(missing_ok=True)  # the entry's checksum file

    replay = copy_query(spark, reader_broker, source, target, checkpoint, availableNow=True)
    replay.awaitTermination(120)
    replay.stop()
    assert replay.exception() is None
    assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [2]
    expected = Counter(f"v{i}".encode() for i in range(900))
    assert Counter(consume_all(reader_broker, target, 1)) == expected
    assert Counter(consume_all(reader_broker, target, 1, committed=False)) == expected


def test_a_query_restarted_from_its_checkpoint_has_no_gap_or_duplicate(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-out"
    kafka.create(source)
    kafka.create(target, 2)
    kafka.values(source, 500)
    first = copy_query(spark, reader_broker, source, target, checkpoint, availableNow=True)
    first.awaitTermination(120)
    first.stop()
    kafka.values(source, 700, prefix="w")
    second = copy_query(spark, reader_broker, source, target, checkpoint, availableNow=True)
    second.awaitTermination(120)
    second.stop()
    assert first.exception() is None and second.exception() is None
    expected = Counter([f"v{i}".encode() for i in range(500)]
                       + [f"w{i}".encode() for i in range(700)])
    assert Counter(consume_all(reader_broker, target, 2)) == expected


def test_a_krill_restart_during_a_streaming_write(
    spark: Any, tmp_path: Path, checkpoint: str, topic_name: str
) -> None:
    node = BrokerProcess(tmp_path / "data").start()
    try:
        kafka = Kafka(node)
        source, target = f"{topic_name}-in", f"{topic_name}-out"
        kafka.create(source)
        kafka.create(target)
        kafka.values(source, 3000)
        every = "100 milliseconds"
        query = copy_query(spark, node, source, target, checkpoint, processingTime=every)
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)
        assert query.recentProgress, "the query made no progress before the restart"
        node.restart()  # mid-stream: the query fails, or rides it out
        kafka.values(source, 1000, prefix="w")
        for _ in range(6):  # a supervisor starts a failed query again from its checkpoint
            if not query.isActive:
                query = copy_query(spark, node, source, target, checkpoint,
                                   processingTime=every)
            query.awaitTermination(15)
            if query.isActive and len(consume_all(node, target, 1, settle_s=0.5)) >= 4000:
                break
        query.stop()
        expected = Counter([f"v{i}".encode() for i in range(3000)]
                           + [f"w{i}".encode() for i in range(1000)])
        assert Counter(consume_all(node, target, 1)) == expected
    finally:
        node.stop()
