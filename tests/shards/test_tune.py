"""`krill tune` (shards/tune.py) against a /sys and /proc tree of the test's own (`--sysroot`):
what it reads, what --apply writes and what it says it could not, and `krill start`'s lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shards import tune

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def fake_root(tmp_path: Path, data_dir: Path) -> Path:
    """A machine whose data disk is `sdz` (with a partition holding `data_dir`), two CPUs,
    a NIC with two interrupts both on CPU 0, and untuned settings."""
    root = tmp_path / "root"
    st = os.stat(data_dir)
    disk = root / "sys/devices/pci0000:00/0000:00:05.0/block/sdz"
    part = disk / "sdz1"
    (part).mkdir(parents=True)
    (part / "partition").write_text("1\n")
    (disk / "queue").mkdir()
    (disk / "queue/scheduler").write_text("[mq-deadline] none\n")
    (disk / "queue/nomerges").write_text("0\n")
    (disk / "device/msi_irqs").mkdir(parents=True)
    (disk / "device/msi_irqs/30").write_text("msix\n")
    (root / "sys/dev/block").mkdir(parents=True)
    (root / "sys/dev/block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(part)
    for irq, cpu in (("30", "1"), ("40", "0"), ("41", "0")):
        (root / f"proc/irq/{irq}").mkdir(parents=True)
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text(cpu + "\n")
    nic = root / "sys/class/net/eth0/device/msi_irqs"
    nic.mkdir(parents=True)
    (nic / "40").write_text("msix\n")
    (nic / "41").write_text("msix\n")
    (root / "sys/class/net/lo").mkdir(parents=True)  # no device: not looked at
    for name, value in (("swappiness", "60"), ("dirty_background_ratio", "10"),
                        ("dirty_ratio", "20")):
        (root / "proc/sys/vm").mkdir(parents=True, exist_ok=True)
        (root / f"proc/sys/vm/{name}").write_text(value + "\n")
    (root / "proc/sys/fs").mkdir(parents=True)
    (root / "proc/sys/fs/aio-max-nr").mkdir()  # a value file that cannot be written
    (root / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text(
        "always [madvise] never\n")
    clock = root / "sys/devices/system/clocksource/clocksource0"
    clock.mkdir(parents=True)
    (clock / "current_clocksource").write_text("kvm-clock\n")
    for cpu in ("cpu0", "cpu1"):
        (root / f"sys/devices/system/cpu/{cpu}/cpufreq").mkdir(parents=True)
        (root / f"sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor").write_text(
            "powersave\n")
    return root


def by_name(results: list[tune.Result]) -> dict[str, tune.Result]:
    return {r.name: r for r in results}


def test_each_setting_is_read_from_the_machine(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    root = fake_root(tmp_path, data)
    found = by_name(tune.check_all(data, "buffered", root))
    assert (found["sdz.scheduler"].current, found["sdz.scheduler"].ok) == ("mq-deadline", False)
    assert (found["sdz.nomerges"].current, found["sdz.nomerges"].ok) == ("0", False)
    assert found["vm.swappiness"].ok is False and found["vm.dirty_ratio"].ok is True
    assert found["vm.dirty_background_ratio"].ok is False
    assert found["transparent_hugepage"].ok is True and found["clocksource"].ok is False
    assert found["cpu1.scaling_governor"].current == "powersave"
    assert found["fs.aio-max-nr"].ok is None  # a directory: not a value this machine shows
    (root / "proc/sys/fs/aio-max-nr").rmdir()
    (root / "proc/sys/fs/aio-max-nr").write_text("65536\n")
    aio = by_name(tune.check_all(data, "buffered", root))["fs.aio-max-nr"]
    assert (aio.current, aio.ok) == ("65536", None)  # shown, not counted: Krill has no AIO
    assert found["eth0.irq_affinity"].ok is False  # both on CPU 0
    assert found["sdz.irq_affinity"].ok is True  # one interrupt
    assert "lo.irq_affinity" not in found
    direct = by_name(tune.check_all(data, "direct", root))
    assert "vm.dirty_ratio" not in direct  # buffered mode's only


def test_apply_sets_what_it_can_and_says_what_it_could_not(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    root = fake_root(tmp_path, data)
    (root / "sys/devices/system/clocksource/clocksource0/current_clocksource").unlink()
    (root / "sys/devices/system/clocksource/clocksource0/current_clocksource").mkdir()
    applied = by_name(tune.apply_all(data, "buffered", root))
    assert applied["sdz.scheduler"].applied == "set"
    assert (root / "sys/devices/pci0000:00/0000:00:05.0/block/sdz/queue/scheduler"
            ).read_text() == "none\n"
    assert applied["vm.swappiness"].applied == "set"
    assert (root / "proc/sys/vm/swappiness").read_text() == "1\n"
    assert applied["cpu0.scaling_governor"].ok is True
    assert applied["vm.dirty_ratio"].applied is None  # it was fine: not touched
    assert applied["eth0.irq_affinity"].applied.startswith("left as is")
    again = by_name(tune.check_all(data, "buffered", root))
    assert [n for n, r in again.items() if r.ok is False] == ["eth0.irq_affinity"]


def test_a_value_this_machine_refuses_is_reported(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only /proc/sys (a container) refuses the write: the line says so."""
    data = tmp_path / "data"
    data.mkdir()
    root = fake_root(tmp_path, data)
    swappiness = root / "proc/sys/vm/swappiness"
    write_text = Path.write_text

    def refusing(self: Path, text: str, *args: object, **kwargs: object) -> int:
        if self == swappiness:
            raise PermissionError(13, "Permission denied")
        return write_text(self, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", refusing)
    result = by_name(tune.apply_all(data, "buffered", root))["vm.swappiness"]
    assert result.ok is False and result.applied == "could not: Permission denied"
    assert swappiness.read_text() == "60\n"


def test_the_command_prints_a_line_each_and_exits_1_while_one_is_off(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    root = fake_root(tmp_path, data)
    run = subprocess.run([sys.executable, "-m", "shards.cli", "tune", "--data-dir", str(data),
                          "--sysroot", str(root)], cwd=ROOT, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 1, run.stderr
    lines = run.stdout.strip().splitlines()
    assert any(line.startswith("OFF  sdz.scheduler: mq-deadline (recommended none)")
               for line in lines), lines
    assert all(line[:3] in ("ok ", "OFF", "n/a") for line in lines)
    applied = subprocess.run([sys.executable, "-m", "shards.cli", "tune", "--data-dir",
                              str(data), "--sysroot", str(root), "--apply"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30)
    assert "[set]" in applied.stdout and applied.returncode == 1  # eth0's interrupts stay
    bad = subprocess.run([sys.executable, "-m", "shards.cli", "tune", "--sysroot",
                          str(tmp_path / "nowhere")], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_start_logs_each_setting_that_is_off_once(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    root = fake_root(tmp_path, data)
    with caplog.at_level("WARNING", logger="krill.tune"):
        count = tune.log_off_settings(data, "direct", root)
    lines = [r.getMessage() for r in caplog.records]
    assert count == len(lines) == 7  # scheduler, nomerges, swappiness, clock, 2 cpus, eth0
    assert all("krill tune" in line for line in lines)
