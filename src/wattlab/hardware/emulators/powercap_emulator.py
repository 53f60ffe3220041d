"""An emulated Linux powercap tree: RAPL zones whose ``energy_uj`` advance from a power profile.

Why: the RAPL source reads files, so a folder laid out like ``/sys/class/powercap`` lets every
test and benchmark run it unchanged on a machine without RAPL (a VM, a container, an ARM
laptop). The layout follows the kernel's powercap ABI: one ``intel-rapl:N`` folder per
package (AMD's RAPL driver uses the same names), sub-zones ``intel-rapl:N:M`` inside it, each
with ``name``, ``energy_uj``, ``max_energy_range_uj`` and ``enabled``.

How the kernel counts, and so how this counts: the MSR is a 32-bit counter of energy units
(Intel servers 61.04 µJ = 2^-14 J, AMD 15.26 µJ = 2^-16 J); ``energy_uj`` is that counter
times the unit, truncated to µJ, and ``max_energy_range_uj`` is the largest value it shows
(the 32-bit mask times the unit). So the file wraps to 0 after ``max_energy_range_uj`` plus
one unit. ``energy_unit_uj = 1`` (the default) makes every µJ visible, for exact tests.

The true energy is exact: each zone's power is piecewise constant (``profile``: (seconds,
watts) segments, repeated), so the energy at any time is a closed form, and ``log`` keeps
every value written, unwrapped, for checking a reader against.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

INTEL_SERVER_UNIT_UJ = 1e6 / 2**14  # 61.04 µJ
AMD_UNIT_UJ = 1e6 / 2**16  # 15.26 µJ
COUNTER_BITS = 32


@dataclass
class Zone:
    """One powercap zone: its folder name, kernel name and power profile.

    ``profile``: (duration s, power W) segments, repeated; ``start_uj`` is the energy already
    counted when the emulation starts (put it near the wrap to see one soon). ``max_power_w``
    is written as ``constraint_0_max_power_uw`` when set (the kernel gives it for some zones).
    """

    folder: str
    name: str
    profile: Sequence[tuple[float, float]]
    energy_unit_uj: float = 1.0
    max_energy_range_uj: int | None = None  # default: the 32-bit mask times the unit
    start_uj: float = 0.0
    max_power_w: float | None = None
    readable: bool = True
    children: list[Zone] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.profile or any(d <= 0 or p < 0 for d, p in self.profile):
            raise ValueError(f"zone {self.folder}: profile needs (seconds > 0, watts >= 0)")
        if self.max_energy_range_uj is None:
            self.states = 2**COUNTER_BITS
            self.max_energy_range_uj = math.floor((self.states - 1) * self.energy_unit_uj)
        else:  # a short range, to see wraps in a test: counter states up to the range
            self.states = round(self.max_energy_range_uj / self.energy_unit_uj) + 1

    def energy_uj(self, t_s: float) -> float:
        """True energy counted after ``t_s`` seconds of emulation (µJ, unwrapped)."""
        period_s = sum(d for d, _ in self.profile)
        per_period_uj = sum(d * p for d, p in self.profile) * 1e6
        whole, rest_s = divmod(max(t_s, 0.0), period_s)
        out = self.start_uj + whole * per_period_uj
        for d, p in self.profile:
            step = min(d, rest_s)
            out += step * p * 1e6
            rest_s -= step
            if rest_s <= 0:
                break
        return out

    def counted_units(self, t_s: float) -> int:
        """The kernel's counter after ``t_s``, unwrapped: whole energy units."""
        return math.floor(self.energy_uj(t_s) / self.energy_unit_uj)

    def shown_uj(self, units: int) -> int:
        """The ``energy_uj`` file's value: the counter wrapped, times the unit, truncated."""
        return math.floor((units % self.states) * self.energy_unit_uj)

    def walk(self) -> list[tuple[Path, Zone]]:
        """The zone and its sub-zones, with their paths relative to the tree root."""
        out = [(Path(self.folder), self)]
        for child in self.children:
            out += [(Path(self.folder) / p, z) for p, z in child.walk()]
        return out


def intel_server(packages: int = 2, package_w: float = 120.0, dram_w: float = 20.0,
                 energy_unit_uj: float = 1.0) -> list[Zone]:
    """A two-socket Intel server: package-N zones (N × 10 W more each) with a dram sub-zone."""
    return [Zone(f"intel-rapl:{i}", f"package-{i}", [(1.0, package_w + 10 * i)],
                 energy_unit_uj=energy_unit_uj,
                 children=[Zone(f"intel-rapl:{i}:0", "dram", [(1.0, dram_w)],
                                energy_unit_uj=energy_unit_uj)])
            for i in range(packages)]


class PowercapEmulator:
    """Writes a powercap tree under ``root`` and advances it (``update``, or a thread).

    ``clock_ns`` is the time source (injectable for tests that step time themselves);
    ``update`` writes every zone's ``energy_uj`` for the clock's now and appends to ``log``
    ``(t_ns, {zone path: counter units, unwrapped})``. Files are replaced atomically, so a reader
    sees the old value or the new, never half of one.
    """

    def __init__(self, root: str | Path, zones: Sequence[Zone], *,
                 clock_ns: Callable[[], int] = time.monotonic_ns, tick_s: float = 0.001) -> None:
        self.root = Path(root)
        self.zones = [item for z in zones for item in z.walk()]
        self.clock_ns = clock_ns
        self.tick_s = tick_s
        self.start_ns = clock_ns()
        self.log: list[tuple[int, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._frozen_ns: int | None = None
        self._write_static()
        self.update()

    def _write_static(self) -> None:
        for rel, zone in self.zones:
            folder = self.root / rel
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "name").write_text(zone.name + "\n")
            (folder / "enabled").write_text("1\n")
            (folder / "max_energy_range_uj").write_text(f"{zone.max_energy_range_uj}\n")
            if zone.max_power_w is not None:
                (folder / "constraint_0_max_power_uw").write_text(
                    f"{round(zone.max_power_w * 1e6)}\n")

    def update(self) -> dict[str, int]:
        """Write every zone's ``energy_uj`` for now; returns the unwrapped counter units."""
        now = self.clock_ns() if self._frozen_ns is None else self._frozen_ns
        t_s = (now - self.start_ns) / 1e9
        counted: dict[str, int] = {}
        for rel, zone in self.zones:
            counted[str(rel)] = zone.counted_units(t_s)
            path = self.root / rel / "energy_uj"
            tmp = path.with_name(".energy_uj.tmp")
            tmp.write_text(f"{zone.shown_uj(counted[str(rel)])}\n")
            os.chmod(tmp, 0o444 if zone.readable else 0o000)
            os.replace(tmp, path)
        self.log.append((now, counted))
        return counted

    def start(self) -> PowercapEmulator:
        """Advance the files every ``tick_s`` in a thread until ``stop``."""
        self._thread = threading.Thread(target=self._loop, name="powercap-emulator", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.update()

    def stop(self) -> dict[str, int]:
        """Stop the thread and freeze the counters at their last written values."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._frozen_ns = self.log[-1][0]
        return self.log[-1][1]

    def true_energy_j(self, zone_path: str, t0_ns: int, t1_ns: int) -> float:
        """The zone's exact energy between two clock times (J)."""
        zone = dict((str(r), z) for r, z in self.zones)[zone_path]
        rel = (t0_ns - self.start_ns) / 1e9, (t1_ns - self.start_ns) / 1e9
        return (zone.energy_uj(rel[1]) - zone.energy_uj(rel[0])) / 1e6
