"""Simulated Kafka clients: real request frames to a shard's `Connection` actor over a socket
pair, on the virtual loop, recording what they did in the history (scenarios/history.py).

`SimProducer` behaves as librdkafka's idempotent producer with acks=all: one record per
ProduceRequest, at most `max_in_flight` requests per partition, every retry with the same
producer id, epoch and sequence. A retriable error, a lost connection or a request timeout
(the connection is then closed, as librdkafka does, and opened again) makes the partition
wait for its requests in flight and resend from the first record not acknowledged; the
broker's sequence check turns a resend of what it already has into the original offset. A
record not acknowledged within `delivery_timeout_s` ends `unknown` (or `failed` if it was
never sent), and that partition stops taking records (librdkafka would bump the epoch).

`SimConsumer` reads its assigned partitions from offset 0 with sessionless Fetch requests,
one after the other, recording each poll that returned records. Their connections are
scenarios/sim/connection.py.

Times in the history are nanoseconds of simulated time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from scenarios.history import Op
from scenarios.sim.connection import (
    PRODUCE_VERSION,
    Callback,
    ClientConnection,
    World,
    encode_request,
)
from wire.errors import DecodeError, ErrorCode
from wire.messages.fetch import FetchRequest
from wire.messages.init_producer_id import InitProducerIdRequest
from wire.messages.produce import ProduceRequest
from wire.records import build_batch, iter_records

if TYPE_CHECKING:
    import random
    from collections import defaultdict

__all__ = ["ClientSettings", "SimConsumer", "SimProducer"]

FETCH_VERSION = 11
INIT_PRODUCER_ID_VERSION = 1
_SIZE = struct.Struct(">i")

# What librdkafka retries (the rest fail the record).
RETRIABLE = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.UNKNOWN_SERVER_ERROR,
})


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """The librdkafka settings the simulated clients follow (simulated time)."""

    request_timeout_s: float = 30.0  # request.timeout.ms
    delivery_timeout_s: float = 300.0  # message.timeout.ms
    retry_backoff_s: float = 0.1  # retry.backoff.ms
    reconnect_backoff_s: float = 0.1  # reconnect.backoff.ms
    max_in_flight: int = 5  # max.in.flight.requests.per.connection (idempotence: at most 5)
    fetch_wait_max_s: float = 0.1  # fetch.wait.max.ms
    fetch_error_backoff_s: float = 0.5  # fetch.error.backoff.ms

    @classmethod
    def of(cls, settings: dict[str, Any]) -> ClientSettings:
        """From librdkafka's names (milliseconds); unknown names are ignored."""
        names = {"request.timeout.ms": "request_timeout_s",
                 "message.timeout.ms": "delivery_timeout_s",
                 "delivery.timeout.ms": "delivery_timeout_s",
                 "retry.backoff.ms": "retry_backoff_s",
                 "reconnect.backoff.ms": "reconnect_backoff_s",
                 "fetch.wait.max.ms": "fetch_wait_max_s",
                 "fetch.error.backoff.ms": "fetch_error_backoff_s"}
        values: dict[str, Any] = {}
        for key, value in settings.items():
            if key in names:
                values[names[key]] = float(value) / 1000
            elif key == "max.in.flight.requests.per.connection":
                values["max_in_flight"] = int(value)
        return cls(**values)


class ClientWorld(World, Protocol):
    """What the clients need of the simulation (scenarios/sim/engine.py's): a connection's
    world, and where operations, figures and acknowledgements are noted."""

    rng: random.Random
    figures: defaultdict[str, Any]
    acked: int
    client_settings: ClientSettings

    def record(self, op: Op) -> None: ...


class _Client:
    """What both kinds share: a connection that is opened again after it is lost."""

    def __init__(self, sim: ClientWorld, name: str, home_shard: int) -> None:
        self.sim = sim
        self.name = name
        self.settings = sim.client_settings
        self._home = home_shard
        self.conn: ClientConnection | None = None
        self._connecting = False
        self.stopped = False  # takes no more work (a producer: no more records)
        self.closed = False  # done for good: no reconnects, no timeout scans
        self._scan_every_s = min(1.0, self.settings.request_timeout_s / 4)
        sim.loop.call_later(self._scan_every_s, self._scan_timeouts)

    def _scan_timeouts(self) -> None:
        """As librdkafka does: a request unanswered for `request_timeout_s` closes its
        connection (every request on it ends without an answer); it is opened again."""
        if self.closed:
            return
        conn = self.conn
        if conn is not None and not conn.closed:
            oldest = conn.oldest_sent_ns()
            if oldest is not None and \
                    self.sim.now_ns() - oldest >= self.settings.request_timeout_s * 1e9:
                self.sim.figures["request_timeouts"] += 1
                conn.close()
        self.sim.loop.call_later(self._scan_every_s, self._scan_timeouts)

    def _connect(self) -> bool:
        """Open a connection to a running shard (the home one if it is up); False if none."""
        node = self.sim.node
        up = [s for s in range(node.shards) if node.up(s) is not None]
        if not up:
            return False
        shard = self._home if self._home in up else self.sim.rng.choice(up)
        self.conn = ClientConnection(self.sim, shard, self.name, self._reconnect_later)
        return True

    def _reconnect_later(self) -> None:
        if self._connecting or self.closed:
            return
        self._connecting = True

        def attempt() -> None:
            self._connecting = False
            if self.closed:
                return
            if self.conn is None or self.conn.closed:
                if not self._connect():
                    self._reconnect_later()
                    return
            self._connected()

        self.sim.loop.call_later(self.settings.reconnect_backoff_s, attempt)

    def _connected(self) -> None:
        raise NotImplementedError

    def _request(self, api_key: int, version: int, request: Any, callback: Callback,
                 parts: list[bytes | bytearray] | None = None) -> None:
        """Send `request` (or the frame `parts` hold); `callback(None)` and a reconnect if it
        gets no answer."""
        conn = self.conn
        if conn is None or conn.closed:
            callback(None)
            self._reconnect_later()
            return

        def answered(body: Any) -> None:
            callback(body)
            if body is None:
                self._reconnect_later()

        if parts is None:
            conn.send(api_key, version, request, answered)
        else:
            conn.send_frame(api_key, version, parts, answered)


@dataclass(slots=True)
class _Record:
    value: str
    sequence: int
    invoke_ns: int
    sent: bool = False
    done: bool = False


@dataclass(slots=True)
class _PartitionState:
    index: int
    next_sequence: int = 0
    queue: list[_Record] = field(default_factory=list)  # not yet acknowledged, in order
    next_to_send: int = 0  # index into `queue`
    in_flight: int = 0
    rewinding: bool = False  # wait for what is in flight, back off, resend from the start
    backing_off: bool = False  # rewinding, nothing in flight: waiting retry.backoff.ms
    dead: bool = False
    frame_head: bytes | None = None  # see SimProducer._frame_head


class SimProducer(_Client):
    def __init__(
        self, sim: ClientWorld, name: str, home_shard: int, topic: str, partitions: int,
        rate: float, message_bytes: int,
    ) -> None:
        super().__init__(sim, name, home_shard)
        self.topic = topic
        self.rate = rate
        self._padding = max(0, message_bytes - len(name) - 8)
        self._parts = [_PartitionState(i) for i in range(partitions)]
        self._count = 0
        self.producer_id = -1
        self.epoch = 0
        self.acked = 0

    @property
    def pending(self) -> int:
        return sum(len(p.queue) for p in self._parts)

    def start(self) -> None:
        if self._connect():
            self._connected()
        else:
            self._reconnect_later()
        self.sim.loop.call_later(self.sim.rng.uniform(0, 1 / self.rate), self._tick)

    def _connected(self) -> None:
        if self.producer_id < 0:
            self._request(22, INIT_PRODUCER_ID_VERSION,
                          InitProducerIdRequest(transactional_id=None,
                                                transaction_timeout_ms=60000),
                          self._got_producer_id)
            return
        for part in self._parts:
            self._pump(part)

    def _got_producer_id(self, body: Any) -> None:
        if body is None or body.error_code != ErrorCode.NONE:
            if body is not None:
                self.sim.loop.call_later(self.settings.retry_backoff_s, self._connected)
            return  # None: reconnecting, which asks again
        self.producer_id, self.epoch = body.producer_id, body.producer_epoch
        for part in self._parts:
            self._pump(part)

    def stop(self) -> None:
        self.stopped = True

    def _tick(self) -> None:
        if self.stopped:
            return
        sim = self.sim
        part = self._parts[self._count % len(self._parts)]
        value = f"{self.name}-{self._count}"
        self._count += 1
        if part.dead:
            sim.record(Op("send", self.name, sim.now_ns(), sim.now_ns(), "failed",
                          topic=self.topic, partition=part.index, value=value))
        else:
            part.queue.append(_Record(value, part.next_sequence, sim.now_ns()))
            part.next_sequence += 1
            self._pump(part)
        sim.loop.call_later(1 / self.rate, self._tick)

    def _pump(self, part: _PartitionState) -> None:
        if self.producer_id < 0 or part.rewinding or part.dead:
            return
        conn = self.conn
        if conn is None or conn.closed:
            return
        while part.in_flight < self.settings.max_in_flight and part.next_to_send < len(part.queue):
            record = part.queue[part.next_to_send]
            part.next_to_send += 1
            if self._expired(part, record):
                return
            self._send(part, record)

    def _expired(self, part: _PartitionState, record: _Record) -> bool:
        """Past the delivery timeout: the partition's records end, and it takes no more."""
        sim = self.sim
        if sim.now_ns() - record.invoke_ns < self.settings.delivery_timeout_s * 1e9:
            return False
        part.dead = True
        for r in part.queue:
            self._complete(part, r, "unknown" if r.sent else "failed", None)
        part.queue.clear()
        return True

    def _send(self, part: _PartitionState, record: _Record) -> None:
        sim = self.sim
        record.sent = True
        part.in_flight += 1
        batch = build_batch(
            [(None, (record.value + " " * self._padding).encode(), [])],
            producer_id=self.producer_id, producer_epoch=self.epoch,
            base_sequence=record.sequence, base_timestamp=sim.now_ns() // 1_000_000,
        )
        if part.frame_head is None:
            part.frame_head = self._frame_head(part.index)
        sim.figures["produce_requests"] += 1
        self._request(0, PRODUCE_VERSION, None,
                      lambda body: self._answered(part, record, body),
                      [part.frame_head, _SIZE.pack(len(batch)), batch])

    def _frame_head(self, index: int) -> bytes:
        """A ProduceRequest frame for one batch of partition `index`, up to the batch's own
        length: in v3-8 the record set is the last field, so a request is this, the batch's
        length and the batch."""
        request = ProduceRequest(
            acks=-1, timeout_ms=30000, transactional_id=None,
            topic_data=[ProduceRequest.TopicProduceData(
                name=self.topic,
                partition_data=[ProduceRequest.PartitionProduceData(index=index, records=b"")],
            )],
        )
        frame = encode_request(self.name, 0, PRODUCE_VERSION, request)
        assert frame.endswith(b"\0\0\0\0"), "the empty record set is the frame's end"
        return frame[:-4]

    def _answered(self, part: _PartitionState, record: _Record, body: Any) -> None:
        part.in_flight -= 1
        if record.done:
            pass
        elif body is None:
            part.rewinding = True
        else:
            error = ErrorCode(body.error_code)
            answer = body
            if error != ErrorCode.NONE:
                self.sim.figures[f"produce_{error.name}"] += 1
            if error == ErrorCode.NONE:
                self._complete(part, record, "ok", answer.base_offset)
                part.queue.remove(record)
                part.next_to_send -= 1
            elif error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                self._complete(part, record, "unknown", None)
                part.queue.remove(record)
                part.next_to_send -= 1
            elif error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and record is part.queue[0]:
                # Nothing before it waits: the broker took later sequences (this one's first
                # attempt was lost on its way). A resend can never fit; librdkafka raises a
                # gap here. Whether an earlier attempt was written is not known.
                self._complete(part, record, "unknown", None)
                part.queue.remove(record)
                part.next_to_send -= 1
                part.rewinding = True
            elif error in RETRIABLE:
                part.rewinding = True
            else:
                self._complete(part, record, "failed", None)
                part.queue.remove(record)
                part.next_to_send -= 1
                part.rewinding = True  # later sequences no longer follow: resend them
        if part.rewinding and part.in_flight == 0:
            if not part.backing_off:  # new records wait out the backoff too, as librdkafka's
                part.backing_off = True
                self.sim.loop.call_later(self.settings.retry_backoff_s, self._resend, part)
        else:
            self._pump(part)

    def _resend(self, part: _PartitionState) -> None:
        part.backing_off = part.rewinding = False
        part.next_to_send = 0
        self._pump(part)

    def _complete(self, part: _PartitionState, record: _Record, outcome: str,
                  offset: int | None) -> None:
        record.done = True
        sim = self.sim
        if outcome == "ok":
            self.acked += 1
            sim.acked += 1
        sim.record(Op("send", self.name, record.invoke_ns, sim.now_ns(), outcome,
                      topic=self.topic, partition=part.index, value=record.value,
                      offset=offset))

    def abandon(self) -> None:
        """The run is over: what was never acknowledged ends `unknown` (or `failed`)."""
        self.stopped = self.closed = True
        for part in self._parts:
            for record in part.queue:
                if not record.done:
                    self._complete(part, record, "unknown" if record.sent else "failed", None)
            part.queue.clear()
        if self.conn is not None:
            self.conn.close()


class SimConsumer(_Client):
    def __init__(self, sim: ClientWorld, name: str, home_shard: int,
                 assignment: list[tuple[str, int]]) -> None:
        super().__init__(sim, name, home_shard)
        self.assignment = assignment
        self.position = {tp: 0 for tp in assignment}
        self.high_watermark = {tp: 0 for tp in assignment}
        self._fetching = False
        self.caught_up_since_ns = -1  # a fetch that began after this found nothing new

    def start(self) -> None:
        sim = self.sim
        sim.record(Op("assign", self.name, sim.now_ns(), sim.now_ns(), "ok",
                      partitions=tuple(self.assignment)))
        if self._connect():
            self._connected()
        else:
            self._reconnect_later()

    def _connected(self) -> None:
        self._fetch()

    def caught_up(self, since_ns: int) -> bool:
        return self.caught_up_since_ns >= since_ns

    def _fetch(self) -> None:
        if self._fetching or self.stopped or not self.assignment:
            return
        topics: dict[str, list[FetchRequest.FetchPartition]] = {}
        for topic, index in self.assignment:
            topics.setdefault(topic, []).append(FetchRequest.FetchPartition(
                partition=index, current_leader_epoch=-1,
                fetch_offset=self.position[(topic, index)], partition_max_bytes=1 << 20))
        request = FetchRequest(
            replica_id=-1, max_wait_ms=round(self.settings.fetch_wait_max_s * 1000),
            min_bytes=1, max_bytes=4 << 20, isolation_level=0, session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        )
        self._fetching = True
        started = self.sim.now_ns()
        self._request(1, FETCH_VERSION, request, lambda body: self._fetched(body, started))

    def _fetched(self, body: Any, started_ns: int) -> None:
        self._fetching = False
        if body is None:
            return  # reconnecting; fetches again once connected
        sim = self.sim
        records: list[tuple[str, int, int, str | None]] = []
        behind = False
        for topic in body.responses:
            for p in topic.partitions:
                tp = (topic.topic, p.partition_index)
                if p.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._reset(tp)
                    behind = True
                    continue
                if p.error_code != ErrorCode.NONE:
                    behind = True
                    continue
                self.high_watermark[tp] = p.high_watermark
                got = self._records(tp, p.records)
                records.extend(got)
                if got:
                    self.position[tp] = got[-1][2] + 1
                if self.position[tp] < p.high_watermark:
                    behind = True
        if records:
            sim.record(Op("poll", self.name, started_ns, sim.now_ns(), "ok",
                          records=tuple(records)))
        elif not behind:
            self.caught_up_since_ns = max(self.caught_up_since_ns, started_ns)
        if behind and not records:
            # An error or an unreadable range answers at once, without a long poll: fetching
            # again at once would spin without simulated time passing (librdkafka waits
            # fetch.error.backoff.ms too).
            sim.loop.call_later(self.settings.fetch_error_backoff_s, self._fetch)
            return
        self._fetch()

    def _records(self, tp: tuple[str, int], data: Any) -> list[tuple[str, int, int, str | None]]:
        if not data:
            return []
        try:
            decoded = list(iter_records(data, start_offset=self.position[tp]))
        except DecodeError:
            self.sim.figures["bad_fetches"] += 1
            return []
        return [(tp[0], tp[1], r.offset, _value(r.value)) for r in decoded]

    def _reset(self, tp: tuple[str, int]) -> None:
        """The position is outside the log: start again from its beginning."""
        sim = self.sim
        self.position[tp] = 0
        sim.record(Op("assign", self.name, sim.now_ns(), sim.now_ns(), "ok",
                      partitions=tuple(self.assignment)))

    def stop(self) -> None:
        self.stopped = self.closed = True
        if self.conn is not None:
            self.conn.close()


def _value(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    return bytes(raw).decode(errors="replace").rstrip(" ")
