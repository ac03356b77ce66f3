"""The `krill` script: every command of shards/cli.py, plus `scenario` and `bench`.

    krill scenario list                         the scenarios shipped in scenarios/library/
    krill scenario run FILE [--out DIR] [--seed N] [--duration 30s]
    krill scenario check DIR                    the checker again, on DIR/history.jsonl
    krill bench saturation -p 6 -s 1024        latency against throughput (scenarios/saturation.py)

Imports flow `scenarios -> shards`, so the script lives here and hands shards' parser the
commands of this layer; everything else is shards/cli.py's, with its conventions: a mistake
is one line (`krill: error: ...`), exit 2 for a usage or file mistake, 1 for a failed run.
A run whose checks fail exits 1 too, after its verdict table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shards import cli as shards_cli
from shards.topic_cli import CommandError

__all__ = ["LIBRARY", "main"]

LIBRARY = Path(__file__).resolve().parent / "library"
EXIT_FAILED_CHECKS = 1


def add_commands(commands: argparse._SubParsersAction) -> None:
    scenario = commands.add_parser("scenario", help="run scripted flows with faults, check "
                                   "what came out (scenarios/README.md)")
    sub = scenario.add_subparsers(dest="scenario_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", help="the scenarios shipped in scenarios/library/")
    listing.set_defaults(func=list_command)
    run = sub.add_parser("run", help="run a scenario file and check its history")
    run.add_argument("file", metavar="FILE", help="a scenario YAML (or an OMB workload file)")
    run.add_argument("--out", metavar="DIR", help="report directory (default ./report/NAME)")
    run.add_argument("--seed", type=int, metavar="N", help="drives every random choice "
                     "(default: the file's `seed`, else 1)")
    run.add_argument("--duration", metavar="TIME", help="run the workload this long, every "
                     "step's time scaled to it (e.g. 20s)")
    run.add_argument("--quiet", action="store_true", help="no progress line, no table")
    run.add_argument("--keep-data", action="store_true", help="keep the nodes' data directories")
    run.set_defaults(func=run_command)
    check = sub.add_parser("check", help="check a recorded history again")
    check.add_argument("dir", metavar="DIR", help="a run's --out directory (or a history.jsonl)")
    check.add_argument("--file", metavar="FILE", help="the scenario whose checks to apply "
                       "(default: the one report.json names)")
    check.set_defaults(func=check_command)
    from scenarios.saturation import add_bench_commands

    add_bench_commands(commands)


def _library() -> list[tuple[str, str, str]]:
    import yaml

    out = []
    for path in sorted(LIBRARY.glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            doc = {}
        mode = (doc.get("cluster") or {}).get("mode", "real") if "workload" in doc else "real"
        text = str(doc.get("description") or doc.get("name", "")).strip().splitlines()
        out.append((path.name, mode, text[0] if text else ""))
    return out


def list_command(args: argparse.Namespace) -> int:
    for name, mode, description in _library():
        print(f"{name:48} {mode:9} {description}")
    return 0


def _load(file: str, seed: int | None, duration: str | None) -> Any:
    from scenarios.spec import SpecError, load, seconds

    path = Path(file)
    if not path.exists() and (LIBRARY / file).exists():
        path = LIBRARY / file  # `krill scenario run kill-node-under-load.yaml`
    try:
        duration_s = seconds(duration) if duration else None
    except ValueError:
        raise shards_cli.UsageError(f"--duration {duration!r} is not a time like 20s") from None
    try:
        return load(path, seed=seed, duration_s=duration_s)
    except SpecError as e:
        raise shards_cli.UsageError(str(e)) from None


def run_command(args: argparse.Namespace) -> int:
    scenario = _load(args.file, args.seed, args.duration)
    out = Path(args.out) if args.out else Path("report") / (scenario.path.stem
                                                            if scenario.path else "scenario")
    if scenario.mode == "simulated":
        from scenarios.simulated import run_simulated

        report = run_simulated(scenario, out, quiet=args.quiet)
    else:
        from scenarios.runner import RunError, run

        try:
            report = run(scenario, out, quiet=args.quiet, keep_data=args.keep_data)
        except RunError as e:
            raise CommandError(str(e)) from None
        except Exception as e:  # a node that would not start: ClusterError, one line
            from scenarios.cluster import ClusterError

            if isinstance(e, ClusterError):
                raise CommandError(str(e)) from None
            raise
    if not args.quiet:
        print(f"report: {out}/report.json  history: {out}/history.jsonl  "
              f"seed: {scenario.seed}")
    if report["verdict"] != "PASS":
        print(f"FAIL: replay with: krill scenario run {args.file} --seed {scenario.seed}",
              file=sys.stderr)
        return EXIT_FAILED_CHECKS
    return 0


def check_command(args: argparse.Namespace) -> int:
    from scenarios.history import HistoryError, read_history
    from scenarios.runner import judge

    target = Path(args.dir)
    history = target if target.is_file() else target / "history.jsonl"
    report_path = history.parent / "report.json"
    recorded: dict[str, Any] = {}
    if report_path.exists():
        recorded = json.loads(report_path.read_text())
    file = args.file or recorded.get("file")
    if not file:
        raise shards_cli.UsageError(f"no scenario named in {report_path}: give --file")
    scenario = _load(file, recorded.get("seed"), None)
    try:
        ops = read_history(history)
    except OSError as e:
        raise CommandError(f"{history}: {e.strerror or e}") from None
    except HistoryError as e:
        raise shards_cli.UsageError(str(e)) from None
    report = judge(scenario, ops, errors=recorded.get("errors"),
                   cluster_checks=recorded.get("cluster_checks"))
    from scenarios.report import verdict_table

    verdict_table(report)
    if recorded and recorded.get("verdict") != report["verdict"]:
        print(f"note: the recorded verdict was {recorded.get('verdict')}", file=sys.stderr)
    return 0 if report["verdict"] == "PASS" else EXIT_FAILED_CHECKS


def main(argv: Sequence[str] | None = None) -> int:
    return shards_cli.main(argv, more_commands=add_commands)


if __name__ == "__main__":
    sys.exit(main())
