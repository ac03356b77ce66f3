"""Random operations on a DiskLog and a MemoryLog side by side; every answer must match.

One seed reproduces a run: `KRILL_FUZZ_SEED=123 pytest tests/storage/test_fuzz.py`.
"""

from __future__ import annotations

import os
import random

import pytest

from storage import DiskLog, FlushTicket, Log, LogConfig, MemoryLog, OffsetOutOfRange
from tests.storage.batches import make_batch, make_records

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

SEEDS = [int(os.environ["KRILL_FUZZ_SEED"])] if "KRILL_FUZZ_SEED" in os.environ else range(12)
STEPS = 400


class Pair:
    def __init__(self, directory, config: LogConfig) -> None:
        self.directory, self.config = directory, config
        self.disk = DiskLog.open(directory, config)
        self.memory = MemoryLog(config)
        self.tickets: tuple[FlushTicket, FlushTicket] | None = None

    def check(self) -> None:
        d, m = self.disk, self.memory
        offsets = (d.log_start_offset, d.flushed_offset, d.written_offset, d.next_offset)
        assert offsets == (m.log_start_offset, m.flushed_offset, m.written_offset, m.next_offset)
        assert d.flushed_offset <= d.written_offset <= d.next_offset
        assert d.segment_base_offsets == m.segment_base_offsets
        assert d.max_timestamp() == m.max_timestamp()

    def append(self, rng: random.Random, now_ms: int) -> None:
        batches = []
        for _ in range(rng.randint(1, 4)):
            timestamps = [rng.randint(0, 5000) for _ in range(rng.randint(1, 5))]
            batches.append(make_batch(timestamps, rng.choice([0, 10, 200, 900])))
        epoch = rng.randint(0, 5)
        results = []
        for log in (self.disk, self.memory):
            records, headers = make_records(*batches)
            results.append(log.append(records, headers, epoch, now_ms))
        assert results[0] == results[1]

    def read(self, rng: random.Random) -> None:
        offset = rng.randint(self.memory.log_start_offset - 1, self.memory.next_offset + 1)
        max_bytes = rng.choice([0, 100, 1000, 5000, 1 << 30])
        max_offset = rng.randint(offset, self.memory.next_offset + 2)
        answers: list[bytes | str] = []
        logs: tuple[Log, Log] = (self.disk, self.memory)
        for log in logs:
            try:
                answers.append(log.read_bytes(offset, max_bytes, max_offset))
            except OffsetOutOfRange:
                answers.append("out of range")
        assert answers[0] == answers[1], (offset, max_bytes, max_offset)
        target = rng.randint(-1, 5100)
        assert self.disk.offset_for_timestamp(target) == self.memory.offset_for_timestamp(target)
        start = rng.randint(0, self.memory.next_offset + 1)
        disk_headers = [h.base_offset for h in self.disk.iter_batch_headers(start)]
        assert disk_headers == [h.base_offset for h in self.memory.iter_batch_headers(start)]

    def flush_step(self, rng: random.Random) -> None:
        if self.tickets is None:
            disk, memory = self.disk.flush_prepare(), self.memory.flush_prepare()
            assert (disk is None) == (memory is None)
            if disk is not None and memory is not None:
                assert disk.offset == memory.offset
                self.tickets = disk, memory
        elif rng.random() < 0.7:
            self.complete()

    def complete(self) -> None:
        if self.tickets is not None:
            logs: tuple[Log, Log] = (self.disk, self.memory)
            for log, ticket in zip(logs, self.tickets, strict=True):
                ticket.run()
                log.flush_complete(ticket)
            self.tickets = None

    def truncate(self, rng: random.Random) -> None:
        low = self.memory.log_start_offset
        if rng.random() < 0.7:  # mostly near the end, as Raft truncates
            low = max(low, self.memory.next_offset - 10)
        offset = rng.randint(low, self.memory.next_offset + 1)
        self.disk.truncate(offset)
        self.memory.truncate(offset)

    def tear(self, rng: random.Random) -> None:
        """Crash with the last batch half written: cut it, or append garbage after it."""
        self.complete()
        headers = list(self.memory.iter_batch_headers(self.memory.log_start_offset))
        last = headers[-1] if headers else None
        self.disk.close()
        tail = sorted(self.directory.glob("*.log"))[-1]
        if last is not None and rng.random() < 0.6:
            keep = tail.stat().st_size - rng.randint(1, last.size)
            os.truncate(tail, keep)
            self.memory.truncate(last.base_offset)
        else:
            with tail.open("ab") as f:
                f.write(rng.randbytes(rng.randint(1, 100)))
        self.disk = DiskLog.open(self.directory, self.config)
        self.memory.forget_volatile_state()

    def reopen(self) -> None:
        self.complete()
        self.disk.close()
        self.disk = DiskLog.open(self.directory, self.config)
        self.memory.forget_volatile_state()


@pytest.mark.parametrize("seed", SEEDS)
def test_disk_log_matches_memory_log(tmp_path, seed):
    rng = random.Random(seed)
    config = LogConfig(
        segment_bytes=rng.choice([1500, 4000, 20_000]),
        segment_ms=rng.choice([50, 1000, 10**9]),
        index_interval_bytes=rng.choice([1, 200, 4096]),
    )
    pair = Pair(tmp_path / "t-0", config)
    now_ms = 0
    operations = ["append"] * 8 + ["read"] * 6 + ["flush"] * 3 + ["truncate", "reopen", "tear"]
    for _ in range(STEPS):
        now_ms += rng.randint(0, 30)
        op = rng.choice(operations)
        if op == "append":
            pair.append(rng, now_ms)
        elif op == "read":
            pair.read(rng)
        elif op == "flush":
            pair.flush_step(rng)
        elif op == "truncate":
            pair.truncate(rng)
        elif op == "tear":
            pair.tear(rng)
        else:
            pair.reopen()
        pair.check()
    pair.complete()
    pair.disk.close()
