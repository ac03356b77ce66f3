"""The steps of a simulated scenario: when each happens, what it does, what it checks.

A step is `at: <time since start>` or `after: <condition>`, and one action (the schema is
scenarios/sim/schema.py; the keys are documented in README-section.md):

    {at: 2s, hold: {from: 0, to: 1}}            # pipe 0->1 keeps what is sent on it
    {after: {held: {from: 0, to: 1, count: 1}}, deliver: {from: 0, to: 1}}
    {at: 3s, drop: {from: 0, to: 1, count: 1}}  # the next message on 0->1 is lost
    {at: 3s, delay: {from: 1, to: 0, ms: 200}}  # the next one arrives 200 ms late
    {at: 4s, fsync_error: {shard: 1}}           # its next fdatasync fails (EIO)
    {at: 4s, slow_disk: {ms: 50}, for: 2s}      # every fdatasync 50 ms slower, for 2 s
    {at: 5s, crash: shard 1, for: 500ms}        # lose what was not synced; restart after
    {at: 6s, restart: shard 1}
    {at: 7s, expect: {partition: t/0, high_watermark: {at_least: 10}}}

Every fault is undone when the workload ends (held messages delivered, shards restarted, the
disk fast again), so the consumers can read everything at the end. An `after` step whose
condition never came true fails its check; so does an `expect` that does not hold.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from scenarios.sim.clock import VirtualLoop
    from scenarios.sim.cluster import SimNode
    from scenarios.sim.disk import SimDisk
    from scenarios.sim.pipes import SimPipeNetwork

__all__ = ["crash", "finish", "parse_duration", "restart", "schedule", "undo_all"]

CONDITION_POLL_S = 0.001  # how often (simulated) an `after` condition is looked at
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}
_PARTITION_FIELDS = {"high_watermark": "high_watermark", "log_end_offset": "next_offset",
                     "flushed_offset": "flushed_offset", "written_offset": "written_offset",
                     "log_start_offset": "log_start_offset"}


class World(Protocol):
    """What the steps need of the simulation (scenarios/sim/engine.py's): its node, pipes and
    disk to fault, its clock, and where faults and checks are noted."""

    loop: VirtualLoop
    node: SimNode
    network: SimPipeNetwork
    disk: SimDisk
    shards: int
    fault_rng: random.Random
    figures: defaultdict[str, Any]
    acked: int
    open_faults: dict[str, tuple[str, int]]
    pending_steps: dict[int, dict[str, Any]]
    steps_done: set[int]

    def open_fault(self, key: str, name: str) -> None: ...
    def close_fault(self, key: str) -> None: ...
    def instant_fault(self, name: str) -> None: ...
    def check(self, step: int, what: str, ok: bool, got: Any, want: Any) -> None: ...
    async def partition_info(self, topic: str, index: int) -> dict[str, int] | None: ...


def parse_duration(value: Any, rng: random.Random | None = None) -> float:
    """Seconds from `2s`, `500ms`, `1.5m` or a plain number of seconds; a range `2s..5s` is
    drawn from `rng`."""
    if isinstance(value, int | float):
        return float(value)
    if ".." in str(value) and rng is not None:
        low, high = str(value).split("..")
        return rng.uniform(parse_duration(low), parse_duration(high))
    match = _DURATION.match(str(value))
    if match is None:
        raise ValueError(f"not a duration: {value!r} (say 2s, 500ms or 1m)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_target(value: Any) -> int | None:
    """`shard 1` -> 1; `node` -> None (every shard)."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text == "node" or text == "node 0":
        return None
    if text.startswith("shard "):
        return int(text.split()[1])
    raise ValueError(f"not a target: {value!r} (say 'shard 1' or 'node')")


def schedule(sim: World, steps: list[dict[str, Any]]) -> None:
    sim.pending_steps = {}
    for index, step in enumerate(steps):
        if "at" in step:
            sim.loop.call_at(parse_duration(step["at"], sim.fault_rng), _run, sim, index, step)
        else:
            sim.pending_steps[index] = step
    if sim.pending_steps:
        sim.loop.call_later(CONDITION_POLL_S, _poll_conditions, sim)


def _poll_conditions(sim: World) -> None:
    for index, step in list(sim.pending_steps.items()):
        if _condition(sim, step["after"]):
            del sim.pending_steps[index]
            _run(sim, index, step)
    if sim.pending_steps:
        sim.loop.call_later(CONDITION_POLL_S, _poll_conditions, sim)


def _condition(sim: World, after: dict[str, Any]) -> bool:
    if "acked" in after:
        return sim.acked >= int(after["acked"])
    if "produce_requests" in after:
        return bool(sim.figures["produce_requests"] >= int(after["produce_requests"]))
    if "held" in after:
        held = after["held"]
        pipe = sim.network.pipe(int(held["from"]), int(held["to"]))
        return len(pipe.held) >= int(held.get("count", 1))
    if "step" in after:
        return int(after["step"]) in sim.steps_done
    raise ValueError(f"unknown condition {after!r}")


def _run(sim: World, index: int, step: dict[str, Any]) -> None:
    for action, do in _ACTIONS.items():
        if action in step:
            do(sim, index, step)
            break
    else:
        raise ValueError(f"step {index} has no action: {step!r}")
    sim.steps_done.add(index)


def _pipe(sim: World, args: dict[str, Any]) -> Any:
    return sim.network.pipe(int(args["from"]), int(args["to"]))


def _pipe_name(args: dict[str, Any]) -> str:
    return f"{args['from']}->{args['to']}"


def _hold(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["hold"]
    _pipe(sim, args).holding = True
    sim.open_fault(f"hold {_pipe_name(args)}", f"hold pipe {_pipe_name(args)}")
    _undo_later(sim, step, lambda: _release(sim, args, None))


def _deliver(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["deliver"]
    _release(sim, args, args.get("count"))


def _release(sim: World, args: dict[str, Any], count: int | None) -> None:
    pipe = _pipe(sim, args)
    pipe.release(None if count is None else int(count))
    if not pipe.holding:
        sim.close_fault(f"hold {_pipe_name(args)}")


def _discard(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["discard"]
    count = args.get("count")
    _pipe(sim, args).discard(None if count is None else int(count))
    sim.instant_fault(f"discard held on pipe {_pipe_name(args)}")


def _drop(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["drop"]
    count = int(args.get("count", 1))
    _pipe(sim, args).drop_next += count
    sim.instant_fault(f"drop {count} on pipe {_pipe_name(args)}")


def _delay(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["delay"]
    count = int(args.get("count", 1))
    _pipe(sim, args).delay_next.extend([float(args["ms"]) / 1000] * count)
    sim.instant_fault(f"delay {count} on pipe {_pipe_name(args)} by {args['ms']} ms")


def _fsync_error(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["fsync_error"]
    count = int(args.get("count", 1))
    sim.disk.fail_next(int(args["shard"]), count)
    sim.instant_fault(f"fsync_error shard {args['shard']} x{count}")


def _slow_disk(sim: World, index: int, step: dict[str, Any]) -> None:
    args = step["slow_disk"]
    sim.node.slow_fsync_s = float(args["ms"]) / 1000
    sim.open_fault("slow_disk", f"slow_disk +{args['ms']} ms")
    _undo_later(sim, step, lambda: _fast_disk(sim))


def _fast_disk(sim: World) -> None:
    sim.node.slow_fsync_s = 0.0
    sim.close_fault("slow_disk")


def _crash(sim: World, index: int, step: dict[str, Any]) -> None:
    target = parse_target(step["crash"])
    shards = range(sim.shards) if target is None else [target]
    for shard in shards:
        crash(sim, shard)
    def restart_all() -> None:
        for shard in shards:
            restart(sim, shard)

    _undo_later(sim, step, restart_all)


def _restart(sim: World, index: int, step: dict[str, Any]) -> None:
    target = parse_target(step["restart"])
    for shard in range(sim.shards) if target is None else [target]:
        restart(sim, shard)


def crash(sim: World, shard: int) -> None:
    if sim.node.up(shard) is None:
        return
    sim.node.crash_shard(shard)
    sim.open_fault(f"crash {shard}", f"crash shard {shard}")


def restart(sim: World, shard: int) -> None:
    if sim.node.up(shard) is not None:
        return
    sim.node.start_shard(shard)
    sim.close_fault(f"crash {shard}")


def _undo_later(sim: World, step: dict[str, Any], undo: Any) -> None:
    if "for" in step:
        sim.loop.call_later(parse_duration(step["for"]), undo)


def undo_all(sim: World) -> None:
    """The workload is over: every fault still in force is undone."""
    for (source, target), pipe in sorted(sim.network.pipes.items()):
        if pipe.holding or pipe.held:
            _release(sim, {"from": source, "to": target}, None)
        pipe.drop_next = 0
        pipe.delay_next.clear()
    sim.network.faults.drop_rate = sim.network.faults.delay_rate = 0.0
    sim.node.fsync_fail_off()
    _fast_disk(sim)
    for shard in range(sim.shards):
        restart(sim, shard)


def finish(sim: World) -> None:
    """`after` steps that never ran fail their check; faults still open are closed."""
    for index, step in sorted(sim.pending_steps.items()):
        sim.check(index, f"after {step['after']}", False, "never happened", "to happen")
    sim.pending_steps.clear()
    for key in list(sim.open_faults):
        sim.close_fault(key)


# Expectations -------------------------------------------------------------------------------


def _expect(sim: World, index: int, step: dict[str, Any]) -> None:
    want = dict(step["expect"])
    if "partition" in want:
        topic, _, number = str(want.pop("partition")).rpartition("/")
        sim.loop.create_task(_expect_partition(sim, index, topic, int(number), want))
    elif "acked" in want:
        _compare(sim, index, "acked", sim.acked, want["acked"])
    elif "held" in want:
        held = want["held"]
        pipe = sim.network.pipe(int(held["from"]), int(held["to"]))
        _compare(sim, index, f"held {_pipe_name(held)}", len(pipe.held), want["count"])
    elif "group" in want:
        _expect_group(sim, index, str(want["group"]), want)
    else:
        raise ValueError(f"step {index}: nothing to expect in {want!r}")


async def _expect_partition(sim: World, index: int, topic: str, number: int,
                            want: dict[str, Any]) -> None:
    info = await sim.partition_info(topic, number)
    for key, wanted in want.items():
        what = f"{topic}/{number} {key}"
        if info is None:
            sim.check(index, what, False, "shard down", wanted)
            continue
        _compare(sim, index, what, info[_PARTITION_FIELDS[key]], wanted)


def _expect_group(sim: World, index: int, group_id: str, want: dict[str, Any]) -> None:
    states = []
    for shard in range(sim.shards):
        running = sim.node.up(shard)
        actor = None if running is None else running.coordinator_actor()
        group = None if actor is None else actor._groups.get(group_id)
        if group is not None:
            states.append((group.state.value, group.member_count))
    state, members = states[0] if states else ("Dead", 0)
    if "state" in want:
        _compare(sim, index, f"group {group_id} state", state, want["state"])
    if "members" in want:
        _compare(sim, index, f"group {group_id} members", members, want["members"])


def _compare(sim: World, index: int, what: str, got: Any, wanted: Any) -> None:
    """`wanted` is a value, or {at_least: n} / {at_most: n}."""
    if isinstance(wanted, dict):
        ok = True
        if "at_least" in wanted:
            ok = ok and got >= wanted["at_least"]
        if "at_most" in wanted:
            ok = ok and got <= wanted["at_most"]
    else:
        ok = got == wanted
    sim.check(index, what, ok, got, wanted)


_ACTIONS = {
    "hold": _hold, "deliver": _deliver, "discard": _discard, "drop": _drop, "delay": _delay,
    "fsync_error": _fsync_error, "slow_disk": _slow_disk, "crash": _crash,
    "restart": _restart, "expect": _expect,
}
