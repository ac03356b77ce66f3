"""Fetch (key 1), versions 4-12.

v4 is the first version carrying RecordBatch v2 with LastStableOffset and aborted
transactions; v5 log start offset; v7 fetch sessions (KIP-227); v9 current leader epoch;
v11 rack id and preferred read replica; v12 flexible, diverging epoch. v13+ address topics
by id and are not offered yet (librdkafka falls back to 12, CLIENTS.md gotcha 9).

Fetch sessions are declined: the answer always carries SessionId 0, so clients keep sending
full fetches (gotcha 8). Each partition's owner answers where the bytes are; the connection
sends them with sendfile. Whole batches only: a fetch inside a batch returns the whole batch.
A long poll waits until `min_bytes` are there or `max_wait_ms` passes, woken by
high-watermark notices from the partitions, never by polling.
"""

from __future__ import annotations

import time
from typing import Any

from actors import limits
from actors.handlers.join import Join, send
from actors.partition import FetchBudget, Read, ReadResult, WatchHighWatermark
from actors.runtime import current_loop
from wire.errors import ErrorCode
from wire.messages.fetch import FetchRequest, FetchResponse

FetchableTopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = FetchResponse.PartitionData

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 12
REQUEST = FetchRequest

_EMPTY = b""


def handle(ctx: Any, request: FetchRequest) -> None:
    if request.session_id != 0:
        ctx.respond(FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0))
        return
    _Fetch(ctx, request).read()


class _Fetch:
    """One fetch request through its read rounds until it has enough bytes or time is up."""

    def __init__(self, ctx: Any, request: FetchRequest) -> None:
        self.ctx = ctx
        self.parts = [(t.topic, p) for t in request.topics for p in t.partitions]
        self.refs = [ctx.services.partition(topic, p.partition) for topic, p in self.parts]
        self.max_bytes = min(
            request.max_bytes if ctx.version >= 3 else limits.fetch_response_bytes_max,
            limits.fetch_response_bytes_max,
        )
        self.min_bytes = request.min_bytes
        wait_ms = min(max(request.max_wait_ms, 0), limits.fetch_wait_ms_max)
        self.deadline = time.monotonic() + wait_ms / 1000
        self.round = 0
        self.timer: Any = None
        self.last_results: list[ReadResult] = []  # what the round before the wait read

    def read(self) -> None:
        self.round += 1
        budget = FetchBudget(self.max_bytes)
        join = Join(len(self.parts), self.read_done)
        for index, ((_, p), ref) in enumerate(zip(self.parts, self.refs, strict=True)):
            reply = join.slot(index)
            read = Read(
                p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch, budget, reply
            )
            if ref is None or not send(ref, read):
                reply(ReadResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))

    def read_done(self, results: list[ReadResult]) -> None:
        total = sum(r.size for r in results)
        remaining = self.deadline - time.monotonic()
        enough = total >= self.min_bytes
        failed = any(r.error != ErrorCode.NONE for r in results)
        if enough or failed or remaining <= 0 or not self.parts:
            self.ctx.respond(self.response(results))
            return
        # Long poll: wait for any partition's high watermark to move, or the deadline.
        wake_round = self.round
        for ref in self.refs:
            if ref is not None:
                send(ref, WatchHighWatermark(lambda: self.wake(wake_round)))
        self.timer = current_loop().call_later(remaining, self.expire, wake_round)
        self.last_results = results

    def wake(self, wake_round: int) -> None:
        if wake_round != self.round:
            return  # a watcher from a round already over
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.read()

    def expire(self, wake_round: int) -> None:
        if wake_round != self.round:
            return
        self.round += 1
        self.timer = None
        self.ctx.respond(self.response(self.last_results))

    def response(self, results: list[ReadResult]) -> FetchResponse:
        topics: dict[str, list[PartitionData]] = {}
        for (topic, p), result in zip(self.parts, results, strict=True):
            topics.setdefault(topic, []).append(
                PartitionData(
                    partition_index=p.partition,
                    error_code=result.error,
                    high_watermark=result.high_watermark,
                    last_stable_offset=result.high_watermark,
                    log_start_offset=result.log_start_offset,
                    aborted_transactions=None,
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
