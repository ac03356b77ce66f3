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
        # Keys for work not built yet are refused, with why; never accepted and ignored.
        ("rpc_port", "33145", r"(?i)rpc.port: not supported: node-to-node RPC comes with"),
        ("seeds", "127.0.0.1:33145", r"(?i)seeds: not supported: clusters of several nodes"),
        ("storage_mode", "direct", r"storage_mode 'direct' \(O_DIRECT\) is not built yet"),
        ("default_replicas", "3", "default_replicas must be 1, not 3: replication"),
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
