"""Kafka's command-line tools, run from the fetched jars as Kafka's `bin/*.sh` scripts run them
(bench/peers/fetch.py): against Krill in tests/kafka_tools, or by hand:

    python -m bench.peers.kafka_tools kafka-topics --bootstrap-server 127.0.0.1:9092 --list
"""

from __future__ import annotations

import subprocess
import sys

from bench.peers.kafka import kafka_java

__all__ = ["TOOLS", "run_tool", "tool_command"]

# Each script of Kafka's bin/ and the class it runs (Kafka 4.x).
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
}


def tool_command(name: str, *args: str) -> list[str]:
    return kafka_java(TOOLS[name], *args, heap_mib=256)  # kafka-run-class.sh's heap for tools


def run_tool(name: str, *args: str, timeout: float = 60.0, stdin: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    """Run one tool to its end (or `timeout`); its exit code, stdout and stderr."""
    return subprocess.run(tool_command(name, *args), input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m bench.peers.kafka_tools TOOL [ARGS...]; TOOL is one of "
              f"{', '.join(TOOLS)}", file=sys.stderr)
        return 2
    return subprocess.call(tool_command(argv[0], *argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
