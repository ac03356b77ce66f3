"""The Controller actor: owner of cluster metadata — topics, their configs, producer ids.

Every change is validated, written atomically to `<data_dir>/_krill/` and only then published:
the shard runtime gets the new immutable `TopicTable` through `on_change` and starts or stops
Partition actors to match. Requests are answered after the publish, so a client that created
a topic can use it at once. (With replication this becomes the controller Raft group of
DESIGN.md §7; the messages stay the same.)

The write (temp file, fsync, rename, fsync of the directory) runs on the I/O pool, never on
the loop: while it is out, later requests wait in order (at most
`controller_requests_waiting_max`, then they are refused with a retriable error), so each sees
the table the one before it left. A write that fails changes nothing and answers
KAFKA_STORAGE_ERROR. The node's partitions are bounded (`partitions_max`, from the node's
`topic_partitions_per_shard`): a client creating topics without end is refused.

A topic's configs change the same way (`AlterTopicConfigs`, from AlterConfigs and
IncrementalAlterConfigs): checked by actors/topic_config.py, written, published; each shard
hands its partitions the new settings (`UpdateSettings`) as it takes the table.
`__consumer_offsets` keeps what its group coordinator depends on (`check_offsets_topic`).

Producer ids come from blocks persisted before use, so an id is never handed out twice, even
across a crash.

Internal topics are exactly Kafka's (`INTERNAL_TOPICS`, Kafka's Topic.isInternal); a user topic
whose name merely starts with "__" is an ordinary topic. The Controller creates whatever it is
asked to: keeping clients from creating an internal topic is the job of the handlers, so that
only its owner (the group coordinator for `__consumer_offsets`) makes it, with its own layout.
"""

from __future__ import annotations

import collections
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pykka import ActorDeadError

from actors import limits
from actors.cluster.topic_names import (
    INTERNAL_TOPICS,
    TRANSACTION_STATE_TOPIC,
    check_topic_name,
)
from actors.group import OFFSETS_TOPIC
from actors.runtime import LoopActor
from actors.services import BrokerSettings, TopicInfo, TopicTable
from actors.topic_config import (
    ConfigError,
    Operation,
    OperationError,
    altered,
    check_offsets_topic,
    replaced,
    validate,
)
from storage.metadata_file import read_json, write_json_atomic
from wire.errors import ErrorCode

__all__ = [
    "Controller",
    "TopicSpec",
    "TopicResult",
    "CreateTopics",
    "DeleteTopics",
    "CreatePartitions",
    "AlterTopicConfigs",
    "AllocateProducerId",
    "INTERNAL_TOPICS",
    "TRANSACTION_STATE_TOPIC",
    "metadata_dir",
    "load_topic_table",
    "load_cluster_id",
]

log = logging.getLogger(__name__)


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
    """The topic table as last written to `<data_dir>/_krill/topics.json` (empty if none).
    Whether a topic is internal follows from its name, whatever an older table stored."""
    stored = read_json(metadata_dir(data_dir) / "topics.json", {"version": 0, "topics": []})
    topics = {
        t["name"]: TopicInfo(
            t["name"],
            bytes.fromhex(t["id"]),
            t["partitions"],
            t["configs"],
            t["name"] in INTERNAL_TOPICS,
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


class AlterTopicConfigs(NamedTuple):
    """New explicit configs for topics: for each (topic, operations), either the operations
    applied in order to the topic's explicit keys (IncrementalAlterConfigs), or, with
    `replace`, the keys set become the whole set (AlterConfigs). Checked as CreateTopics
    checks them (actors.topic_config); the result's info carries the new configs."""

    changes: list[tuple[str, list[Operation]]]
    replace: bool
    validate_only: bool
    reply: Callable[[list[TopicResult]], None]


class AllocateProducerId(NamedTuple):
    """Replies a new producer id, or -1 if none can be handed out now (retriable)."""

    reply: Callable[[int], None]


class PartitionResult(NamedTuple):
    topic: str
    partition: int
    error: ErrorCode
    message: str | None = None


class MovePartitions(NamedTuple):
    """AlterPartitionReassignments: for each topic, (partition, the node ids to move it to,
    or None to cancel its move) (actors/cluster/moves.py). Replies one result per
    partition, in order, once the moves are recorded (not done)."""

    moves: list[tuple[str, list[tuple[int, list[int] | None]]]]
    reply: Callable[[list[PartitionResult]], None]


class CompleteMove(NamedTuple):
    """A partition's Raft leader: its group's members are its move's target now. Replies
    NONE once the controller recorded it, or the error why not (a move since redirected)."""

    topic: str
    topic_id: bytes
    partition: int
    target: tuple[tuple[int, int], ...]
    reply: Callable[[ErrorCode], None]


class _Written(NamedTuple):
    """A metadata file write came back from the I/O pool."""

    then: Callable[[BaseException | None], None]
    error: BaseException | None


RunBlocking = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]


def _nothing() -> None:
    pass


def topic_names_of(message: Any) -> list[str | None]:
    """The topics a request to the Controller names, to answer each when it is refused."""
    if isinstance(message, DeleteTopics):
        return list(message.names)
    if isinstance(message, CreateTopics):
        return [s.name for s in message.specs]
    if isinstance(message, AlterTopicConfigs):
        return [name for name, _ in message.changes]
    if isinstance(message, MovePartitions):
        return [name for name, _ in message.moves]
    return [name for name, _ in message.counts]


def refuse_moves(message: MovePartitions, error: ErrorCode, why: str) -> None:
    message.reply([PartitionResult(topic, index, error, why)
                   for topic, moves in message.moves for index, _ in moves])


class Controller(LoopActor):
    def __init__(
        self,
        settings: BrokerSettings,
        on_change: Callable[[TopicTable, Callable[[], None]], None],
        run_blocking: RunBlocking,
    ) -> None:
        super().__init__()
        self.settings = settings
        self._on_change = on_change
        self._run_blocking = run_blocking
        self._writing = False  # a metadata file write is out on the I/O pool
        self._waiting: collections.deque[Any] = collections.deque()  # requests behind it
        self._dir = metadata_dir(settings.data_dir)
        self._table = TopicTable()
        self._next_producer_id = 0
        self._producer_id_limit = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            CreateTopics: self._create_topics,
            DeleteTopics: self._delete_topics,
            CreatePartitions: self._create_partitions,
            AlterTopicConfigs: self._alter_configs,
            AllocateProducerId: self._allocate_producer_id,
            MovePartitions: self._move_partitions,
            CompleteMove: lambda m: m.reply(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS),
        }

    def on_start(self) -> None:
        self._table = load_topic_table(self.settings.data_dir)
        ids = read_json(self._dir / "producer_ids.json", {"next": 1})
        self._next_producer_id = self._producer_id_limit = int(ids["next"])
        self._on_change(self._table, _nothing)

    def table(self) -> TopicTable:
        return self._table

    def on_receive(self, message: Any) -> Any:
        if type(message) is _Written:
            return self._written(message)
        handler = self._handlers.get(type(message))
        if handler is None:
            return super().on_receive(message)
        if self._writing:
            self._wait(message)
            return None
        return handler(message)

    # Writing metadata files ---------------------------------------------------------------

    def _write(
        self, name: str, value: Any, then: Callable[[BaseException | None], None]
    ) -> None:
        """Write `<data_dir>/_krill/<name>` on the I/O pool; `then(error)` runs here after it,
        and requests that arrive meanwhile wait for it."""
        assert not self._writing, "one metadata write at a time"
        self._writing = True
        path = self._dir / name
        ref = self.actor_ref

        def written(_result: Any, error: BaseException | None) -> None:
            try:
                ref.tell(_Written(then, error))
            except ActorDeadError:
                pass  # the shard is stopping: nobody waits for the answer

        self._run_blocking(lambda: write_json_atomic(path, value), written)

    def _written(self, m: _Written) -> None:
        self._writing = False
        if m.error is not None:
            log.error("cannot write the cluster metadata: %r", m.error)
        m.then(m.error)
        while self._waiting and not self._writing:
            message = self._waiting.popleft()
            self._handlers[type(message)](message)

    def _wait(self, message: Any) -> None:
        if len(self._waiting) < limits.controller_requests_waiting_max:
            self._waiting.append(message)
            return
        log.warning("controller: %d requests waiting; refusing more", len(self._waiting))
        if isinstance(message, AllocateProducerId):
            message.reply(-1)
        elif isinstance(message, MovePartitions):
            refuse_moves(message, ErrorCode.REQUEST_TIMED_OUT, "controller busy")
        elif isinstance(message, CompleteMove):
            message.reply(ErrorCode.REQUEST_TIMED_OUT)
        else:
            busy = ErrorCode.REQUEST_TIMED_OUT
            message.reply(
                [TopicResult(name or "", busy, "controller busy")
                 for name in topic_names_of(message)]
            )

    # Topics -------------------------------------------------------------------------------

    def _move_partitions(self, m: MovePartitions) -> None:
        """A node of its own holds every partition's one replica: a move to itself is nothing
        to do, any other names an unknown node, and no move is ever under way."""
        me = self.settings.node_id
        results = []
        for topic, moves in m.moves:
            info = self._table.topics.get(topic)
            for index, nodes in moves:
                if info is None or not 0 <= index < info.partitions:
                    error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
                elif nodes is None:
                    error, message = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None
                elif nodes != [me]:
                    error = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                    message = f"a node of its own (node {me}) holds every replica"
                else:
                    error, message = ErrorCode.NONE, None
                results.append(PartitionResult(topic, index, error, message))
        m.reply(results)

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
                    log.info("creating topic %s with %d partitions", r.name, r.info.partitions)
            self._publish(topics, results, m.reply)
        else:
            m.reply(results)

    def _check_create(self, spec: TopicSpec, topics: dict[str, TopicInfo]) -> TopicResult:
        name = spec.name
        problem = check_topic_name(name)
        if problem is not None:
            return TopicResult(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in topics:
            return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS,
                               f"Topic '{name}' already exists.")  # Kafka's words
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
        too_many = self._over_partition_limit(topics, partitions)
        if too_many is not None:
            return TopicResult(name, ErrorCode.INVALID_PARTITIONS, too_many)
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
        info = TopicInfo(name, uuid.uuid4().bytes, partitions, configs, name in INTERNAL_TOPICS)
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
            log.info("deleting topic %s", info.name)
        if any(r.error == ErrorCode.NONE for r in results):
            self._publish(topics, results, m.reply)
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
            elif (too_many := self._over_partition_limit(topics, count - info.partitions)):
                results.append(TopicResult(name, ErrorCode.INVALID_PARTITIONS, too_many))
            else:
                grown = TopicInfo(info.name, info.topic_id, count, info.configs, info.internal)
                if not m.validate_only:
                    topics[name] = grown
                results.append(TopicResult(name, ErrorCode.NONE, None, grown))
        if not m.validate_only and any(r.error == ErrorCode.NONE for r in results):
            self._publish(topics, results, m.reply)
        else:
            m.reply(results)

    def _alter_configs(self, m: AlterTopicConfigs) -> None:
        topics = dict(self._table.topics)
        results = [self._check_alter(name, ops, m.replace, topics) for name, ops in m.changes]
        changed = False
        for r in results:
            if r.error == ErrorCode.NONE and r.info is not None:
                changed = changed or r.info.configs != topics[r.name].configs
                topics[r.name] = r.info
        if changed and not m.validate_only:
            for r in results:
                if r.info is not None:
                    log.info("topic %s configs now %s", r.name, r.info.configs)
            self._publish(topics, results, m.reply)
        else:
            m.reply(results)

    def _check_alter(
        self, name: str, ops: list[Operation], replace: bool, topics: dict[str, TopicInfo]
    ) -> TopicResult:
        info = topics.get(name)
        if info is None:
            return TopicResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such topic")
        try:
            configs = replaced(ops) if replace else altered(info.configs, ops)
            if name == OFFSETS_TOPIC:
                check_offsets_topic(configs)
        except OperationError as e:
            return TopicResult(name, ErrorCode.INVALID_REQUEST, str(e))
        except ConfigError as e:
            return TopicResult(name, ErrorCode.INVALID_CONFIG, str(e))
        new = TopicInfo(info.name, info.topic_id, info.partitions, configs, info.internal)
        return TopicResult(name, ErrorCode.NONE, None, new)

    def _over_partition_limit(self, topics: dict[str, TopicInfo], more: int) -> str | None:
        """Why `more` partitions would take the node past `partitions_max`, or None."""
        owned = sum(info.partitions for info in topics.values())
        limit = self.settings.partitions_max
        if owned + more <= limit:
            return None
        return (f"the node has {owned} partitions and takes at most {limit} "
                f"(topic_partitions_per_shard x shards); {more} more do not fit")

    def _publish(
        self,
        topics: dict[str, TopicInfo],
        results: list[TopicResult],
        reply: Callable[[list[TopicResult]], None],
    ) -> None:
        """Write the new table, then hand it to every shard; `reply(results)` once all have
        it, so a client told "created" finds the topic on whichever shard its next connection
        lands. If the write fails nothing changes, and the results say so."""
        table = TopicTable(topics, self._table.version + 1)

        def then(error: BaseException | None) -> None:
            if error is not None:
                failed = ErrorCode.KAFKA_STORAGE_ERROR
                reply([r._replace(error=failed, message=f"metadata write failed: {error}")
                       if r.error == ErrorCode.NONE else r for r in results])
                return
            self._table = table
            self._on_change(table, lambda: reply(results))

        self._write(
            "topics.json",
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
            then,
        )

    # Producer ids -------------------------------------------------------------------------

    def _allocate_producer_id(self, m: AllocateProducerId) -> None:
        if self._next_producer_id >= self._producer_id_limit:
            limit = self._next_producer_id + limits.producer_id_block_size

            def then(error: BaseException | None) -> None:
                if error is not None:
                    m.reply(-1)
                    return
                self._producer_id_limit = limit
                self._allocate_producer_id(m)

            self._write("producer_ids.json", {"next": limit}, then)
            return
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        m.reply(producer_id)
