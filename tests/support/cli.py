"""`krill` as a user runs it, for every test of the command line.

Each call is a fresh `python -m shards.cli` process in the repository, so what is tested is
the whole path a user takes: argument parsing, configuration, the one-line errors and the
exit code. Its environment has no `KRILL_*` variable of the test run's own (a developer's
`KRILL_BROKERS` must not point a test at another node), only those `env` names. Standard
input is empty unless the test gives one, so a command that reads it never waits on the
terminal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.broker import REPO, BrokerProcess

__all__ = ["CLI_TIMEOUT_S", "krill", "krill_environment", "krill_on", "krill_start_refused"]

KRILL = (sys.executable, "-m", "shards.cli")
CLI_TIMEOUT_S = 60.0  # one client command; `krill cluster up` and the like pass their own
_REFUSED_START_TIMEOUT_S = 30.0  # a `krill start` that was not refused is killed after this


def krill_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its `KRILL_*` variables, plus `env`."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KRILL_")}
    environment.update(env or {})
    return environment


def krill(
    *args: str,
    broker: BrokerProcess | None = None,
    stdin: str = "",
    env: dict[str, str] | None = None,
    timeout_s: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run `krill ARGS` (then `-b <broker>` when a broker is given); its exit code and output."""
    where = ("-b", broker.bootstrap) if broker is not None else ()
    return subprocess.run(
        [*KRILL, *args, *where], input=stdin, capture_output=True, text=True, cwd=REPO,
        env=krill_environment(env), timeout=timeout_s,
    )  # fmt: skip


def krill_on(
    broker: BrokerProcess, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """`krill ARGS -b <broker>`: a client command against one node."""
    return krill(*args, broker=broker, stdin=stdin)


def krill_start_refused(
    *args: str, env: dict[str, str] | None = None, before: tuple[str, ...] = ()
) -> tuple[int, str, float]:
    """`krill BEFORE start ARGS` expected to refuse: (exit code, stderr, seconds). It runs in
    its own process group with no `KRILL_*` variable but `env`'s, so a node that does start
    (the refusal under test failed) is killed with every shard after a timeout and the test
    fails."""
    started = time.monotonic()
    process = subprocess.Popen(
        [*KRILL, *before, "start", *args], cwd=REPO, env=krill_environment(env),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = process.communicate(timeout=_REFUSED_START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise AssertionError(
            f"krill {' '.join((*before, 'start', *args))} {env or ''} was not refused:\n"
            f"{stderr[-2000:]}"
        ) from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, stderr, time.monotonic() - started
