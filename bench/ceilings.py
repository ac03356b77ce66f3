"""Ceilings measured in the same run as the broker figures.

(a) ``fdatasync``: a raw Python ``os.write`` + ``os.fdatasync`` append loop into a temp file
    under the bench data root (same filesystem as the brokers' data dirs), 16 KiB and 64 KiB.
(b) ``echo``: a raw Python blocking socket echo over loopback, between this process and a
    separate server process (like client and broker), 1 KiB and 64 KiB messages.

MB here is 10**6 bytes, as in every bench figure, so ratios compare like with like.

Run alone: ``python -m bench.ceilings [--quick]`` prints the ceilings JSON.
The echo server is ``python -m bench.ceilings echo-server`` (prints its port, then serves).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench.broker import log


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 1])."""
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[idx]


def latency_summary_ms(seconds: list[float]) -> dict[str, float | int]:
    s = sorted(seconds)
    if not s:
        return {"count": 0}
    return {
        "count": len(s),
        "p50": round(percentile(s, 0.50) * 1e3, 3),
        "p99": round(percentile(s, 0.99) * 1e3, 3),
        "p99_9": round(percentile(s, 0.999) * 1e3, 3),
        "max": round(s[-1] * 1e3, 3),
    }


# --------------------------------------------------------------------------- fdatasync


def fdatasync_loop(
    directory: str, size: int, *, seconds: float, max_bytes: int = 1 << 30
) -> dict[str, object]:
    """Append ``size`` bytes then fdatasync, repeatedly, for ``seconds`` (bounded)."""
    buf = os.urandom(size)
    fd, path = tempfile.mkstemp(prefix="ceiling-fdatasync-", dir=directory)
    lat: list[float] = []
    try:
        for _ in range(5):  # warm-up: allocate the first extents, fault in code paths
            os.write(fd, buf)
            os.fdatasync(fd)
        written = 0
        pc = time.perf_counter
        t_start = pc()
        t_end = t_start + seconds
        while written < max_bytes:
            t0 = pc()
            os.write(fd, buf)
            os.fdatasync(fd)
            t1 = pc()
            lat.append(t1 - t0)
            written += size
            if t1 >= t_end:
                break
        elapsed = pc() - t_start
    finally:
        os.close(fd)
        os.unlink(path)
    s = lat
    summary = latency_summary_ms(s)
    return {
        "write_bytes": size,
        "appends": len(s),
        "seconds": round(elapsed, 3),
        "appends_per_s": round(len(s) / elapsed, 1),
        "mb_per_s": round(written / elapsed / 1e6, 2),
        "p50_ms": summary.get("p50"),
        "p99_ms": summary.get("p99"),
        "max_ms": summary.get("max"),
    }


# --------------------------------------------------------------------------- socket echo


def echo_server_main() -> None:
    """Blocking echo server, one thread per connection; prints its port on stdout."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    print(srv.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with conn:
            while True:
                n = conn.recv_into(buf)
                if not n:
                    return
                conn.sendall(view[:n])

    # Exit when the parent closes our stdin (or dies), so we never outlive the bench.
    def watch_stdin() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _recv_exact(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        r = sock.recv_into(view[got:n])
        if not r:
            raise ConnectionError("echo server closed the connection")
        got += r


def echo_loop(port: int, size: int, *, seconds: float, max_round_trips: int = 10**7) -> dict:
    msg = os.urandom(size)
    buf = bytearray(size)
    view = memoryview(buf)
    lat: list[float] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(20):  # warm-up
            sock.sendall(msg)
            _recv_exact(sock, view, size)
        pc = time.perf_counter
        t_start = pc()
        t_end = t_start + seconds
        n = 0
        while n < max_round_trips:
            t0 = pc()
            sock.sendall(msg)
            _recv_exact(sock, view, size)
            t1 = pc()
            lat.append(t1 - t0)
            n += 1
            if t1 >= t_end:
                break
        elapsed = pc() - t_start
    if buf != msg:
        raise RuntimeError("echo returned different bytes")
    summary = latency_summary_ms(lat)
    return {
        "message_bytes": size,
        "round_trips": n,
        "seconds": round(elapsed, 3),
        "round_trips_per_s": round(n / elapsed, 1),
        # payload bytes carried one way per second
        "mb_per_s": round(n * size / elapsed / 1e6, 2),
        "p50_us": round(summary["p50"] * 1e3, 1),
        "p99_us": round(summary["p99"] * 1e3, 1),
    }


def echo_ceilings(sizes: list[int], seconds: float) -> dict[str, dict]:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.ceilings", "echo-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        assert server.stdout is not None
        line = _readline_with_timeout(server, 10.0)
        port = int(line)
        out = {}
        for size in sizes:
            out[f"echo_{size // 1024}k"] = echo_loop(port, size, seconds=seconds)
        return out
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)


def _readline_with_timeout(proc: subprocess.Popen, timeout: float) -> bytes:
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not result or not result[0].strip():
        raise RuntimeError("echo server did not report its port")
    return result[0]


# --------------------------------------------------------------------------- all


def measure(data_root: str | None, *, quick: bool) -> dict[str, object]:
    """All ceilings; each entry is a dict, or ``{"error": ...}`` if that one failed."""
    secs = 1.0 if quick else 3.0
    out: dict[str, object] = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds_each": secs,
    }
    root = data_root or tempfile.gettempdir()
    with tempfile.TemporaryDirectory(prefix="krill-bench-ceiling-", dir=root) as d:
        for size in (16 * 1024, 64 * 1024):
            key = f"fdatasync_{size // 1024}k"
            log(f"ceiling {key} ({secs}s)")
            try:
                out[key] = fdatasync_loop(d, size, seconds=secs)
            except Exception as e:
                out[key] = {"error": f"{type(e).__name__}: {e}"}
    log(f"ceiling socket echo 1k/64k ({secs}s each)")
    try:
        out.update(echo_ceilings([1024, 64 * 1024], secs))
    except Exception as e:
        out["echo_1k"] = out["echo_64k"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.ceilings")
    ap.add_argument("mode", nargs="?", default="measure", choices=["measure", "echo-server"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    if args.mode == "echo-server":
        echo_server_main()
        return
    print(json.dumps(measure(args.data_root, quick=args.quick)), flush=True)


if __name__ == "__main__":
    main()
