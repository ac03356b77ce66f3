"""Produce (key 0), versions 3-9.

v3 is the first version carrying RecordBatch v2 (magic 2) and TransactionalId; v5 adds
LogStartOffset to the response; v7 allows zstd; v8 adds RecordErrors (the records that made a
batch be refused, by index: KIP-467, actors/record_checks.py) and ErrorMessage; v9 is
flexible. Versions 0-2 (message sets v0/v1) are not offered, so clients write v2 batches
(CLIENTS.md §4).

Record sets stay opaque bytes: each batch's header, length and CRC-32C are checked here, then
the partition's owner assigns offsets and appends (DESIGN.md §2). acks=0 gets no response;
acks=1 and acks=all are answered once the data is flushed (safe mode). An acks=all produce
to a topic whose min.insync.replicas exceeds the replicas in sync gets NOT_ENOUGH_REPLICAS and
is not appended, as Kafka answers: the partition's leader knows its in-sync replicas and
checks (actors/partition_produce.py); acks=0 and acks=1 do not wait for other replicas.

Transactional batches (KIP-98) are taken: each must carry a producer id, and opens or
continues its producer's transaction on the partition (actors/txn_state.py); the request's
TransactionalId is carried, not checked (the coordinator fences producers by epoch, which the
partition checks). Control batches are refused: only the coordinator writes markers.
"""

from __future__ import annotations

from typing import Any

from actors.handlers.join import Join, send
from actors.partition_messages import Produce, ProduceResult
from wire import limits
from wire.errors import DecodeError, ErrorCode
from wire.messages.produce import ProduceRequest, ProduceResponse
from wire.record_batch import BatchHeader, iter_batches

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 9
REQUEST = ProduceRequest

TopicProduceResponse = ProduceResponse.TopicProduceResponse
PartitionProduceResponse = ProduceResponse.PartitionProduceResponse
BatchIndexAndErrorMessage = ProduceResponse.BatchIndexAndErrorMessage

_VALID_ACKS = (0, 1, -1)
_CODEC_MAX = 4  # zstd


def expects_response(request: ProduceRequest) -> bool:
    return request.acks != 0


def handle(ctx: Any, request: ProduceRequest) -> None:
    services = ctx.services
    acks = request.acks
    parts = [(t.name, p) for t in request.topic_data for p in t.partition_data]
    join = None
    if acks != 0:
        join = Join(len(parts), lambda results: ctx.respond(_response(parts, results)))
    # Received into the shard's arena: each partition's produce holds the region until its
    # phase one, when the bytes are in the log (or refused); a cross-core one passes them on
    # by reference.
    lent = ctx.frame_buffer
    for index, (topic, data) in enumerate(parts):
        reply = join.slot(index) if join is not None else None
        error, message, headers = _check(acks, data.records)
        if error is None:
            ref = services.partition(topic, data.index)
            if ref is not None:
                on_dispatched = None
                if lent is not None:
                    lent.retain()
                    on_dispatched = lent.release
                trace = ctx.trace if index == 0 else None  # the first partition's, if sampled
                if send(ref, Produce(data.records, headers, acks, reply, on_dispatched,
                                     trace=trace)):
                    continue
                if lent is not None:
                    lent.release()
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if reply is not None:
            reply(ProduceResult(error, message=message))


def _check(
    acks: int, records: memoryview | None
) -> tuple[ErrorCode | None, str | None, list[BatchHeader]]:
    """(error, message, batch headers): error None when the record set may be appended."""
    if acks not in _VALID_ACKS:
        return ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} is not 0, 1 or -1", []
    if not records:
        return ErrorCode.CORRUPT_MESSAGE, "no record batches", []
    try:
        # The topic's max.message.bytes is checked by the partition, which knows the topic.
        headers = iter_batches(records, batch_bytes_max=limits.frame_bytes_max)
    except DecodeError as e:
        return ErrorCode.CORRUPT_MESSAGE, str(e), []
    for header in headers:
        if header.codec > _CODEC_MAX:
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"codec {header.codec}", []
        if header.is_control:
            return ErrorCode.INVALID_RECORD, "clients may not write control batches", []
        if header.is_transactional and header.producer_id < 0:
            return ErrorCode.INVALID_RECORD, "a transactional batch needs a producer id", []
    return None, None, headers


def _response(parts: list[tuple[str, Any]], results: list[ProduceResult]) -> ProduceResponse:
    topics: dict[str, list[PartitionProduceResponse]] = {}
    for (topic, data), result in zip(parts, results, strict=True):
        topics.setdefault(topic, []).append(
            PartitionProduceResponse(
                index=data.index,
                error_code=result.error,
                base_offset=result.base_offset,
                log_append_time_ms=result.log_append_time_ms,
                log_start_offset=result.log_start_offset,
                record_errors=[
                    BatchIndexAndErrorMessage(batch_index=e.batch_index,
                                              batch_index_error_message=e.message)
                    for e in result.record_errors
                ],
                error_message=result.message,
            )
        )
    return ProduceResponse(
        responses=[
            TopicProduceResponse(name=name, partition_responses=partitions)
            for name, partitions in topics.items()
        ],
        throttle_time_ms=0,
    )
