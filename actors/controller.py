"""The Controller actor: owner of cluster metadata — topics, their configs, producer ids.

Every change is validated, written atomically to `<data_dir>/_krill/` and only then published:
the shard runtime gets the new immutable `TopicTable` through `on_change` and starts or stops
Partition actors to match. Requests are answered after the publish, so a client that created
a topic can use it at once. (With replication this becomes the controller Raft group of
DESIGN.md §7; the messages stay the same.)

Producer ids come from blocks persisted before use, so an id is never handed out twice, even
across a crash.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from actors import limits
from actors.runtime import LoopActor
from actors.services import BrokerSettings, TopicInfo, TopicTable
from actors.topic_config import ConfigError, validate
from storage.metadata_file import read_json, write_json_atomic
from wire.errors import ErrorCode

__all__ = [
    "Controller",
    "TopicSpec",
    "TopicResult",
    "CreateTopics",
    "DeleteTopics",
    "CreatePartitions",
    "AllocateProducerId",
    "metadata_dir",
    "load_topic_table",
    "load_cluster_id",
]

log = logging.getLogger(__name__)

_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def metadata_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / "_krill"


def load_cluster_id(data_dir: str | Path) -> str:
    """The cluster id, made once when the data directory is new and kept forever after."""
    path = metadata_dir(data_dir) / "cluster.json"
    stored = read_json(path)
    if stored is not None:
        return str(stored["cluster_id"])
    cluster_id = str(uuid.uuid4())
    write_json_atomic(path, {"cluster_id": cluster_id})
    return cluster_id


def load_topic_table(data_dir: str | Path) -> TopicTable:
    """The topic table as last written to `<data_dir>/_krill/topics.json` (empty if none)."""
    stored = read_json(metadata_dir(data_dir) / "topics.json", {"version": 0, "topics": []})
    topics = {
        t["name"]: TopicInfo(
            t["name"], bytes.fromhex(t["id"]), t["partitions"], t["configs"], t["internal"]
        )
        for t in stored["topics"]
    }
    return TopicTable(topics, stored["version"])


class TopicSpec(NamedTuple):
    name: str
    partitions: int  # -1: the broker default
    replication_factor: int  # -1: the broker default
    assignments: list[tuple[int, list[int]]]
    configs: dict[str, str | None]


class TopicResult(NamedTuple):
    name: str
    error: ErrorCode
    message: str | None = None
    info: TopicInfo | None = None


class CreateTopics(NamedTuple):
    specs: list[TopicSpec]
    validate_only: bool
    reply: Callable[[list[TopicResult]], None]


class DeleteTopics(NamedTuple):
    names: list[str | None]
    ids: list[bytes | None]
    reply: Callable[[list[TopicResult]], None]


class CreatePartitions(NamedTuple):
    counts: list[tuple[str, int]]
    validate_only: bool
    reply: Callable[[list[TopicResult]], None]


class AllocateProducerId(NamedTuple):
    reply: Callable[[int], None]


def _nothing() -> None:
    pass


def check_topic_name(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None if it is (Kafka's Topic.validate)."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > limits.topic_name_chars_max:
        return f"topic name is longer than {limits.topic_name_chars_max} characters"
    if not _LEGAL_TOPIC_NAME.match(name):
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


class Controller(LoopActor):
    def __init__(
        self,
        settings: BrokerSettings,
        on_change: Callable[[TopicTable, Callable[[], None]], None],
    ) -> None:
        super().__init__()
        self.settings = settings
        self._on_change = on_change
        self._dir = metadata_dir(settings.data_dir)
        self._table = TopicTable()
        self._next_producer_id = 0
        self._producer_id_limit = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            CreateTopics: self._create_topics,
            DeleteTopics: self._delete_topics,
            CreatePartitions: self._create_partitions,
            AllocateProducerId: self._allocate_producer_id,
        }

    def on_start(self) -> None:
        self._table = load_topic_table(self.settings.data_dir)
        ids = read_json(self._dir / "producer_ids.json", {"next": 1})
        self._next_producer_id = self._producer_id_limit = int(ids["next"])
        self._on_change(self._table, _nothing)

    def table(self) -> TopicTable:
        return self._table

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            return super().on_receive(message)
        return handler(message)

    # Topics -------------------------------------------------------------------------------

    def _create_topics(self, m: CreateTopics) -> None:
        topics = dict(self._table.topics)
        results = []
        for spec in m.specs:
            result = self._check_create(spec, topics)
            if result.error == ErrorCode.NONE and not m.validate_only:
                assert result.info is not None
                topics[spec.name] = result.info
            results.append(result)
        if not m.validate_only and any(r.error == ErrorCode.NONE for r in results):
            for r in results:
                if r.info is not None:
                    log.info("created topic %s with %d partitions", r.name, r.info.partitions)
            self._publish(topics, lambda: m.reply(results))
        else:
            m.reply(results)

    def _check_create(self, spec: TopicSpec, topics: dict[str, TopicInfo]) -> TopicResult:
        name = spec.name
        problem = check_topic_name(name)
        if problem is not None:
            return TopicResult(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in topics:
            return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists")
        partitions = spec.partitions
        if spec.assignments:
            if partitions != -1:
                return TopicResult(
                    name, ErrorCode.INVALID_REQUEST, "give partitions or assignments, not both"
                )
            partitions = len(spec.assignments)
            for _, nodes in spec.assignments:
                if nodes != [self.settings.node_id]:
                    return TopicResult(
                        name, ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"unknown nodes in {nodes}"
                    )
        if partitions == -1:
            partitions = self.settings.default_partitions
        if not 0 < partitions <= limits.partitions_per_topic_max:
            return TopicResult(
                name, ErrorCode.INVALID_PARTITIONS, f"{partitions} partitions is out of range"
            )
        if spec.replication_factor not in (-1, 1) and not spec.assignments:
            return TopicResult(
                name,
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {spec.replication_factor} is larger than the 1 node",
            )
        try:
            configs = validate(spec.configs)
        except ConfigError as e:
            return TopicResult(name, ErrorCode.INVALID_CONFIG, str(e))
        info = TopicInfo(name, uuid.uuid4().bytes, partitions, configs, name.startswith("__"))
        return TopicResult(name, ErrorCode.NONE, None, info)

    def _delete_topics(self, m: DeleteTopics) -> None:
        topics = dict(self._table.topics)
        results = []
        for name, topic_id in zip(m.names, m.ids, strict=True):
            info = topics.get(name) if name else self._table.by_id(topic_id or b"")
            if info is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if name is None:
                    error = ErrorCode.UNKNOWN_TOPIC_ID
                results.append(TopicResult(name or "", error, "no such topic"))
                continue
            del topics[info.name]
            results.append(TopicResult(info.name, ErrorCode.NONE, None, info))
            log.info("deleted topic %s", info.name)
        if any(r.error == ErrorCode.NONE for r in results):
            self._publish(topics, lambda: m.reply(results))
        else:
            m.reply(results)

    def _create_partitions(self, m: CreatePartitions) -> None:
        topics = dict(self._table.topics)
        results = []
        for name, count in m.counts:
            info = topics.get(name)
            if info is None:
                results.append(
                    TopicResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
                )
            elif count <= info.partitions:
                message = f"topic has {info.partitions} partitions; asked for {count}"
                results.append(TopicResult(name, ErrorCode.INVALID_PARTITIONS, message))
            elif count > limits.partitions_per_topic_max:
                results.append(TopicResult(name, ErrorCode.INVALID_PARTITIONS, "too many"))
            else:
                grown = TopicInfo(info.name, info.topic_id, count, info.configs, info.internal)
                if not m.validate_only:
                    topics[name] = grown
                results.append(TopicResult(name, ErrorCode.NONE, None, grown))
        if not m.validate_only and any(r.error == ErrorCode.NONE for r in results):
            self._publish(topics, lambda: m.reply(results))
        else:
            m.reply(results)

    def _publish(self, topics: dict[str, TopicInfo], done: Callable[[], None]) -> None:
        """Write the new table, then hand it to every shard; `done` once all have it, so a
        client told "created" finds the topic on whichever shard its next connection lands."""
        table = TopicTable(topics, self._table.version + 1)
        write_json_atomic(
            self._dir / "topics.json",
            {
                "version": table.version,
                "topics": [
                    {
                        "name": t.name,
                        "id": t.topic_id.hex(),
                        "partitions": t.partitions,
                        "configs": t.configs,
                        "internal": t.internal,
                    }
                    for t in topics.values()
                ],
            },
        )
        self._table = table
        self._on_change(table, done)

    # Producer ids -------------------------------------------------------------------------

    def _allocate_producer_id(self, m: AllocateProducerId) -> None:
        if self._next_producer_id >= self._producer_id_limit:
            self._producer_id_limit = self._next_producer_id + limits.producer_id_block_size
            write_json_atomic(self._dir / "producer_ids.json", {"next": self._producer_id_limit})
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        m.reply(producer_id)
