"""The committed `wire/messages` must equal what the generator makes from the specs today,
and the generator's small parsers must do what the spec format needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from wire.codegen import generate as gen

pytestmark = pytest.mark.timeout(60)

needs_specs = pytest.mark.skipif(
    not gen.DEFAULT_SPECS.is_dir(), reason=f"specs folder {gen.DEFAULT_SPECS} is absent"
)


@needs_specs
def test_committed_messages_are_not_stale(tmp_path: Path) -> None:
    assert gen.main(["--out", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.py")}
    committed = {p.name: p.read_text() for p in gen.DEFAULT_OUT.glob("*.py")}
    stale = sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))
    assert not stale, f"run `python -m wire.codegen.generate`; stale: {stale}"


@needs_specs
def test_check_flag_reports_a_stale_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gen.main(["--out", str(tmp_path)]) == 0
    assert gen.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "produce.py").write_text(gen.HEADER + "# edited by hand\n")
    (tmp_path / "left_over.py").write_text(gen.HEADER)
    assert gen.main(["--out", str(tmp_path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "produce.py" in out and "left_over.py" in out


@needs_specs
def test_every_generated_file_says_so() -> None:
    for path in gen.DEFAULT_OUT.glob("*.py"):
        assert path.read_text().startswith(gen.HEADER), path


def test_strip_comments_keeps_slashes_inside_strings() -> None:
    text = '{ "a": "http://x//y", // gone\n  "b": "say \\"//\\"" } // also gone'
    assert gen.strip_comments(text) == '{ "a": "http://x//y", \n  "b": "say \\"//\\"" } '


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0+", (0, None)), ("3-7", (3, 7)), ("5", (5, 5)), ("none", None), (None, None)],
)
def test_parse_range(text: str | None, expected: tuple[int, int | None] | None) -> None:
    assert gen.parse_range(text) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("PartitionIndex", "partition_index"),
        ("TopicData", "topic_data"),
        ("KRaftVersion", "k_raft_version"),
        ("V3AndBelowTopics", "v3_and_below_topics"),
        ("isKRaftController", "is_k_raft_controller"),
        ("From", "from_"),
    ],
)
def test_snake(name: str, expected: str) -> None:
    assert gen.snake(name) == expected


def test_defaults_from_spec_strings() -> None:
    def field(type_: str, default: object) -> gen.FieldSpec:
        return gen.FieldSpec("X", "x", type_, (0, None), None, None, None, "inherit", default, "")

    assert gen.default_value(field("int32", "0x7fffffff")) == 0x7FFFFFFF
    assert gen.default_value(field("int64", "-1")) == -1
    assert gen.default_value(field("int16", -2)) == -2
    assert gen.default_value(field("bool", "true")) is True
    assert gen.default_value(field("string", "null")) is None
    assert gen.default_value(field("string", None)) == ""
    assert gen.default_value(field("[]int32", "null")) is None
    assert gen.default_value(field("[]int32", None)) == []
    assert gen.default_value(field("uuid", None)) == bytes(16)
