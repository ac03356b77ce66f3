"""Fixtures of the Spark reader tests: one local Spark session and one broker for them all.

Starting Spark costs ~5 s, so the session is shared by every test (session scope); so is the
broker, and each test makes topics of its own. The session has both data sources: Krill's own
(`krill`) and Spark's Kafka connector (`kafka`, its jars fetched once by
bench/peers/fetch.py into the cache). Tests that need Spark are marked `spark`
(select them with `-m spark`, leave them out with `-m "not spark"`).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # Executors' Python workers must run this interpreter (pyarrow, msgpack, zmq, wire).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from bench.peers.fetch import spark_kafka_jars
    from wire.spark import register

    session = (
        SparkSession.builder.master("local[2,4]")  # a failed task is tried 4 times
        .appName("krill-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", ",".join(str(jar) for jar in spark_kafka_jars()))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def reader_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One node for every Spark reader test (each test uses topics of its own)."""
    node = BrokerProcess(tmp_path_factory.mktemp("spark") / "data").start()
    try:
        yield node
    finally:
        node.kill9() if node.alive() else node.stop()


@pytest.fixture
def topic_name() -> str:
    return f"spark-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")


class Kafka:
    """confluent-kafka against the test broker: make topics, produce, delete."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker

    def create(self, topic: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)

    def delete(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        admin.delete_topics([topic])[topic].result(timeout=30)

    def produce(
        self,
        topic: str,
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
        partition: int = 0,
        compression: str = "none",
    ) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "compression.type": compression,
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )
        errors: list[Any] = []
        for key, value, headers in records:
            producer.produce(
                topic,
                value=value,
                key=key,
                headers=list(headers) or None,  # type: ignore[arg-type]
                partition=partition,
                on_delivery=lambda err, _msg: errors.append(err) if err else None,
            )
        assert producer.flush(30) == 0
        assert not errors, errors

    def values(self, topic: str, count: int, partition: int = 0, prefix: str = "v") -> None:
        self.produce(topic, [(None, f"{prefix}{i}".encode(), []) for i in range(count)], partition)


@pytest.fixture(scope="session")
def kafka(reader_broker: BrokerProcess) -> Kafka:
    return Kafka(reader_broker)
