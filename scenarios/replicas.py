"""Every replica's log, read from its node's disk, and whether the replicas of each partition
agree: the check a cluster scenario ends with, once every fault is undone and the load is over.

The clients' history shows what was acknowledged and read; it cannot show a follower whose
log went another way, or stopped, while the leader served every read. So, after the calm
that follows the load, the runner reads each node's segment files (`read_node`: every
partition directory, `__consumer_offsets` and the controller's log included) and asks each
node's admin endpoint for its replicas (`/v1/partitions`: role, leader, log end, high
watermark), and polls until they agree or a bound passes (`converge`):

- on disk (`compare_logs`), every replica of a partition holds the same batches (base and
  last offset, leader epoch, CRC, length) from the highest start among them to its end. A
  replica's start is its log start (the first stored batch, or higher where DeleteRecords or
  retention moved it: `log-start-offset.json`), or where compaction has not cleaned yet
  (`cleaner-offset.json`): below that, replicas may differ by design (each one cleans and
  drops segments on its own schedule). Replicas of two incarnations of one topic name (their
  `partition.metadata` topic ids differ) are a difference too;
- by the admin endpoint (`compare_views`), every replica names one leader, and its log end
  and high watermark are the leader's: a follower left behind has stopped following; and
  then the leader counts every replica in sync (its `isr`);
- where an acknowledged DeleteRecords moved a partition's log start, every replica's log
  start is there or past it (`compare_log_starts`): Kafka answers DeleteRecords once every
  in-sync replica has moved it, and a replica below it would serve the deleted records again
  once it leads.

A difference is one line naming the partition, the nodes and where they part:

    workload-0-2: from offset 0: node 1 ends at 812, node 2 at 640, node 3 at 812;
        first difference at offset 640: node 1 (640..644 epoch 3), node 2 (none), ...

Files are read while the nodes run: a reader stops at the first incomplete, zeroed or
corrupt batch (a preallocated or torn tail, as recovery does), and a file that vanishes
while it is read (a segment removed by retention) makes the round try again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from wire.record_batch import HEADER_BYTES, BatchHeader, read_header

__all__ = ["CONTROLLER", "Convergence", "StoredBatch", "StoredLog", "behind",
           "compare_log_starts", "compare_logs", "compare_views", "converge",
           "leaders_high_watermarks", "read_log", "read_node", "synced_offsets",
           "whole_batches"]

CONTROLLER = "controller"  # the controller group's log, `_krill/controller`
NODE_DIR = "_krill"  # the node's own files: its controller log, hard states, cluster id
TRASH_SUFFIX = "-delete"  # a deleted or replaced incarnation's directory (storage/partition_dir.py)
LOG_START_FILE = "log-start-offset.json"  # storage/log.py
CLEANER_FILE = "cleaner-offset.json"  # storage/log.py
METADATA_FILE = "partition.metadata"
_CRC_START = 21  # a batch's CRC covers it from `attributes` to its end
# Batches of a difference shown on each side.
SHOWN_BATCHES = 3
CONVERGE_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """What identifies a batch across replicas: the leader's bytes, copied unchanged."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size: int

    def __str__(self) -> str:
        return f"{self.base_offset}..{self.last_offset} epoch {self.leader_epoch}"


@dataclass(slots=True)
class StoredLog:
    """One replica's log as its files hold it."""

    topic_id: str | None
    log_start: int
    clean_start: int  # below this, compaction may have cleaned: replicas differ by design
    batches: list[StoredBatch] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The offset after the last whole batch (the log start when there is none)."""
        return self.batches[-1].last_offset + 1 if self.batches else self.log_start

    def compared_from(self) -> int:
        return max(self.log_start, self.clean_start)


def whole_batches(data: bytes | memoryview, check_crc: bool = True) -> list[BatchHeader]:
    """The header of each whole batch of a segment's bytes, in order, up to the first
    incomplete, zeroed or (`check_crc`) corrupt one: a preallocated or torn tail, as
    recovery reads it (storage/recovery.py)."""
    headers = []
    position = 0
    view = memoryview(data)
    while position + HEADER_BYTES <= len(data):
        try:
            header = read_header(data, position)
        except ValueError:
            break
        end = position + header.size
        if end > len(data) or (check_crc and crc32c.crc32c(view[position + _CRC_START:end])
                               != header.crc):
            break
        headers.append(header)
        position = end
    return headers


def _state(directory: Path, name: str, key: str) -> int:
    try:
        return int(json.loads((directory / name).read_text())[key])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 0


def _topic_id(directory: Path) -> str | None:
    try:
        text = (directory / METADATA_FILE).read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


def read_log(directory: Path) -> StoredLog:
    """A replica's log from its directory's segment files. FileNotFoundError when a file
    went away while it was read (ask again)."""
    batches: list[StoredBatch] = []
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        for h in whole_batches(data):
            batches.append(StoredBatch(h.base_offset, h.last_offset, h.partition_leader_epoch,
                                       h.crc, h.size))
    saved_start = _state(directory, LOG_START_FILE, "log_start_offset")
    first = batches[0].base_offset if batches else 0
    return StoredLog(topic_id=_topic_id(directory), log_start=max(saved_start, first),
                     clean_start=_state(directory, CLEANER_FILE, "offset"), batches=batches)


def read_node(data_dir: Path) -> dict[str, StoredLog]:
    """Every replica a node's data directory holds, by `<topic>-<partition>` (internal topics
    included), and the controller's log as `controller`."""
    logs: dict[str, StoredLog] = {}
    for directory in sorted(data_dir.iterdir()):
        name = directory.name
        if directory.is_dir() and name != NODE_DIR and not name.endswith(TRASH_SUFFIX) \
                and name.rpartition("-")[2].isdigit():
            logs[name] = read_log(directory)
    controller = data_dir / NODE_DIR / "controller"
    if controller.is_dir():
        logs[CONTROLLER] = read_log(controller)
    return logs


def compare_logs(name: str, logs: Mapping[int, StoredLog]) -> str | None:
    """One line naming how the replicas of `name` (node -> its log) differ; None when they
    hold the same batches from the highest start among them to their end."""
    ids = {node: log.topic_id for node, log in logs.items() if log.topic_id is not None}
    if len(set(ids.values())) > 1:
        return f"{name}: replicas of different incarnations (topic ids {_said(ids)})"
    start = max(log.compared_from() for log in logs.values())
    kept = {node: [b for b in log.batches if b.last_offset >= start]
            for node, log in logs.items()}
    if len({tuple(batches) for batches in kept.values()}) == 1 \
            and len({log.end for log in logs.values()}) == 1:
        return None
    ends = ", ".join(f"node {node} ends at {log.end}" for node, log in sorted(logs.items()))
    first = _first_difference(kept)
    shown = "; ".join(
        f"node {node} ({', '.join(map(str, batches[first:first + SHOWN_BATCHES])) or 'none'})"
        for node, batches in sorted(kept.items()))
    at = min((b[first].base_offset for b in kept.values() if first < len(b)), default=start)
    return f"{name}: from offset {start}: {ends}; first difference at offset {at}: {shown}"


def _first_difference(kept: Mapping[int, list[StoredBatch]]) -> int:
    """The first batch index where the replicas' lists differ (or one of them ends)."""
    lists = list(kept.values())
    index = 0
    while all(index < len(batches) for batches in lists) \
            and len({batches[index] for batches in lists}) == 1:
        index += 1
    return index


def _said(values: Mapping[int, Any]) -> str:
    return ", ".join(f"node {node}: {value}" for node, value in sorted(values.items()))


def compare_views(views: Mapping[int, Any], expected: Mapping[tuple[str, int], list[int]]
                  ) -> list[str]:
    """What the nodes' `/v1/partitions` answers (node -> answer, None: no answer) say is
    wrong with each partition: a node that does not answer, a replica `expected` (partition
    -> its replicas, from Metadata) that no node lists, no one leader that every replica
    names, a replica whose log end or high watermark is not its leader's (it stopped
    following, or has not caught up yet), or a leader whose in-sync replicas leave out one
    that has caught up."""
    problems = [f"node {node}: /v1/partitions did not answer" for node, view in views.items()
                if view is None]
    replicas: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for node, view in views.items():
        for entry in (view or {}).get("partitions", ()):
            replicas.setdefault((entry["topic"], entry["partition"]), {})[node] = entry
    for (topic, partition), nodes in sorted(expected.items()):
        missing = [n for n in nodes if n not in replicas.get((topic, partition), {})
                   and views.get(n) is not None]
        if missing:
            problems.append(f"{topic}-{partition}: no replica listed on node(s) {missing}")
    for (topic, partition), entries in sorted(replicas.items()):
        problem = _replica_problem(entries)
        if problem:
            problems.append(f"{topic}-{partition}: {problem}")
    return problems


def _replica_problem(entries: Mapping[int, dict[str, Any]]) -> str | None:
    leaders = [node for node, e in entries.items() if e["role"] == "leader"]
    named = {node: e["leader"] for node, e in entries.items()}
    shown = "; ".join(f"node {node}: {e['role']}, log end {e['log_end']}, high watermark "
                      f"{e['high_watermark']}, leader {e['leader']}"
                      for node, e in sorted(entries.items()))
    if len(leaders) != 1:
        return f"{len(leaders)} leaders ({shown})"
    leader = entries[leaders[0]]
    if set(named.values()) != {leaders[0]}:
        return f"replicas name different leaders ({shown})"
    behind = [node for node, e in entries.items()
              if (e["log_end"], e["high_watermark"]) != (leader["log_end"],
                                                         leader["high_watermark"])]
    if behind:
        return f"node(s) {sorted(behind)} not at the leader's log end ({shown})"
    isr, replicas = leader.get("isr"), leader.get("replicas")
    if isr and replicas and set(isr) != set(replicas):
        return f"in-sync replicas {sorted(isr)} of {sorted(replicas)}, all caught up ({shown})"
    return None


def synced_offsets(views: Mapping[int, Any], node_id: int) -> dict[str, int]:
    """Per partition (`<topic>-<partition>`, its directory's name), the highest offset the
    other nodes' views say `node_id` holds durably: its match as its leader counts it (a
    follower acknowledges only what it synced), or the high watermark (committed)."""
    kept: dict[str, int] = {}
    for node, view in views.items():
        if node == node_id or view is None:
            continue
        for e in view.get("partitions", ()):
            name = f"{e['topic']}-{e['partition']}"
            best = e["high_watermark"] - 1
            if e["role"] == "leader":
                best = max(best, e["followers"].get(str(node_id), -1))
            kept[name] = max(kept.get(name, -1), best)
    return {name: offset for name, offset in kept.items() if offset >= 0}


def leaders_high_watermarks(views: Mapping[int, Any], node_id: int
                            ) -> dict[tuple[str, int], int]:
    """The high watermark of each partition `node_id` follows, as its leader answers."""
    return {(e["topic"], e["partition"]): e["high_watermark"]
            for node, view in views.items() if node != node_id and view
            for e in view.get("partitions", ()) if e["role"] == "leader"
            and str(node_id) in e["followers"]}


def behind(views: Mapping[int, Any], node_id: int, targets: Mapping[tuple[str, int], int]
           ) -> list[str]:
    """The partitions where `node_id`'s log end has not reached `targets` (or that it does
    not list), as 'topic-partition at <log end> of <target>'."""
    mine = {(e["topic"], e["partition"]): e
            for e in (views.get(node_id) or {}).get("partitions", ())}
    return [f"{t}-{p} at {mine[(t, p)]['log_end'] if (t, p) in mine else 'none'} of {target}"
            for (t, p), target in sorted(targets.items())
            if (t, p) not in mine or mine[(t, p)]["log_end"] < target]


@dataclass
class Convergence:
    """`converge`'s answer: whether the replicas agreed, after how long, what they compared,
    and the differences of the last round when they did not."""

    ok: bool
    seconds: float
    partitions: int  # replica sets compared on disk (the controller's log included)
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 1), "partitions": self.partitions,
                "problems": self.problems}


def compare_log_starts(name: str, logs: Mapping[int, StoredLog], deleted_below: int
                       ) -> str | None:
    """A replica whose log start is below where an acknowledged DeleteRecords moved it: it
    would serve the deleted records again once it leads."""
    low = {node: log.log_start for node, log in logs.items() if log.log_start < deleted_below}
    if not low:
        return None
    return (f"{name}: log start below {deleted_below}, where DeleteRecords moved it, on "
            f"{_said(low)}")


def converge(data_dirs: Mapping[int, Path], views: Callable[[], Mapping[int, Any]],
             expected: Mapping[tuple[str, int], list[int]], timeout_s: float,
             deleted_below: Mapping[str, int] | None = None) -> Convergence:
    """Poll the nodes' views and files until every partition's replicas agree (both checks
    above) and every replica's log start is at or past where an acknowledged DeleteRecords
    moved it (`deleted_below`: partition directory name -> offset), or `timeout_s` passes;
    the last round's differences then."""
    started = time.monotonic()
    while True:
        problems = compare_views(views(), expected)
        compared = 0
        try:
            logs = {node: read_node(d) for node, d in data_dirs.items()}
        except FileNotFoundError as e:  # a segment removed while read: the next round
            problems.append(f"a file went away while it was read: {e.filename}")
            logs = {}
        by_name: dict[str, dict[int, StoredLog]] = {}
        for node, held in logs.items():
            for name, log in held.items():
                by_name.setdefault(name, {})[node] = log
        for name, replicas in sorted(by_name.items()):
            compared += 1
            difference = compare_logs(name, replicas) if len(replicas) > 1 else None
            if difference:
                problems.append(difference)
            if name in (deleted_below or {}):
                low = compare_log_starts(name, replicas, (deleted_below or {})[name])
                if low:
                    problems.append(low)
        elapsed = time.monotonic() - started
        if not problems:
            return Convergence(True, elapsed, compared, [])
        if elapsed >= timeout_s:
            return Convergence(False, elapsed, compared, problems)
        time.sleep(CONVERGE_POLL_S)
