"""Builds the Java programs of tests/jvm/clients against one kafka-clients version.

`classpath(version)` runs `mvn -q -B package -Dkafka.version=VERSION` once per version into
`~/.cache/krill/jvm-clients/VERSION/` (`KRILL_JVM_CACHE` moves it), outside the repository,
and again only when the pom or a source file changed (their hash is kept beside the jar).
Maven's own cache (~/.m2) holds what it fetched. The answer is the Java classpath: the
programs' jar and every runtime dependency (copied to `lib/` by maven-dependency-plugin).

A missing `java` or `mvn`, a Maven that cannot fetch, or a build that fails raises
JvmBuildError with the reason: the tests fail with it, they never skip.

    .venv/bin/python -m tests.jvm.build 4.3.1      # build, print the classpath
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["KAFKA_3", "KAFKA_4", "VERSIONS", "JvmBuildError", "classpath", "java"]

KAFKA_4 = "4.3.1"
KAFKA_3 = "3.9.1"
VERSIONS = (KAFKA_4, KAFKA_3)

CLIENTS = Path(__file__).resolve().parent / "clients"
_MVN_TIMEOUT_S = 600.0
_JAR = "krill-jvm-clients.jar"
_STAMP = "sources.sha256"
_FETCH_FAILURES = (
    "Could not resolve",
    "Could not transfer",
    "Unknown host",
    "Network is unreachable",
)


class JvmBuildError(RuntimeError):
    """Java or Maven missing, Maven unable to fetch, or the build failing."""


def _cache() -> Path:
    default = Path.home() / ".cache" / "krill" / "jvm-clients"
    return Path(os.environ.get("KRILL_JVM_CACHE", default))


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise JvmBuildError(
            f"`{name}` not found on PATH: the Java client tests need Java 17+ and Maven 3.8+ "
            f"(apt-get install openjdk-17-jdk-headless maven)"
        )
    return found


def java() -> str:
    """The `java` launcher; JvmBuildError if there is none."""
    return _tool("java")


def _sources_hash(version: str) -> str:
    digest = hashlib.sha256(version.encode())
    files = [CLIENTS / "pom.xml", *sorted((CLIENTS / "src").rglob("*.java"))]
    for path in files:
        digest.update(str(path.relative_to(CLIENTS)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def classpath(version: str) -> str:
    """The programs built against kafka-clients `version` (building them if their sources
    changed since the last build): a Java classpath."""
    java()
    mvn = _tool("mvn")
    out = _cache() / version
    out.parent.mkdir(parents=True, exist_ok=True)
    wanted = _sources_hash(version)
    with open(out.parent / f"{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per version at a time
        stamp = out / _STAMP
        if not (stamp.exists() and stamp.read_text() == wanted and (out / _JAR).exists()):
            shutil.rmtree(out, ignore_errors=True)
            _build(mvn, version, out)
            stamp.write_text(wanted)
    return f"{out / _JAR}{os.pathsep}{out / 'lib' / '*'}"


def _build(mvn: str, version: str, out: Path) -> None:
    command = [
        mvn, "-q", "-B", "-f", str(CLIENTS / "pom.xml"), "package",
        f"-Dkafka.version={version}", f"-Dkrill.build.dir={out}", "-Dstyle.color=never",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, cwd=CLIENTS
        )
    except subprocess.TimeoutExpired as e:
        raise JvmBuildError(
            f"mvn package for kafka-clients {version} not done within {_MVN_TIMEOUT_S:.0f}s "
            f"(is Maven Central reachable?)"
        ) from e
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        why = (
            "Maven could not fetch the dependencies (is Maven Central reachable?)"
            if any(s in output for s in _FETCH_FAILURES)
            else "the build failed"
        )
        raise JvmBuildError(
            f"mvn package for kafka-clients {version}: {why}, exit {done.returncode}:\n{output}"
        )
    if not (out / _JAR).exists():
        raise JvmBuildError(f"mvn package for kafka-clients {version} left no {out / _JAR}")


if __name__ == "__main__":
    for v in sys.argv[1:] or VERSIONS:
        print(classpath(v))
