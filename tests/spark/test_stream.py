"""Streaming reads through the `krill` data source: micro-batches, checkpoints, replays.

Every query runs with Trigger.AvailableNow, so it reads what is there and stops by itself;
stopping, producing more and restarting from the checkpoint must miss and repeat nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from tests.spark.conftest import Kafka
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.integration]

Batches = list[tuple[int, list[tuple[int, int, bytes]]]]  # (batch id, [(partition, offset, value)])


def run(
    spark: Any,
    broker: BrokerProcess,
    topic: str,
    checkpoint: str,
    batches: Batches,
    fail_on: set[int] | None = None,
    **options: Any,
) -> None:
    """One AvailableNow query to its end; `fail_on` batch ids raise once, after recording."""
    reader = (
        spark.readStream.format("krill")
        .option("krill.bootstrap", broker.reader_address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)

    def handle(df: Any, batch_id: int) -> None:
        rows = [(r.partition, r.offset, bytes(r.value)) for r in df.collect()]
        batches.append((batch_id, sorted(rows)))
        if fail_on is not None and batch_id in fail_on:
            fail_on.discard(batch_id)
            raise RuntimeError(f"batch {batch_id} fails once")

    query = (
        reader.load()
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    except Exception as exc:  # StreamingQueryException: the query failed
        raise RuntimeError(str(exc)) from None
    assert not query.isActive, "AvailableNow query did not finish"


def offsets_read(batches: Batches) -> Counter[tuple[int, int]]:
    return Counter((p, o) for _, rows in batches for p, o, _ in rows)


def test_rate_limit_split_by_lag_and_restart_without_gaps_or_duplicates(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    kafka.create(topic_name, 2)
    kafka.values(topic_name, 300, partition=0)
    kafka.values(topic_name, 100, partition=1)
    first: Batches = []
    run(spark, reader_broker, topic_name, checkpoint, first, maxOffsetsPerTrigger=100)
    per_batch = [Counter(p for p, _, _ in rows) for _, rows in first if rows]
    # Lags 300 and 100 share 100 records as 75 and 25, and keep that ratio to the end.
    assert per_batch == [Counter({0: 75, 1: 25})] * 4

    kafka.values(topic_name, 40, partition=0, prefix="w")
    kafka.values(topic_name, 10, partition=1, prefix="w")
    second: Batches = []
    run(spark, reader_broker, topic_name, checkpoint, second, maxOffsetsPerTrigger=100)
    assert min(batch_id for batch_id, _ in second) > max(batch_id for batch_id, _ in first)

    seen = offsets_read(first + second)
    expected = {(0, o) for o in range(340)} | {(1, o) for o in range(110)}
    assert set(seen) == expected, "gaps"
    assert max(seen.values()) == 1, "duplicates"
    assert sum(len(rows) for _, rows in second) == 50


def test_failed_micro_batch_replays_identical_rows(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    kafka.create(topic_name, 2)
    kafka.values(topic_name, 40, partition=0)
    kafka.values(topic_name, 20, partition=1)
    failed: Batches = []
    with pytest.raises(RuntimeError, match="fails once"):
        run(
            spark,
            reader_broker,
            topic_name,
            checkpoint,
            failed,
            fail_on={1},
            maxOffsetsPerTrigger=15,
        )
    assert [batch_id for batch_id, _ in failed] == [0, 1]

    replayed: Batches = []
    run(spark, reader_broker, topic_name, checkpoint, replayed, maxOffsetsPerTrigger=15)
    assert replayed[0] == failed[1], "the failed batch replays with identical rows"
    done = failed[:1] + replayed
    seen = offsets_read(done)
    assert set(seen) == {(0, o) for o in range(40)} | {(1, o) for o in range(20)}
    assert max(seen.values()) == 1


def test_fail_on_data_loss_after_topic_recreated(
    spark: Any, reader_broker: BrokerProcess, kafka: Kafka, topic_name: str, checkpoint: str
) -> None:
    kafka.create(topic_name)
    kafka.values(topic_name, 20)
    first: Batches = []
    run(spark, reader_broker, topic_name, checkpoint, first)
    assert len(offsets_read(first)) == 20

    kafka.delete(topic_name)
    deadline = time.monotonic() + 30
    while True:  # the deletion reaches every shard asynchronously
        try:
            kafka.create(topic_name)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    kafka.values(topic_name, 5, prefix="new")

    with pytest.raises(RuntimeError, match="some data may have been lost"):
        run(spark, reader_broker, topic_name, checkpoint, [])
    after: Batches = []
    run(spark, reader_broker, topic_name, checkpoint, after, failOnDataLoss="false")
    assert [value for _, rows in after for _, _, value in rows] == [
        f"new{i}".encode() for i in range(5)
    ]
