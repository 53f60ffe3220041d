"""Linux powercap (RAPL) zones: find them, read ``energy_uj``, undo its wrap-around.

Why a driver: the kernel's RAPL counters (Intel, and AMD through the same ``intel-rapl``
names) are plain files, but reading them honestly needs three things every caller would
otherwise get wrong: which zones to add (a package's ``core`` and ``uncore`` sub-zones are
parts of it; ``dram`` is not; ``psys`` covers the whole platform; ``intel-rapl-mmio`` is a
second view of the same package), the wrap (``energy_uj`` falls back to 0 after
``max_energy_range_uj``), and why a file cannot be read (since Linux 5.10, CVE-2020-8694,
``energy_uj`` is readable by root only).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path

from wattlab.errors import MeterError

DEFAULT_ROOT = "/sys/class/powercap"
ZONE_PATTERN = re.compile(r"^intel-rapl:\d+(:\d+)*$")  # not intel-rapl-mmio: the same package
FALLBACK_MAX_POWER_W = 1000.0  # no socket or DIMM set draws more; used where the kernel is silent

# what each kernel zone name measures, and whether it is a part of its parent zone
DOMAINS: dict[str, tuple[str, bool]] = {
    "package": ("cores, caches and uncore of one CPU socket (not its DRAM)", False),
    "dram": ("the DRAM attached to this socket", False),
    "core": ("the CPU cores of this socket (part of the package)", True),
    "uncore": ("the socket's integrated graphics/uncore (part of the package)", True),
    "psys": ("the whole platform as the SoC sees it (covers packages, more)", False),
}

PERMISSION_FIX = (
    "since Linux 5.10 energy_uj is readable by root only (CVE-2020-8694). Fix: run as root, "
    "or once per boot `sudo chmod a+r {root}/intel-rapl:*/energy_uj "
    "{root}/intel-rapl:*/intel-rapl:*/energy_uj` (a udev rule or systemd-tmpfiles line keeps "
    "it); in a container also mount the host's {root} (e.g. docker -v {root}:{root}:ro)")
NO_ZONES_FIX = (
    "no RAPL zones (intel-rapl:N) under {root}: a virtual machine (hypervisors do not pass "
    "RAPL through), a container without the host's /sys/class/powercap, a CPU without RAPL, "
    "or the intel_rapl_msr / amd rapl driver not loaded (`sudo modprobe intel_rapl_msr`)")


def domain_of(name: str) -> str:
    """``package-0`` → ``package``: the kernel numbers packages in their zone names."""
    return name.split("-", 1)[0] if name.startswith("package-") else name


@dataclass(frozen=True)
class PowercapZone:
    """One zone folder: its kernel name, what it measures, its wrap and its power bound."""

    path: Path
    name: str
    domain: str
    max_energy_range_uj: int
    max_power_w: float  # the kernel's constraint_0_max_power_uw, else FALLBACK_MAX_POWER_W
    parent: str  # folder name of the package zone this is under ("" for a package)

    @property
    def part_of_parent(self) -> bool:
        return DOMAINS.get(self.domain, ("", False))[1]

    @property
    def wrap_s(self) -> float:
        """Shortest time in which the counter can wrap: its range at the zone's top power."""
        return self.max_energy_range_uj / (self.max_power_w * 1e6)

    def describe(self) -> str:
        return DOMAINS.get(self.domain, ("a RAPL zone the kernel calls " + self.name, False))[0]


def _read_int(path: Path, root: Path) -> int:
    try:
        return int(path.read_text().strip())
    except PermissionError as e:
        raise MeterError(f"{path}: permission denied; {PERMISSION_FIX.format(root=root)}") from e
    except OSError as e:
        if e.errno == errno.ENODATA:  # some kernels answer a disabled zone so
            raise MeterError(f"{path}: the zone gives no data (disabled?)") from e
        raise MeterError(f"{path}: cannot read: {e}") from e
    except ValueError as e:
        raise MeterError(f"{path}: not a number: {e}") from e


def _max_power_w(folder: Path, root: Path) -> float:
    path = folder / "constraint_0_max_power_uw"
    if not path.exists():
        return FALLBACK_MAX_POWER_W
    try:
        uw = _read_int(path, root)
    except MeterError:
        return FALLBACK_MAX_POWER_W
    return uw / 1e6 if uw > 0 else FALLBACK_MAX_POWER_W


def discover(root: str | Path = DEFAULT_ROOT) -> list[PowercapZone]:
    """Every RAPL zone under ``root``, packages first, each followed by its sub-zones.

    Raises MeterError naming the cause and the fix when there is none, or when the
    counters cannot be read.
    """
    base = Path(root)
    if not base.is_dir():
        raise MeterError(f"{base}: no such folder; " + NO_ZONES_FIX.format(root=base))
    tops = sorted((p for p in base.iterdir() if ZONE_PATTERN.match(p.name)
                   and p.name.count(":") == 1), key=lambda p: int(p.name.split(":")[1]))
    if not tops:
        raise MeterError(NO_ZONES_FIX.format(root=base))
    zones: list[PowercapZone] = []
    for top in tops:
        subs = sorted((p for p in top.iterdir() if ZONE_PATTERN.match(p.name)),
                      key=lambda p: int(p.name.rsplit(":", 1)[1]))
        for folder in [top, *subs]:
            name = (folder / "name").read_text().strip()
            zones.append(PowercapZone(folder, name, domain_of(name),
                                      _read_int(folder / "max_energy_range_uj", base),
                                      _max_power_w(folder, base),
                                      "" if folder is top else top.name))
    for zone in zones:  # fail at open, with the fix, rather than at the first poll
        read_uj(zone, base)
    return zones


def read_uj(zone: PowercapZone, root: str | Path = DEFAULT_ROOT) -> int:
    """The zone's ``energy_uj`` now (opened each time: cheap, and never a stale view)."""
    return _read_int(zone.path / "energy_uj", Path(root))


class Unwrapper:
    """Turns successive ``energy_uj`` readings into energy since the first, across wraps.

    A reading below the previous one means the counter passed ``max_energy_range_uj`` and
    started again from 0: one wrap adds the range plus 1 µJ (the kernel documents the range
    as the largest value; where the counter steps in coarser units, Intel 61 µJ and AMD
    15.3 µJ, a wrap is off by less than one unit). Reads closer together than the zone's
    ``wrap_s`` can never miss a wrap (the RAPL source reads far more often and reports a
    read that came later as a gap).
    """

    def __init__(self, zone: PowercapZone, first_uj: int) -> None:
        self.zone = zone
        self.first_uj = first_uj
        self.last_uj = first_uj
        self.total_uj = 0
        self.wraps = 0

    def add(self, reading_uj: int) -> int:
        """Energy since the first reading (µJ) after this one."""
        delta = reading_uj - self.last_uj
        if delta < 0:
            delta += self.zone.max_energy_range_uj + 1
            self.wraps += 1
        self.last_uj = reading_uj
        self.total_uj += delta
        return self.total_uj
