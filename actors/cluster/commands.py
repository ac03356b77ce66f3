"""The controller log's commands: small typed records, and their one msgpack encoding.

A command is what a proposer appends to the controller group's log (as the value of one
record of a Kafka batch) and what every seed node applies, in log order, to its
`ClusterState`. Everything `apply` needs is in the command: the proposer chose the topic id,
the replicas and the producer-id block's node before proposing, so applying draws no random
number and reads no clock.

The encoding is a msgpack array, the format first, then the command's tag, then its fields
in the order the record declares them:

    RegisterNode(NodeInfo(1, "h1", 9092, "h1", 33145, 2, 2000, None, "h1:9093"))
        -> [3, 1, 1, "h1", 9092, "h1", 33145, 2, 2000, None, "h1:9093"]
    DeleteTopic("orders", b"\\x9a...")  ->  [3, 3, "orders", b"\\x9a..."]

Replicas travel flat, `[node, shard, node, shard, ...]` per partition, the leader first. A
snapshot (`Snapshot`) is written in the same terms: the nodes' fields and, for each topic, the
fields of a CreateTopic that would make it as it is now.

Growing the format: a later format appends fields at the end of a command's array (never
reorders or retypes one) and bumps `FORMAT`; `decode` reads every format up to its own,
giving the fields an older format lacked their defaults (format 2 added a node's reader
address, `NodeInfo.reader`, at the end of RegisterNode and of a snapshot's node; format 3 the
partition moves, `MovePartitions` and `CompleteMove`, and a snapshot's moves under way). A format
newer than the decoder's is a `CommandError`: a node must not apply a command it half
understands (its state would differ from its peers'), so it stops applying until it is
upgraded.

`decode` returns a command or raises `CommandError`, nothing else: a field of the wrong type,
a length over a limit, trailing bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import msgpack

from actors import limits as actor_limits
from actors.cluster import limits
from actors.topic_config import Operation

__all__ = [
    "FORMAT",
    "Address",
    "AllocateProducerIdBlock",
    "AlterTopicConfigs",
    "Command",
    "CommandError",
    "CompleteMove",
    "CreatePartitions",
    "CreateTopic",
    "DeleteTopic",
    "Move",
    "MovePartitions",
    "NodeInfo",
    "RegisterNode",
    "Replicas",
    "Snapshot",
    "decode",
    "decode_snapshot",
    "encode",
    "encode_snapshot",
    "moves_from_wire",
    "moves_to_wire",
    "replicas_from_wire",
    "replicas_to_wire",
]

FORMAT = 3  # the encoding's version: the first element of every encoded command

# A replica's home: (node id, shard of that node).
Address = tuple[int, int]
# One partition's replicas, the preferred leader first.
Replicas = tuple[Address, ...]


class CommandError(ValueError):
    """Bytes that are not a command this node knows: malformed, over a limit, or a newer
    format."""


class NodeInfo(NamedTuple):
    """A node as the cluster knows it. `partitions_max` is the node's own bound on the replicas
    it hosts (topic_partitions_per_shard x shards)."""

    node: int
    host: str  # the Kafka listener clients are told about
    port: int
    rpc_host: str  # node-to-node RPC: shard k listens on rpc_port + k
    rpc_port: int
    shards: int
    partitions_max: int
    rack: str | None = None
    reader: str | None = None  # the Spark reader endpoint, "host:port" (format 2; None: unknown)


class RegisterNode(NamedTuple):
    """A node joins, or comes back with new addresses, more shards or another bound."""

    info: NodeInfo


class CreateTopic(NamedTuple):
    """A topic with its id and every partition's replicas chosen (actors/cluster/placement.py).
    `configs` are the explicit keys, validated by the proposer and again when applied."""

    name: str
    topic_id: bytes  # 16 bytes
    replicas: tuple[Replicas, ...]  # one entry per partition
    configs: Mapping[str, str]


class DeleteTopic(NamedTuple):
    """Delete the topic `name` if it is still the one with `topic_id`: a delete proposed
    before the topic was deleted and created again must not remove the new one."""

    name: str
    topic_id: bytes


class CreatePartitions(NamedTuple):
    """Grow `name` to `partitions` partitions; `replicas` holds the new ones' replicas, so it
    fits only a topic that still has `partitions - len(replicas)` when applied."""

    name: str
    topic_id: bytes
    partitions: int  # the topic's partition count after
    replicas: tuple[Replicas, ...]


class AlterTopicConfigs(NamedTuple):
    """The operations themselves, not their outcome, so that two alterations proposed from
    the same configs both take effect: applied in order to the configs the topic has then
    (IncrementalAlterConfigs), or, with `replace`, the keys set become the whole set
    (AlterConfigs)."""

    name: str
    operations: tuple[Operation, ...]
    replace: bool


class AllocateProducerIdBlock(NamedTuple):
    """Hand `node` the next block of producer ids (actors/limits.py producer_id_block_size)."""

    node: int


class Move(NamedTuple):
    """A partition's move under way (format 3): from the replicas it had when the move began
    to `target` (actors/cluster/moves.py)."""

    origin: Replicas
    target: Replicas


class MovePartitions(NamedTuple):
    """Start, redirect or cancel moves of `name`'s partitions (AlterPartitionReassignments):
    each (partition, its target replicas), or (partition, None) to cancel the move under way,
    which then goes back to the replicas it began from. Format 3."""

    name: str
    topic_id: bytes
    moves: tuple[tuple[int, Replicas | None], ...]


class CompleteMove(NamedTuple):
    """The partition's Raft group has `target`'s voters and no other member: its move is done
    (proposed by the group's leader). Format 3."""

    name: str
    topic_id: bytes
    partition: int
    target: Replicas


Command = (
    RegisterNode
    | CreateTopic
    | DeleteTopic
    | CreatePartitions
    | AlterTopicConfigs
    | AllocateProducerIdBlock
    | MovePartitions
    | CompleteMove
)


# Encoding ----------------------------------------------------------------------------------


def replicas_to_wire(replicas: Replicas) -> list[int]:
    return [n for address in replicas for n in address]


def replicas_from_wire(flat: Any) -> Replicas:
    if not isinstance(flat, list) or len(flat) % 2:
        raise CommandError(f"replicas are a flat list of (node, shard) pairs: {flat!r:.80}")
    if len(flat) > 2 * limits.replication_factor_max:
        raise CommandError(f"{len(flat) // 2} replicas is over the limit")
    return tuple((_int(flat[i]), _int(flat[i + 1])) for i in range(0, len(flat), 2))


def _int(value: Any) -> int:
    if type(value) is not int:
        raise CommandError(f"expected an integer, got {value!r:.80}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise CommandError(f"expected a string, got {value!r:.80}")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise CommandError(f"expected bytes, got {value!r:.80}")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise CommandError(f"expected a boolean, got {value!r:.80}")
    return value


def _optional_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _partitions(value: Any) -> tuple[Replicas, ...]:
    if not isinstance(value, list) or len(value) > actor_limits.partitions_per_topic_max:
        raise CommandError("partitions must be a list within partitions_per_topic_max")
    return tuple(replicas_from_wire(flat) for flat in value)


def _configs(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise CommandError(f"configs must be a map, got {value!r:.80}")
    return {_str(k): _str(v) for k, v in value.items()}


def _operations(value: Any) -> tuple[Operation, ...]:
    if not isinstance(value, list):
        raise CommandError(f"operations must be a list, got {value!r:.80}")
    operations = []
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise CommandError(f"an operation is [key, op, value], got {item!r:.80}")
        operations.append(Operation(_str(item[0]), _int(item[1]), _optional_str(item[2])))
    return tuple(operations)


def _node(f: list[Any]) -> NodeInfo:
    reader = _optional_str(f[8]) if len(f) > 8 else None  # format 2 added it
    return NodeInfo(_int(f[0]), _str(f[1]), _int(f[2]), _str(f[3]), _int(f[4]), _int(f[5]),
                    _int(f[6]), _optional_str(f[7]), reader)


def _topic_to_wire(c: CreateTopic) -> list[Any]:
    return [c.name, c.topic_id, [replicas_to_wire(r) for r in c.replicas],
            dict(sorted(c.configs.items()))]


def _topic_from_wire(f: list[Any]) -> CreateTopic:
    return CreateTopic(_str(f[0]), _bytes(f[1]), _partitions(f[2]), _configs(f[3]))


def moves_to_wire(moves: Mapping[int, Move]) -> list[Any]:
    """[[partition, origin, target], ...] by partition."""
    return [[p, replicas_to_wire(m.origin), replicas_to_wire(m.target)]
            for p, m in sorted(moves.items())]


def moves_from_wire(value: Any) -> dict[int, Move]:
    if not isinstance(value, list) or len(value) > actor_limits.partitions_per_topic_max:
        raise CommandError("moves must be a list within partitions_per_topic_max")
    moves = {}
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise CommandError(f"a move is [partition, origin, target], got {item!r:.80}")
        moves[_int(item[0])] = Move(replicas_from_wire(item[1]), replicas_from_wire(item[2]))
    return moves


def _moves_command_to_wire(c: MovePartitions) -> list[Any]:
    return [c.name, c.topic_id,
            [[p, None if r is None else replicas_to_wire(r)] for p, r in c.moves]]


def _moves_command_from_wire(f: list[Any]) -> MovePartitions:
    if not isinstance(f[2], list) or len(f[2]) > actor_limits.partitions_per_topic_max:
        raise CommandError("moves must be a list within partitions_per_topic_max")
    moves = []
    for item in f[2]:
        if not isinstance(item, list) or len(item) != 2:
            raise CommandError(f"a move is [partition, target or nil], got {item!r:.80}")
        moves.append((_int(item[0]), None if item[1] is None else replicas_from_wire(item[1])))
    return MovePartitions(_str(f[0]), _bytes(f[1]), tuple(moves))


class _Codec(NamedTuple):
    tag: int
    to_wire: Callable[[Any], list[Any]]
    from_wire: Callable[[list[Any]], Any]
    fields: int  # how many fields format 1 has
    grown: Mapping[int, int] | None = None  # how many a later format has, where it added some

    def fields_in(self, form: int) -> int:
        """The command's field count in format `form` (the latest growth at or before it)."""
        grown = self.grown or {}
        return max(((f, n) for f, n in grown.items() if f <= form), default=(1, self.fields))[1]


_CODECS: dict[type, _Codec] = {
    RegisterNode: _Codec(1, lambda c: list(c.info), lambda f: RegisterNode(_node(f)), 8, {2: 9}),
    CreateTopic: _Codec(2, _topic_to_wire, _topic_from_wire, 4),
    DeleteTopic: _Codec(
        3,
        lambda c: [c.name, c.topic_id],
        lambda f: DeleteTopic(_str(f[0]), _bytes(f[1])),
        2,
    ),
    CreatePartitions: _Codec(
        4,
        lambda c: [c.name, c.topic_id, c.partitions, [replicas_to_wire(r) for r in c.replicas]],
        lambda f: CreatePartitions(_str(f[0]), _bytes(f[1]), _int(f[2]), _partitions(f[3])),
        4,
    ),
    AlterTopicConfigs: _Codec(
        5,
        lambda c: [c.name, [list(o) for o in c.operations], c.replace],
        lambda f: AlterTopicConfigs(_str(f[0]), _operations(f[1]), _bool(f[2])),
        3,
    ),
    AllocateProducerIdBlock: _Codec(
        6,
        lambda c: [c.node],
        lambda f: AllocateProducerIdBlock(_int(f[0])),
        1,
    ),
    MovePartitions: _Codec(7, _moves_command_to_wire, _moves_command_from_wire, 3),
    CompleteMove: _Codec(
        8,
        lambda c: [c.name, c.topic_id, c.partition, replicas_to_wire(c.target)],
        lambda f: CompleteMove(_str(f[0]), _bytes(f[1]), _int(f[2]), replicas_from_wire(f[3])),
        4,
    ),
}
_BY_TAG = {codec.tag: codec for codec in _CODECS.values()}


def encode(command: Command) -> bytes:
    codec = _CODECS[type(command)]
    data: bytes = msgpack.packb([FORMAT, codec.tag, *codec.to_wire(command)], use_bin_type=True)
    assert len(data) <= limits.command_bytes_max, f"a command of {len(data)} bytes"
    return data


def decode(data: bytes | memoryview) -> Command:
    value = _unpack(data, limits.command_bytes_max, "command")
    if len(value) < 2:
        raise CommandError(f"a command is [format, tag, fields...], got {value!r:.80}")
    form, tag, fields = value[0], value[1], value[2:]
    codec = _BY_TAG.get(tag) if type(tag) is int else None
    if codec is None:
        raise CommandError(f"unknown command tag {tag!r:.80}")
    expected = codec.fields_in(form)
    if len(fields) != expected:
        raise CommandError(f"command tag {tag}: {len(fields)} fields, expected {expected} "
                           f"in format {form}")
    command: Command = codec.from_wire(fields)
    return command


def _unpack(data: bytes | memoryview, bytes_max: int, what: str) -> list[Any]:
    """A msgpack array whose first element is a format this node reads."""
    if len(data) > bytes_max:
        raise CommandError(f"a {what} of {len(data)} bytes is over the limit of {bytes_max}")
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError) as e:  # msgpack's errors are ValueErrors
        raise CommandError(f"a {what} that is not msgpack: {e}") from None
    if not isinstance(value, list) or not value:
        raise CommandError(f"a {what} is an array, format first; got {value!r:.80}")
    form = value[0]
    if type(form) is not int or not 1 <= form <= FORMAT:
        raise CommandError(f"{what} format {form!r:.80}; this node reads 1 to {FORMAT}")
    return value


# Snapshots -----------------------------------------------------------------------------------


class Snapshot(NamedTuple):
    """The whole cluster state at `version`, in the terms of the commands that could build
    it: `[FORMAT, version, next producer id, [node fields...], [CreateTopic fields...],
    {topic: moves}]` (the moves under way: format 3), nodes by id and topics by name, so
    equal states give equal bytes."""

    version: int
    next_producer_id: int
    nodes: tuple[NodeInfo, ...]
    topics: tuple[CreateTopic, ...]
    moves: Mapping[str, Mapping[int, Move]] = {}  # noqa: RUF012 (never mutated)


def encode_snapshot(snapshot: Snapshot) -> bytes:
    data: bytes = msgpack.packb(
        [
            FORMAT,
            snapshot.version,
            snapshot.next_producer_id,
            [list(n) for n in sorted(snapshot.nodes)],
            [_topic_to_wire(t) for t in sorted(snapshot.topics, key=lambda t: t.name)],
            {name: moves_to_wire(m) for name, m in sorted(snapshot.moves.items()) if m},
        ],
        use_bin_type=True,
    )
    assert len(data) <= limits.snapshot_bytes_max, f"a snapshot of {len(data)} bytes"
    return data


def decode_snapshot(data: bytes | memoryview) -> Snapshot:
    value = _unpack(data, limits.snapshot_bytes_max, "snapshot")
    if len(value) == 5:
        value.append({})  # before format 3: no moves
    if len(value) != 6 or not isinstance(value[3], list) or not isinstance(value[4], list) \
            or not isinstance(value[5], dict):
        raise CommandError("a snapshot is [format, version, next id, nodes, topics, moves]")
    if len(value[3]) > limits.nodes_max:
        raise CommandError(f"{len(value[3])} nodes is over nodes_max")
    for fields in (*value[3], *value[4]):
        if not isinstance(fields, list):
            raise CommandError(f"a snapshot entry is an array, got {fields!r:.80}")
    node_fields = _CODECS[RegisterNode].fields_in(value[0])
    if any(len(f) != node_fields for f in value[3]) or any(len(f) != 4 for f in value[4]):
        raise CommandError("a snapshot entry with the wrong number of fields")
    return Snapshot(
        _int(value[1]),
        _int(value[2]),
        tuple(_node(f) for f in value[3]),
        tuple(_topic_from_wire(f) for f in value[4]),
        {_str(name): moves_from_wire(m) for name, m in value[5].items()},
    )
