"""Direct mode's disk mechanisms on this machine's disk, without a broker (storage/appender.py,
storage/direct_read.py), interleaved (ABBA) in one run.

`direct_io` has two parts:

- `writes`: a flush's O_DIRECT writes of 1, 4 and 16 chunks (128 KiB each; a partition's
  flush at 150k msg/s of 1 KiB over 6 partitions carries under one, a follower catching up
  many) and its fdatasync: the chunks written one after another (what the appender does) or 4
  in flight on a thread pool, completing in any order (what Redpanda's `segment_appender`
  does); into a file whose size stays at the data's end with blocks reserved past it
  (`fallocate(KEEP_SIZE)`, the appender's layout) or one whose size is extended ahead. ms per
  flush, median and p99 per way; the ratio in-flight / one-at-a-time per round. Decides
  whether several writes in flight are worth building here (bench/README.md).
- `catch_up_read`: a consumer far behind reads a whole log from its start (`--messages`
  batches of ~16 KiB; default 64 MiB) in 1 MiB reads, as a shard's loop reads (nowait, the miss
  warmed on the same thread here, then the read again): a buffered log's page-cache path
  (RWF_NOWAIT, warm, sendfile) beside a direct log's O_DIRECT read windows (a copy, written).
  Both into /dev/null, the page cache of both logs' files dropped before each round. MB/s,
  CPU seconds per GB (both sides' work: here one thread does both), misses, and the pages of
  the log files the page cache holds after the read.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.broker import log
from bench.cluster import median_of, range_of
from bench.report import case_failed, finish, header
from storage import DiskLog, FileSlice, LogConfig, NotCached
from storage.appender import _LIBC, ChunkPool
from storage.page_cache import drop_file, file_cached_pages
from tests.storage.batches import make_batch, make_records  # the storage tests' batches
from wire.record_batch import read_header

__all__ = ["DIRECT_IO_CASES"]

CHUNK = 128 * 1024
FLUSH_CHUNKS = (1, 4, 16)
IN_FLIGHT = 4
READ_BYTES = 1024 * 1024
BATCH_VALUE_BYTES = 16 * 1024
MODES = ("buffered", "direct")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- writes


def _flushes(directory: Path, chunks: int, in_flight: int, sized: bool, count: int,
             pool: ThreadPoolExecutor) -> list[float]:
    """ms of each of `count` flushes (O_DIRECT writes of `chunks` chunks, `in_flight` at a
    time, then fdatasync) into a file whose size is extended ahead (`sized`) or stays at the
    data's end with blocks reserved past it (what the appender does)."""
    buffer = mmap.mmap(-1, CHUNK * chunks)
    buffer.write(os.urandom(CHUNK * chunks))
    view = memoryview(buffer)
    path = directory / f"writes-{chunks}-{in_flight}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    times = []
    try:
        if sized:
            os.posix_fallocate(fd, 0, CHUNK * chunks * count)
        else:
            _LIBC.reserve(fd, 0, CHUNK * chunks * count)
        os.fsync(fd)

        def write(k: int, base: int) -> None:
            piece, done = view[k * CHUNK:(k + 1) * CHUNK], 0
            while done < CHUNK:
                done += os.pwrite(fd, piece[done:], base + k * CHUNK + done)

        for i in range(count):
            base = i * CHUNK * chunks
            t0 = time.perf_counter()
            if in_flight == 1:
                for k in range(chunks):
                    write(k, base)
            else:
                list(pool.map(lambda k, b=base: write(k, b), range(chunks)))
            os.fdatasync(fd)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        os.close(fd)
        path.unlink()
        view.release()
        buffer.close()
    return times


def _writes(directory: Path, rounds: int, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"chunk_bytes": CHUNK, "in_flight": IN_FLIGHT, "flushes": count}
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for layout, sized in (("size_at_data_end", False), ("size_extended_ahead", True)):
            for chunks in FLUSH_CHUNKS:
                runs: dict[int, list[list[float]]] = {1: [], IN_FLIGHT: []}
                for r in range(rounds):
                    for in_flight in ((1, IN_FLIGHT) if r % 2 == 0 else (IN_FLIGHT, 1)):
                        runs[in_flight].append(
                            _flushes(directory, chunks, in_flight, sized, count, pool))
                figures: dict[str, Any] = {}
                for in_flight, times in runs.items():
                    name = "one_at_a_time" if in_flight == 1 else f"{in_flight}_in_flight"
                    figures[name] = {
                        "p50_ms": median_of(statistics.median(t) for t in times),
                        "p99_ms": median_of(sorted(t)[int(0.99 * (len(t) - 1))] for t in times)}
                figures["p50_ratio_in_flight_over_one"] = [
                    round(statistics.median(b) / statistics.median(a), 3)
                    for a, b in zip(runs[1], runs[IN_FLIGHT], strict=True)]
                out.setdefault(layout, {})[f"{chunks}_chunks"] = figures
                log(f"direct_io writes {layout} {chunks} chunks: {figures}")
    return out


# --------------------------------------------------------------------------- catch_up_read


def _fill(log_: DiskLog, batches: int) -> None:
    """`batches` one-record batches of ~16 KiB, flushed 64 at a time."""
    for start in range(0, batches, 64):
        records, headers = make_records(*[make_batch([1000 + i], BATCH_VALUE_BYTES)
                                          for i in range(start, min(batches, start + 64))])
        log_.append(records, headers, 1, 0)
        log_.flush()


def _drop(directory: Path) -> None:
    for path in directory.glob("*.log"):
        drop_file(path)


def _cached(directory: Path) -> int:
    return sum(file_cached_pages(path) for path in directory.glob("*.log"))


def _read_all(log_: DiskLog, sink: int) -> tuple[int, int]:
    """Read the log from its start as a shard's loop does; (bytes, misses)."""
    offset, total, misses = log_.log_start_offset, 0, 0
    while offset < log_.next_offset:
        for _ in range(10):
            try:
                region = log_.read(offset, READ_BYTES, 1 << 62, nowait=True)
                break
            except NotCached as miss:
                miss.warm()
                misses += 1
        else:
            raise RuntimeError(f"a warmed read at {offset} kept missing")
        if isinstance(region, FileSlice):
            done = 0
            while done < region.length:
                done += os.sendfile(sink, region.fd, region.position + done,
                                    region.length - done)
            total += region.length
            offset += region.records  # reads start at batch boundaries here
        else:
            assert region is not None
            os.write(sink, region)
            total += len(region)
            offset = _next_offset(region)
    return total, misses


def _next_offset(region: memoryview) -> int:
    """The offset after the last batch of `region` (whole batches)."""
    position, header = 0, None
    while position < len(region):
        header = read_header(region, position)
        position += header.size
    assert header is not None
    return header.next_offset


def _open(directory: Path, mode: str) -> DiskLog:
    """The log of `mode`, opened afresh (no window, no chunk held) and served."""
    chunks = ChunkPool(CHUNK, 4 * CHUNK) if mode == "direct" else None
    log_ = DiskLog.open(directory / mode, LogConfig(), chunks)
    log_.serve()
    return log_


def _catch_up(directory: Path, rounds: int, batches: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for mode in MODES:
        log_ = _open(directory, mode)
        try:
            _fill(log_, batches)
        finally:
            log_.close()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                log_ = _open(directory, mode)
                try:
                    _drop(log_.directory)
                    cpu, t0 = _cpu(), time.perf_counter()
                    total, misses = _read_all(log_, sink)
                    wall, cpu = time.perf_counter() - t0, _cpu() - cpu
                    cached = _cached(log_.directory)
                finally:
                    log_.close()
                runs[mode].append({"mb_per_s": round(total / wall / 1e6, 1),
                                   "cpu_s_per_gb": round(cpu / total * 1e9, 2),
                                   "misses": misses, "bytes": total,
                                   "page_cache_pages_after": cached})
                log(f"direct_io catch_up_read {mode}: {runs[mode][-1]}")
    finally:
        os.close(sink)
    out: dict[str, Any] = {"log_bytes": runs["direct"][0]["bytes"], "read_bytes": READ_BYTES}
    for mode, rs in runs.items():
        out[mode] = {"mb_per_s_median": median_of(r["mb_per_s"] for r in rs),
                     "mb_per_s_range": range_of(r["mb_per_s"] for r in rs),
                     "cpu_s_per_gb_median": median_of(r["cpu_s_per_gb"] for r in rs),
                     "misses": [r["misses"] for r in rs],
                     "page_cache_pages_after": [r["page_cache_pages_after"] for r in rs]}
    return out


def run_direct_io(args: argparse.Namespace) -> dict[str, Any]:
    case = "direct_io"
    res = header(case, args)
    rounds = args.rounds or (2 if args.quick else 4)
    flushes = 50 if args.quick else 200
    batches = args.messages or (512 if args.quick else 4096)  # x ~16 KiB
    res.update({"rounds": rounds})
    t0 = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="krill-direct-io-", dir=args.data_root))
    try:
        res["writes"] = _writes(directory, rounds, flushes)
        res["catch_up_read"] = _catch_up(directory, rounds, batches)
    except (OSError, RuntimeError, AssertionError) as e:
        case_failed(res, case, e)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return finish(res, t0)


DIRECT_IO_CASES = {"direct_io": run_direct_io}
