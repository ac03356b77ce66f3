"""NodeConfig: layer precedence, host:port parsing, validation, and the JSON hand-off."""

from __future__ import annotations

import argparse
import os

import pytest

from shards.config import ConfigError, NodeConfig, load_config, parse_host_port, usable_cores

pytestmark = pytest.mark.timeout(60)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "krill.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_follow_design_section_10():
    config = load_config({}, {}, None)
    assert config.data_dir == "./data"
    assert config.listen == ("127.0.0.1", 9092)
    assert config.advertise == ("127.0.0.1", 9092)
    assert config.reader_listen == ("127.0.0.1", 9093)
    assert config.admin_listen == ("127.0.0.1", 9644)
    assert config.node_id == 0
    assert config.disable_metrics is False
    assert config.smp == len(os.sched_getaffinity(0))
    assert config.message_max_bytes == 1048588
    assert config.segment_bytes == 128 * 1024 * 1024
    assert config.segment_ms == 7 * 24 * 3600 * 1000
    assert config.auto_create_topics is True
    assert config.log_level == "info"


def test_flags_beat_env_beat_file_beat_defaults(tmp_path):
    path = write(
        tmp_path, "data_dir: /from/file\nnode_id: 3\nlisten: 10.0.0.1:9000\nsegment_ms: 1000\n"
    )
    env = {"KRILL_DATA_DIR": "/from/env", "KRILL_NODE_ID": "4"}
    flags = argparse.Namespace(
        data_dir="/from/flag", node_id=None, listen=None, command="start", config=path
    )
    config = load_config(flags, env, path)
    assert config.data_dir == "/from/flag"  # flag over env and file
    assert config.node_id == 4  # env over file
    assert config.listen == ("10.0.0.1", 9000)  # file over default
    assert config.segment_ms == 1000
    assert config.segment_bytes == NodeConfig().segment_bytes  # default


def test_compound_and_field_keys_merge_field_by_field(tmp_path):
    path = write(tmp_path, "listen: 0.0.0.0:9000\n")
    config = load_config({}, {"KRILL_LISTEN_PORT": "9100"}, path)
    assert config.listen == ("0.0.0.0", 9100)
    config = load_config({"listen": "127.0.0.2:9200"}, {"KRILL_LISTEN": "127.0.0.3:9300"}, path)
    assert config.listen == ("127.0.0.2", 9200)


def test_advertise_defaults():
    assert load_config({"listen": "0.0.0.0:9500"}, {}, None).advertise == ("127.0.0.1", 9500)
    assert load_config({"listen": "10.1.2.3:9500"}, {}, None).advertise == ("10.1.2.3", 9500)
    config = load_config(
        {"listen": "0.0.0.0:9500"}, {"KRILL_ADVERTISE": "kafka.example:19092"}, None
    )
    assert config.advertise == ("kafka.example", 19092)
    assert NodeConfig(advertise_port=7000).advertise == ("127.0.0.1", 7000)


def test_env_types_are_converted():
    config = load_config(
        {},
        {
            "KRILL_SMP": "1",
            "KRILL_AUTO_CREATE_TOPICS": "false",
            "KRILL_READER_LISTEN": "[::1]:9999",
            "KRILL_LOG_LEVEL": "DEBUG",
            "KRILL_BROKERS": "ignored:1",
        },
        None,
    )
    assert config.smp == 1
    assert config.auto_create_topics is False
    assert config.reader_listen == ("::1", 9999)
    assert config.log_level == "debug"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("localhost:9092", ("localhost", 9092)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("[::]:65535", ("::", 65535)),
        ("node-1.cluster.local:33145", ("node-1.cluster.local", 33145)),
    ],
)
def test_parse_host_port(text, expected):
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "nonsense",
        "9092",
        ":9092",
        "host:",
        "host:0",
        "host:65536",
        "host:-1",
        "host:x",
        "::1:9092",
        "[::1]9092",
        "a b:9092",
    ],
)
def test_parse_host_port_rejects(text):
    with pytest.raises(ConfigError, match="host:port|bad port"):
        parse_host_port(text)


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ({"smp": 0}, {}, "smp must be at least 1"),
        ({"smp": usable_cores() + 1}, {}, "usable core"),
        ({"listen": "nonsense"}, {}, "--listen must be host:port"),
        ({"admin_port": 70000}, {}, "admin_port must be between 1 and 65535"),
        ({"admin_listen": "127.0.0.1:9092"}, {}, "listen and admin_listen must differ"),
        ({"admin_listen": "0.0.0.0:9092"}, {}, "listen and admin_listen must differ"),
        ({"smp": 1, "kafka_connections_max": 0}, {}, "kafka_connections_max must be at least 1"),
        ({}, {"KRILL_DISABLE_METRICS": "perhaps"}, "KRILL_DISABLE_METRICS must be true"),
        ({}, {"KRILL_KAFKA_CONNECTIONS_MAX": "0"}, "kafka_connections_max must be at least 1"),
        ({}, {"KRILL_LISTEN_PORT": "0"}, "listen_port must be between 1 and 65535"),
        ({}, {"KRILL_SEGMENT_BYTES": "0"}, "segment_bytes must be at least 1"),
        ({}, {"KRILL_MESSAGE_MAX_BYTES": "-5"}, "message_max_bytes must be at least 1"),
        ({}, {"KRILL_SMP": "many"}, "KRILL_SMP must be an integer"),
        (
            {},
            {"KRILL_AUTO_CREATE_TOPICS": "maybe"},
            "KRILL_AUTO_CREATE_TOPICS must be true or false",
        ),
        ({}, {"KRILL_LOG_LEVEL": "loud"}, "log_level must be one of"),
        ({"advertise": "0.0.0.0:9092"}, {}, "advertise_host must be an address clients can reach"),
    ],
)
def test_validation_errors_are_one_line(flags, env, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(flags, env, None)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        # Keys for work not built yet (and values no mode has) are refused, with why.
        ("storage_mode", "mmap", r"storage_mode must be 'buffered' or 'direct', not 'mmap'"),
        ("direct_memory_bytes", "4096", "direct_memory_bytes must be at least 262144"),
        ("default_replicas", "3", "default_replicas 3 needs a cluster: set seeds"),
        ("seeds", "127.0.0.1:33145", r"node_id 0 is not one of the seeds \(1\): every node"),
    ],
)
def test_keys_for_later_work_are_refused_from_every_source(tmp_path, key, value, message):
    sources = [
        ({key: value}, {}, None),
        ({}, {f"KRILL_{key.upper()}": value}, None),
        ({}, {}, write(tmp_path, f"{key}: {value}\n")),
    ]
    for flags, env, path in sources:
        with pytest.raises(ConfigError, match=message) as info:
            load_config(flags, env, path)
        assert "\n" not in str(info.value)


def test_ports_may_repeat_on_other_hosts():
    config = load_config({"listen": "127.0.0.1:9100", "admin_listen": "127.0.0.2:9100"}, {}, None)
    assert config.admin_listen == ("127.0.0.2", 9100)


def test_connections_max_covers_every_accepting_shard():
    with pytest.raises(ConfigError, match="at least the 2 shards that accept connections"):
        load_config({"smp": 2, "kafka_connections_max": 1}, {}, None)
    config = load_config({"smp": 2, "kafka_shards": 1, "kafka_connections_max": 1}, {}, None)
    assert config.kafka_connections_max == 1


def test_the_admin_address_takes_both_spellings(tmp_path):
    assert load_config({"admin_port": 9700}, {}, None).admin_listen == ("127.0.0.1", 9700)
    config = load_config({}, {}, write(tmp_path, "admin_listen: 0.0.0.0:9701\n"))
    assert config.admin_listen == ("0.0.0.0", 9701)
    assert load_config({}, {"KRILL_DISABLE_METRICS": "true"}, None).disable_metrics is True


def test_file_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(ConfigError, match="config file '.*missing.yaml' not found"):
        load_config({}, {}, str(tmp_path / "missing.yaml"))
    path = write(tmp_path, "data_dir: /d\nlisten_prot: 9092\n")
    with pytest.raises(ConfigError, match="unknown key 'listen_prot'"):
        load_config({}, {}, path)
    path = write(tmp_path, "listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config({}, {}, path)
    path = write(tmp_path, "- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config({}, {}, path)
    path = write(tmp_path, "listen_port: true\n")
    with pytest.raises(ConfigError, match="listen_port must be an integer"):
        load_config({}, {}, path)
    path = write(tmp_path, "advertise: nowhere\n")
    with pytest.raises(ConfigError, match="advertise must be host:port"):
        load_config({}, {}, path)


def test_empty_file_is_all_defaults(tmp_path):
    assert load_config({}, {}, write(tmp_path, "")) == load_config({}, {}, None)


def test_json_round_trip():
    config = NodeConfig(
        data_dir="/var/lib/krill",
        listen_host="0.0.0.0",
        listen_port=19092,
        advertise_host="broker.example",
        node_id=7,
        smp=1,
        auto_create_topics=False,
        segment_bytes=4096,
        log_level="debug",
    )
    assert NodeConfig.from_json(config.to_json()) == config
    assert NodeConfig.from_json(NodeConfig().to_json()) == NodeConfig()


def test_from_json_rejects_bad_documents():
    with pytest.raises(ConfigError, match="unknown key"):
        NodeConfig.from_json('{"data_dir": "/d", "surprise": 1}')
    with pytest.raises(ConfigError, match="malformed"):
        NodeConfig.from_json("{")
    with pytest.raises(ConfigError, match="listen_port must be an integer"):
        NodeConfig.from_json('{"listen_port": "9092"}')


def test_from_json_does_not_check_smp_against_this_process_cores():
    # A shard process pinned to one core still reads the node's smp.
    config = NodeConfig(smp=usable_cores() + 8)
    assert NodeConfig.from_json(config.to_json()).smp == usable_cores() + 8


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        NodeConfig().data_dir = "/elsewhere"  # type: ignore[misc]


# A cluster: seeds, node RPC, replicas, Raft timing ------------------------------------------

THREE = "127.0.0.1:33145,127.0.0.1:33245,127.0.0.1:33345"


def cluster(**flags):
    """A node of the three-seed cluster of issue 17's example, node 1 unless told."""
    values = {"seeds": THREE, "node_id": 1, "smp": 1, **flags}
    return load_config(values, {}, None)


def test_no_seeds_is_a_node_of_its_own():
    config = load_config({}, {}, None)
    assert config.seeds == ""
    assert config.seed_nodes == {}
    assert config.rpc_listen == ("127.0.0.1", 33145)
    assert config.default_replicas == 1
    assert config.raft_election_timeout_ms == 1000
    assert config.raft_heartbeat_interval_ms == 300


def test_seeds_without_ids_count_from_one():
    config = cluster(default_replicas=3)
    assert config.seed_nodes == {
        1: ("127.0.0.1", 33145), 2: ("127.0.0.1", 33245), 3: ("127.0.0.1", 33345),
    }  # fmt: skip
    assert config.default_replicas == 3
    assert config.seeds == THREE  # the string, as given: it goes to the shards as JSON


def test_seeds_with_ids_and_every_source(tmp_path):
    seeds = "7@10.0.0.7:33145, 9@[::1]:4000"
    expected = {7: ("10.0.0.7", 33145), 9: ("::1", 4000)}
    flags = {"node_id": 9, "rpc_listen": "[::1]:4000", "smp": 1}
    assert load_config({**flags, "seeds": seeds}, {}, None).seed_nodes == expected
    assert load_config(flags, {"KRILL_SEEDS": seeds}, None).seed_nodes == expected
    path = write(tmp_path, "seeds:\n  - 7@10.0.0.7:33145\n  - 9@[::1]:4000\n")
    assert load_config(flags, {}, path).seed_nodes == expected  # YAML's list
    path = write(tmp_path, f"seeds: '{seeds}'\n")
    assert load_config(flags, {}, path).seed_nodes == expected  # or one string


def test_rpc_address_from_every_spelling(tmp_path):
    assert load_config({"rpc_port": 40000}, {}, None).rpc_listen == ("127.0.0.1", 40000)
    assert load_config({}, {"KRILL_RPC_LISTEN": "0.0.0.0:40001"}, None).rpc_listen == (
        "0.0.0.0", 40001)
    config = load_config({}, {"KRILL_RPC_PORT": "40002"}, write(tmp_path, "rpc_host: 10.0.0.1\n"))
    assert config.rpc_listen == ("10.0.0.1", 40002)


def test_seed_nodes_survive_the_json_hand_off():
    config = cluster(default_replicas=2)
    back = NodeConfig.from_json(config.to_json())
    assert back == config
    assert back.seed_nodes == config.seed_nodes


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"seeds": "127.0.0.1"}, r"seeds entry must be host:port, not '127.0.0.1'"),
        ({"seeds": "127.0.0.1:33145,,127.0.0.1:33345"}, r"seeds entry must be host:port, not ''"),
        ({"seeds": "x@127.0.0.1:33145"}, r"seeds entry 'x@127.0.0.1:33145' must be \[id@\]"),
        ({"seeds": "-1@127.0.0.1:33145"}, r"must be \[id@\]host:port"),
        ({"seeds": "127.0.0.1:70000"}, r"seeds entry '127.0.0.1:70000' has a bad port"),
        ({"seeds": "0.0.0.0:33145"}, r"must name an address other nodes can reach"),
        ({"seeds": "1@127.0.0.1:33145,1@127.0.0.1:33245"}, r"seeds name node 1 twice"),
        ({"seeds": "127.0.0.1:33145,2@127.0.0.1:33245,2@127.0.0.1:33345"},
         r"seeds name node 2 twice"),
        ({"seeds": "127.0.0.1:33145,127.0.0.1:33145"},
         r"seeds name the address 127.0.0.1:33145 twice"),
        ({"node_id": 4}, r"node_id 4 is not one of the seeds \(1, 2, 3\): every node of a "
                         r"cluster is a seed; nodes beyond the seeds are not built yet"),
        ({"node_id": 2}, r"seeds give node 2 the RPC address 127.0.0.1:33245, but its "
                         r"rpc_port is 33145"),
        ({"rpc_port": 65535, "seeds": "1@127.0.0.1:65535", "smp": 2},
         r"rpc_port 65535 leaves no port for each of the 2 shards"),
        ({"rpc_port": 0}, r"rpc_port must be between 1 and 65535"),
        ({"rpc_listen": "[::1"}, r"--rpc-listen must be host:port"),
        ({"default_replicas": 4}, r"default_replicas 4 is more than the 3 seed node\(s\)"),
        ({"default_replicas": 0}, r"default_replicas must be at least 1, not 0"),
        ({"listen": "127.0.0.1:33145"}, r"listen and rpc_listen must differ"),
        ({"admin_listen": "0.0.0.0:33145"}, r"admin_listen and rpc_listen must differ"),
        ({"reader_listen": "127.0.0.1:33146", "smp": 2},
         r"reader_listen and rpc_listen \(shard 1\) must differ, not 127.0.0.1:33146"),
        ({"raft_heartbeat_interval_ms": 9}, r"raft_heartbeat_interval_ms must be at least 10"),
        ({"raft_heartbeat_interval_ms": 100, "raft_election_timeout_ms": 299},
         r"raft_election_timeout_ms must be at least 3 heartbeat intervals \(300\), not 299"),
    ],
)  # fmt: skip
def test_cluster_mistakes_are_one_line(flags, message):
    if flags.get("smp", 1) > usable_cores():
        pytest.skip("needs more usable cores")
    with pytest.raises(ConfigError, match=message) as info:
        cluster(**flags)
    assert "\n" not in str(info.value)


def test_a_single_seed_cluster_is_legal():
    config = load_config({"seeds": "1@127.0.0.1:40000", "node_id": 1, "rpc_port": 40000}, {}, None)
    assert config.seed_nodes == {1: ("127.0.0.1", 40000)}


def test_rpc_ports_may_overlap_other_ports_without_seeds():
    # Without seeds nothing binds them: a test's free Kafka port may well be 33145.
    config = load_config({"listen": "127.0.0.1:33145"}, {}, None)
    assert config.listen == config.rpc_listen


def test_yaml_seeds_must_be_strings(tmp_path):
    path = write(tmp_path, "seeds: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"seeds must be a list of \[id@\]host:port strings"):
        load_config({}, {}, path)


@pytest.mark.parametrize(
    "election_ms, heartbeat_ms, ticks",
    [(1000, 150, 7), (450, 150, 3), (300, 100, 3), (1000, 100, 10), (1049, 100, 10),
     (1050, 100, 10), (1051, 100, 11), (30, 10, 3)],
)
def test_election_timeout_in_ticks(election_ms, heartbeat_ms, ticks):
    config = NodeConfig(raft_election_timeout_ms=election_ms,
                        raft_heartbeat_interval_ms=heartbeat_ms)
    assert config.raft_election_ticks == ticks
