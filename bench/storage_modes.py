"""Buffered beside direct storage mode (storage/appender.py), one node, in one run.

`storage_modes`: two nodes of one shard per core, one in each `storage_mode`, side by side; the
same client (confluent-kafka, the idempotent producer, acks=all, 1 KiB values, 6 partitions)
against each in turn, interleaved (ABBA) so that drift on this machine falls on both:

- as fast as it goes (`produce_max`): msg/s and broker CPU per GB, per round; the ratio
  direct / buffered per round, median and range (the issue's throughput target: the default
  mode within 0.95x of what it was);
- a consumer catching up (`catch_up`): after each such round, the page cache of the topic's
  segment files dropped, the whole topic read from offset 0 as fast as it goes: msg/s and
  broker CPU per GB (direct mode reads the files with O_DIRECT into read windows,
  storage/direct_read.py; buffered through the page cache, with sendfile);
- at fixed offered rates (10k, 50k, 100k, 150k msg/s; `--fixed-seconds`, default 10 s): p50,
  p99 and p99.9 from each message's scheduled send time, the rate achieved, and the node's
  loop stalls in the window (krill_reactor_stalls_total) with the fdatasync pool's call p99.

Each round writes a fresh topic. The figures say which mode is the default (bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import ExitStack
from typing import Any

from bench.broker import Broker, log, tree_cpu_seconds
from bench.budget import scrape, window_figures
from bench.clients import consume_all
from bench.cluster import PARTITIONS, VALUE_BYTES, Side, median_of, range_of, ratio
from bench.measure import liveness
from bench.report import CaseError, case_failed, finish, header
from storage.page_cache import drop_file

__all__ = ["STORAGE_MODE_CASES"]

MODES = ("buffered", "direct")
RATES = (10_000, 50_000, 100_000, 150_000)
QUICK_RATES = (5_000,)
MAX_MESSAGES = 200_000
QUICK_MAX_MESSAGES = 5_000


def _abba(rounds: int) -> list[tuple[int, str]]:
    return [(r, mode) for r in range(rounds)
            for mode in (MODES if r % 2 == 0 else MODES[::-1])]


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for q in ("p50", "p99", "p99_9"):
        values = [r["client_ms"].get(q) for r in rounds]
        out[f"{q}_ms_median"], out[f"{q}_ms_range"] = median_of(values), range_of(values)
    out["achieved_msgs_per_s_median"] = median_of(r["achieved_msgs_per_s"] for r in rounds)
    out["stalls"] = [r["loop"]["stalls"] for r in rounds]
    out["fdatasync_call_p99_ms"] = [r["io"]["call"]["p99_ms"] for r in rounds]
    return out


def _drop_page_cache(data_dir: str, topic: str) -> int:
    """Drop the page cache of `topic`'s segment files (clean pages: flushed); how many."""
    files = 0
    for root, _, names in os.walk(data_dir):
        if not os.path.basename(root).startswith(f"{topic}-"):
            continue
        for name in names:
            if name.endswith(".log"):
                drop_file(os.path.join(root, name))
                files += 1
    return files


def _catch_up(broker: Broker, topic: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The whole topic read from offset 0, its files' page cache dropped first."""
    files = _drop_page_cache(broker.data_dir, topic)
    if not files:
        raise CaseError(f"no segment files of {topic} under {broker.data_dir}")
    out = consume_all(broker.bootstrap, topic, PARTITIONS, n, stall_timeout=args.stall_timeout,
                      timeout=args.phase_timeout, check=liveness(broker), broker_pid=broker.pid)
    gb = n * VALUE_BYTES / 1e9
    return {"msgs_per_s": out["msgs_per_s"],
            "whole": out["messages"] == n and out["offset_gaps"] == 0,
            "broker_cpu_s_per_gb": round(out["broker_cpu_s"] / gb, 2), "files": files}


def run_storage_modes(args: argparse.Namespace) -> dict[str, Any]:
    case = "storage_modes"
    res = header(case, args)
    rates = QUICK_RATES if args.quick else RATES
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.fixed_seconds or (2.0 if args.quick else 10.0)
    n = args.messages or (QUICK_MAX_MESSAGES if args.quick else MAX_MESSAGES)
    res.update({"rates": list(rates), "rounds": rounds, "fixed_seconds": seconds,
                "max_messages": n, "value_bytes": VALUE_BYTES, "partitions": PARTITIONS,
                "acks": "all", "idempotent": True, "client": "confluent-kafka"})
    value = os.urandom(VALUE_BYTES)
    t0 = time.monotonic()
    try:
        with ExitStack() as stack:
            sides: dict[str, Side] = {}
            ports: dict[str, int] = {}
            brokers: dict[str, Broker] = {}
            for mode in MODES:
                broker = stack.enter_context(Broker(
                    smp=os.cpu_count() or 1, krill=args.krill, data_root=args.data_root,
                    keep=args.keep, extra_args=("--storage-mode", mode)))
                if not broker.admin_port:
                    raise CaseError("this krill serves no /metrics (no --admin-port)")
                sides[mode] = Side(mode, broker.bootstrap, 1,
                                   lambda b=broker: tree_cpu_seconds(b.pid), liveness(broker))
                ports[mode] = broker.admin_port
                brokers[mode] = broker
                res["smp"] = broker.smp
            for mode in MODES:
                res[mode] = {"rounds": [], "fixed_rate": {}}
            for r, mode in _abba(rounds):
                side = sides[mode]
                side.next_topic()
                out = side.produce(n, value, args)
                res[mode]["rounds"].append(out)
                log(f"{case} max {r + 1}/{rounds} {mode}: {out['msgs_per_s']} msg/s, "
                    f"{out['broker_cpu_s_per_gb']} CPU-s/GB")
                out["catch_up"] = _catch_up(brokers[mode], side.topic, n, args)
                log(f"{case} catch-up {r + 1}/{rounds} {mode}: "
                    f"{out['catch_up']['msgs_per_s']} msg/s, "
                    f"{out['catch_up']['broker_cpu_s_per_gb']} CPU-s/GB")
            for rate in rates:
                for r, mode in _abba(rounds):
                    side = sides[mode]
                    side.next_topic()
                    before = scrape([ports[mode]])
                    fixed = side.fixed(rate, seconds, value, args)
                    window = window_figures(before, scrape([ports[mode]]))
                    window["client_ms"] = fixed["latency_from_schedule_ms"]
                    window["achieved_msgs_per_s"] = fixed["achieved_msgs_per_s"]
                    res[mode]["fixed_rate"].setdefault(str(rate), []).append(window)
                    c = window["client_ms"]
                    log(f"{case} {rate} msg/s {r + 1}/{rounds} {mode}: p50 {c.get('p50')} "
                        f"p99 {c.get('p99')} p99.9 {c.get('p99_9')} ms, achieved "
                        f"{fixed['achieved_msgs_per_s']}, stalls {window['loop']['stalls']}")
            for mode in MODES:
                rs = res[mode]["rounds"]
                res[mode]["msgs_per_s_median"] = median_of(x["msgs_per_s"] for x in rs)
                res[mode]["cpu_s_per_gb_median"] = median_of(x["broker_cpu_s_per_gb"] for x in rs)
                res[mode]["catch_up_msgs_per_s_median"] = median_of(
                    x["catch_up"]["msgs_per_s"] for x in rs)
                res[mode]["catch_up_cpu_s_per_gb_median"] = median_of(
                    x["catch_up"]["broker_cpu_s_per_gb"] for x in rs)
                res[mode]["fixed"] = {rate: _summary(w)
                                      for rate, w in res[mode].pop("fixed_rate").items()}
            by_round = [ratio(d["msgs_per_s"], b["msgs_per_s"]) for b, d in
                        zip(res["buffered"]["rounds"], res["direct"]["rounds"], strict=False)]
            res["direct_over_buffered_msgs_per_s_median"] = median_of(by_round)
            res["direct_over_buffered_msgs_per_s_range"] = range_of(by_round)
            for rate in rates:
                b = res["buffered"]["fixed"].get(str(rate))
                d = res["direct"]["fixed"].get(str(rate))
                if b and d:
                    res[f"p99_{rate}_direct_over_buffered"] = ratio(d["p99_ms_median"],
                                                                    b["p99_ms_median"])
            for mode in MODES:
                for rs in res[mode]["rounds"]:
                    rs.pop("latency_ms", None)
    except Exception as e:
        case_failed(res, case, e)
    return finish(res, t0)


STORAGE_MODE_CASES = {"storage_modes": run_storage_modes}
