"""read: a fetch's `Read` of a partition another shard owns, answered with where the bytes are.

    source                                        owner
    ReadCall(topic, partition, offset, max_bytes,  -->  Partition: where the bytes are
      leader epoch, budget left, budget taken,
      any replica, committed)
                    <-- ReadAnswer(error, hwm, log start, FileSlice place, last stable
                        offset, aborted transactions as [producer id, first offset] pairs
                        or None)
                        (or the bytes as payload frame 0, when the log had them in memory)

No log bytes cross: the source opens the segment file by path (its fd cache is
calls/segments.py) and sendfiles it itself (DESIGN.md §3). The budget crosses as two ints and
is charged on the source, where the fetch response is built. Segment files are this node's:
a read from another node's replica (node RPC) will carry its bytes as payload frame 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.partition_messages import FetchBudget, Read, ReadResult
from shards.calls.base import Address, Caller, Request, tell_partition
from storage import FileSlice
from wire.errors import ErrorCode

__all__ = ["KIND", "ReadAnswer", "ReadCall", "send", "serve"]

KIND = 3


class ReadCall(NamedTuple):
    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int
    budget_remaining: int
    budget_taken: int
    any_replica: bool
    committed: bool  # read_committed (Read.committed)


class ReadAnswer(NamedTuple):
    error: int
    high_watermark: int
    log_start_offset: int
    # A FileSlice's place: [path, position, length, record count, inode]; None: no slice
    # (nothing to read, or the bytes are payload frame 0).
    file_slice: list[Any] | None
    last_stable_offset: int
    aborted_transactions: list[list[int]] | None  # [producer id, first offset] each


def send(router: Caller, to: Address, topic: str, partition: int, m: Read) -> None:
    budget = m.budget

    def on_reply(body: Any, frames: list[Any]) -> None:
        answer = ReadAnswer._make(body)
        error, hwm, start = ErrorCode(answer.error), answer.high_watermark, answer.log_start_offset
        records: Any = None
        if answer.file_slice is not None:
            path, position, length, count, inode = answer.file_slice
            file = router.segment_files.open(path, inode)
            if file is not None:
                records = FileSlice(file.fd, position, length, path, count, inode, file)
        elif frames:
            records = memoryview(frames[0])
        lso, pairs = answer.last_stable_offset, answer.aborted_transactions
        aborted = None if pairs is None else [(pid, first) for pid, first in pairs]
        result = ReadResult(error, hwm, start, records, lso, aborted)
        size = result.size
        if size > budget.remaining and budget.taken:
            # Only a response's first batch may overflow.
            result = ReadResult(error, hwm, start, None, lso)
            size = 0
        budget.remaining -= size
        budget.taken += size
        m.reply(result)

    call = ReadCall(
        topic, partition, m.offset, m.max_bytes, m.current_leader_epoch, budget.remaining,
        budget.taken, m.any_replica, m.committed,
    )  # fmt: skip
    router.call(to, KIND, call, [], on_reply)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    call = ReadCall._make(body)
    budget = FetchBudget(call.budget_remaining)
    budget.taken = call.budget_taken

    def reply(result: ReadResult) -> None:
        records = result.records
        place: list[Any] | None = None
        payloads: list[Any] = []
        if isinstance(records, FileSlice):
            place = [records.path, records.position, records.length, records.records,
                     records.inode]
        elif records is not None:
            payloads = [records]
        aborted = result.aborted_transactions
        answer = ReadAnswer(
            int(result.error), result.high_watermark, result.log_start_offset, place,
            result.last_stable_offset, None if aborted is None else [list(a) for a in aborted],
        )
        request.answer(answer, payloads)

    message = Read(call.offset, call.max_bytes, call.current_leader_epoch, budget, reply,
                   call.any_replica, call.committed)
    if not tell_partition(request, call.topic, call.partition, message):
        reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
