"""The end-of-run replica check (scenarios/replicas.py) on hand-made data directories and
`/v1/partitions` answers: replicas that agree pass; a follower left behind, a log that went
another way, two incarnations of one name, a torn tail, each found and named; what replicas
may differ in by design (DeleteRecords' log start, a segment dropped by retention) is not.
And the power cut (scenarios/power_loss.py) never takes a batch known to be synced."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from scenarios.power_loss import cachestat_available, lose_unsynced
from scenarios.replicas import (
    CONTROLLER,
    behind,
    compare_log_starts,
    compare_logs,
    compare_views,
    converge,
    leaders_high_watermarks,
    read_node,
    synced_offsets,
)
from wire.record_batch import patch_base_offset
from wire.records import build_batch

pytestmark = pytest.mark.timeout(30)

TOPIC_ID = "8B4rO2z7SPGlqw0VzxuhTg"


def batch(base: int, records: int, epoch: int, fill: bytes = b"v") -> bytes:
    data = build_batch([(None, fill * 20, ()) for _ in range(records)], base_timestamp=1)
    patch_base_offset(data, 0, base, epoch)
    return bytes(data)


def replica(data_dir: Path, name: str, segments: dict[int, list[bytes]],
            topic_id: str | None = TOPIC_ID, log_start: int | None = None) -> Path:
    """A partition directory as a node writes it: segment files named by base offset."""
    directory = data_dir / name
    directory.mkdir(parents=True)
    if topic_id is not None:
        (directory / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
    for base, batches in segments.items():
        (directory / f"{base:020d}.log").write_bytes(b"".join(batches))
    if log_start is not None:
        (directory / "log-start-offset.json").write_text(f'{{"log_start_offset": {log_start}}}')
    return directory


def log_of(base: int = 0) -> list[bytes]:
    """Three batches: 0..1 and 2..4 in epoch 1, 5 in epoch 2 (from `base` on)."""
    return [batch(base, 2, 1), batch(base + 2, 3, 1), batch(base + 5, 1, 2)]


def nodes(tmp_path: Path, logs: dict[int, dict[int, list[bytes]]], **kw: Any) -> dict[int, Path]:
    dirs = {}
    for node, segments in logs.items():
        dirs[node] = tmp_path / f"node-{node}"
        replica(dirs[node], "t-0", segments, **kw)
    return dirs


def difference(dirs: dict[int, Path], name: str = "t-0") -> str | None:
    return compare_logs(name, {node: read_node(d)[name] for node, d in dirs.items()})


def test_replicas_with_the_same_batches_agree(tmp_path: Path) -> None:
    dirs = nodes(tmp_path, {1: {0: log_of()}, 2: {0: log_of()}, 3: {0: log_of()}})
    assert difference(dirs) is None
    held = read_node(dirs[1])["t-0"]
    assert (held.topic_id, held.log_start, held.end, len(held.batches)) == (TOPIC_ID, 0, 6, 3)


def test_a_replica_left_behind_is_named_with_where_it_ends(tmp_path: Path) -> None:
    dirs = nodes(tmp_path, {1: {0: log_of()}, 2: {0: log_of()[:1]}, 3: {0: log_of()}})
    found = difference(dirs)
    assert found is not None
    assert "node 1 ends at 6, node 2 ends at 2, node 3 ends at 6" in found
    assert "first difference at offset 2" in found and "node 2 (none)" in found


def test_a_replica_that_went_another_way_is_found(tmp_path: Path) -> None:
    other = log_of()[:2] + [batch(5, 1, 3)]  # offset 5 written in another term
    dirs = nodes(tmp_path, {1: {0: log_of()}, 2: {0: other}, 3: {0: log_of()}})
    found = difference(dirs)
    assert found is not None and "first difference at offset 5" in found
    assert "node 1 (5..5 epoch 2)" in found and "node 2 (5..5 epoch 3)" in found
    # The same offsets and epoch, other bytes: the CRC tells them apart.
    changed = log_of()[:2] + [batch(5, 1, 2, fill=b"w")]
    assert difference(nodes(tmp_path / "b", {1: {0: log_of()}, 2: {0: changed}})) is not None


def test_what_replicas_may_differ_in_by_design_is_no_difference(tmp_path: Path) -> None:
    # Node 1 dropped its first segment (retention); node 2 keeps it but DeleteRecords moved
    # its log start past it; node 3 has all: from the highest start (2) on they agree.
    first, rest = log_of()[:1], log_of()[1:]
    dirs = {1: tmp_path / "n1", 2: tmp_path / "n2", 3: tmp_path / "n3"}
    replica(dirs[1], "t-0", {2: rest})
    replica(dirs[2], "t-0", {0: first, 2: rest}, log_start=2)
    replica(dirs[3], "t-0", {0: first, 2: rest})
    assert difference(dirs) is None
    assert read_node(dirs[2])["t-0"].log_start == 2


def test_a_replica_below_where_delete_records_moved_the_log_start_is_named(
        tmp_path: Path) -> None:
    # DeleteRecords to 2 reached nodes 1 and 2, not node 3 (issue 26, defect 8): from the
    # highest start the logs agree, but node 3 would serve 0..1 again once it leads.
    dirs = {1: tmp_path / "n1", 2: tmp_path / "n2", 3: tmp_path / "n3"}
    replica(dirs[1], "t-0", {0: log_of()}, log_start=2)
    replica(dirs[2], "t-0", {0: log_of()}, log_start=2)
    replica(dirs[3], "t-0", {0: log_of()})
    logs = {node: read_node(d)["t-0"] for node, d in dirs.items()}
    assert compare_logs("t-0", logs) is None
    assert compare_log_starts("t-0", logs, 2) == (
        "t-0: log start below 2, where DeleteRecords moved it, on node 3: 0")
    assert compare_log_starts("t-0", logs, 0) is None
    views = {n: view(n, ("t", 0, "leader" if n == 1 else "follower", 1, 6, 6)) for n in dirs}
    done = converge(dirs, lambda: views, {("t", 0): [1, 2, 3]}, 0, deleted_below={"t-0": 2})
    assert done.problems == ["t-0: log start below 2, where DeleteRecords moved it, on node 3: 0"]


def test_a_torn_tail_is_read_up_to_the_last_whole_batch(tmp_path: Path) -> None:
    torn = log_of()
    torn[-1] = torn[-1][: len(torn[-1]) // 2]
    dirs = nodes(tmp_path, {1: {0: log_of()}, 2: {0: torn + [b"\0" * 100]}})
    assert read_node(dirs[2])["t-0"].end == 5
    assert "node 2 ends at 5" in (difference(dirs) or "")


def test_replicas_of_two_incarnations_differ(tmp_path: Path) -> None:
    dirs = {1: tmp_path / "n1", 2: tmp_path / "n2"}
    replica(dirs[1], "t-0", {0: log_of()})
    replica(dirs[2], "t-0", {0: log_of()}, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    assert "replicas of different incarnations" in (difference(dirs) or "")


def test_a_node_holds_its_partitions_internal_ones_and_the_controller_log(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "node-1"
    for name in ("t-0", "__consumer_offsets-7", "old-0.Zm9v-delete"):
        replica(data_dir, name, {0: log_of()})
    (data_dir / "_krill" / "shard-0").mkdir(parents=True)
    replica(data_dir / "_krill", "controller", {0: log_of()}, topic_id=None)
    assert sorted(read_node(data_dir)) == ["__consumer_offsets-7", CONTROLLER, "t-0"]


def view(node: int, *entries: tuple[str, int, str, int, int, int]) -> dict[str, Any]:
    """A `/v1/partitions` answer: (topic, partition, role, leader, log end, high watermark)."""
    return {"node_id": node, "partitions": [
        {"topic": t, "partition": p, "role": role, "leader": leader, "term": 3,
         "log_end": end, "high_watermark": hw, "followers": {}, "quiesced": False}
        for t, p, role, leader, end, hw in entries]}


def test_views_of_caught_up_replicas_agree() -> None:
    views = {1: view(1, ("t", 0, "leader", 1, 9, 9)), 2: view(2, ("t", 0, "follower", 1, 9, 9)),
             3: view(3, ("t", 0, "follower", 1, 9, 9))}
    assert compare_views(views, {("t", 0): [1, 2, 3]}) == []


def test_views_name_a_replica_that_stopped_following() -> None:
    views = {1: view(1, ("t", 0, "leader", 1, 9, 9)), 2: view(2, ("t", 0, "follower", 1, 7, 7)),
             3: view(3, ("t", 0, "follower", 1, 9, 9))}
    [problem] = compare_views(views, {("t", 0): [1, 2, 3]})
    assert problem.startswith("t-0: node(s) [2] not at the leader's log end")
    assert "node 2: follower, log end 7, high watermark 7, leader 1" in problem


def test_views_name_a_caught_up_replica_left_out_of_the_in_sync_replicas() -> None:
    views = {1: view(1, ("t", 0, "leader", 1, 9, 9)), 2: view(2, ("t", 0, "follower", 1, 9, 9)),
             3: view(3, ("t", 0, "follower", 1, 9, 9))}
    views[1]["partitions"][0].update(replicas=[1, 2, 3], isr=[1, 2, 3])
    assert compare_views(views, {("t", 0): [1, 2, 3]}) == []
    views[1]["partitions"][0]["isr"] = [1, 2]
    [problem] = compare_views(views, {("t", 0): [1, 2, 3]})
    assert problem.startswith("t-0: in-sync replicas [1, 2] of [1, 2, 3], all caught up")


def test_views_name_no_leader_two_leaders_a_missing_replica_and_a_silent_node() -> None:
    views: dict[int, Any] = {
        1: view(1, ("t", 0, "follower", -1, 9, 9), ("t", 1, "leader", 1, 4, 4)),
        2: view(2, ("t", 0, "follower", -1, 9, 9), ("t", 1, "leader", 2, 4, 4)),
        3: None}
    problems = compare_views(views, {("t", 0): [1, 2, 3], ("t", 1): [1, 2], ("t", 2): [1]})
    assert problems[0] == "node 3: /v1/partitions did not answer"
    assert problems[1] == "t-2: no replica listed on node(s) [1]"
    assert problems[2].startswith("t-0: 0 leaders") and problems[3].startswith("t-1: 2 leaders")


def test_what_a_power_loss_keeps_and_when_the_node_has_caught_up() -> None:
    # Node 3 lost power: t-0's leader (1) counted its match at 7 (past the high watermark,
    # 5); t-1's leader was node 3 itself, so the others' high watermark (9) is what is known.
    views: dict[int, Any] = {
        1: view(1, ("t", 0, "leader", 1, 9, 6), ("t", 1, "follower", 2, 9, 9)),
        2: view(2, ("t", 0, "follower", 1, 9, 5), ("t", 1, "leader", 2, 9, 10)),
        3: None}
    views[1]["partitions"][0]["followers"] = {"2": 8, "3": 7}
    views[2]["partitions"][1]["followers"] = {"1": 9}
    assert synced_offsets(views, 3) == {"t-0": 7, "t-1": 9}
    # Back, it follows t-0 (led by 1) and must reach its high watermark there.
    views[3] = view(3, ("t", 0, "follower", 1, 4, 4))
    assert leaders_high_watermarks(views, 3) == {("t", 0): 6}
    assert behind(views, 3, {("t", 0): 6, ("t", 1): 10}) == ["t-0 at 4 of 6", "t-1 at none of 10"]
    assert behind(views, 3, {("t", 0): 4}) == []


def test_converge_waits_for_agreement_or_says_what_differs(tmp_path: Path) -> None:
    dirs = nodes(tmp_path, {1: {0: log_of()}, 2: {0: log_of()}})
    views = {1: view(1, ("t", 0, "leader", 1, 6, 6)), 2: view(2, ("t", 0, "follower", 1, 6, 6))}
    done = converge(dirs, lambda: views, {("t", 0): [1, 2]}, timeout_s=5)
    assert done.ok and done.partitions == 1 and done.problems == []
    behind = {**views, 2: view(2, ("t", 0, "follower", 1, 5, 5))}
    (dirs[2] / "t-0" / f"{0:020d}.log").write_bytes(b"".join(log_of()[:2]))
    done = converge(dirs, lambda: behind, {("t", 0): [1, 2]}, timeout_s=0)
    assert not done.ok and len(done.problems) == 2, done.problems
    assert done.to_json()["problems"][1].startswith("t-0: from offset 0: node 1 ends at 6")


@pytest.mark.skipif(not cachestat_available(), reason="cachestat(2) (Linux 6.5)")
def test_a_power_cut_keeps_what_a_leader_counted_as_synced(tmp_path: Path) -> None:
    # Three batches synced, one more written after: the cut comes at the first dirty page,
    # which also holds the synced third batch's tail; told the third batch (offsets 2..4)
    # was acknowledged, the cut keeps it and takes only the unsynced one.
    directory = tmp_path / "t-0"
    directory.mkdir()
    path = directory / f"{0:020d}.log"
    synced = b"".join([batch(0, 40, 1), batch(40, 40, 1), batch(80, 40, 1)])
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, synced)
        os.fdatasync(fd)
        os.write(fd, batch(120, 40, 1))
    finally:
        os.close(fd)
    page = os.sysconf("SC_PAGE_SIZE")
    assert len(synced) % page, "the test needs the synced end inside a page"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / path.name).write_bytes(path.read_bytes())  # written, never synced: all dirty
    assert lose_unsynced(bare) == {path.name: 0}
    assert lose_unsynced(directory, synced_offset=119) == {path.name: len(synced)}
    assert path.read_bytes() == synced
