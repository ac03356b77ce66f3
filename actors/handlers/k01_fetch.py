"""Fetch (key 1), versions 4-12.

v4 is the first version carrying RecordBatch v2 with LastStableOffset and aborted
transactions; v5 log start offset; v7 fetch sessions (KIP-227); v9 current leader epoch;
v11 rack id and preferred read replica; v12 flexible, diverging epoch. v13+ address topics
by id and are not offered yet (librdkafka falls back to 12, CLIENTS.md gotcha 9).

Fetch sessions are declined: the answer always carries SessionId 0, so clients keep sending
full fetches (gotcha 8). Each partition's owner answers where the bytes are; the connection
sends them with sendfile. Whole batches only: a fetch inside a batch returns the whole batch.

A long poll waits until `min_bytes` are there or `max_wait_ms` passes. It registers one waiter
on every partition in the shard's watermark table (actors/watermarks.py), woken when a
partition's high watermark passes what this request read; then it reads again. The waiter is
cancelled, on all partitions at once, and the timer released when the request answers, and
when its connection closes first: an idle long poll holds nothing once it is over.

A round that read nothing is answered with its partitions in one fixed order, and with the
connection's previous answer while every partition's result is the same object: an idle
consumer's answer is built and encoded once, not every `fetch.wait.max.ms` (`answer`).

Isolation (KIP-98): READ_COMMITTED (isolation_level 1) reads whole batches below each
partition's last stable offset and answers the aborted transactions that overlap what it
could read; READ_UNCOMMITTED reads to the high watermark, its aborted transactions null.
Both answer the last stable offset (actors/txn_state.py). A read_committed long poll waits
on the same high-watermark notices: the last stable offset moves only when the high watermark
does (a marker counts once it is committed).
"""

from __future__ import annotations

from typing import Any

from actors import limits
from actors.handlers.join import Join, send
from actors.metrics import ShardMetrics
from actors.partition_messages import FetchBudget, Read, ReadResult
from actors.runtime import current_loop
from actors.watermarks import Waiter
from storage import FileSlice
from wire.errors import ErrorCode
from wire.messages.fetch import FetchRequest, FetchResponse
from wire.record_batch import offsets_spanned

FetchableTopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = FetchResponse.PartitionData
AbortedTransaction = FetchResponse.AbortedTransaction

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 12
REQUEST = FetchRequest

_EMPTY = b""
_READ_COMMITTED = 1


def handle(ctx: Any, request: FetchRequest) -> None:
    if request.session_id != 0:
        ctx.respond(FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0))
        return
    fetch = _Fetch(ctx, request)
    # From the start, not from the first wait: the connection may close while a round reads.
    ctx.on_abort(fetch.abort)
    fetch.read()


class _Fetch:
    """One fetch request through its read rounds until it has enough bytes or time is up."""

    def __init__(self, ctx: Any, request: FetchRequest) -> None:
        self.ctx = ctx
        self.parts = [(t.topic, p) for t in request.topics for p in t.partitions]
        self.keys = [(topic, p.partition) for topic, p in self.parts]
        # Partition actors, looked up when a round must ask one (the table answers the rest).
        self.refs: dict[int, Any] = {}
        self.max_bytes = min(
            request.max_bytes if ctx.version >= 3 else limits.fetch_response_bytes_max,
            limits.fetch_response_bytes_max,
        )
        self.min_bytes = request.min_bytes
        self.committed = request.isolation_level == _READ_COMMITTED
        wait_ms = min(max(request.max_wait_ms, 0), limits.fetch_wait_ms_max)
        # The loop's clock (time.monotonic in a shard; simulated time in scenarios/sim/).
        self.deadline = current_loop().time() + wait_ms / 1000
        self.timer: Any = None
        self.waiter: Waiter | None = None  # this round's wait on every partition
        self.last_results: list[ReadResult] = []  # what the round before the wait read
        self.done = False

    def read(self) -> None:
        """One round: a Read to each partition's actor, except those the shard's watermark
        table answers (missing, or idle at the offset asked); `read_done` when all are in."""
        results: list[ReadResult | None] = [None] * len(self.parts)
        to_read: list[int] = []
        missing = False
        idle_read, partition = self.ctx.services.long_polls.idle_read, self.ctx.services.partition
        for index, ((_, p), key) in enumerate(zip(self.parts, self.keys, strict=True)):
            idle = idle_read(key, p.fetch_offset, p.current_leader_epoch)
            if idle is not None:  # a local partition with nothing past the offset: no message
                results[index] = idle.at_end
                continue
            ref = self.refs.get(index)
            if ref is None:
                ref = self.refs[index] = partition(*key)
            if ref is None:
                results[index] = ReadResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                missing = True
            else:
                to_read.append(index)
        if not to_read:  # what the table answered is empty and fine: only `missing` counts
            self.read_done(results, 0, missing)  # type: ignore[arg-type]
            return

        def read_all(read: list[ReadResult]) -> None:
            for index, result in zip(to_read, read, strict=True):
                results[index] = result
            total = sum(r.size for r in read)
            failed = missing or any(r.error != ErrorCode.NONE for r in read)
            self.read_done(results, total, failed)  # type: ignore[arg-type]

        budget = FetchBudget(self.max_bytes)
        join = Join(len(to_read), read_all)
        for slot, index in enumerate(to_read):
            p, reply = self.parts[index][1], join.slot(slot)
            read = Read(
                p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch, budget, reply,
                committed=self.committed,
            )
            if not send(self.refs[index], read):
                reply(ReadResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))

    def read_done(self, results: list[ReadResult], total: int, failed: bool) -> None:
        """The round is in: `total` bytes read, `failed` if any partition answered an error."""
        if self.done:
            return  # the connection closed while this round read
        remaining = self.deadline - current_loop().time()
        enough = total >= self.min_bytes
        if enough or failed or remaining <= 0 or not self.parts:
            self.finish(results)
            return
        # Long poll: wait for any partition's high watermark to pass what this round saw.
        self.last_results = results
        watch, waiter = self.ctx.services.long_polls.watch, Waiter(self.wake)
        self.waiter = waiter
        for key, result in zip(self.keys, results, strict=True):
            if not watch(key, result.high_watermark, waiter):  # it moved since it was read
                self.cancel_watches()
                current_loop().call_soon(self.wake)
                return
        if self.timer is None:
            self.timer = current_loop().call_later(remaining, self.expire)

    def wake(self) -> None:
        if self.done:
            return
        self.cancel_watches()
        self.read()

    def expire(self) -> None:
        self.timer = None
        if not self.done:
            self.cancel_watches()
            self.finish(self.last_results)

    def abort(self) -> None:
        """The connection closed before the answer: release everything this request holds."""
        self.done = True
        self.cancel_watches()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def cancel_watches(self) -> None:
        if self.waiter is not None:  # dead on every partition at once; swept later
            self.waiter.cancel()
            self.waiter = None

    def finish(self, results: list[ReadResult]) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not any(r.records is not None for r in results):
            self.ctx.respond(self.answer(results))
            return
        metrics = self.ctx.services.metrics
        if metrics is not None:
            _count_fetched(metrics, self.parts, results)
        self.ctx.memo = None  # an answer with records is never the same twice
        self.ctx.respond(_response(self.parts, results, self.committed))

    def answer(self, results: list[ReadResult]) -> FetchResponse:
        """The response to a round that read nothing, its partitions in one fixed order:
        the one this connection got last if it asked for the same partitions and every
        result is the same object (an idle partition's answer, made when it last published).
        An idle consumer asks the same thing every few ms, and its answer is then built and
        encoded once. The order is free: clients find a response's partitions by topic and
        partition (librdkafka rotates where its requests start, so none match byte for
        byte)."""
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        keys = [self.keys[i] for i in order]
        ordered = [results[i] for i in order]
        memo = self.ctx.memo
        if (
            memo is not None
            and memo[0] == (keys, self.committed)
            and all(a is b for a, b in zip(memo[1], ordered, strict=True))
        ):
            response: FetchResponse = memo[2]
            return response
        parts = [self.parts[i] for i in order]
        response = _response(parts, ordered, self.committed)
        self.ctx.memo = ((keys, self.committed), ordered, response)
        return response


def _response(parts: list[Any], results: list[ReadResult], committed: bool) -> FetchResponse:
    topics: dict[str, list[PartitionData]] = {}
    for (topic, p), result in zip(parts, results, strict=True):
        aborted = None
        if committed:
            aborted = [AbortedTransaction(producer_id=producer_id, first_offset=first)
                       for producer_id, first in result.aborted_transactions or ()]
        topics.setdefault(topic, []).append(
            PartitionData(
                partition_index=p.partition,
                error_code=result.error,
                high_watermark=result.high_watermark,
                last_stable_offset=result.last_stable_offset,
                log_start_offset=result.log_start_offset,
                aborted_transactions=aborted,
                preferred_read_replica=-1,
                records=result.records if result.records is not None else _EMPTY,
            )
        )
    return FetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        session_id=0,
        responses=[
            FetchableTopicResponse(topic=name, partitions=partitions)
            for name, partitions in topics.items()
        ],
    )


def _count_fetched(metrics: ShardMetrics, parts: list[Any], results: list[ReadResult]) -> None:
    """Bytes and records sent, per partition, by this shard (whoever owns the partition)."""
    for (topic, p), result in zip(parts, results, strict=True):
        records = result.records
        if records is None:
            continue
        stats = metrics.partition(topic, p.partition)
        stats.fetched_bytes += result.size
        if isinstance(records, FileSlice):
            stats.fetched_records += records.records
        else:  # bytes read from memory (direct mode's chunks), or another shard's answer
            stats.fetched_records += offsets_spanned(records)
