"""One node's configuration: what it is, where it comes from, and when it is wrong.

A `NodeConfig` is built once, by the supervisor's `krill start`, from four layers merged per
field: command-line flags, then `KRILL_<FIELD>` environment variables, then a YAML file, then
the defaults below (DESIGN.md §10). Compound `host:port` keys (`listen`, `advertise`,
`reader_listen`, `admin_listen`, `rpc_listen`) are split into their `*_host`/`*_port` fields
before the merge, so
`--listen 0.0.0.0:9092` and `KRILL_LISTEN_PORT=9000` combine field by field. The supervisor
hands the result to each shard process as JSON (`to_json`/`from_json`).

Every mistake is a `ConfigError` whose message is one line naming the source and the key, so
the CLI can print it as `krill: error: <message>` and stop. Every key is honoured or refused:
keys for work not built yet (O_DIRECT storage, nodes beyond the seeds) are refused with the
reason, never accepted and ignored.

A cluster is its seeds: `seeds` names every node's RPC address (`[id@]host:port`, the i-th
from 1 being node i when no id is given), and they are the voters of the controller's Raft
group. No seeds: a node of its own, with one replica per partition.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shards import limits
from storage import limits as storage_limits

__all__ = [
    "ConfigError",
    "NodeConfig",
    "load_config",
    "parse_host_port",
    "parse_seeds",
    "usable_cores",
]

MiB = 1024 * 1024
DAY_MS = 24 * 60 * 60 * 1000

ENV_PREFIX = "KRILL_"
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical")
STORAGE_MODES = ("buffered", "direct")  # page cache, or O_DIRECT (storage/appender.py)

# Keys a node will take once the work behind them is built; until then naming one is an error
# (key -> why). Empty now; kept so the next such key is refused the same way.
NOT_BUILT: dict[str, str] = {}

# Compound keys accepted in flags, the environment and the file: key -> (host field, port field).
HOST_PORT_KEYS = {
    "listen": ("listen_host", "listen_port"),
    "advertise": ("advertise_host", "advertise_port"),
    "reader_listen": ("reader_host", "reader_port"),
    "admin_listen": ("admin_host", "admin_port"),
    "rpc_listen": ("rpc_host", "rpc_port"),
}

# Below this a heartbeat interval is a busy loop, not a tick (10 ms: Python's loop turn under
# load is a few ms).
RAFT_HEARTBEAT_INTERVAL_MIN_MS = 10

# Hosts that mean "every interface": clients cannot connect to them, so never advertise them.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class ConfigError(ValueError):
    """A user's configuration mistake; the message is one line."""


def usable_cores() -> int:
    """The number of cores this process may run on (its CPU affinity, not the machine's)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class NodeConfig:
    data_dir: str = "./data"
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertise_host: str | None = None  # None: the listen host, or 127.0.0.1 for a wildcard
    advertise_port: int | None = None  # None: the listen port
    node_id: int = 0
    smp: int = field(default_factory=usable_cores)  # shard processes, one per core
    reader_host: str = "127.0.0.1"
    reader_port: int = 9093
    admin_host: str = "127.0.0.1"  # the admin HTTP endpoint: /metrics, /v1/status/ready
    admin_port: int = 9644
    # Node-to-node RPC (shards/node_mesh.py): shard k listens on rpc_port + k. Bound only in
    # a cluster (with seeds).
    rpc_host: str = "127.0.0.1"
    rpc_port: int = 33145
    # The cluster's nodes, comma-separated `[id@]host:port` RPC addresses (the controller's
    # voters); without `id@` the i-th, from 1, is node i. Empty: a node of its own.
    seeds: str = ""
    # Raft timing (Redpanda's names): the heartbeat interval is the Raft tick; a follower that
    # hears no leader campaigns after a random [T, 2T) of the election timeout T. Redpanda
    # beats every 150 ms; here every heartbeat of every idle group is Python work on both
    # ends, and 300 ms keeps 1,000 idle partitions x RF 3 near a tenth of a core per node
    # (bench `cluster`) while a follower still hears three beats per election timeout.
    raft_election_timeout_ms: int = 1000
    raft_heartbeat_interval_ms: int = 300
    # Kafka's replica.lag.time.max.ms: a follower that has not caught up with its leader's
    # log end for this long leaves the partition's in-sync replicas (actors/isr.py); one
    # whose node is not heard from for an election timeout leaves at once.
    replica_lag_time_max_ms: int = 30_000
    # Bytes per second the node's Raft leaders send the learners they are catching up (a
    # partition move's new replicas; Redpanda's raft_learner_recovery_rate), shared evenly by
    # its shards (actors/recovery_throttle.py); 0: not throttled.
    learner_recovery_rate_bytes: int = 32 * MiB
    disable_metrics: bool = False  # record nothing and serve no /metrics (Redpanda's name)
    # A loop turn this long or longer is a stall: counted, and its stack logged as it happens
    # (shards/loop_watch.py; Seastar's reactor stall detector). 0: no watchdog thread.
    loop_stall_threshold_ms: int = 10
    # One produce request in this many is timed stage by stage (actors/trace.py, the
    # krill_produce_stage_seconds histograms); 0: none.
    trace_produce_every: int = 0
    auto_create_topics: bool = True
    default_partitions: int = 1
    default_replicas: int = 1  # more than 1 only in a cluster, at most one per seed
    message_max_bytes: int = 1048588  # Kafka's default: 1 MiB plus the batch overhead
    segment_bytes: int = 128 * MiB
    segment_ms: int = 7 * DAY_MS
    # Node defaults of a topic's retention.ms and retention.bytes (Redpanda's names); -1: keep
    # everything.
    log_retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    # How often each shard looks for segments to delete and logs to compact (Redpanda's name).
    log_cleanup_interval_ms: int = 10_000
    # Bytes in flight per shard before its connections stop reading (shards/memory.py).
    memory_budget_bytes: int = limits.shard_memory_budget_bytes
    # Each shard's shared memory (shards/arena.py): large produce requests are received into
    # it and batches for other shards' partitions cross by reference. 0: fresh buffers and
    # pipe frames instead.
    pipe_arena_bytes: int = limits.pipe_arena_bytes
    # Shards that accept Kafka connections: 0 means all. A bench and test knob: with 1, every
    # connection lands on shard 0, so partitions owned elsewhere take the cross-core path.
    kafka_shards: int = 0
    # Kafka connections the node keeps open at once (Redpanda's kafka_connections_max); past
    # it a new connection is closed at once. Split evenly over the accepting shards.
    kafka_connections_max: int = limits.kafka_connections_max
    # Partitions each shard may own (Redpanda's name); CreateTopics past it is refused.
    topic_partitions_per_shard: int = limits.topic_partitions_per_shard
    offsets_topic_partitions: int = 50  # __consumer_offsets partitions (Kafka's default)
    group_initial_rebalance_delay_ms: int = 3000  # Kafka's group.initial.rebalance.delay.ms
    # Committed offsets of a group Empty this long expire (Kafka offsets.retention.minutes,
    # 7 days); looked for this often (Redpanda's names).
    group_offset_retention_sec: int = 7 * 24 * 3600
    group_offset_retention_check_ms: int = 600_000
    # Kafka's transaction.max.timeout.ms: an InitProducerId asking a longer transaction
    # timeout is answered INVALID_TRANSACTION_TIMEOUT.
    transaction_max_timeout_ms: int = 900_000
    # Kafka's transactional.id.expiration.ms: a transactional id with no transaction for this
    # long is forgotten (its producer id with it).
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    storage_mode: str = "buffered"  # "buffered" (page cache) or "direct" (O_DIRECT)
    # Direct mode: each shard's write memory and cache of recent batches (storage/appender.py).
    direct_memory_bytes: int = storage_limits.direct_memory_bytes_default
    # Produces are refused (KAFKA_STORAGE_ERROR) while the data disk has less free than this
    # (Redpanda's name; storage/free_space.py); 0: no guard, writes go until ENOSPC.
    storage_min_free_bytes: int = limits.storage_min_free_bytes
    # The admin API's /v1/failure-probes (slow or failing fdatasync) may be used (Redpanda's
    # name); off, they answer 403. For fault-injection tests and scenarios, never production.
    enable_failure_injection: bool = False
    log_level: str = "info"

    def __post_init__(self) -> None:
        # Structural checks only: smp against the usable cores is checked in load_config,
        # because a shard process reading this back from JSON is pinned to a single core.
        for name, value in dataclasses.asdict(self).items():
            _check_type(name, value)
        for name in ("listen_port", "reader_port", "admin_port", "rpc_port"):
            _check_port(name, getattr(self, name))
        if self.advertise_port is not None:
            _check_port("advertise_port", self.advertise_port)
        for name in ("listen_host", "reader_host", "admin_host", "rpc_host"):
            _check_host(name, getattr(self, name), wildcard_ok=True)
        if self.advertise_host is not None:
            _check_host("advertise_host", self.advertise_host, wildcard_ok=False)
        for name in ("smp", "default_partitions", "default_replicas", "message_max_bytes",
                     "segment_bytes", "segment_ms", "memory_budget_bytes",
                     "offsets_topic_partitions", "kafka_connections_max",
                     "topic_partitions_per_shard"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("log_retention_ms", "retention_bytes"):
            if getattr(self, name) < -1:
                raise ConfigError(f"{name} must be -1 (no limit) or more, not "
                                  f"{getattr(self, name)}")
        if self.log_cleanup_interval_ms < 1:
            raise ConfigError("log_cleanup_interval_ms must be at least 1, not "
                              f"{self.log_cleanup_interval_ms}")
        for name, zero in (("storage_min_free_bytes", "no guard"),
                           ("trace_produce_every", "none"),
                           ("learner_recovery_rate_bytes", "not throttled"),
                           ("loop_stall_threshold_ms", "no watchdog")):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 ({zero}) or more, not "
                                  f"{getattr(self, name)}")
        if self.pipe_arena_bytes < 0:
            raise ConfigError(f"pipe_arena_bytes must not be negative, not {self.pipe_arena_bytes}")
        for name in ("group_offset_retention_sec", "group_offset_retention_check_ms",
                     "transaction_max_timeout_ms", "transactional_id_expiration_ms",
                     "replica_lag_time_max_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.group_initial_rebalance_delay_ms < 0:
            raise ConfigError("group_initial_rebalance_delay_ms must not be negative, not "
                              f"{self.group_initial_rebalance_delay_ms}")
        if not 0 <= self.kafka_shards <= self.smp:
            raise ConfigError(f"kafka_shards must be 0..smp ({self.smp}), not {self.kafka_shards}")
        if self.node_id < 0:
            raise ConfigError(f"node_id must not be negative, not {self.node_id}")
        if not self.data_dir:
            raise ConfigError("data_dir must not be empty")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.storage_mode not in STORAGE_MODES:
            raise ConfigError(f"storage_mode must be 'buffered' or 'direct', not "
                              f"{self.storage_mode!r}")
        least = 2 * storage_limits.direct_chunk_bytes
        if self.direct_memory_bytes < least:
            raise ConfigError(f"direct_memory_bytes must be at least {least} (two chunks), "
                              f"not {self.direct_memory_bytes}")
        self._check_raft_timing()
        self._check_cluster()
        self._check_overlaps()

    def _check_raft_timing(self) -> None:
        heartbeat, election = self.raft_heartbeat_interval_ms, self.raft_election_timeout_ms
        if heartbeat < RAFT_HEARTBEAT_INTERVAL_MIN_MS:
            raise ConfigError(f"raft_heartbeat_interval_ms must be at least "
                              f"{RAFT_HEARTBEAT_INTERVAL_MIN_MS}, not {heartbeat}")
        if election < 3 * heartbeat:
            raise ConfigError(f"raft_election_timeout_ms must be at least 3 heartbeat intervals "
                              f"({3 * heartbeat}), not {election}")

    def _check_cluster(self) -> None:
        seeds = self.seed_nodes  # parsed and checked once, then cached
        if not seeds:
            if self.default_replicas != 1:
                raise ConfigError(f"default_replicas {self.default_replicas} needs a cluster: "
                                  "set seeds")
            return
        if self.rpc_port + self.smp - 1 > 65535:  # bound only in a cluster
            raise ConfigError(f"rpc_port {self.rpc_port} leaves no port for each of the "
                              f"{self.smp} shards (rpc_port + shard must be at most 65535)")
        ids = ", ".join(map(str, seeds))
        if self.node_id not in seeds:
            raise ConfigError(f"node_id {self.node_id} is not one of the seeds ({ids}): every "
                              "node of a cluster is a seed; nodes beyond the seeds are not "
                              "built yet")
        own_host, own_port = seeds[self.node_id]
        if own_port != self.rpc_port:
            raise ConfigError(f"seeds give node {self.node_id} the RPC address "
                              f"{own_host}:{own_port}, but its rpc_port is {self.rpc_port}")
        if self.default_replicas > len(seeds):
            raise ConfigError(f"default_replicas {self.default_replicas} is more than the "
                              f"{len(seeds)} seed node(s)")

    def _check_overlaps(self) -> None:
        addresses = [("listen", self.listen), ("reader_listen", self.reader_listen),
                     ("admin_listen", self.admin_listen)]
        # The RPC ports are bound only in a cluster; a node of its own may reuse them.
        if self.seed_nodes:
            addresses += [(f"rpc_listen (shard {k})" if k else "rpc_listen",
                           (self.rpc_host, self.rpc_port + k)) for k in range(self.smp)]
        for a, (name_a, address_a) in enumerate(addresses):
            for name_b, address_b in addresses[a + 1:]:
                if _overlap(address_a, address_b):
                    raise ConfigError(f"{name_a} and {name_b} must differ, not "
                                      f"{address_a[0]}:{address_a[1]} and "
                                      f"{address_b[0]}:{address_b[1]}")

    @functools.cached_property
    def seed_nodes(self) -> dict[int, tuple[str, int]]:
        """The cluster's nodes: node id -> (RPC host, RPC port of its shard 0), in the seeds'
        order; empty for a node of its own. (A frozen dataclass still has a `__dict__`, where
        cached_property keeps the parse; `seeds` stays the string, for the JSON hand-off.)"""
        return parse_seeds(self.seeds)

    @property
    def raft_election_ticks(self) -> int:
        """The election timeout in Raft ticks (one tick per heartbeat interval)."""
        return max(3, round(self.raft_election_timeout_ms / self.raft_heartbeat_interval_ms))


    @property
    def advertise(self) -> tuple[str, int]:
        """The (host, port) clients are told to connect to in Metadata responses."""
        host = self.advertise_host
        if host is None:
            host = "127.0.0.1" if self.listen_host in WILDCARD_HOSTS else self.listen_host
        port = self.listen_port if self.advertise_port is None else self.advertise_port
        return host, port

    @property
    def listen(self) -> tuple[str, int]:
        return self.listen_host, self.listen_port

    @property
    def reader_listen(self) -> tuple[str, int]:
        return self.reader_host, self.reader_port

    @property
    def admin_listen(self) -> tuple[str, int]:
        return self.admin_host, self.admin_port

    @property
    def rpc_listen(self) -> tuple[str, int]:
        """Shard 0's RPC address; shard k listens on the port + k."""
        return self.rpc_host, self.rpc_port

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"node config JSON is malformed: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError("node config JSON must be an object")
        unknown = sorted(set(values) - set(_FIELD_TYPES))
        if unknown:
            raise ConfigError(f"node config JSON has unknown key(s): {', '.join(unknown)}")
        return cls(**values)


# Field name -> the scalar type it holds (Optional fields map to their inner type).
_FIELD_TYPES: dict[str, type] = {
    "data_dir": str, "listen_host": str, "listen_port": int, "advertise_host": str,
    "advertise_port": int, "node_id": int, "smp": int, "reader_host": str, "reader_port": int,
    "admin_host": str, "admin_port": int, "disable_metrics": bool,
    "loop_stall_threshold_ms": int, "trace_produce_every": int, "auto_create_topics": bool,
    "default_partitions": int, "default_replicas": int, "message_max_bytes": int,
    "segment_bytes": int, "segment_ms": int, "log_retention_ms": int, "retention_bytes": int,
    "log_cleanup_interval_ms": int, "memory_budget_bytes": int,
    "pipe_arena_bytes": int, "offsets_topic_partitions": int, "kafka_shards": int,
    "kafka_connections_max": int, "topic_partitions_per_shard": int,
    "group_initial_rebalance_delay_ms": int, "group_offset_retention_sec": int,
    "group_offset_retention_check_ms": int, "transaction_max_timeout_ms": int,
    "transactional_id_expiration_ms": int, "storage_mode": str, "log_level": str,
    "direct_memory_bytes": int,
    "storage_min_free_bytes": int, "enable_failure_injection": bool,
    "rpc_host": str, "rpc_port": int, "seeds": str, "raft_election_timeout_ms": int,
    "raft_heartbeat_interval_ms": int, "replica_lag_time_max_ms": int,
    "learner_recovery_rate_bytes": int,
}
_OPTIONAL_FIELDS = ("advertise_host", "advertise_port")
assert set(_FIELD_TYPES) == {f.name for f in dataclasses.fields(NodeConfig)}


def _overlap(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Whether two listening addresses collide: one port, and one host or a wildcard."""
    return a[1] == b[1] and (a[0] == b[0] or a[0] in WILDCARD_HOSTS or b[0] in WILDCARD_HOSTS)


def _check_type(name: str, value: object) -> None:
    if value is None and name in _OPTIONAL_FIELDS:
        return
    expected = _FIELD_TYPES[name]
    # bool is a subclass of int: `listen_port: true` must not pass as port 1.
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be {_TYPE_WORDS[expected]}, not {value!r}")


_TYPE_WORDS = {str: "a string", int: "an integer", bool: "true or false"}


def _check_port(name: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be between 1 and 65535, not {port}")


def _check_host(name: str, host: str, wildcard_ok: bool) -> None:
    if not wildcard_ok and host in WILDCARD_HOSTS:
        raise ConfigError(f"{name} must be an address clients can reach, not {host!r}")
    if host == "" or any(c.isspace() for c in host) or "/" in host:
        raise ConfigError(f"{name} is not a valid host: {host!r}")


def parse_host_port(text: str, what: str = "address") -> tuple[str, int]:
    """Split `host:port` (or `[ipv6]:port`) into a host and a port in 1..65535.

    >>> parse_host_port("0.0.0.0:9092")
    ('0.0.0.0', 9092)
    >>> parse_host_port("[::1]:9093")
    ('::1', 9093)
    """
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be host:port, not {text!r}")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        ok = sep == "]" and rest.startswith(":")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        ok = sep == ":" and ":" not in host
    if not ok or not host or any(c.isspace() for c in host):
        raise ConfigError(f"{what} must be host:port, not {text!r}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what} {text!r} has a bad port: use 1-65535")
    return host, int(port_text)


def parse_seeds(text: str) -> dict[int, tuple[str, int]]:
    """The seeds' `[id@]host:port,...` as node id -> (host, port); without `id@`, the i-th
    entry (from 1) is node i.

    >>> parse_seeds("127.0.0.1:33145,127.0.0.1:33245")
    {1: ('127.0.0.1', 33145), 2: ('127.0.0.1', 33245)}
    >>> parse_seeds("7@node-a:33145")
    {7: ('node-a', 33145)}
    """
    nodes: dict[int, tuple[str, int]] = {}
    if not text.strip():
        return nodes
    for i, entry in enumerate(text.split(","), start=1):
        entry = entry.strip()
        id_text, at, address = entry.rpartition("@")
        if at and not id_text.isdigit():
            raise ConfigError(f"seeds entry {entry!r} must be [id@]host:port with a "
                              "non-negative integer id")
        node = int(id_text) if at else i
        host, port = parse_host_port(address, "seeds entry")
        if host in WILDCARD_HOSTS:
            raise ConfigError(f"seeds entry {entry!r} must name an address other nodes can "
                              f"reach, not {host!r}")
        if node in nodes:
            raise ConfigError(f"seeds name node {node} twice")
        if (host, port) in nodes.values():
            raise ConfigError(f"seeds name the address {host}:{port} twice")
        nodes[node] = host, port
    return nodes


def _convert(name: str, value: Any, label: str) -> Any:
    """Turn a raw value from the environment or the file into the field's type."""
    expected = _FIELD_TYPES[name]
    if value is None and name in _OPTIONAL_FIELDS:
        return None
    if expected is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    elif expected is str:
        if name == "seeds" and isinstance(value, list):  # YAML's list of `[id@]host:port`
            if all(isinstance(entry, str) for entry in value):
                return ",".join(value)
            raise ConfigError(f"{label} must be a list of [id@]host:port strings, not {value!r}")
        if isinstance(value, str):
            return value.lower() if name in ("log_level", "storage_mode") else value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # YAML reads `data_dir: 2024` as an integer
    raise ConfigError(f"{label} must be {_TYPE_WORDS[expected]}, not {value!r}")


def _layer(
    raw: Mapping[str, Any], label: Callable[[str], str], strict: str | None = None
) -> dict[str, Any]:
    """Map one source's keys to field values; with `strict` (the source's name), keys that
    are not ours are an error.

    `label(key)` names a key in error messages (`--listen`, `KRILL_LISTEN`, ...). None means
    "not given" and is skipped, so a lower layer's value stands.
    """
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if key in NOT_BUILT:
            raise ConfigError(f"{label(key)}: not supported: {NOT_BUILT[key]}")
        if key in HOST_PORT_KEYS:
            host_field, port_field = HOST_PORT_KEYS[key]
            values[host_field], values[port_field] = parse_host_port(value, label(key))
        elif key in _FIELD_TYPES:
            values[key] = _convert(key, value, label(key))
        elif strict is not None:
            raise ConfigError(f"{strict}: unknown key {key!r}")
    return values


def _flag_label(key: str) -> str:
    return "--" + key.replace("_", "-")


def _env_label(key: str) -> str:
    return ENV_PREFIX + key.upper()


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    raw = {key: environ[_env_label(key)] for key in (*HOST_PORT_KEYS, *_FIELD_TYPES, *NOT_BUILT)
           if environ.get(_env_label(key), "") != ""}
    return _layer(raw, _env_label)


def _file_layer(path: str) -> dict[str, Any]:
    import yaml  # only `krill start --config` needs it

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path!r} is not valid YAML{where}: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path!r} must be a mapping of key: value")
    for key in raw:
        if not isinstance(key, str):
            raise ConfigError(f"config file {path!r}: unknown key {key!r}")
    source = f"config file {path!r}"
    return _layer(raw, lambda key: f"{source}: {key}", strict=source)


def load_config(
    args: argparse.Namespace | Mapping[str, Any],
    environ: Mapping[str, str],
    config_file: str | None,
) -> NodeConfig:
    """Merge flags > environment > file > defaults into a checked `NodeConfig`.

    `args` holds flag values under field names or the compound keys (`listen`, ...); None
    means "not given", and keys that are not configuration (`command`, ...) are ignored.
    """
    flags = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(_file_layer(config_file))
    merged.update(_env_layer(environ))
    merged.update(_layer(flags, _flag_label))
    config = NodeConfig(**merged)
    cores = usable_cores()
    if config.smp > cores:
        raise ConfigError(f"smp {config.smp} is more than the {cores} usable core(s)")
    accepting = config.kafka_shards or config.smp
    if config.kafka_connections_max < accepting:
        raise ConfigError(f"kafka_connections_max must be at least the {accepting} shards "
                          f"that accept connections, not {config.kafka_connections_max}")
    return config


def reader_advertised(config: NodeConfig) -> str:
    """The reader address the Spark source is told to connect to (never a wildcard)."""
    host, port = config.reader_listen
    if host in ("0.0.0.0", "::", ""):
        host = config.advertise[0]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
