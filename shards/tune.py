"""`krill tune`: the kernel settings a node's latency depends on, checked and (with
`--apply`) set (Redpanda's `rpk redpanda tune`, the design's "automatic Linux kernel tuning").

One `Setting` per thing to look at: where it lives under /sys or /proc, what it is now, what
it should be and why. Each is read from files only (no tool is run), so a machine that does
not expose one (a VM without cpufreq, a container without /sys/block) says so instead of
failing:

    krill tune [--data-dir DIR] [--storage-mode MODE]     one line per setting
    krill tune --apply                                      and set what this machine lets
                                                            us set; say what it did not

`krill start` logs, once, each setting that is off (`log_off_settings`). `root` (default "/",
`--sysroot` on the command line) is where /sys and /proc are looked for: tests point it at a
tree of their own, and so never read or change this machine's settings.

Checked: the data directory's block device (`queue/scheduler`: none, `queue/nomerges`: 2),
the interrupts of its disk and of the network interfaces (spread over more than one CPU),
transparent huge pages (madvise), `vm.swappiness` (1), `fs.aio-max-nr` (shown only: Krill
uses threads, not Linux AIO), the clock
source (tsc), each CPU's frequency governor (performance) and, for buffered storage,
`vm.dirty_background_ratio` (<= 5) and `vm.dirty_ratio` (>= 20).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["Setting", "Result", "check_all", "apply_all", "format_result", "log_off_settings"]

log = logging.getLogger("krill.tune")


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    current: str | None  # None: this machine does not expose it
    recommended: str
    ok: bool | None  # None: not exposed, or not applicable
    why: str
    applied: str | None = None  # what --apply did ("set", or why it could not)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A file holding one value; `good(current)` says whether it is as recommended, and
    `value` is what --apply writes."""

    name: str
    path: str  # under root, e.g. "proc/sys/vm/swappiness"
    recommended: str
    why: str
    good: Callable[[str], bool]
    value: str
    informational: bool = False  # shown, never counted off nor set (Krill does not use it)

    def read(self, root: Path) -> str | None:
        try:
            return (root / self.path).read_text().strip()
        except OSError:
            return None

    def check(self, root: Path) -> Result:
        current = self.read(root)
        if current is None:
            return Result(self.name, None, self.recommended, None,
                          f"not exposed here ({'/' + self.path})")
        ok = None if self.informational else self.good(current)
        return Result(self.name, _shown(current), self.recommended, ok, self.why)

    def apply(self, root: Path) -> Result:
        before = self.check(root)
        if before.ok is not False:
            return before
        try:
            (root / self.path).write_text(self.value + "\n")
        except OSError as e:
            return dataclasses.replace(before, applied=f"could not: {e.strerror or e}")
        after = self.check(root)
        return dataclasses.replace(after, applied="set" if after.ok else
                     f"could not: wrote {self.value!r}, reads {after.current!r}")


def _shown(current: str) -> str:
    """The value a sysfs choice file marks with brackets ("[mq-deadline] none"), else the
    whole text."""
    if "[" in current and "]" in current:
        return current[current.index("[") + 1:current.index("]")]
    return current


def _is(expected: str) -> Callable[[str], bool]:
    return lambda current: _shown(current) == expected


def _at_least(n: int) -> Callable[[str], bool]:
    return lambda current: current.isdigit() and int(current) >= n


def _at_most(n: int) -> Callable[[str], bool]:
    return lambda current: current.isdigit() and int(current) <= n


# --------------------------------------------------------------------------- the settings

def _static_settings(storage_mode: str) -> list[Setting]:
    settings = [
        Setting("vm.swappiness", "proc/sys/vm/swappiness", "1",
                "a swapped-out page of a shard's memory stalls its loop for a disk read",
                _at_most(1), "1"),
        Setting("fs.aio-max-nr", "proc/sys/fs/aio-max-nr", ">= 1048576",
                "Redpanda's value, for Linux AIO; Krill's I/O pools use threads, so it is "
                "shown only", _at_least(1048576), "1048576", informational=True),
        Setting("transparent_hugepage", "sys/kernel/mm/transparent_hugepage/enabled",
                "madvise", "'always' lets khugepaged compact memory under a shard's loop; "
                "madvise gives huge pages only where asked", _is("madvise"), "madvise"),
        Setting("clocksource", "sys/devices/system/clocksource/clocksource0/"
                "current_clocksource", "tsc", "every loop turn and latency stamp reads the "
                "clock; tsc is read without a system call", _is("tsc"), "tsc"),
    ]
    if storage_mode == "buffered":
        settings += [
            Setting("vm.dirty_background_ratio", "proc/sys/vm/dirty_background_ratio",
                    "<= 5", "buffered mode: write-back starts early, so an fdatasync finds "
                    "little to write and a burst does not reach dirty_ratio",
                    _at_most(5), "5"),
            Setting("vm.dirty_ratio", "proc/sys/vm/dirty_ratio", ">= 20",
                    "buffered mode: past it every pwrite (on a shard's loop) is throttled "
                    "until write-back catches up", _at_least(20), "20"),
        ]
    return settings


def _cpu_governors(root: Path) -> list[Setting]:
    cpus = sorted((root / "sys/devices/system/cpu").glob("cpu[0-9]*"),
                  key=lambda p: int(p.name[3:]))
    found = [Setting(f"cpu{cpu.name[3:]}.scaling_governor",
                     str((cpu / "cpufreq/scaling_governor").relative_to(root)), "performance",
                     "a core that slows between bursts adds its ramp-up to the next "
                     "request's latency", _is("performance"), "performance")
             for cpu in cpus if (cpu / "cpufreq/scaling_governor").exists()]
    if not found:
        return [Setting("cpu.scaling_governor", "sys/devices/system/cpu/cpu0/cpufreq/"
                        "scaling_governor", "performance", "", _is("performance"),
                        "performance")]
    return found


def block_device(data_dir: Path, root: Path) -> Path | None:
    """The sysfs directory of the whole disk holding `data_dir` (a partition's parent), or
    None if it is not a block device of this machine (tmpfs, overlay, a container)."""
    try:
        st = os.stat(data_dir if data_dir.exists() else data_dir.parent)
    except OSError:
        return None
    link = root / "sys/dev/block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        device = link.resolve(strict=True)
    except OSError:
        return None
    if (device / "partition").exists():
        device = device.parent
    return device if (device / "queue").is_dir() else None


def _disk_settings(data_dir: Path, root: Path) -> list[Setting]:
    device = block_device(data_dir, root)
    if device is None:
        return [Setting("disk.scheduler", "sys/dev/block/<data dir's device>/queue/scheduler",
                        "none", "", _is("none"), "none")]
    queue = device.relative_to(root) / "queue"
    name = device.name
    return [
        Setting(f"{name}.scheduler", str(queue / "scheduler"), "none",
                "the data disk's own queue orders its writes; a kernel scheduler adds "
                "latency in front of every fdatasync", _is("none"), "none"),
        Setting(f"{name}.nomerges", str(queue / "nomerges"), "2",
                "each flush is one write already; looking for merges costs CPU on every I/O",
                _is("2"), "2"),
    ]


def _irq_results(data_dir: Path, root: Path) -> list[Result]:
    """The interrupts of the data disk and of each network interface with a device: spread
    over more than one CPU (one CPU taking them all stalls the shard pinned there)."""
    sources: list[tuple[str, Path]] = []
    device = block_device(data_dir, root)
    if device is not None:
        sources.append((device.name, device / "device"))
    for iface in sorted((root / "sys/class/net").glob("*")):
        if (iface / "device").exists():
            sources.append((iface.name, iface / "device"))
    results = []
    for name, dev in sources:
        irqs = sorted((p.name for p in (dev / "msi_irqs").glob("*")), key=int) if (
            dev / "msi_irqs").is_dir() else []
        if not irqs:
            results.append(Result(f"{name}.irq_affinity", None, "spread", None,
                                  "no MSI interrupts listed for it here"))
            continue
        cpus = set()
        for irq in irqs:
            try:
                cpus.add((root / f"proc/irq/{irq}/effective_affinity_list").read_text().strip()
                         or (root / f"proc/irq/{irq}/smp_affinity_list").read_text().strip())
            except OSError:
                continue
        results.append(Result(
            f"{name}.irq_affinity", ",".join(sorted(cpus)) or "?", "spread over CPUs",
            len(cpus) > 1 or len(irqs) == 1 or (os.cpu_count() or 1) == 1,
            f"{len(irqs)} interrupts; all on one CPU stall the shard pinned there "
            "(--apply leaves them to irqbalance)"))
    return results


def _settings(data_dir: Path, storage_mode: str, root: Path) -> list[Setting]:
    return (_disk_settings(data_dir, root) + _static_settings(storage_mode)
            + _cpu_governors(root))


def check_all(data_dir: Path, storage_mode: str, root: Path = Path("/")) -> list[Result]:
    return ([s.check(root) for s in _settings(data_dir, storage_mode, root)]
            + _irq_results(data_dir, root))


def apply_all(data_dir: Path, storage_mode: str, root: Path = Path("/")) -> list[Result]:
    return ([s.apply(root) for s in _settings(data_dir, storage_mode, root)]
            + [dataclasses.replace(r, applied="left as is (irqbalance places interrupts)")
               if r.ok is False else r for r in _irq_results(data_dir, root)])


def format_result(r: Result) -> str:
    state = {True: "ok", False: "OFF", None: "n/a"}[r.ok]
    line = f"{state:3}  {r.name}: {r.current if r.current is not None else '-'}" \
           f" (recommended {r.recommended}): {r.why}"
    if r.applied is not None:
        line += f" [{r.applied}]"
    return line


def off_lines(results: list[Result]) -> Iterator[str]:
    for r in results:
        if r.ok is False:
            yield format_result(r)


def log_off_settings(data_dir: Path, storage_mode: str, root: Path = Path("/")) -> int:
    """`krill start`: one warning per setting that is off; how many."""
    lines = list(off_lines(check_all(data_dir, storage_mode, root)))
    for line in lines:
        log.warning("kernel setting off (krill tune): %s", line)
    return len(lines)
