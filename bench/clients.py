"""The Kafka clients of the bench cases: topics, producers at full speed or a fixed rate, consumers.

librdkafka (confluent-kafka) through the same code for every broker a case compares (Krill,
Apache Kafka, tansu), so a ratio compares brokers, not clients. A fixed-rate producer sends
each message at its scheduled time and measures latency from that time (`send_paced`), so a
stalled broker shows in the figures instead of slowing the offered rate.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from bench import ceilings as ceil
from bench.broker import (
    log,
    tree_cpu_seconds,
)
from bench.measure import (
    ErrorLog,
    StatsCollector,
    client_cpu,
)
from bench.report import (
    CaseError,
)

MB = 1e6  # decimal, as in the ceilings


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> float:
    """CreateTopics via AdminClient, then wait until Metadata shows every partition led.

    Returns the seconds it took.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    t0 = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        request_timeout=timeout,
    )
    try:
        futs[name].result(timeout=timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise CaseError(f"CreateTopics {name} x{partitions} failed: {e}") from e
    except concurrent.futures.TimeoutError as e:
        raise CaseError(f"CreateTopics {name} x{partitions}: no answer in {timeout}s") from e
    deadline = time.monotonic() + timeout
    last = "no metadata"
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None:
            led = [p for p in t.partitions.values() if p.leader >= 0 and p.error is None]
            if len(led) == partitions:
                return time.perf_counter() - t0
            last = f"{len(led)}/{partitions} partitions have a leader"
        elif t is not None:
            last = str(t.error)
        time.sleep(0.1)
    raise CaseError(f"topic {name} not ready after {timeout}s: {last}")


def delete_topic(bootstrap: str, name: str, timeout: float = 30.0) -> None:
    """DeleteTopics via AdminClient; returns once the broker has answered."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.delete_topics([name], request_timeout=timeout)
    try:
        futs[name].result(timeout=timeout)
    except KafkaException as e:
        raise CaseError(f"DeleteTopics {name} failed: {e}") from e
    except concurrent.futures.TimeoutError as e:
        raise CaseError(f"DeleteTopics {name}: no answer in {timeout}s") from e


def close_bounded(client: Any, what: str, timeout: float = 10.0) -> None:
    t = threading.Thread(target=client.close, name=f"close-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        log(f"{what}.close() did not return in {timeout}s; abandoning it")


def producer_config(bootstrap: str, stats: StatsCollector, errors: ErrorLog) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "statistics.interval.ms": 500,
        "stats_cb": stats.cb,
        "error_cb": errors.cb,
        "message.timeout.ms": 60_000,
    }


class Deliveries:
    """Delivery-report bookkeeping; per-message latency from produce() to callback."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.last_t = 0.0
        self._pc = time.perf_counter

    def cb(self, t0: float, err: Any, msg: Any) -> None:
        t = self._pc()
        self.last_t = t
        if err is None:
            self.latencies.append(t - t0)
        else:
            self.errors += 1
            if self.first_error is None:
                self.first_error = str(err)

    @property
    def done(self) -> int:
        return len(self.latencies) + self.errors


def flush_deliveries(
    producer: Any,
    dr: Deliveries,
    deadline: float,
    check: Callable[[], None],
    stall_timeout: float = 30.0,
) -> None:
    """Wait for every delivery report; fail if none arrives for ``stall_timeout`` s."""
    done, progress_at = dr.done, time.monotonic()
    while len(producer) > 0:
        now = time.monotonic()
        if dr.done != done:
            done, progress_at = dr.done, now
        elif now - progress_at > stall_timeout:
            raise CaseError(
                f"produce stalled: no delivery report for {stall_timeout}s, "
                f"{len(producer)} undelivered, {dr.done} delivered"
                + (f"; first error: {dr.first_error}" if dr.first_error else "")
            )
        if now > deadline:
            raise CaseError(f"flush timed out with {len(producer)} messages undelivered")
        producer.flush(0.5)
        check()


# --------------------------------------------------------------------------- phases


def wait_room(
    producer: Any,
    dr: Deliveries,
    deadline: float,
    check: Callable[[], None],
    stall_timeout: float,
) -> None:
    done, since = dr.done, time.monotonic()
    while dr.done == done:
        producer.poll(0.01)
        now = time.monotonic()
        if now - since > stall_timeout or now > deadline:
            raise CaseError(
                f"produce stalled: local queue full and no delivery report for "
                f"{now - since:.0f}s ({dr.done} delivered)"
                + (f"; first error: {dr.first_error}" if dr.first_error else "")
            )
        if now - since > 1.0:
            check()


def send_all(p: Any, dr: Deliveries, topic: str, value: bytes, n: int, partitions: int,
             deadline: float, check: Callable[[], None], stall_timeout: float) -> float:
    """Hand ``n`` messages to the producer ``p`` as fast as it takes them, round-robin over
    partitions, each delivery timed by ``dr`` from its send; when it was done sending."""
    produce, poll, cb, pc = p.produce, p.poll, dr.cb, time.perf_counter
    for i in range(n):
        while True:
            try:
                produce(topic, value, partition=i % partitions, on_delivery=partial(cb, pc()))
                break
            except BufferError:
                # The local queue is full: wait for deliveries, but not forever.
                wait_room(p, dr, deadline, check, stall_timeout)
        if not i & 63:
            poll(0)
            if not i & 8191:
                check()
                if time.monotonic() > deadline:
                    raise CaseError(f"produce timed out after {i} messages")
    return pc()


def produce_max(
    bootstrap: str,
    topic: str,
    n: int,
    value: bytes,
    partitions: int,
    *,
    timeout: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """Produce ``n`` messages as fast as the client can, round-robin over partitions."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer"), Deliveries()
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    p = Producer(producer_config(bootstrap, stats, errors))
    deadline = time.monotonic() + timeout
    t_start = time.perf_counter()
    t_sent = send_all(p, dr, topic, value, n, partitions, deadline, check, stall_timeout)
    flush_deliveries(p, dr, deadline, check, stall_timeout)
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors; first: {dr.first_error}")
    out = max_rate_figures(
        n, len(value), dr.last_t - t_start, t_sent - t_start, stats,
        cpu_b1 - cpu_b0, cpu_c1 - cpu_c0, errors,
    )  # fmt: skip
    out["latency_ms"] = ceil.latency_summary_ms(dr.latencies)
    return out


def max_rate_figures(
    n: int,
    value_bytes: int,
    elapsed: float,
    send_loop: float,
    stats: StatsCollector,
    broker_cpu: float,
    client_cpu_s: float,
    errors: ErrorLog,
) -> dict[str, Any]:
    """The figures of a produce phase at the client's full speed (`produce_max`,
    `produce_max_batched`): `n` messages of `value_bytes`, the last acknowledged `elapsed`
    seconds after the first was sent, the last sent after `send_loop` seconds."""
    reqs, txb = stats.produce_requests(), stats.tx_bytes()
    return {
        "messages": n,
        "elapsed_s": round(elapsed, 3),
        "send_loop_s": round(send_loop, 3),
        "msgs_per_s": round(n / elapsed, 1),
        "mb_per_s": round(n * value_bytes / elapsed / MB, 2),
        "produce_requests": reqs,
        "requests_per_s": round(reqs / elapsed, 1) if reqs else None,
        "msgs_per_request": round(n / reqs, 1) if reqs else None,
        "avg_request_bytes": round(txb / reqs) if reqs and txb else None,
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_produce_request": round(broker_cpu / reqs * 1e6, 1) if reqs else None,
        "broker_cpu_us_per_message": round(broker_cpu / n * 1e6, 2),
        "client_cpu_s": round(client_cpu_s, 3),
        "client_errors": errors.errors,
    }


# Messages per produce_batch() call in `produce_max_batched`.
PRODUCE_BATCH_MESSAGES = 1000


def produce_max_batched(
    bootstrap: str,
    topic: str,
    n: int,
    value: bytes,
    partitions: int,
    *,
    timeout: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`produce_max` with the cheapest client this Python library offers: messages handed to
    librdkafka a thousand at a time (``produce_batch``), and only failed deliveries reported
    back (``delivery.report.only.error``), so no Python runs per message once it is queued.

    It measures what the client costs at its cheapest, not latency (nothing reports when a
    message was acknowledged). Failed deliveries fail the phase. `config`: librdkafka
    settings over the bench's.
    """
    from confluent_kafka import Producer

    stats, errors = StatsCollector(), ErrorLog("producer(batched)")
    failed: list[str] = []

    def on_failure(err: Any, _msg: Any) -> None:
        failed.append(str(err))

    settings = producer_config(bootstrap, stats, errors)
    settings.update({"delivery.report.only.error": True, "on_delivery": on_failure})
    settings.update(config or {})
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    p = Producer(settings)
    deadline = time.monotonic() + timeout
    # Round-robin over the partitions, a call's worth at a time: produce_batch places every
    # message of a call in the call's partition (a message's own "partition" is ignored).
    unsent = [n // partitions + (k < n % partitions) for k in range(partitions)]
    pc = time.perf_counter
    t_start = pc()
    sent = calls = 0
    while sent < n:
        for partition in range(partitions):
            count = min(PRODUCE_BATCH_MESSAGES, unsent[partition])
            unsent[partition] -= count
            batch = [{"value": value} for _ in range(count)]
            since = time.monotonic()
            while batch:
                queued = p.produce_batch(topic, batch, partition=partition)
                sent += queued
                # A full local queue refuses the rest of the batch (each marked `_error`).
                batch = batch[queued:]
                if batch:
                    p.poll(0.01)
                    now = time.monotonic()
                    if now - since > stall_timeout or now > deadline:
                        raise CaseError(
                            f"batched produce stalled: local queue full for {now - since:.0f}s "
                            f"after {sent} messages"
                        )
            p.poll(0)
            if not calls & 7:  # the first call, then every eighth
                check()
                if time.monotonic() > deadline:
                    raise CaseError(f"batched produce timed out after {sent} messages")
            calls += 1
    t_sent = pc()
    left = p.flush(max(0.0, deadline - time.monotonic()))
    t_done = pc()
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if left:
        raise CaseError(f"batched produce: {left} messages undelivered at the deadline")
    if failed:
        raise CaseError(f"{len(failed)} delivery errors (batched); first: {failed[0]}")
    out = max_rate_figures(
        n, len(value), t_done - t_start, t_sent - t_start, stats,
        cpu_b1 - cpu_b0, cpu_c1 - cpu_c0, errors,
    )  # fmt: skip
    out["messages_per_call"] = PRODUCE_BATCH_MESSAGES
    return out


class Paced(NamedTuple):
    messages: int
    seconds: float  # from the first send to the last
    max_backlog: int  # the most messages that were due and not yet sent


def send_paced(
    p: Any, dr: Deliveries, topic: str, value: bytes, partitions: int, *, rate: int,
    seconds: float, report: Callable[[float, float], Callable[[Any, Any], None]],
    check: Callable[[], None], stall_timeout: float,
) -> Paced:  # fmt: skip
    """Produce at ``rate`` msg/s for ``seconds`` round-robin over the partitions: each ms,
    send what is due, then poll; then flush. ``report(t_call, t_due)``: a message's delivery
    callback, made as it is handed to produce() at ``t_call``, due by the schedule at
    ``t_due``."""
    produce, poll, pc = p.produce, p.poll, time.perf_counter
    total = int(rate * seconds)
    deadline = time.monotonic() + seconds * 3 + 30
    behind_max = 0
    i = 0
    t_start = pc()
    next_check = t_start + 1.0
    while i < total:
        now = pc()
        due = min(total, int((now - t_start) * rate) + 1)
        behind_max = max(behind_max, due - i)
        while i < due:
            try:
                produce(topic, value, partition=i % partitions,
                        on_delivery=report(pc(), t_start + i / rate))
                i += 1
            except BufferError:
                wait_room(p, dr, deadline, check, stall_timeout)
        now = pc()
        if now > next_check:
            next_check = now + 1.0
            check()
            if time.monotonic() > deadline:
                raise CaseError(f"fixed-rate produce timed out after {i} messages")
        wait = t_start + i / rate - now
        # poll() returns early when a delivery report arrives; timeouts are whole ms.
        poll(max(0.001, wait) if wait > 0 else 0)
    t_sent = pc()
    flush_deliveries(p, dr, deadline, check, stall_timeout)
    return Paced(total, t_sent - t_start, behind_max)


def produce_fixed_rate(
    bootstrap: str,
    topic: str,
    value: bytes,
    partitions: int,
    *,
    rate: int,
    seconds: float,
    stall_timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """Produce at ``rate`` msg/s for ``seconds``: each ms, send what is due, then poll."""
    from confluent_kafka import Producer

    stats, errors, dr = StatsCollector(), ErrorLog("producer(fixed)"), Deliveries()
    p = Producer(producer_config(bootstrap, stats, errors))
    cb, pc = dr.cb, time.perf_counter
    # Connect and fetch metadata before the clock starts; the warm-up message isn't counted.
    p.produce(topic, value, partition=0, on_delivery=partial(cb, pc()))
    flush_deliveries(p, dr, time.monotonic() + 30, check, stall_timeout)
    if dr.errors:
        raise CaseError(f"fixed-rate warm-up message failed: {dr.first_error}")
    dr.latencies.clear()
    stats.wait_fresh(p)
    reqs0 = stats.produce_requests() or 0
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    sent = send_paced(p, dr, topic, value, partitions, rate=rate, seconds=seconds,
                      report=lambda t_call, _due: partial(cb, t_call), check=check,
                      stall_timeout=stall_timeout)
    cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
    stats.wait_fresh(p)
    if dr.errors:
        raise CaseError(f"{dr.errors} delivery errors at fixed rate; first: {dr.first_error}")
    reqs = (stats.produce_requests() or 0) - reqs0
    broker_cpu = cpu_b1 - cpu_b0
    return {
        "target_msgs_per_s": rate,
        "achieved_msgs_per_s": round(sent.messages / sent.seconds, 1),
        "seconds": round(sent.seconds, 3),
        "messages": sent.messages,
        "max_backlog_msgs": sent.max_backlog,
        "latency_ms": ceil.latency_summary_ms(dr.latencies),
        "produce_requests": reqs,
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_produce_request": round(broker_cpu / reqs * 1e6, 1) if reqs else None,
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
    }


def consume_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    *,
    stall_timeout: float,
    timeout: float,
    check: Callable[[], None],
    broker_pid: int,
) -> dict[str, Any]:
    """assign() every partition from offset 0 and read ``expected`` messages back."""
    from confluent_kafka import Consumer, TopicPartition

    errors, stats = ErrorLog("consumer"), StatsCollector()
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"krill-bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "error_cb": errors.cb,
            "statistics.interval.ms": 500,
            "stats_cb": stats.cb,
            # librdkafka stops fetching once 100k messages wait in its queue and then backs
            # off for fetch.queue.backoff.ms (1 s by default since 2.4). With 100 B messages
            # that limit is ~10 MB and the backoff, not the broker, set the consume figure:
            # half the runs read ~150k msg/s at ~50 ms per fetch, the others >1M.
            "fetch.queue.backoff.ms": 1,
        }
    )
    cpu_b0, cpu_c0 = tree_cpu_seconds(broker_pid), client_cpu()
    pc = time.perf_counter
    try:
        t_start = pc()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        count = nbytes = gaps = 0
        next_off = [0] * partitions
        msg_errors: list[str] = []
        t_first = t_last = None
        deadline = time.monotonic() + timeout
        last_progress = time.monotonic()
        while count < expected:
            batch = c.consume(num_messages=5000, timeout=0.2)
            now = time.monotonic()
            if batch:
                for m in batch:
                    if m.error() is not None:
                        if len(msg_errors) < 5:
                            msg_errors.append(str(m.error()))
                        continue
                    part, off = m.partition(), m.offset()
                    if off != next_off[part]:
                        gaps += 1
                    next_off[part] = off + 1
                    nbytes += len(m.value())
                    count += 1
                t_last = pc()
                if t_first is None:
                    t_first = t_last
                last_progress = now
            else:
                check()
                if now - last_progress > stall_timeout:
                    raise CaseError(
                        f"consume stalled for {stall_timeout}s at {count}/{expected} messages"
                        + (f"; errors: {msg_errors}" if msg_errors else "")
                    )
            if now > deadline:
                raise CaseError(f"consume timed out at {count}/{expected} messages")
        cpu_b1, cpu_c1 = tree_cpu_seconds(broker_pid), client_cpu()
        stats.wait_fresh(c)
    finally:
        close_bounded(c, "consumer")
    assert t_last is not None and t_first is not None
    elapsed = t_last - t_start
    steady = t_last - t_first
    fetches = stats.requests("Fetch")
    verified = gaps == 0 and count == expected and next_off == _expected_ends(expected, partitions)
    return {
        "messages": count,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed, 1),
        "mb_per_s": round(nbytes / elapsed / MB, 2),
        "first_message_after_s": round(t_first - t_start, 3),
        "steady_msgs_per_s": round(count / steady, 1) if steady > 0 else None,
        "fetch_requests": fetches,
        "ms_per_fetch": round(elapsed / fetches * 1e3, 2) if fetches else None,
        "offset_gaps": gaps,
        "verified": verified,
        "message_errors": msg_errors,
        "broker_cpu_s": round(cpu_b1 - cpu_b0, 3),
        "client_cpu_s": round(cpu_c1 - cpu_c0, 3),
        "client_errors": errors.errors,
    }


def _expected_ends(n: int, partitions: int) -> list[int]:
    """End offsets after round-robin producing n messages over ``partitions`` partitions."""
    return [n // partitions + (1 if p < n % partitions else 0) for p in range(partitions)]
