"""`krill bench saturation`: the latency-versus-throughput curve of one node, in one command.

Method. First the maximum: one producer sends as fast as it can for `--max-seconds` (acks as
given, the given partitions and message size, round-robin) and the maximum is the
acknowledged messages over the time from the first send to the last acknowledgement. Then
one step per `--steps` share of that maximum (10, 25, 50, 70, 85, 100, 120% by default),
each at a FIXED offered rate for `--step-seconds`: message i of a step is scheduled at
start + i / rate, and every tick (at most PACING_TICK_S) the producer sends all that are due
and then serves its callbacks until the next one is due. A message's latency runs from its
scheduled time, not from when the loop got round to sending it, to its acknowledgement: a
client that falls behind its schedule shows it in the latency (coordinated omission
corrected, as wrk2 does). A step's achieved rate is its acknowledgements per second from
the first to the last. Each step's latencies go into an hdrhistogram (1 µs to
LATENCY_US_MAX, 3 digits) whose encoded form is kept in `report.json`.

The knee: the low-load p99 is the lowest p99 of the steps offered at most 50% of the
maximum (the lowest step's if there is none): the line is what the node showed it can do. A
step is off the line when its p99 exceeds KNEE_P99_FACTOR times that, or its achieved rate is
under KNEE_ACHIEVED_MIN of its offered rate. The knee is the first step (by offered rate) from
which every step is off the line: a lone spike below it (a segment roll, the shared machine)
is listed under `spikes`, not taken for the knee. None when the highest step is on the line.

The issue's target is read at the step offered 50% of the maximum (else the step nearest
it): its p99, and p99.9 / p50 there, whose goal is at most FLAT_TAIL_RATIO_MAX.

Without `-b` a node is started for the run (`krill start` with its defaults, on free ports,
in a temporary data directory) and stopped after; with `-b` the node there is measured.
Either way the topic made for the run is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.cluster import ClusterError, Node
from scenarios.report import Progress, curve_png, saturation_table
from shards.cli_client import CLIENT_FLAGS_GIVEN, Client, brokers_argument, wait
from shards.topic_cli import CommandError

__all__ = ["Plan", "add_bench_commands", "find_knee", "low_load_p99_ms", "measure",
           "out_of_line", "saturation_command"]

STEPS_PCT = (10.0, 25.0, 50.0, 70.0, 85.0, 100.0, 120.0)
STEP_SECONDS = 5.0
MAX_SECONDS = 5.0
KNEE_P99_FACTOR = 3.0  # p99 over this many times the low-load p99: the tail left the line
KNEE_ACHIEVED_MIN = 0.95  # achieved under this share of offered: the node did not keep up
LOW_LOAD_PCT_MAX = 50.0  # steps at most this share of the maximum set the low-load p99
FLAT_TAIL_RATIO_MAX = 5.0  # the goal for p99.9 / p50 at 50% of the maximum
PACING_TICK_S = 0.001
MAX_BURST_MESSAGES = 256  # sends between two looks at the clock in the maximum phase
LINGER_MS = 5
STALL_S = 30.0  # no acknowledgement for this long while some are owed: the run fails
STEP_GRACE_S = 30.0  # a step may run this much past twice its length before it is cut
DRAIN_S = 1.0  # pause between steps so one's backlog is not the next one's latency
SETTLE_AFTER_MAXIMUM_S = 2.0  # and more after the maximum: the node flushes what it took
PROGRESS_EVERY_S = 0.5
LATENCY_US_MAX = 600_000_000
HDR_DIGITS = 3
NODE_START_S = 30.0
NODE_STOP_S = 15.0
CLIENTS = ("confluent-kafka", "kafka-python")


@dataclass(frozen=True, slots=True)
class Plan:
    partitions: int = 6
    message_bytes: int = 1024
    steps_pct: tuple[float, ...] = STEPS_PCT
    step_seconds: float = STEP_SECONDS
    max_seconds: float = MAX_SECONDS
    acks: str = "all"
    client: str = "confluent-kafka"


# Acknowledgements and the producers -------------------------------------------------------


class _Acks:
    """Latency (s, from the scheduled time) of each acknowledged send; failures counted."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.latencies: list[float] = []
        self.failed = 0
        self.first_error: str | None = None
        self.first_ack_s = self.last_ack_s = 0.0

    @property
    def done(self) -> int:
        return len(self.latencies) + self.failed

    def confluent(self, scheduled_s: float, err: Any, _msg: Any) -> None:
        self.last_ack_s = now = time.perf_counter()
        if not self.first_ack_s:
            self.first_ack_s = now
        if err is None:
            self.latencies.append(now - scheduled_s)
        else:
            self.fail(err)

    def ok(self, scheduled_s: float, _metadata: Any) -> None:
        self.last_ack_s = now = time.perf_counter()
        if not self.first_ack_s:
            self.first_ack_s = now
        self.latencies.append(now - scheduled_s)

    def fail(self, err: Any, *_: Any) -> None:
        self.last_ack_s = time.perf_counter()
        self.failed += 1
        if self.first_error is None:
            self.first_error = str(err)


class _ConfluentProducer:
    def __init__(self, client: Client, topic: str, acks: str, record: _Acks) -> None:
        from confluent_kafka import Producer

        self.topic, self.record = topic, record
        self._producer = Producer(client.config(**{"acks": acks, "linger.ms": LINGER_MS}))
        self._produce, self._poll = self._producer.produce, self._producer.poll

    def send(self, value: bytes, partition: int, scheduled_s: float) -> bool:
        """False when the client's queue is full (serve, then send it again)."""
        try:
            self._produce(self.topic, value, partition=partition,
                          on_delivery=partial(self.record.confluent, scheduled_s))
            return True
        except BufferError:
            return False

    def serve(self, timeout_s: float) -> None:
        self._poll(timeout_s)

    def pending(self) -> int:
        return len(self._producer)

    def close(self) -> None:
        self._producer.flush(1.0)


class _KafkaPythonProducer:
    def __init__(self, client: Client, topic: str, acks: str, record: _Acks) -> None:
        from kafka import KafkaProducer

        self.topic, self.record = topic, record
        self._owed = 0  # sends not yet settled; its I/O thread settles them
        self._lock = threading.Lock()
        self._producer = KafkaProducer(
            bootstrap_servers=client.brokers.split(","), linger_ms=LINGER_MS,
            acks=acks if acks == "all" else int(acks))

    def send(self, value: bytes, partition: int, scheduled_s: float) -> bool:
        with self._lock:
            self._owed += 1
        future = self._producer.send(self.topic, value, partition=partition)
        future.add_callback(self.record.ok, scheduled_s).add_errback(self.record.fail)
        future.add_both(self._settled)
        return True

    def _settled(self, _outcome: Any) -> None:
        with self._lock:
            self._owed -= 1

    def serve(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def pending(self) -> int:
        return self._owed

    def close(self) -> None:
        self._producer.close(timeout=1.0)


_Producer = _ConfluentProducer | _KafkaPythonProducer


# The phases ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    """What every phase needs: the producer, its record, the message, liveness checks."""

    producer: _Producer
    record: _Acks
    client: Client
    value: bytes
    partitions: int
    alive: Callable[[], None]
    progress: Progress

    def check(self) -> None:
        self.alive()
        self.client.check_still_up()

    def drain(self, deadline_s: float) -> None:
        """Serve callbacks until nothing is owed or the deadline; fail on a stall."""
        done, progress_at = self.record.done, time.perf_counter()
        while self.producer.pending() > 0:
            now = time.perf_counter()
            if self.record.done != done:
                done, progress_at = self.record.done, now
            elif now - progress_at > STALL_S:
                raise CommandError(f"no acknowledgement for {STALL_S:g} s with "
                                   f"{self.producer.pending()} sends owed" + self._why())
            if now > deadline_s:
                return
            self.producer.serve(0.05)
            self.check()

    def wait_room(self) -> None:
        """The client's queue is full: serve it until an acknowledgement frees room."""
        done, since = self.record.done, time.perf_counter()
        while self.record.done == done:
            self.producer.serve(PACING_TICK_S)
            if time.perf_counter() - since > STALL_S:
                raise CommandError(f"client queue full and no acknowledgement for {STALL_S:g} s"
                                   + self._why())
        self.check()

    def _why(self) -> str:
        return f"; first error: {self.record.first_error}" if self.record.first_error else ""


def _maximum(run: _Run, seconds: float) -> dict[str, Any]:
    """Send as fast as the client goes for `seconds`, then wait for every acknowledgement."""
    run.record.reset()
    send, pc = run.producer.send, time.perf_counter
    start = pc()
    end = start + seconds
    i = 0
    while pc() < end:
        for _ in range(MAX_BURST_MESSAGES):
            scheduled = pc()
            while not send(run.value, i % run.partitions, scheduled):
                run.wait_room()
            i += 1
        run.producer.serve(0)
        run.progress.update(pc() - start, seconds, len(run.record.latencies) / (pc() - start),
                            None, 0, "maximum: as fast as the client goes")
    run.check()
    run.drain(pc() + STALL_S * 4)
    if run.record.failed or not run.record.latencies:
        raise CommandError(f"{run.record.failed} of {i} sends failed in the maximum phase"
                           + run._why())
    elapsed = run.record.last_ack_s - start
    acked = len(run.record.latencies)
    return {"msgs_per_s": round(acked / elapsed, 1),
            "mb_per_s": round(acked * len(run.value) / elapsed / 1e6, 2),
            "seconds": round(elapsed, 3), "acked": acked}


def _step(run: _Run, pct: float, rate: float, seconds: float, note: str) -> dict[str, Any]:
    """Offer `rate` msg/s for `seconds`; latency from each message's scheduled time."""
    run.record.reset()
    send, serve, pc = run.producer.send, run.producer.serve, time.perf_counter
    total = max(1, round(rate * seconds))
    cpu_start = time.process_time()
    start = pc()
    deadline = start + 2 * seconds + STEP_GRACE_S
    behind_max_s, i = 0.0, 0
    next_look, seen = start + PROGRESS_EVERY_S, 0
    while i < total:
        now = pc()
        due = min(total, int((now - start) * rate) + 1)
        if due > i:
            behind_max_s = max(behind_max_s, now - (start + i / rate))
        while i < due:
            if send(run.value, i % run.partitions, start + i / rate):
                i += 1
            else:
                run.wait_room()
        if now >= next_look:
            if now > deadline:
                break
            run.check()
            window = run.record.latencies[seen:]
            seen += len(window)
            p99 = float(np.percentile(window, 99)) * 1e3 if window else None
            run.progress.update(now - start, seconds, len(window) / PROGRESS_EVERY_S, p99, 0, note)
            next_look = now + PROGRESS_EVERY_S
        wait_s = start + i / rate - pc()
        serve(max(PACING_TICK_S, wait_s) if wait_s > 0 else 0)
    unsent = total - i
    run.drain(deadline)
    return _step_figures(run.record, pct, rate, total, unsent, run.producer.pending(),
                         behind_max_s, time.process_time() - cpu_start)


def _step_figures(record: _Acks, pct: float, rate: float, total: int, unsent: int, unacked: int,
                  behind_max_s: float, cpu_s: float) -> dict[str, Any]:
    """The step's figures. Achieved rate: acknowledgements per second from the first to the
    last (not from the first send, which would count one latency as lost time)."""
    from hdrh.histogram import HdrHistogram

    histogram = HdrHistogram(1, LATENCY_US_MAX, HDR_DIGITS)
    micros = np.clip(np.round(np.array(record.latencies) * 1e6), 1, LATENCY_US_MAX)
    values, counts = np.unique(micros.astype(np.int64), return_counts=True)
    for value, count in zip(values.tolist(), counts.tolist(), strict=True):
        histogram.record_value(value, count)

    def ms(q: float) -> float:
        return round(histogram.get_value_at_percentile(q) / 1e3, 3)

    acked = len(record.latencies)
    acking_s = record.last_ack_s - record.first_ack_s
    return {"offered_pct": pct, "offered_msgs_per_s": round(rate, 1),
            "achieved_msgs_per_s": round((acked - 1) / acking_s, 1) if acking_s > 0 else 0.0,
            "messages": total, "acked": acked, "failed": record.failed, "unsent": unsent,
            "unacked": unacked, "p50_ms": ms(50), "p99_ms": ms(99), "p99_9_ms": ms(99.9),
            "max_ms": round(histogram.get_max_value() / 1e3, 3),
            "behind_max_ms": round(behind_max_s * 1e3, 3), "client_cpu_s": round(cpu_s, 3),
            "first_error": record.first_error, "hdr": histogram.encode().decode()}


# The curve's reading ------------------------------------------------------------------------


def find_knee(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The step where the curve leaves the low-load line for good, as a copy with `reason`
    and `low_load_p99_ms`; None when the last step is still on the line. The rule is in the
    module's docstring; `out_of_line` tells a single step's verdict."""
    ordered = sorted(steps, key=lambda s: s["offered_msgs_per_s"])
    baseline = low_load_p99_ms(ordered)
    knee = None
    for step in reversed(ordered):
        reason = out_of_line(step, baseline)
        if not reason:
            break
        knee = {**step, "reason": reason, "low_load_p99_ms": baseline}
    return knee


def low_load_p99_ms(steps: Sequence[dict[str, Any]]) -> float:
    """The lowest p99 of the steps offered at most LOW_LOAD_PCT_MAX of the maximum (the
    lowest-offered step's when none is); NaN without steps."""
    if not steps:
        return math.nan
    low = [s["p99_ms"] for s in steps if s["offered_pct"] <= LOW_LOAD_PCT_MAX]
    return float(min(low or [min(steps, key=lambda s: s["offered_pct"])["p99_ms"]]))


def out_of_line(step: dict[str, Any], baseline_ms: float) -> str:
    """Why a step is off the low-load line ('' when it is on it)."""
    reasons = []
    if step["p99_ms"] > KNEE_P99_FACTOR * baseline_ms:
        reasons.append(f"p99 {step['p99_ms']:g} ms is {step['p99_ms'] / baseline_ms:.1f}x "
                       f"the low-load {baseline_ms:g} ms")
    if step["achieved_msgs_per_s"] < KNEE_ACHIEVED_MIN * step["offered_msgs_per_s"]:
        share = step["achieved_msgs_per_s"] / step["offered_msgs_per_s"]
        reasons.append(f"achieved {share:.0%} of offered")
    return "; ".join(reasons)


def _at_half(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    if not steps:
        return None
    step = min(steps, key=lambda s: abs(s["offered_pct"] - 50.0))
    ratio = step["p99_9_ms"] / step["p50_ms"] if step["p50_ms"] > 0 else math.inf
    return {"offered_pct": step["offered_pct"], "achieved_msgs_per_s": step["achieved_msgs_per_s"],
            "p50_ms": step["p50_ms"], "p99_ms": step["p99_ms"], "p99_9_ms": step["p99_9_ms"],
            "p99_9_over_p50": round(ratio, 2),
            "p99_9_over_p50_max": FLAT_TAIL_RATIO_MAX, "flat_tail": ratio <= FLAT_TAIL_RATIO_MAX}


def measure(bootstrap: str, plan: Plan, *, alive: Callable[[], None] = lambda: None,
            progress: Progress | None = None) -> dict[str, Any]:
    """Measure the maximum and every step against the node at `bootstrap`: the report."""
    progress = progress or Progress(quiet=True)
    client = Client(bootstrap)
    admin = client.admin()  # CommandError when nothing listens there
    topic = f"krill-saturation-{uuid.uuid4().hex[:8]}"
    _create_topic(client, admin, topic, plan.partitions)
    started = time.time()
    try:
        record = _Acks()
        producer: _Producer = (_ConfluentProducer if plan.client == "confluent-kafka"
                               else _KafkaPythonProducer)(client, topic, plan.acks, record)
        run = _Run(producer, record, client, os.urandom(plan.message_bytes), plan.partitions,
                   alive, progress)
        try:
            maximum = _maximum(run, plan.max_seconds)
            time.sleep(SETTLE_AFTER_MAXIMUM_S)
            steps = []
            for number, pct in enumerate(plan.steps_pct, 1):
                time.sleep(DRAIN_S)
                rate = maximum["msgs_per_s"] * pct / 100
                note = f"step {number}/{len(plan.steps_pct)}: {pct:g}% = {rate:,.0f} msg/s"
                steps.append(_step(run, pct, rate, plan.step_seconds, note))
        finally:
            producer.close()
    finally:
        _delete_topic(client, admin, topic)
    return {"bootstrap": bootstrap, **asdict(plan), "started_at": started,
            "wall_s": round(time.time() - started, 1), "maximum": maximum, "steps": steps,
            "knee": find_knee(steps), "spikes": _spikes(steps), "at_50pct": _at_half(steps),
            "knee_rule": f"off the line: p99 > {KNEE_P99_FACTOR:g}x the lowest p99 of the "
                         f"steps at <= {LOW_LOAD_PCT_MAX:g}% of the maximum, or achieved < "
                         f"{KNEE_ACHIEVED_MIN:.0%} of offered; the knee: the first step from "
                         "which every step is off the line"}


def _spikes(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps off the line below the knee: {offered_pct, reason}."""
    knee = find_knee(steps)
    baseline = low_load_p99_ms(steps)
    return [{"offered_pct": s["offered_pct"], "reason": out_of_line(s, baseline)}
            for s in steps if out_of_line(s, baseline)
            and (knee is None or s["offered_msgs_per_s"] < knee["offered_msgs_per_s"])]


def _create_topic(client: Client, admin: Any, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    wait(client, admin.create_topics([NewTopic(topic, partitions, 1)])[topic], topic)
    deadline = time.monotonic() + NODE_START_S
    while time.monotonic() < deadline:  # until every partition has a leader
        found = admin.list_topics(topic, timeout=5).topics.get(topic)
        if found and found.error is None and len(found.partitions) == partitions and all(
                p.leader >= 0 for p in found.partitions.values()):
            return
        time.sleep(0.1)
    raise CommandError(f"topic {topic!r} has no leader for every partition after "
                       f"{NODE_START_S:g} s")


def _delete_topic(client: Client, admin: Any, topic: str) -> None:
    try:
        wait(client, admin.delete_topics([topic])[topic], topic)
    except CommandError:
        pass  # best effort: the run's figures matter more than its leftovers


# The command --------------------------------------------------------------------------------


def add_bench_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`krill bench saturation ...` under the `krill` command's sub-commands."""
    bench = commands.add_parser("bench", help="measure a node")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    sat = kinds.add_parser(
        "saturation", help="latency against throughput, the offered load stepped up",
        description="Measure the node's maximum produce rate, then offer fixed rates from "
        "10%% to 120%% of it and record p50/p99/p99.9 latency (from each message's scheduled "
        "send time) and the achieved rate of each; name the knee. Without -b a node is "
        "started for the run in a temporary directory.")
    brokers_argument(sat)
    sat.add_argument("-p", "--partitions", type=_positive(int), default=6, metavar="N",
                     help="partitions of the topic made for the run (default 6)")
    sat.add_argument("-s", "--message-size", type=_positive(int), default=1024, metavar="BYTES",
                     help="value bytes per message (default 1024)")
    sat.add_argument("--out", default="saturation", metavar="DIR",
                     help="where report.json and curve.png go (default ./saturation)")
    sat.add_argument("--steps", type=_steps, default=STEPS_PCT, metavar="PCT[,PCT...]",
                     help="offered shares of the maximum, in %% (default "
                     f"{','.join(f'{p:g}' for p in STEPS_PCT)})")
    sat.add_argument("--step-seconds", type=_positive(float), default=STEP_SECONDS,
                     metavar="S", help=f"length of each step (default {STEP_SECONDS:g})")
    sat.add_argument("--max-seconds", type=_positive(float), default=MAX_SECONDS, metavar="S",
                     help=f"length of the as-fast-as-possible phase (default {MAX_SECONDS:g})")
    sat.add_argument("--acks", choices=("all", "1", "0"), default="all",
                     help="producer acks (default all)")
    sat.add_argument("--client", choices=CLIENTS, default=CLIENTS[0],
                     help=f"Kafka client library (default {CLIENTS[0]})")
    sat.add_argument("--quiet", action="store_true", help="no progress line")
    sat.set_defaults(func=saturation_command)


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
        return value

    return parse


def _steps(text: str) -> tuple[float, ...]:
    try:
        steps = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of percentages: {text!r}") from None
    if not steps or steps[0] <= 0:
        raise argparse.ArgumentTypeError(f"percentages must be more than 0: {text!r}")
    return tuple(steps)


def saturation_command(args: argparse.Namespace) -> int:
    plan = Plan(partitions=args.partitions, message_bytes=args.message_size,
                steps_pct=tuple(args.steps), step_seconds=args.step_seconds,
                max_seconds=args.max_seconds, acks=args.acks, client=args.client)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommandError(f"cannot make {out}: {e.strerror}") from None
    given = {"-b", "--brokers"} & set(getattr(args, CLIENT_FLAGS_GIVEN, ()))
    with Progress(quiet=args.quiet) as progress:
        if given:
            report = measure(args.brokers, plan, progress=progress)
            report["node"] = "given"
        else:
            report = _on_a_node_of_its_own(plan, progress)
    write_report(out, report)
    saturation_table(report)
    return 0


def _on_a_node_of_its_own(plan: Plan, progress: Progress) -> dict[str, Any]:
    """`measure` against a node started for it: `krill start`'s default shard count (every
    usable core) and settings, free ports, a temporary directory; stopped and removed after."""
    shards = len(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="krill-saturation-"))
    node = None
    try:
        node = Node(0, root, shards, {})
        node.start()

        def alive() -> None:
            if not node.alive():
                raise CommandError(f"the node started for the run exited: "
                                   f"{node.last_log_line()}")

        report = measure(node.bootstrap, plan, alive=alive, progress=progress)
    except ClusterError as e:
        raise CommandError(str(e)) from None
    finally:
        if node is not None:
            node.close()
        shutil.rmtree(root, ignore_errors=True)
    report["node"] = f"started for the run ({shards} shards, krill start defaults)"
    return report


def write_report(out: Path, report: dict[str, Any]) -> None:
    """`report.json` (every figure) and `curve.png` in `out`."""
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    curve_png(out / "curve.png", report["steps"], report["knee"])
