"""read: a fetch's `Read` of a partition another shard owns, answered with where the bytes are.

    source                                        owner
    ReadCall(topic, partition, offset, max_bytes,  -->  Partition: where the bytes are
      leader epoch, budget left, budget taken)
                    <-- ReadAnswer(error, hwm, log start, FileSlice place)
                        (or the bytes as payload frame 0, when the log had them in memory)

No log bytes cross: the source opens the segment file by path (its fd cache is
calls/segments.py) and sendfiles it itself (DESIGN.md §3). The budget crosses as two ints and
is charged on the source, where the fetch response is built. Segment files are this node's:
a read from another node's replica (node RPC) will carry its bytes as payload frame 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from actors.partition import FetchBudget, Read, ReadResult
from shards.calls.base import Address, Request, tell_partition
from storage import FileSlice
from wire.errors import ErrorCode

if TYPE_CHECKING:
    from shards.router import Router

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


class ReadAnswer(NamedTuple):
    error: int
    high_watermark: int
    log_start_offset: int
    # A FileSlice's place: [path, position, length, record count, inode]; None: no slice
    # (nothing to read, or the bytes are payload frame 0).
    file_slice: list[Any] | None


def send(router: Router, to: Address, topic: str, partition: int, m: Read) -> None:
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
        result = ReadResult(error, hwm, start, records)
        size = result.size
        if size > budget.remaining and budget.taken:
            result = ReadResult(error, hwm, start)  # only a response's first batch may overflow
            size = 0
        budget.remaining -= size
        budget.taken += size
        m.reply(result)

    call = ReadCall(
        topic, partition, m.offset, m.max_bytes, m.current_leader_epoch, budget.remaining,
        budget.taken, m.any_replica,
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
        answer = ReadAnswer(
            int(result.error), result.high_watermark, result.log_start_offset, place
        )
        request.answer(answer, payloads)

    message = Read(call.offset, call.max_bytes, call.current_leader_epoch, budget, reply,
                   call.any_replica)
    if not tell_partition(request, call.topic, call.partition, message):
        reply(ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
