"""The Spark reader: a PySpark data source `krill` and its ZeroMQ client (DESIGN.md §8).

The one part of `wire/` that does I/O, and the only place importing pyspark. Importing this
package does not import pyspark; `register(spark)` does:

    from wire.spark import register
    register(spark)
    spark.read.format("krill").option("krill.bootstrap", "127.0.0.1:9093") ...

protocol.py  the messages (msgpack, versioned; PROTOCOL.md)
client.py    ZeroMQ DEALER client with timeouts
replicas.py  which node serves a partition (leader or in-sync replica), failover between them
offsets.py   option parsing, offset resolution, planning, rate limits, data loss (pure)
arrow.py     fetched record batches -> Arrow rows
datasource.py  the DataSource, its batch and stream readers
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the `krill` data source with a SparkSession."""
    from wire.spark.datasource import register as register_source

    register_source(spark)
