"""Consumer-group cases of the bench: ``offset_commit_rate`` and ``rebalance_time``.

Registered in ``bench/run.py``; see bench/README.md for every field. Both reuse the run.py
harness (broker start/stop, liveness, CPU accounting, one JSON line per case).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections import deque
from typing import Any

from bench import ceilings as ceil
from bench.broker import Broker, RssSampler, log, tree_cpu_seconds
from bench.clients import close_bounded, create_topic
from bench.measure import (
    EnvBroker,
    ErrorLog,
    broker_live_figures,
    broker_stop_figures,
    client_cpu,
    liveness,
)
from bench.report import CaseError, case_failed, compare, finish, header

# Issue 4 (consumer groups): the targets.
TARGET_COMMITS_PER_S = 5_000  # OffsetCommit on one shard
TARGET_REBALANCE_S = 1.0  # 3-member group, from the last JoinGroup to every member assigned

OFFSET_COMMIT = 8
COMMIT_VERSION = 8
COMMIT_PARTITIONS = 6
PIPELINE_WINDOW = 64  # OffsetCommit requests in flight on the one connection (the target)
MID_WINDOW = 16
REBALANCE_PARTITIONS = 6
REBALANCE_MEMBERS = 3
SESSION_TIMEOUT_MS = 6_000  # the broker's minimum (Kafka's group.min.session.timeout.ms)
HEARTBEAT_INTERVAL_MS = 100
JOIN_STAGGER_S = 0.5  # between the members' subscribe() calls
DELAY_ENV = "KRILL_GROUP_INITIAL_REBALANCE_DELAY_MS"


# --------------------------------------------------------------------------- offset_commit_rate


def _commit_request(group: str, topic: str, partition: int, offset: int) -> Any:
    from wire.messages.offset_commit import OffsetCommitRequest

    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=topic,
                partitions=[
                    OffsetCommitRequest.OffsetCommitRequestPartition(
                        partition_index=partition, committed_offset=offset
                    )
                ],
            )
        ],
    )


def _commit_errors(frame: bytes) -> tuple[int, list[int]]:
    from wire.messages import response_header_version
    from wire.messages.offset_commit import OffsetCommitResponse
    from wire.messages.response_header import ResponseHeader
    from wire.primitives import Reader

    reader = Reader(frame)
    hdr = ResponseHeader.decode(reader, response_header_version(OFFSET_COMMIT, COMMIT_VERSION))
    body = OffsetCommitResponse.decode(reader, COMMIT_VERSION)
    return hdr.correlation_id, [p.error_code for t in body.topics for p in t.partitions]


def _ready_commit(client: Any, group: str, topic: str, timeout: float) -> float:
    """Commit until the coordinator answers NONE (it creates and loads __consumer_offsets
    on first use). Returns the seconds it took."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    last: list[int] = []
    while time.monotonic() < deadline:
        cid = client.send(OFFSET_COMMIT, COMMIT_VERSION, _commit_request(group, topic, 0, 0))
        frame = client.receive_frame()
        if frame is None:
            raise CaseError("broker closed the connection during the first OffsetCommit")
        got, last = _commit_errors(frame)
        if got != cid:
            raise CaseError(f"correlation id {got}, expected {cid}")
        if last == [0]:
            return time.perf_counter() - t0
        time.sleep(0.05)
    raise CaseError(f"OffsetCommit not accepted after {timeout}s: error codes {last}")


def commit_loop(
    bootstrap: str,
    group: str,
    topic: str,
    *,
    window: int,
    seconds: float,
    broker_pid: int,
    check: Any,
    first_offset: int,
) -> dict[str, Any]:
    """OffsetCommit v8 on one raw connection, ``window`` requests in flight, for ``seconds``.

    Each request commits one partition (round-robin over the topic's partitions) at an
    increasing offset. Latency is per request: its ``sendall`` to its response frame.
    """
    from tests.support.raw_client import RawClient

    pc = time.perf_counter
    with RawClient(bootstrap, client_id="krill-bench-commit") as client:
        _ready_commit(client, group, topic, 30.0)
        encode = client.encode
        sent_at: deque[tuple[int, float]] = deque()
        lat: list[float] = []
        errors = 0
        first_error: int | None = None
        cid = 1_000_000
        offset = first_offset
        last_offset: dict[int, int] = {}
        cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
        t_start = pc()
        t_end = t_start + seconds
        next_check = t_start + 1.0

        def send_one() -> None:
            nonlocal cid, offset
            cid += 1
            offset += 1
            part = offset % COMMIT_PARTITIONS
            req = _commit_request(group, topic, part, offset)
            data = encode(OFFSET_COMMIT, COMMIT_VERSION, req, cid)
            sent_at.append((cid, pc()))
            client.send_raw(data)
            last_offset[part] = offset

        for _ in range(window):
            send_one()
        while sent_at:
            frame = client.receive_frame()
            now = pc()
            if frame is None:
                raise CaseError(f"broker closed the connection after {len(lat)} commits")
            got, codes = _commit_errors(frame)
            want, t_sent = sent_at.popleft()
            if got != want:
                raise CaseError(f"responses out of order: correlation {got}, expected {want}")
            lat.append(now - t_sent)
            bad = [c for c in codes if c != 0]
            if bad:
                errors += 1
                first_error = first_error if first_error is not None else bad[0]
            if now < t_end:
                send_one()
            if now > next_check:
                next_check = now + 1.0
                check()
        t_last = pc()
        cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    n = len(lat)
    elapsed = t_last - t_start
    broker_cpu = cpu_b1 - cpu_b0
    return {
        "window": window,
        "commits": n,
        "elapsed_s": round(elapsed, 3),
        "commits_per_s": round(n / elapsed, 1),
        "latency_ms": ceil.latency_summary_ms(lat),
        "commit_errors": errors,
        "first_error_code": first_error,
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_commit": round(broker_cpu / n * 1e6, 1) if n else None,
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
        "last_offsets": last_offset,
    }


def commit_consumer(bootstrap: str, group: str) -> tuple[Any, ErrorLog]:
    from confluent_kafka import Consumer

    errors = ErrorLog("commit-consumer")
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "error_cb": errors.cb,
    })  # fmt: skip
    return c, errors


def confluent_commit_loop(
    c: Any, errors: ErrorLog, topic: str, *, seconds: float, broker_pid: int, first_offset: int
) -> dict[str, Any]:
    """``Consumer.commit(offsets=[...], asynchronous=False)`` in a loop: a real client's
    round trip (librdkafka's commit path plus Python)."""
    from confluent_kafka import TopicPartition

    # Connects and finds the coordinator before the clock starts.
    c.commit(offsets=[TopicPartition(topic, 0, first_offset)], asynchronous=False)
    lat: list[float] = []
    pc = time.perf_counter
    offset = first_offset
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    t_start = pc()
    t_end = t_start + seconds
    while True:
        t = pc()
        if t >= t_end:
            break
        offset += 1
        c.commit(
            offsets=[TopicPartition(topic, offset % COMMIT_PARTITIONS, offset)],
            asynchronous=False,
        )
        lat.append(pc() - t)
    elapsed = pc() - t_start
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    n = len(lat)
    broker_cpu = cpu_b1 - cpu_b0
    return {
        "commits": n,
        "elapsed_s": round(elapsed, 3),
        "commits_per_s": round(n / elapsed, 1),
        "latency_ms": ceil.latency_summary_ms(lat),
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_commit": round(broker_cpu / n * 1e6, 1) if n else None,
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
        "client_errors": errors.errors,
    }


def run_offset_commit_rate(args: argparse.Namespace) -> dict[str, Any]:
    """One ``--smp 1`` broker, one group, commits as fast as one connection can carry them."""
    from confluent_kafka import TopicPartition

    case = "offset_commit_rate"
    seconds = 2.0 if args.quick else 5.0
    serial_s = 1.0 if args.quick else 2.0
    res = header(case, args)
    res["smp"] = 1
    res.update({
        "topic_partitions": COMMIT_PARTITIONS, "commit_version": COMMIT_VERSION,
        "partitions_per_commit": 1, "seconds": seconds,
    })  # fmt: skip
    topic = f"bench-{case}"
    group = f"krill-bench-commit-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    broker = Broker(smp=1, krill=args.krill, data_root=args.data_root, keep=args.keep)
    consumer = None
    try:
        with broker, RssSampler(broker.pid) as rss:
            check = liveness(broker)
            res["broker_pid"] = broker.pid
            res["broker_start_s"] = round(time.monotonic() - t0, 3)
            try:
                res["topic_create_s"] = round(
                    create_topic(broker.bootstrap, topic, COMMIT_PARTITIONS), 3
                )
                log(f"{case}: serial commits (1 in flight) for {serial_s}s")
                serial = commit_loop(
                    broker.bootstrap, group, topic, window=1, seconds=serial_s,
                    broker_pid=broker.pid, check=check, first_offset=0,
                )  # fmt: skip
                res["serial"] = serial
                log(f"{case}: serial {serial['commits_per_s']} commits/s; "
                    f"{MID_WINDOW} in flight for {serial_s}s")  # fmt: skip
                mid = commit_loop(
                    broker.bootstrap, group, topic, window=MID_WINDOW, seconds=serial_s,
                    broker_pid=broker.pid, check=check, first_offset=5_000_000,
                )  # fmt: skip
                res[f"window_{MID_WINDOW}"] = mid
                mid.pop("last_offsets")
                log(f"{case}: window {MID_WINDOW} {mid['commits_per_s']} commits/s; "
                    f"pipelined ({PIPELINE_WINDOW} in flight) for {seconds}s")  # fmt: skip
                piped = commit_loop(
                    broker.bootstrap, group, topic, window=PIPELINE_WINDOW, seconds=seconds,
                    broker_pid=broker.pid, check=check, first_offset=10_000_000,
                )  # fmt: skip
                res["pipelined"] = piped
                log(f"{case}: pipelined {piped['commits_per_s']} commits/s")
                last = piped.pop("last_offsets")
                serial.pop("last_offsets")
                # Read back (OffsetFetch) what the pipelined phase committed last.
                consumer, cerrors = commit_consumer(broker.bootstrap, group)
                got = consumer.committed(
                    [TopicPartition(topic, p) for p in range(COMMIT_PARTITIONS)], timeout=10
                )
                fetched = {tp.partition: tp.offset for tp in got}
                res["verified"] = fetched == last
                if not res["verified"]:
                    log(f"{case}: committed {fetched}, expected {last}")
                log(f"{case}: confluent_kafka commit(asynchronous=False) for {serial_s}s")
                res["confluent_sync"] = confluent_commit_loop(
                    consumer, cerrors, topic, seconds=serial_s, broker_pid=broker.pid,
                    first_offset=20_000_000,
                )  # fmt: skip
                check()
            finally:
                if consumer is not None:
                    close_bounded(consumer, "commit-consumer")
                broker_live_figures(res, broker, rss)
    except Exception as e:
        case_failed(res, case, e, broker=broker)
    finally:
        broker_stop_figures(res, broker)
    rate = res.get("pipelined", {}).get("commits_per_s")
    res["target_met"] = {"commits_ge_5000_per_s": compare(rate, "ge", TARGET_COMMITS_PER_S)}
    return finish(res, t0)


# --------------------------------------------------------------------------- rebalance_time


class Member:
    """One confluent-kafka consumer in its own thread: subscribe at a signal, poll until
    told to close; tracks its current assignment (eager protocol) and when it changed."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, tracker: Tracker):
        self.name = name
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.tracker = tracker
        self.errors = ErrorLog(name)
        self.ready = threading.Event()  # created, metadata fetched
        self.go = threading.Event()  # subscribe now
        self.leave = threading.Event()  # close() now
        self.closed = threading.Event()
        self.t_subscribe: float | None = None
        self.t_close: float | None = None
        self.close_s: float | None = None
        self.assigns = 0
        self.failure: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        try:
            c = Consumer({
                "bootstrap.servers": self.bootstrap, "group.id": self.group,
                "client.id": self.name, "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "error_cb": self.errors.cb,
            })  # fmt: skip
        except Exception as e:
            self.failure = f"{type(e).__name__}: {e}"
            self.ready.set()
            return
        try:
            c.list_topics(self.topic, timeout=10)  # connected, metadata known
            self.ready.set()
            if not self.go.wait(60):
                return
            self.t_subscribe = time.perf_counter()
            c.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
            while not self.leave.is_set():
                c.poll(0.01)
            self.t_close = time.perf_counter()
            c.close()
            self.close_s = time.perf_counter() - self.t_close
        except Exception as e:
            self.failure = f"{type(e).__name__}: {e}"
        finally:
            self.ready.set()
            self.closed.set()

    def _on_assign(self, _c: Any, tps: list[Any]) -> None:
        self.assigns += 1
        self.tracker.set(self.name, {tp.partition for tp in tps})

    def _on_revoke(self, _c: Any, _tps: list[Any]) -> None:
        self.tracker.set(self.name, set())


class Tracker:
    """Current assignment per member; notes the first moment the wanted members hold every
    partition exactly once."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.lock = threading.Lock()
        self.held: dict[str, set[int]] = {}
        self.want: set[str] = set()
        self.done_at: float | None = None
        self.done = threading.Event()

    def expect(self, members: set[str]) -> None:
        with self.lock:
            self.want = set(members)
            self.done_at = None
            self.done.clear()
            self._check(time.perf_counter())

    def set(self, name: str, parts: set[int]) -> None:
        t = time.perf_counter()
        with self.lock:
            self.held[name] = parts
            self._check(t)

    def _check(self, t: float) -> None:
        if self.done_at is not None or not self.want:
            return
        owners = [p for n, s in self.held.items() if s for p in s]
        holders = {n for n, s in self.held.items() if s}
        if (
            holders == self.want
            and len(owners) == self.partitions
            and set(owners) == set(range(self.partitions))
        ):
            self.done_at = t
            self.done.set()

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {n: sorted(s) for n, s in sorted(self.held.items())}


def rebalance_round(bootstrap: str, topic: str, check: Any, timeout: float) -> dict[str, Any]:
    """Three members subscribe ``JOIN_STAGGER_S`` apart; then the last one closes."""
    group = f"krill-bench-rebalance-{uuid.uuid4().hex[:8]}"
    tracker = Tracker(REBALANCE_PARTITIONS)
    members = [Member(f"m{i}", bootstrap, group, topic, tracker) for i in range(REBALANCE_MEMBERS)]
    out: dict[str, Any] = {"group": group}
    try:
        for m in members:
            m.thread.start()
        for m in members:
            if not m.ready.wait(30) or m.failure:
                raise CaseError(f"member {m.name} not ready: {m.failure or 'timeout'}")
        tracker.expect({m.name for m in members})
        for i, m in enumerate(members):
            if i:
                time.sleep(JOIN_STAGGER_S)
            m.go.set()
        deadline = time.monotonic() + timeout
        while not tracker.done.wait(0.2):
            check()
            failed = [f"{m.name}: {m.failure}" for m in members if m.failure]
            if failed:
                raise CaseError(f"member failed: {failed}")
            if time.monotonic() > deadline:
                raise CaseError(f"3 members not all assigned after {timeout}s: "
                                f"{tracker.snapshot()}")  # fmt: skip
        t_last = max(m.t_subscribe or 0.0 for m in members)
        t_first = min(m.t_subscribe or 0.0 for m in members)
        assert tracker.done_at is not None
        out["join_s"] = round(tracker.done_at - t_last, 3)
        out["join_from_first_subscribe_s"] = round(tracker.done_at - t_first, 3)
        out["assignment_3"] = tracker.snapshot()
        out["assign_callbacks_3"] = {m.name: m.assigns for m in members}
        # One member leaves (LeaveGroup in close()): the other two take its partitions.
        time.sleep(0.5)
        leaver, stay = members[-1], members[:-1]
        tracker.expect({m.name for m in stay})
        leaver.leave.set()
        deadline = time.monotonic() + timeout
        while not tracker.done.wait(0.2):
            check()
            if time.monotonic() > deadline:
                raise CaseError(f"2 members do not hold all partitions {timeout}s after "
                                f"a close(): {tracker.snapshot()}")  # fmt: skip
        if not leaver.closed.wait(15):
            raise CaseError("close() of the leaving member did not return in 15 s")
        assert tracker.done_at is not None and leaver.t_close is not None
        out["leave_s"] = round(tracker.done_at - leaver.t_close, 3)
        out["leaver_close_s"] = round(leaver.close_s, 3) if leaver.close_s is not None else None
        out["assignment_2"] = {n: p for n, p in tracker.snapshot().items() if n != leaver.name}
        out["client_errors"] = [e for m in members for e in m.errors.errors][:10]
    finally:
        for m in members:
            m.leave.set()
        for m in members:
            if m.thread.is_alive() and not m.closed.wait(15):
                log(f"member {m.name} did not close in 15 s; abandoning it")
    return out


def _rebalance_sub(
    args: argparse.Namespace, delay_ms: int, rounds: int, case: str
) -> dict[str, Any]:
    sub: dict[str, Any] = {"initial_rebalance_delay_ms": delay_ms, "broker_env": {}}
    if delay_ms != 3000:  # 3000 is the broker's default: leave it unset there
        sub["broker_env"] = {DELAY_ENV: str(delay_ms)}
    t1 = time.monotonic()
    broker = EnvBroker(
        env=sub["broker_env"], smp=args.smp, krill=args.krill, data_root=args.data_root,
        keep=args.keep,
    )  # fmt: skip
    topic = f"bench-{case}"
    try:
        with broker, RssSampler(broker.pid) as rss:
            check = liveness(broker)
            sub["broker_pid"] = broker.pid
            try:
                sub["topic_create_s"] = round(
                    create_topic(broker.bootstrap, topic, REBALANCE_PARTITIONS), 3
                )
                sub["rounds"] = []
                for r in range(rounds):
                    cpu0 = tree_cpu_seconds(broker.pid)
                    one = rebalance_round(broker.bootstrap, topic, check, timeout=30.0)
                    one["broker_cpu_s"] = round(tree_cpu_seconds(broker.pid) - cpu0, 3)
                    sub["rounds"].append(one)
                    log(f"{case} delay={delay_ms}: round {r + 1}/{rounds} join "
                        f"{one['join_s']} s, leave {one['leave_s']} s")  # fmt: skip
                joins = [x["join_s"] for x in sub["rounds"]]
                leaves = [x["leave_s"] for x in sub["rounds"]]
                sub["join_s"] = {"median": round(statistics.median(joins), 3), "max": max(joins)}
                sub["leave_s"] = {"median": round(statistics.median(leaves), 3), "max": max(leaves)}
            finally:
                broker_live_figures(sub, broker, rss)
    except Exception as e:
        case_failed(sub, f"{case} delay={delay_ms}", e, broker=broker)
    finally:
        broker_stop_figures(sub, broker)
    sub.setdefault("error", None)
    sub["wall_s"] = round(time.monotonic() - t1, 2)
    return sub


def run_rebalance_time(args: argparse.Namespace) -> dict[str, Any]:
    """3 consumers over 6 partitions: join, then one leaves; with the initial-rebalance
    delay at 0, then at Kafka's default 3000 ms."""
    case = "rebalance_time"
    res = header(case, args)
    rounds = 1 if args.quick else 3
    res.update({
        "members": REBALANCE_MEMBERS, "partitions": REBALANCE_PARTITIONS,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS, "join_stagger_s": JOIN_STAGGER_S,
        "rounds": rounds,
    })  # fmt: skip
    t0 = time.monotonic()
    errors = []
    for delay_ms, n in ((0, rounds), (3000, 1)):
        sub = _rebalance_sub(args, delay_ms, n, case)
        res[f"delay_{delay_ms}"] = sub
        if sub["error"]:
            errors.append(f"delay {delay_ms}: {sub['error']}")
    join_max = res["delay_0"].get("join_s", {}).get("max")
    res["target_met"] = {"rebalance_3_members_le_1s": compare(join_max, "le", TARGET_REBALANCE_S)}
    res["error"] = "; ".join(errors) or None
    return finish(res, t0)


GROUP_CASES = {
    "offset_commit_rate": run_offset_commit_rate,
    "rebalance_time": run_rebalance_time,
}
