"""The checks a produce makes record by record (KIP-467): a record Kafka's LogValidator
refuses is named by its index in its batch, so a client fails just that record and fails the
others of the batch with "an invalid record in the same batch" (librdkafka's
_INVALID_DIFFERENT_RECORD), instead of failing them all alike.

Record sets stay opaque on the produce path (DESIGN.md §2); the one check Krill makes inside
them is Kafka's for compacted topics, where every record needs a key (compaction keeps the
latest value of each key, and a keyless record has none). Only such a topic's batches are
decoded, one at a time; the partition asks this before it appends. Kafka's other per-record
check, a timestamp within `message.timestamp.{before,after}.max.ms`, has no counterpart: Krill
refuses those settings (actors/topic_config.py).

    batch of 7 records, keys on 0 2 3 6  ->  INVALID_RECORD, record errors at 1 4 5, and a
                                             summary naming how many and the first three

As in Kafka, the first batch with a refused record refuses the whole record set, and its
indexes count from that batch's first record. At most `record_errors_max` are listed.
"""

from __future__ import annotations

from actors import limits
from actors.partition_messages import ProduceResult, RecordError
from wire.errors import DecodeError, ErrorCode
from wire.record_batch import BatchHeader
from wire.records import decode_batch

__all__ = ["keyless_records"]

_SHOWN_IN_SUMMARY = 3  # record errors quoted in the partition's error message, as Kafka


def keyless_records(records: memoryview, headers: list[BatchHeader], partition: str
                    ) -> ProduceResult | None:
    """The refusal of a record set for a compacted topic holding a record with no key (or
    records that do not decode), None if every record has a key. `partition` names it in
    the messages, as `topic-index`."""
    message = f"Compacted topic cannot accept message without key in topic partition {partition}"
    for header in headers:
        if header.is_control:
            continue  # a transaction marker: its record's key is the marker's type
        batch = records[header.position:header.position + header.size]
        try:
            _, decoded = decode_batch(batch, check_crc=False)  # the handler checked the CRC
        except DecodeError as e:
            return ProduceResult(ErrorCode.INVALID_RECORD, message=f"records do not decode: {e}")
        errors = tuple(RecordError(index, message)
                       for index, record in enumerate(decoded) if record.key is None)
        if errors:
            return _refusal(errors)
    return None


def _refusal(errors: tuple[RecordError, ...]) -> ProduceResult:
    shown = ", ".join(f"RecordError(batchIndex={e.batch_index}, message='{e.message}')"
                      for e in errors[:_SHOWN_IN_SUMMARY])
    summary = (f"One or more records have been rejected due to {len(errors)} record errors in "
               f"total, and only showing the first three errors at most: [{shown}]")
    return ProduceResult(ErrorCode.INVALID_RECORD, message=summary,
                         record_errors=errors[:limits.record_errors_max])
