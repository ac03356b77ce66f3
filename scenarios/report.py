"""What a run shows a person: the timeline and curve pictures, the verdict table, a live line.

`timeline_png` draws throughput and p50/p99 latency of a history over time with each fault as
a shaded band; `curve_png` draws the saturation curve (latency against achieved throughput,
the knee marked); `verdict_table` prints the checks and anomalies of a checked run; `Progress`
is the one live line a run prints while it goes.

The timeline must draw a history of a couple of million operations in seconds, so the
operations are read into numpy columns in one Python pass and everything after is array
work: per-bucket counts with `bincount`, per-bucket percentiles by sorting (bucket, latency)
pairs once and indexing each bucket's rank (numpy, not hdrhistogram: an hdrhistogram per
bucket costs ~1 µs of Python per recorded value). Percentiles are nearest-rank, the rule of
`scenarios.checker`: the value at index min(n - 1, floor(q * n)) of the sorted latencies.

Pictures are drawn with matplotlib's Agg canvas through `Figure` (no pyplot, no display, no
global state), and matplotlib is imported only when a picture is drawn.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from scenarios.history import Op

__all__ = ["Progress", "Timeline", "bucket_percentiles_ms", "curve_png", "saturation_table",
           "timeline_png", "timeline_series", "verdict_table"]

NS_PER_S = 1_000_000_000
TIMELINE_QUANTILES = (0.5, 0.99)
PROGRESS_REFRESH_S = 0.1  # the live line is redrawn at most this often
EXAMPLE_CHARS_MAX = 100  # an anomaly's first example, as JSON, cut to this
PICTURE_DPI = 110

Fault = tuple[str, int, int]  # name, start ns, end ns (the run's monotonic clock)


# The timeline -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timeline:
    """Per-bucket series of a history; bucket k covers [k, k + 1) * bucket_s after start."""

    bucket_s: float
    acked_per_s: np.ndarray  # acknowledged sends completed in the bucket, per second
    polled_per_s: np.ndarray  # records returned by polls completed in the bucket, per second
    p50_ms: np.ndarray  # acknowledged sends completed in the bucket; NaN where none
    p99_ms: np.ndarray

    @property
    def starts_s(self) -> np.ndarray:
        return np.arange(len(self.acked_per_s)) * self.bucket_s


def bucket_percentiles_ms(complete_ns: np.ndarray, latency_ns: np.ndarray, start_ns: int,
                          bucket_s: float, buckets: int,
                          quantiles: Sequence[float]) -> np.ndarray:
    """Nearest-rank percentiles of latency per time bucket, in ms: shape (quantiles, buckets),
    NaN in a bucket with no value. A value belongs to the bucket its completion falls in."""
    out = np.full((len(quantiles), buckets), np.nan)
    if len(latency_ns) == 0:
        return out
    index = _bucket_index(complete_ns, start_ns, bucket_s, buckets)
    order = np.lexsort((latency_ns, index))  # by bucket, then by latency within it
    ordered = np.asarray(latency_ns)[order]
    counts = np.bincount(index, minlength=buckets)
    first = np.cumsum(counts) - counts
    filled = counts > 0
    for row, q in enumerate(quantiles):
        rank = np.minimum(counts - 1, np.floor(q * counts).astype(np.int64))
        out[row, filled] = ordered[first[filled] + rank[filled]] / 1e6
    return out


def _bucket_index(times_ns: np.ndarray, start_ns: int, bucket_s: float,
                  buckets: int) -> np.ndarray:
    index = ((np.asarray(times_ns, dtype=np.int64) - start_ns) // int(bucket_s * NS_PER_S))
    return np.clip(index, 0, buckets - 1)  # anything before the start counts in the first


def timeline_series(ops: Sequence[Op], start_ns: int, bucket_s: float = 1.0) -> Timeline:
    """The per-bucket series of `ops` (one Python pass over them, then numpy)."""
    acked_at: list[int] = []
    acked_latency: list[int] = []
    polled_at: list[int] = []
    polled_count: list[int] = []
    for op in ops:
        if op.outcome != "ok":
            continue
        if op.op == "send":
            acked_at.append(op.complete_ns)
            acked_latency.append(op.complete_ns - op.invoke_ns)
        elif op.op == "poll" and op.records:
            polled_at.append(op.complete_ns)
            polled_count.append(len(op.records))
    sent = np.array(acked_at, dtype=np.int64)
    polled = np.array(polled_at, dtype=np.int64)
    end_ns = max([start_ns + 1] + [int(a.max()) + 1 for a in (sent, polled) if len(a)])
    buckets = max(1, math.ceil((end_ns - start_ns) / (bucket_s * NS_PER_S)))

    def per_s(times: np.ndarray, weights: list[int] | None = None) -> np.ndarray:
        if len(times) == 0:
            return np.zeros(buckets)
        index = _bucket_index(times, start_ns, bucket_s, buckets)
        return np.bincount(index, weights=weights, minlength=buckets) / bucket_s

    p50, p99 = bucket_percentiles_ms(sent, np.array(acked_latency, dtype=np.int64), start_ns,
                                     bucket_s, buckets, TIMELINE_QUANTILES)
    return Timeline(bucket_s, per_s(sent), per_s(polled, polled_count), p50, p99)


def timeline_png(path: str | Path, ops: Sequence[Op], faults: Sequence[Fault], start_ns: int,
                 bucket_s: float = 1.0) -> None:
    """Two panels over seconds since `start_ns`: throughput (acknowledged sends and polled
    records per second) above, p50/p99 latency of acknowledged sends below; each fault a
    shaded band named at its start."""
    series = timeline_series(ops, start_ns, bucket_s)
    figure, canvas = _figure(10, 6)
    top, bottom = figure.subplots(2, 1, sharex=True)
    x = series.starts_s + bucket_s / 2  # each point at its bucket's middle
    top.plot(x, series.acked_per_s, label="acknowledged sends/s", color="tab:blue")
    top.plot(x, series.polled_per_s, label="polled records/s", color="tab:green")
    top.set_ylabel("per second")
    top.set_ylim(bottom=0)
    bottom.plot(x, series.p50_ms, label="p50", color="tab:blue", marker=".", markersize=3)
    bottom.plot(x, series.p99_ms, label="p99", color="tab:red", marker=".", markersize=3)
    bottom.set_ylabel("send latency (ms)")
    bottom.set_xlabel(f"seconds since start ({_bucket_words(bucket_s)} buckets)")
    if np.any(np.isfinite(series.p99_ms)) and np.nanmin(series.p50_ms) > 0:
        bottom.set_yscale("log")
    for number, (name, begin_ns, end_ns) in enumerate(faults):
        begin_s, end_s = (begin_ns - start_ns) / NS_PER_S, (end_ns - start_ns) / NS_PER_S
        for axes in (top, bottom):
            axes.axvspan(begin_s, max(end_s, begin_s + bucket_s / 20), color="tab:orange",
                         alpha=0.25, linewidth=0)
        top.annotate(name, xy=(begin_s, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(2, -12 - 11 * (number % 3)), textcoords="offset points",
                     fontsize=8, color="saddlebrown")
    for axes in (top, bottom):
        axes.grid(True, alpha=0.3)
        axes.legend(loc="upper right", fontsize=8)
    top.set_title("throughput and latency over time" + (", faults shaded" if faults else ""))
    figure.tight_layout()
    canvas.print_png(str(path))


def _bucket_words(bucket_s: float) -> str:
    return f"{bucket_s:g} s" if bucket_s >= 1 else f"{bucket_s * 1000:g} ms"


def _figure(width_in: float, height_in: float) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), dpi=PICTURE_DPI)
    return figure, FigureCanvasAgg(figure)


# The saturation curve -----------------------------------------------------------------------


def curve_png(path: str | Path, points: Sequence[dict[str, Any]],
              knee: dict[str, Any] | None) -> None:
    """p50/p99/p99.9 latency (ms, log scale) against achieved throughput (msg/s), one point
    per step, each labelled with its offered share of the maximum; the knee marked.

    A point (a step of `scenarios.saturation`): `achieved_msgs_per_s`, `p50_ms`, `p99_ms`,
    `p99_9_ms`, `offered_pct`. The knee is one of them, with a `reason`.
    """
    figure, canvas = _figure(9, 5.5)
    axes = figure.subplots()
    x = [p["achieved_msgs_per_s"] for p in points]
    for key, label, color in (("p50_ms", "p50", "tab:blue"), ("p99_ms", "p99", "tab:red"),
                              ("p99_9_ms", "p99.9", "tab:purple")):
        axes.plot(x, [p[key] for p in points], marker="o", label=label, color=color)
    for p in points:
        axes.annotate(f"{p['offered_pct']:g}%", xy=(p["achieved_msgs_per_s"], p["p50_ms"]),
                      xytext=(0, -14), textcoords="offset points", ha="center", fontsize=7,
                      color="gray")
    if knee is not None:
        axes.axvline(knee["achieved_msgs_per_s"], color="black", linestyle="--", alpha=0.6)
        axes.scatter([knee["achieved_msgs_per_s"]], [knee["p99_ms"]], s=260, zorder=3,
                     facecolors="none", edgecolors="black", linewidths=1.5)
    axes.set_yscale("log")
    axes.set_xlabel("achieved throughput (msg/s)")
    axes.set_ylabel("latency from scheduled send (ms)")
    title = "latency against throughput: "
    if knee is None:
        title += "no knee (the highest step is still on the low-load line)"
    else:
        title += (f"knee at {knee['offered_pct']:g}% offered, "
                  f"{knee['achieved_msgs_per_s']:,.0f} msg/s achieved\n{knee.get('reason', '')}")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    canvas.print_png(str(path))


# The verdict --------------------------------------------------------------------------------


def verdict_table(report: dict[str, Any], *, console: Any = None) -> None:
    """Print the checks (name, value, bound, PASS/FAIL), the anomalies (name, count, first
    example) and the verdict of a report shaped like `CheckResult.to_json()` plus `verdict`."""
    from rich.console import Console
    from rich.table import Table

    out = console or Console()
    checks = Table(title="checks", title_justify="left")
    for column in ("check", "value", "bound", "result"):
        checks.add_column(column, justify="right" if column in ("value", "bound") else "left")
    for name, c in sorted(report.get("checks", {}).items()):
        checks.add_row(name, _cell(c.get("value")), _cell(c.get("bound")), _pass(c.get("ok")))
    anomalies = Table(title="anomalies", title_justify="left")
    for column in ("anomaly", "count", "first example"):
        anomalies.add_column(column, justify="right" if column == "count" else "left",
                             overflow="fold")
    for name, cases in report.get("anomalies", {}).items():
        example = _example(cases[0]) if cases else ""
        anomalies.add_row(name, f"[red]{len(cases)}[/red]" if cases else "0", example)
    if report.get("checks"):
        out.print(checks)
    out.print(anomalies)
    verdict = report.get("verdict", report.get("valid"))
    word = verdict.upper() if isinstance(verdict, str) else ("PASS" if verdict else "FAIL")
    out.print("verdict: " + (_pass(word == "PASS") if word in ("PASS", "FAIL") else word))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _pass(ok: Any) -> str:
    return "[bold green]PASS[/bold green]" if ok else "[bold red]FAIL[/bold red]"


def _example(case: Any) -> str:
    import json

    text = json.dumps(case, separators=(",", ":"), default=str)
    return text if len(text) <= EXAMPLE_CHARS_MAX else text[:EXAMPLE_CHARS_MAX - 1] + "…"


# The saturation table -----------------------------------------------------------------------


def saturation_table(report: dict[str, Any], *, console: Any = None) -> None:
    """Print a `scenarios.saturation` report: each step, the knee, spikes, the 50% figures."""
    from rich.console import Console
    from rich.table import Table

    maximum = report["maximum"]
    table = Table(title=f"saturation: {report['partitions']} partitions, "
                  f"{report['message_bytes']} B, acks={report['acks']}, maximum "
                  f"{maximum['msgs_per_s']:,.0f} msg/s ({maximum['mb_per_s']:g} MB/s)",
                  title_justify="left")
    table.caption = "rates in msg/s, latencies in ms from the scheduled send time"
    for column in ("offered", "rate", "achieved", "p50", "p99", "p99.9", "behind", ""):
        table.add_column(column, justify="right" if column else "left")
    knee = report["knee"]
    for s in report["steps"]:
        mark = "knee" if knee and s["offered_pct"] == knee["offered_pct"] else ""
        table.add_row(f"{s['offered_pct']:g}%", f"{s['offered_msgs_per_s']:,.0f}",
                      f"{s['achieved_msgs_per_s']:,.0f}", f"{s['p50_ms']:g}",
                      f"{s['p99_ms']:g}", f"{s['p99_9_ms']:g}", f"{s['behind_max_ms']:g}", mark)
    out = console or Console()
    out.print(table)
    out.print(f"knee: {knee['offered_pct']:g}% offered ({knee['reason']})" if knee
              else "knee: none (no step left the low-load line)")
    for spike in report["spikes"]:
        out.print(f"off the line, not the knee: {spike['offered_pct']:g}% ({spike['reason']})")
    half = report["at_50pct"]
    if half:
        verdict = "[green]met[/green]" if half["flat_tail"] else "[red]not met[/red]"
        out.print(f"at {half['offered_pct']:g}% of the maximum: p99 {half['p99_ms']:g} ms, "
                  f"p99.9/p50 {half['p99_9_over_p50']:g} (goal <= {half['p99_9_over_p50_max']:g}: "
                  f"{verdict})")


# The live line ------------------------------------------------------------------------------


class Progress:
    """One live line: elapsed of total, throughput, p99, faults so far, a note.

    On a terminal it is a rich `Live` line; otherwise `\\r` and the line on `stream`, a
    newline at `close()`. `quiet`: nothing at all (tests). Redrawn at most every
    PROGRESS_REFRESH_S; `close()` draws the last state.
    """

    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stdout
        self.line = ""
        self._drawn_at = 0.0
        self._live: Any = None
        self._closed = False
        if not quiet and self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(file=self.stream), auto_refresh=False,
                              transient=False)
            self._live.start()

    def update(self, elapsed_s: float, total_s: float, msgs_per_s: float, p99_ms: float | None,
               faults_so_far: int, note: str = "") -> None:
        self.line = _progress_line(elapsed_s, total_s, msgs_per_s, p99_ms, faults_so_far, note)
        now = time.monotonic()
        if now - self._drawn_at >= PROGRESS_REFRESH_S:
            self._drawn_at = now
            self._draw()

    def _draw(self) -> None:
        if self.quiet or self._closed:
            return
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(self.line), refresh=True)
        else:
            self.stream.write("\r" + self.line)
            self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._draw()
        self._closed = True
        if self._live is not None:
            self._live.stop()
        elif not self.quiet and self.line:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _progress_line(elapsed_s: float, total_s: float, msgs_per_s: float, p99_ms: float | None,
                   faults_so_far: int, note: str) -> str:
    p99 = "-" if p99_ms is None or not math.isfinite(p99_ms) else f"{p99_ms:.1f} ms"
    line = (f"{elapsed_s:6.1f}/{total_s:.0f} s  {msgs_per_s:>10,.0f} msg/s  p99 {p99:>9}  "
            f"faults {faults_so_far}")
    return f"{line}  {note}" if note else line
