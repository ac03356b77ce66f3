"""Issue #3's cases: 2 shards against 1, and the cross-core produce path against the local one.

Each case compares two set-ups ("sides") in one run. On this shared virtual machine the CPU
a gigabyte costs drifts by 2x within a minute, far more than the effects measured here. So
the two sides run side by side, and the produce phase is repeated in `rounds` rounds in ABBA
order (A then B, B then A, ...): each round measures both sides within seconds of each other,
and the case reports every round, each side's median, and the median over rounds of the
per-round ratio, which is the figure the targets are checked against. Consume and fixed-rate
phases run once per side after the rounds.

Each round produces into a topic of its own and first deletes the side's previous one, so
the page cache stays the size of one round, as a broker's does in steady state (retention
deletes as fast as producers write). Growing it instead made each gigabyte up to 10x dearer
late in a run: a page the page cache takes for the first time has to be handed over by the
hypervisor (this guest gives freed pages back), while a page freed a moment ago is reused
at once. A raw write + fdatasync loop shows the same step after ~1 GiB of fresh pages.

Where the client runs decides much of what a gigabyte costs here. This machine has two
cores, so the bench's client (Python plus librdkafka's threads) shares a core with a shard.
On the core of the shard that took its connection, the request bytes are still in that
core's cache when the broker reads them (a loopback hand-over), which no remote client
gives; on the other core, they arrive cold, as from a network card. Left to the scheduler,
the client sits on whichever core is idle, and that is a different core for each side of a
comparison: with one shard busy it takes the idle one, with two busy it is spread over both.
So each case pins the client (`CLIENT_PLACEMENTS`): its rounds run with the client on a core
other than the connection's (every node here takes its connections on shard 0), the
placement the targets are checked in, as nearest to a client across a network; then fewer
rounds on the connection's core, and unpinned, reported beside it.

What bounds produce throughput here is the client. A pinned client keeps its core full in
every round (`client_core_busy`, `shards_on_client_core_busy`): beside one shard it has the
core to itself, beside two it has what shard 1 leaves it, and B's msg/s over A's is close
to that share (`_client_bound_prediction`). Even the cheapest client (`produce_max_batched`,
run in `BATCHED_ROUNDS` more rounds) needs more than one core to keep one shard's core busy
(`client_cores_to_fill_one_shard`), and beside that shard this machine leaves it one.

Both cases first measure the floor under their targets: one bare round trip over the real
pipes between two pinned processes (bench/pipe_floor.py), and set it beside the CPU each
target leaves per forwarded request (`_forward_figures`).

    python -m bench.run --case shards_1_vs_2 --case cross_core_vs_local [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.broker import Broker, RssSampler, log
from bench.clients import (
    consume_all,
    create_topic,
    delete_topic,
    produce_fixed_rate,
    produce_max,
    produce_max_batched,
)
from bench.measure import (
    EnvBroker,
    ProcessCpu,
    broker_live_figures,
    broker_stop_figures,
    idle_cpu,
    liveness,
)
from bench.pipe_floor import measure_pipe_round_trip
from bench.produce_consume import FIXED_RATE
from bench.report import (
    CaseError,
    case_failed,
    compare,
    finish,
    get_path,
    header,
    ratio,
    vs_ceiling,
)

__all__ = ["run_cross_core_vs_local", "run_shards_1_vs_2"]

TARGET_CPU_PER_GB_2_OVER_1 = 1.1  # broker CPU-s per GB produced, --smp 2 over --smp 1
TARGET_PRODUCE_2_OVER_1 = 1.0  # produce msg/s, --smp 2 over --smp 1
TARGET_CROSS_OVER_LOCAL_CPU_PER_GB = 1.3  # produce, cross-core partition over local one
VALUE_BYTES = 1024
PARTITIONS = 6  # the produce_consume_1k_x6 workload
ROUNDS = 10
# Of the produce requests a --smp 2 node takes in the 1 KiB x 6 workload, the share that is
# forwarded: librdkafka sends one partition per ProduceRequest over one connection, the
# client spreads messages round-robin, and the shard table gives each shard three of the six
# partitions; so half the requests go to the shard that did not accept the connection.
FORWARDED_SHARE_2_SHARDS = 0.5
PIPE_FLOOR_ROUND_TRIPS = 20_000
# Round trips of the handoff floor (bench/pipe_floor.py), each handing over a request's bytes.
HANDOFF_FLOOR_ROUND_TRIPS = 5_000
# Where the bench's client runs during the produce rounds (see the module doc). The first is
# the placement the targets are checked in; the others get `SECONDARY_ROUNDS_DIVISOR` times
# fewer rounds and are reported beside it.
CLIENT_PLACEMENTS = ("off_connection_core", "on_connection_core", "unpinned")
SECONDARY_ROUNDS_DIVISOR = 2
# How long a started node may take until every shard has logged its pid (`_shard_cores`).
SHARD_LINES_TIMEOUT_S = 10.0
# Rounds of `shards_1_vs_2` with the cheapest client (`produce_max_batched`), after the rest.
BATCHED_ROUNDS = 4
# A pinned client's core is full when the client's CPU and its shards' make this share of a
# phase's elapsed time or more: the client is then what bounds throughput
# (`_client_bound_prediction`).
CLIENT_SATURATED = 0.9


class Side:
    """One set-up of a comparison: a broker (possibly shared with the other side), and the
    topic of its current round, named by `topic_for(round)`."""

    def __init__(
        self, name: str, broker: Broker, topic_for: Callable[[int], str], partitions: int
    ) -> None:
        self.name = name
        self.broker = broker
        self.topic_for = topic_for
        self.topic = topic_for(0)
        self.partitions = partitions
        self.cpu = ProcessCpu(broker)
        self.check = liveness(broker)
        self.res: dict[str, Any] = {"topic": self.topic, "partitions": partitions, "rounds": []}
        self.produced = 0  # into the current topic
        self.topics_made = 1
        self.client_core: int | None = None  # where this side's phases run the client
        self.shard_cores: dict[int, int] = {}  # shard id -> its core (`_shard_cores`)

    def create_topic(self) -> float:
        return create_topic(self.broker.bootstrap, self.topic, self.partitions)

    def next_topic(self) -> None:
        """Delete this side's topic, then create a fresh one (see the module doc)."""
        delete_topic(self.broker.bootstrap, self.topic)
        self.topic = self.topic_for(self.topics_made)
        self.topics_made += 1
        self.create_topic()
        self.produced = 0
        self.res["topic"] = self.topic

    def phase(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        before = self.cpu.snapshot()
        with client_on_core(self.client_core):
            out = fn()
        out["broker_cpu_s_by_process"] = by_process = self.cpu.since(before)
        # Only this side's processes: the other side's broker may run beside it, idle.
        cpu = sum(by_process.values())
        if out.get("messages"):
            out["broker_cpu_s_per_gb"] = round(cpu / (out["messages"] * VALUE_BYTES / 1e9), 3)
        return out

    def produce(
        self, n: int, value: bytes, args: argparse.Namespace, batched: bool = False
    ) -> dict[str, Any]:
        """A produce phase with the bench's client, or with the cheapest (`batched`)."""
        produce = produce_max_batched if batched else produce_max
        out = self.phase(lambda: produce(
            self.broker.bootstrap, self.topic, n, value, self.partitions,
            timeout=args.phase_timeout, stall_timeout=args.stall_timeout,
            check=self.check, broker_pid=self.broker.pid,
        ))  # fmt: skip
        self.produced += n
        _client_core_figures(out, self.client_core, self.shard_cores)
        return out


def _client_core_figures(
    out: dict[str, Any], client_core: int | None, shard_cores: dict[int, int]
) -> None:
    """With the client pinned to one core, how busy a produce phase kept that core: the
    client's CPU, and its shards' (those pinned to the same core), each over the phase's
    elapsed time. A client at ~1.0 is what bounds the phase's throughput."""
    elapsed, client = out.get("elapsed_s"), out.get("client_cpu_s")
    if client_core is None or not elapsed or client is None:
        return
    by_process = out.get("broker_cpu_s_by_process", {})
    shards = sum(
        by_process.get(f"shard{shard}", 0.0)
        for shard, core in shard_cores.items()
        if core == client_core
    )
    out["client_core_busy"] = round(client / elapsed, 3)
    out["shards_on_client_core_busy"] = round(shards / elapsed, 3)


def _client_bound_prediction(x: dict[str, Any], y: dict[str, Any]) -> float | None:
    """B's msg/s over A's in one round pair (rounds `x` of A, `y` of B), if the client is
    what bounds both: its core is full (the client's CPU and that core's shards' make at
    least `CLIENT_SATURATED` of the elapsed time), it costs the same CPU per message on both
    sides, and it has only what the shards leave it. None unless the client was pinned and
    its core full on both sides."""
    names = ("client_core_busy", "shards_on_client_core_busy")
    figures = [float(f) for f in (r.get(what) for r in (x, y) for what in names) if f is not None]
    if len(figures) != 4:
        return None
    busy_a, shards_a, busy_b, shards_b = figures
    if min(busy_a + shards_a, busy_b + shards_b) < CLIENT_SATURATED:
        return None
    left_a, left_b = 1.0 - shards_a, 1.0 - shards_b
    return round(left_b / left_a, 3) if left_a > 0 else None


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _rounds(
    a: Side,
    b: Side,
    rounds: int,
    n: int,
    value: bytes,
    args: argparse.Namespace,
    label: str,
    key: str = "rounds",
    batched: bool = False,
) -> None:
    """ABBA rounds of the produce phase (the cheapest client's if `batched`), appended to
    each side's ``res[key]``."""
    for r in range(rounds):
        for side in (a, b) if r % 2 == 0 else (b, a):
            side.next_topic()  # the first topic took the warm-up
            out = side.produce(n, value, args, batched)
            side.res.setdefault(key, []).append(out)
            log(
                f"{label} {key} {r + 1}/{rounds} {side.name}: {out['msgs_per_s']} msg/s, "
                f"{out.get('broker_cpu_s_per_gb')} CPU-s/GB"
            )


def _rounds_key(placement: str) -> str:
    """Where a side keeps its rounds in `placement`: the targets' one under ``rounds``."""
    return "rounds" if placement == CLIENT_PLACEMENTS[0] else f"rounds_{placement}"


def _placed_rounds(
    a: Side,
    b: Side,
    cores: dict[str, int | None],
    rounds: int,
    n: int,
    value: bytes,
    args: argparse.Namespace,
    label: str,
) -> None:
    """The produce rounds in every client placement, the targets' first and in full; the
    sides are left with the targets' placement for the phases after."""
    for placement in CLIENT_PLACEMENTS:
        a.client_core = b.client_core = cores[placement]
        count = rounds
        if placement != CLIENT_PLACEMENTS[0]:
            count = max(1, rounds // SECONDARY_ROUNDS_DIVISOR)
        _rounds(a, b, count, n, value, args, f"{label} {placement}", _rounds_key(placement))
    a.client_core = b.client_core = cores[CLIENT_PLACEMENTS[0]]


def _shard_cores(broker: Broker, timeout: float = SHARD_LINES_TIMEOUT_S) -> dict[int, int]:
    """Shard id -> the core its process is pinned to, read from the process itself, once
    every shard has logged its pid (a node is ready before its last shard says so)."""
    cpu = ProcessCpu(broker)
    deadline = time.monotonic() + timeout
    while True:
        cpu.snapshot()  # learns the shard pids from the broker's log
        shards = {pid: label for pid, label in cpu.labels.items() if label.startswith("shard")}
        if len(shards) >= broker.smp:
            break
        if time.monotonic() > deadline:
            raise CaseError(f"{len(shards)} of {broker.smp} shards logged their pid in {timeout}s")
        time.sleep(0.05)
    return {
        int(label.removeprefix("shard")): min(os.sched_getaffinity(pid))
        for pid, label in shards.items()
    }


def _client_cores(shard_cores: list[dict[int, int]], machine: list[int]) -> dict[str, int | None]:
    """The client's core in each placement (see the module doc), given each node's shard
    cores (`_shard_cores`) and the cores this machine lets the bench use. Every node here
    takes its connections on shard 0, so that core is the connection's; off it, a core no
    shard uses if there is one, else the first other core."""
    connection: set[int] = set()
    used: set[int] = set()
    for cores in shard_cores:
        if 0 not in cores:
            raise CaseError(f"a node without shard 0 (shards on cores {cores})")
        connection.add(cores[0])
        used.update(cores.values())
    if len(connection) != 1:
        raise CaseError(f"the nodes' shard 0 run on different cores: {sorted(connection)}")
    (core,) = connection
    others = [c for c in machine if c != core]
    if not others:
        raise CaseError(f"the client needs a core besides shard 0's ({core})")
    free = [c for c in others if c not in used]
    return {
        "off_connection_core": (free or others)[0],
        "on_connection_core": core,
        "unpinned": None,
    }


def _placements_for(brokers: list[Broker]) -> tuple[dict[str, int | None], list[dict[int, int]]]:
    """The client's core per placement, and each broker's shard cores."""
    shard_cores = [_shard_cores(b) for b in brokers]
    return _client_cores(shard_cores, sorted(os.sched_getaffinity(0))), shard_cores


@contextlib.contextmanager
def client_on_core(core: int | None) -> Iterator[None]:
    """Run the client on `core` (None: anywhere): this thread, and so every thread it starts
    meanwhile (librdkafka's, made when a phase creates its producer or consumer)."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _summarise(a: Side, b: Side, res: dict[str, Any], prefix: str) -> None:
    """Medians per side and the per-round ratios (b over a), under ``res``, for the targets'
    placement; each placement's medians under ``res["client_placements"]``."""
    for side in (a, b):
        rs = side.res["rounds"]
        side.res["produce_median"] = {
            "msgs_per_s": _median([r["msgs_per_s"] for r in rs]),
            "mb_per_s": _median([r["mb_per_s"] for r in rs]),
            "requests_per_s": _median([r.get("requests_per_s") for r in rs]),
            "broker_cpu_s_per_gb": _median([r.get("broker_cpu_s_per_gb") for r in rs]),
            "latency_p99_ms": _median([get_path(r, "latency_ms", "p99") for r in rs]),
            "msgs_per_request": _median([r.get("msgs_per_request") for r in rs]),
        }
    cpu, rate = _round_ratios(a, b, "rounds")
    res[f"{prefix}_cpu_per_gb_by_round"] = cpu
    res[f"{prefix}_msgs_per_s_by_round"] = rate
    res[f"{prefix}_cpu_per_gb_median"] = _median(cpu)
    res[f"{prefix}_msgs_per_s_median"] = _median(rate)
    placements: dict[str, Any] = {}
    for placement in CLIENT_PLACEMENTS:
        key = _rounds_key(placement)
        cpu, rate = _round_ratios(a, b, key)
        figures: dict[str, Any] = {
            "client_core": res.get("client_cores", {}).get(placement),
            "rounds": len(cpu),
        }
        for side in (a, b):
            figures[f"{side.name}_cpu_per_gb_median"] = _side_median(
                side, key, "broker_cpu_s_per_gb"
            )
        figures[f"{prefix}_cpu_per_gb_median"] = _median(cpu)
        figures[f"{prefix}_msgs_per_s_median"] = _median(rate)
        if figures["client_core"] is not None:
            for side in (a, b):
                for what in ("client_core_busy", "shards_on_client_core_busy"):
                    figures[f"{side.name}_{what}_median"] = _side_median(side, key, what)
            pairs = zip(a.res.get(key, []), b.res.get(key, []), strict=False)
            figures[f"{prefix}_msgs_per_s_client_bound_prediction_median"] = _median(
                [_client_bound_prediction(x, y) for x, y in pairs]
            )
        placements[placement] = figures
    res["client_placements"] = placements
    prediction = f"{prefix}_msgs_per_s_client_bound_prediction_median"
    res[prediction] = placements[CLIENT_PLACEMENTS[0]].get(prediction)


def _side_median(side: Side, key: str, what: str) -> float | None:
    return _median([r.get(what) for r in side.res.get(key, [])])


def _round_ratios(a: Side, b: Side, key: str) -> tuple[list[Any], list[Any]]:
    """Per round, B over A: CPU per GB, and msg/s. Rounds are appended in order, so a case
    that failed in a round's middle leaves one side a round ahead: that round is dropped."""
    pairs = list(zip(a.res.get(key, []), b.res.get(key, []), strict=False))
    cpu = [ratio(y.get("broker_cpu_s_per_gb"), x.get("broker_cpu_s_per_gb")) for x, y in pairs]
    rate = [ratio(y["msgs_per_s"], x["msgs_per_s"]) for x, y in pairs]
    return cpu, rate


def _pipe_floor(res: dict[str, Any], quick: bool) -> None:
    """The bare pipe round trip (bench/pipe_floor.py), measured now, under ``res``."""
    log("pipe round-trip floor")
    try:
        res["pipe_round_trip_floor"] = measure_pipe_round_trip(
            PIPE_FLOOR_ROUND_TRIPS // 10 if quick else PIPE_FLOOR_ROUND_TRIPS
        )
    except Exception as e:
        res["pipe_round_trip_floor"] = {"error": f"{type(e).__name__}: {e}"}


def _handoff_floor(res: dict[str, Any], b: Side, quick: bool) -> None:
    """The floor with B's median request handed from core to core (bench/pipe_floor.py),
    measured after the brokers stopped, under ``res["handoff_floor"]``."""
    per_request = get_path(b.res, "produce_median", "msgs_per_request")
    if not per_request:
        return
    log("handoff floor")
    try:
        res["handoff_floor"] = measure_pipe_round_trip(
            HANDOFF_FLOOR_ROUND_TRIPS // 10 if quick else HANDOFF_FLOOR_ROUND_TRIPS,
            handoff_bytes=round(per_request * VALUE_BYTES),
        )
    except Exception as e:
        res["handoff_floor"] = {"error": f"{type(e).__name__}: {e}"}


def _forward_figures(
    a: Side, b: Side, res: dict[str, Any], prefix: str, target: float, share: float
) -> None:
    """What B's CPU per GB over A's comes to per forwarded request, what the target leaves
    for it, and the floors (a bare pipe round trip; one handing over B's median request)
    set beside what the target leaves.

    Per round: a request is the size of B's in that round (its messages per request, 1 KiB
    each); `share` of B's requests are forwarded. Extra = (B's - A's CPU per byte) x request bytes
    / share; left by the target = (target - 1) x A's CPU per byte x request bytes / share.
    A floor over what the target leaves means that no forwarding path with a round trip per
    request can meet the target here at A's request size, however little it does. B can
    still come in under the target when its client batched more (fewer requests per GB):
    `<prefix>_request_size_ratio_median` is B's messages per request over A's.
    """
    extra: list[float] = []
    left: list[float] = []
    sizes: list[float | None] = []
    for x, y in zip(a.res["rounds"], b.res["rounds"], strict=True):
        sizes.append(ratio(y.get("msgs_per_request"), x.get("msgs_per_request")))
        gb_a, gb_b = x.get("broker_cpu_s_per_gb"), y.get("broker_cpu_s_per_gb")
        per_request = y.get("msgs_per_request")
        if gb_a is None or gb_b is None or not per_request:
            continue
        # CPU-s per GB is 1e-3 CPU-µs per byte.
        request_bytes = per_request * VALUE_BYTES
        extra.append((gb_b - gb_a) * 1e-3 * request_bytes / share)
        left.append((target - 1) * gb_a * 1e-3 * request_bytes / share)
    left_us = _median(left)
    res[f"{prefix}_forwarded_share"] = share
    res[f"{prefix}_request_size_ratio_median"] = _median(sizes)
    res[f"{prefix}_extra_cpu_us_per_forwarded_request_median"] = _median(extra)
    res[f"{prefix}_target_leaves_cpu_us_per_forwarded_request_median"] = left_us
    floor = res.get("pipe_round_trip_floor", {}).get("cpu_us_per_round_trip")
    res[f"{prefix}_pipe_floor_over_target_leaves"] = ratio(floor, left_us)
    handoff = res.get("handoff_floor", {}).get("handoff_floor_cpu_us")
    res[f"{prefix}_handoff_floor_over_target_leaves"] = ratio(handoff, left_us)


def _once_ratios(a: Side, b: Side, res: dict[str, Any], name: Callable[[str], str]) -> None:
    """B over A for the phases run once per side, under ``name(<what>)`` keys."""
    paths = {
        "consume_cpu_per_gb": ("consume", "broker_cpu_s_per_gb"),
        "consume": ("consume", "msgs_per_s"),
        "fixed_rate_cpu_per_gb": ("fixed_rate_20k", "broker_cpu_s_per_gb"),
        "fixed_rate_p99": ("fixed_rate_20k", "latency_ms", "p99"),
    }
    for what, path in paths.items():
        res[name(what)] = ratio(get_path(b.res, *path), get_path(a.res, *path))


def _cross_name(what: str) -> str:
    """`cross_core_vs_local` keys: ``consume_cross_over_local_cpu_per_gb`` and so on."""
    if what.endswith("_cpu_per_gb"):
        return f"{what.removesuffix('_cpu_per_gb')}_cross_over_local_cpu_per_gb"
    return f"{what}_cross_over_local"


def _after_rounds(
    sides: list[Side], value: bytes, fixed_s: float, args: argparse.Namespace, label: str
) -> None:
    """One consume phase (everything produced) and one fixed-rate phase per side."""
    for side in sides:
        expected = side.produced
        side.res["consume"] = side.phase(lambda s=side, e=expected: consume_all(
            s.broker.bootstrap, s.topic, s.partitions, e,
            stall_timeout=args.stall_timeout, timeout=args.phase_timeout,
            check=s.check, broker_pid=s.broker.pid,
        ))  # fmt: skip
        log(f"{label} {side.name}: consume {side.res['consume']['msgs_per_s']} msg/s")
    for side in sides:
        side.res["fixed_rate_20k"] = side.phase(lambda s=side: produce_fixed_rate(
            s.broker.bootstrap, s.topic, value, s.partitions,
            rate=FIXED_RATE, seconds=fixed_s, stall_timeout=args.stall_timeout,
            check=s.check, broker_pid=s.broker.pid,
        ))  # fmt: skip
        side.produced += side.res["fixed_rate_20k"]["messages"]
        log(f"{label} {side.name}: fixed rate p99 "
            f"{side.res['fixed_rate_20k']['latency_ms']['p99']} ms")  # fmt: skip


def _client_figures(a: Side, b: Side, res: dict[str, Any]) -> None:
    """What the client costs beside one shard, with the bench's client and the cheapest.

    `client_cores_to_fill_one_shard` is the client's CPU over the broker's with one shard:
    the cores a client needs to keep that shard's core busy. Over the cores the machine
    leaves it (all but the shard's), one shard is never what bounds produce throughput here,
    and a second shard can only take CPU from the client.
    """
    fill: dict[str, Any] = {}
    for key, client in (("rounds", "produce"), ("rounds_batched", "produce_batch")):
        fill[client] = _median([
            ratio(r.get("client_cpu_s"), r.get("broker_cpu_s")) for r in a.res.get(key, [])
        ])  # fmt: skip
    res["client_cores_to_fill_one_shard"] = fill
    res["client_cores_left_beside_one_shard"] = len(os.sched_getaffinity(0)) - 1
    cpu, rate = _round_ratios(a, b, "rounds_batched")
    res["batched_smp_2_over_1_cpu_per_gb_median"] = _median(cpu)
    res["batched_smp_2_over_1_msgs_per_s_median"] = _median(rate)
    for side in (a, b):
        side.res["produce_batched_median"] = {
            what: _side_median(side, "rounds_batched", what)
            for what in ("msgs_per_s", "broker_cpu_s_per_gb", "client_core_busy")
        }


def _sizes(args: argparse.Namespace) -> tuple[int, int, int, float]:
    """(messages per round, rounds, warm-up messages, fixed-rate seconds), multiples of 6."""
    n = args.messages or (12_000 if args.quick else 150_000)
    n -= n % PARTITIONS
    rounds = args.rounds or (2 if args.quick else ROUNDS)
    warmup = PARTITIONS * 500
    fixed_s = args.fixed_seconds or (2.0 if args.quick else 5.0)
    return n, rounds, warmup, fixed_s


def run_shards_1_vs_2(args: argparse.Namespace, ceilings: dict[str, Any]) -> dict[str, Any]:
    """A ``--smp 1`` and a ``--smp 2`` broker side by side, the 1 KiB x 6 workload on each."""
    case = "shards_1_vs_2"
    n, rounds, warmup, fixed_s = _sizes(args)
    res = header(case, args)
    res["smp"] = [1, 2]
    res.update({
        "messages_per_round": n, "rounds": rounds, "warmup_messages": warmup,
        "value_bytes": VALUE_BYTES, "partitions": PARTITIONS, "acks": "all",
    })  # fmt: skip
    value = os.urandom(VALUE_BYTES)
    topic = f"bench-{case}"
    t0 = time.monotonic()
    _pipe_floor(res, args.quick)
    # Both nodes take their connections on shard 0 (see the module doc): with one client
    # connection that is what the kernel picks half the time; the other half is its mirror.
    env = {"KRILL_KAFKA_SHARDS": "1"}
    res["smp_2_broker_env"] = env
    brokers: dict[int, Broker] = {
        1: Broker(smp=1, krill=args.krill, data_root=args.data_root, keep=args.keep),
        2: EnvBroker(env=env, smp=2, krill=args.krill, data_root=args.data_root, keep=args.keep),
    }
    sides: list[Side] = []
    try:
        with (
            brokers[1],
            brokers[2],
            RssSampler(brokers[1].pid) as rss1,
            RssSampler(brokers[2].pid) as rss2,
        ):
            cores, shard_cores = _placements_for(list(brokers.values()))
            res["client_cores"] = cores
            for (smp, broker), on_cores in zip(brokers.items(), shard_cores, strict=True):
                side = Side(f"smp={smp}", broker, lambda r: f"{topic}-{r}", PARTITIONS)
                side.client_core = cores[CLIENT_PLACEMENTS[0]]
                side.shard_cores = on_cores
                side.res["smp"] = smp
                side.res["broker_pid"] = broker.pid
                side.res["topic_create_s"] = round(side.create_topic(), 3)
                side.produce(warmup, value, args)  # untimed: connections, segments, caches
                side.res["idle"] = idle_cpu(broker, 1.0 if args.quick else 2.0)
                sides.append(side)
            try:
                _placed_rounds(sides[0], sides[1], cores, rounds, n, value, args, case)
                _after_rounds(sides, value, fixed_s, args, case)
                # The cheapest client, in the targets' placement (`_client_figures`).
                _rounds(
                    sides[0], sides[1], min(rounds, BATCHED_ROUNDS), n, value, args,
                    f"{case} batched", "rounds_batched", batched=True,
                )  # fmt: skip
            finally:
                for side, rss in zip(sides, (rss1, rss2), strict=False):
                    broker_live_figures(side.res, side.broker, rss)
    except Exception as e:
        case_failed(res, case, e, **{f"smp={smp} broker": b for smp, b in brokers.items()})
    finally:
        for side in sides:
            broker_stop_figures(side.res, side.broker)
    if len(sides) == 2 and sides[1].res["rounds"]:
        _summarise(sides[0], sides[1], res, "smp_2_over_1")
        _handoff_floor(res, sides[1], args.quick)
        _forward_figures(
            sides[0], sides[1], res, "smp_2_over_1",
            TARGET_CPU_PER_GB_2_OVER_1, FORWARDED_SHARE_2_SHARDS,
        )  # fmt: skip
        res["cpu_per_gb_2_over_1"] = res["smp_2_over_1_cpu_per_gb_median"]
        res["produce_2_over_1"] = res["smp_2_over_1_msgs_per_s_median"]
        _once_ratios(sides[0], sides[1], res, lambda what: f"{what}_2_over_1")
        _client_figures(sides[0], sides[1], res)
    for side in sides:
        figures = {"produce": side.res.get("produce_median")}
        figures.update({k: side.res.get(k) for k in ("consume", "fixed_rate_20k")})
        side.res["vs_ceiling"] = vs_ceiling(figures, ceilings)
        res[f"smp_{side.res['smp']}"] = side.res
    res["target_met"] = {
        "cpu_per_gb_2_le_1_1x_1": compare(
            res.get("cpu_per_gb_2_over_1"), "le", TARGET_CPU_PER_GB_2_OVER_1
        ),
        "produce_2_ge_1": compare(res.get("produce_2_over_1"), "ge", TARGET_PRODUCE_2_OVER_1),
    }
    return finish(res, t0)


def _topic_on_shard(prefix: str, shard: int, shards: int = 2) -> str:
    """The first ``<prefix>-<i>`` whose partition 0 is owned by ``shard``."""
    from shards.shard_table import shard_of

    for i in range(1000):
        name = f"{prefix}-{i}"
        if shard_of(name, 0, shards) == shard:
            return name
    raise CaseError(f"no topic {prefix}-0..999 is owned by shard {shard} of {shards}")


def run_cross_core_vs_local(args: argparse.Namespace) -> dict[str, Any]:
    """``--smp 2`` with ``KRILL_KAFKA_SHARDS=1``: every connection is on shard 0, so a
    partition owned by shard 1 is always reached over the pipes, one owned by shard 0 never.
    """
    case = "cross_core_vs_local"
    n, rounds, warmup, fixed_s = _sizes(args)
    env = {"KRILL_KAFKA_SHARDS": "1"}
    res = header(case, args)
    res["smp"] = 2
    res.update({
        "messages_per_round": n, "rounds": rounds, "warmup_messages": warmup,
        "value_bytes": VALUE_BYTES, "partitions": 1, "acks": "all", "broker_env": env,
    })  # fmt: skip
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    _pipe_floor(res, args.quick)
    broker = EnvBroker(env=env, smp=2, krill=args.krill, data_root=args.data_root, keep=args.keep)
    sides: list[Side] = []
    try:
        with broker, RssSampler(broker.pid) as rss:
            res["broker_pid"] = broker.pid
            cores, (on_cores,) = _placements_for([broker])
            res["client_cores"] = cores
            for name, owner in (("local", 0), ("cross", 1)):
                side = Side(
                    name, broker, lambda r, n=name, o=owner: _topic_on_shard(f"bench-{n}-{r}", o), 1
                )
                side.client_core = cores[CLIENT_PLACEMENTS[0]]
                side.shard_cores = on_cores
                side.res["owner_shard"] = owner
                side.res["topic_create_s"] = round(side.create_topic(), 3)
                side.produce(warmup, value, args)  # untimed: both paths warm
                sides.append(side)
            res["idle"] = idle_cpu(broker, 1.0 if args.quick else 2.0)
            try:
                _placed_rounds(sides[0], sides[1], cores, rounds, n, value, args, case)
                _after_rounds(sides, value, fixed_s, args, case)
            finally:
                broker_live_figures(res, broker, rss)
    except Exception as e:
        case_failed(res, case, e, broker=broker)
    finally:
        broker_stop_figures(res, broker)
    for side in sides:
        res[side.name] = side.res
    if len(sides) == 2 and sides[1].res["rounds"]:
        _summarise(sides[0], sides[1], res, "cross_over_local")
        _handoff_floor(res, sides[1], args.quick)
        _forward_figures(
            sides[0], sides[1], res, "cross_over_local", TARGET_CROSS_OVER_LOCAL_CPU_PER_GB, 1.0
        )
        res["cross_over_local_cpu_per_gb"] = res["cross_over_local_cpu_per_gb_median"]
        res["produce_cross_over_local"] = res["cross_over_local_msgs_per_s_median"]
        _once_ratios(sides[0], sides[1], res, _cross_name)
    res["target_met"] = {
        "cross_over_local_cpu_per_gb_le_1_3": compare(
            res.get("cross_over_local_cpu_per_gb"), "le", TARGET_CROSS_OVER_LOCAL_CPU_PER_GB
        ),
    }
    return finish(res, t0)
