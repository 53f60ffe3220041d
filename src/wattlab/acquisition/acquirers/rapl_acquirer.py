"""CPU and DRAM energy from Linux powercap (RAPL) as a source: one stream per package.

Stream ``<id>.<package>`` (``rapl.package-0``) holds one J channel per zone of that package,
``package_energy_j``, ``dram_energy_j``, ``core_energy_j``: energy since the stream opened,
unwrapped from the zone's ``energy_uj``. Each channel's meaning and ``config["zones"]`` say
what it covers and whether it is a part of the package (``core``, ``uncore``: never add them
to it); ``wattlab energy --node`` reads that to add CPU and DRAM without a double count.

Cadence: all zones are read together every ``interval_s`` (0.1 s), and never less often than a
quarter of the shortest time any zone could take to wrap at its top power, so no wrap is
ever missed. A read that still comes later than that (a stalled host) is sent as a Gap
saying the energy across it may lack whole wraps.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading, sleep_until_due
from wattlab.acquisition.acquirers.meter_registry import MeterKind, register
from wattlab.drivers.powercap import DEFAULT_ROOT, PowercapZone, Unwrapper, discover, read_uj
from wattlab.errors import MeterError, UsageError
from wattlab.option_checks import positive_number
from wattlab.samples import Channel, Gap, SourceDescriptor

DEFAULT_INTERVAL_S = 0.1
WRAP_MARGIN = 4  # read at least this many times per shortest possible wrap
POLL_STEP_S = 0.1


def channel_names(zones: list[PowercapZone]) -> list[str]:
    """``<domain>_energy_j`` per zone, the folder number added where a domain repeats."""
    names: list[str] = []
    for z in zones:
        name = f"{z.domain}_energy_j"
        if name in names or sum(o.domain == z.domain for o in zones) > 1:
            name = f"{z.domain}{z.path.name.rsplit(':', 1)[1]}_energy_j"
        names.append(name)
    return names


class RaplAcquirer:
    """Reads every RAPL zone under ``root`` (``/sys/class/powercap``, or an emulated tree).

    ``clock_ns`` and ``sleep`` are injectable so tests can step time with the emulator.
    """

    def __init__(self, root: str = DEFAULT_ROOT, source_id: str = "rapl", *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[int, float], bool] = sleep_until_due) -> None:
        if not interval_s > 0:
            raise UsageError(f"rapl {root}: interval_s must be > 0, got {interval_s}")
        self.root = root
        self.source_id = source_id
        self.requested_interval_s = interval_s
        self.interval_s = interval_s
        self._clock = clock_ns
        self._sleep = sleep
        self._packages: dict[str, list[tuple[str, Unwrapper]]] = {}  # stream id → channels
        self._last_ns = 0
        self._due_ns = 0
        self._pending: list[Reading] = []  # the zero row of each stream, read at open

    def open(self) -> list[SourceDescriptor]:
        """Find the zones, read each once (the zero of its channel), describe the streams."""
        zones = discover(self.root)
        shortest_wrap_s = min(z.wrap_s for z in zones)
        self.interval_s = min(self.requested_interval_s, shortest_wrap_s / WRAP_MARGIN)
        t0 = self._clock()
        firsts = [read_uj(z, self.root) for z in zones]
        self._last_ns = (t0 + self._clock()) // 2
        self._due_ns = self._last_ns + round(self.interval_s * 1e9)
        by_package: dict[str, list[tuple[PowercapZone, int]]] = {}
        for zone, first in zip(zones, firsts, strict=True):
            by_package.setdefault(zone.parent or zone.path.name, []).append((zone, first))
        descriptors = []
        for folder, members in by_package.items():
            package = members[0][0]
            stream = f"{self.source_id}.{package.name}"
            names = channel_names([z for z, _ in members])
            self._packages[stream] = [(n, Unwrapper(z, f))
                                      for n, (z, f) in zip(names, members, strict=True)]
            top = names[0]
            self._pending.append(Chunk(stream, np.array([self._last_ns], dtype=np.int64),
                                       np.zeros((1, len(names)))))
            descriptors.append(SourceDescriptor(
                source_id=stream, kind="rapl", model=f"RAPL {package.name}",
                channels=tuple(Channel(n, "J", f"{z.describe()}: energy since the stream "
                                                f"opened, from {z.path}/energy_uj")
                               for n, (z, _) in zip(names, members, strict=True)),
                transport=f"powercap:{self.root}", host=socket.gethostname(),
                config={
                    "root": str(self.root), "package": folder,
                    "zones": {n: {"path": str(z.path), "name": z.name, "domain": z.domain,
                                  "part_of": top if z.part_of_parent else None,
                                  "max_energy_range_uj": z.max_energy_range_uj,
                                  "max_power_w": z.max_power_w, "first_energy_uj": f}
                              for n, (z, f) in zip(names, members, strict=True)},
                    "interval_s": self.interval_s, "shortest_wrap_s": shortest_wrap_s,
                    "measures": "cpu" if package.domain == "package" else package.domain,
                }))
        return descriptors

    def poll(self) -> list[Reading]:
        """Read every zone when due: one row per package stream."""
        if not self._packages:
            raise MeterError(f"rapl {self.root}: poll before open")
        pending, self._pending = self._pending, []
        if not self._sleep(self._due_ns, POLL_STEP_S):
            return pending
        return pending + self._read()

    def _read(self) -> list[Reading]:
        t0 = self._clock()
        raw = {s: [read_uj(u.zone, self.root) for _, u in chans]
               for s, chans in self._packages.items()}
        t_ns = (t0 + self._clock()) // 2
        out: list[Reading] = []
        late_s = (t_ns - self._last_ns) / 1e9
        for stream, chans in self._packages.items():
            shortest = min(u.zone.wrap_s for _, u in chans)
            if late_s > shortest:
                out.append(Gap(stream, f"RAPL read {late_s:.1f} s after the last, longer than "
                               f"the {shortest:.1f} s a zone can take to wrap at its top "
                               "power: whole wraps may be missing from this span",
                               t_first_ns=self._last_ns, t_last_ns=t_ns))
            totals = [u.add(r) / 1e6 for (_, u), r in zip(chans, raw[stream], strict=True)]
            out.append(Chunk(stream, np.array([t_ns], dtype=np.int64),
                             np.array([totals], dtype=np.float64)))
        self._last_ns = t_ns
        step = round(self.interval_s * 1e9)
        self._due_ns = max(self._due_ns + step, t_ns + step // 2)
        return out

    def flush(self) -> list[Reading]:
        """One last read, so the stream's energy runs to the stop."""
        pending, self._pending = self._pending, []
        return pending + self._read() if self._packages else []

    def close(self) -> None:
        """Nothing is held open between reads."""
        self._packages = {}


def _build(address: str, source_id: str, options: Mapping[str, Any]) -> RaplAcquirer:
    return RaplAcquirer(address or DEFAULT_ROOT, source_id,
                        interval_s=float(options.get("interval_s", DEFAULT_INTERVAL_S)))


def _emulate(power_w: Callable[[Any], Any], seed: int, name: str) -> int:
    """An emulated two-socket tree in a new folder, advancing until Ctrl-C."""
    import tempfile

    from wattlab.hardware.emulators.powercap_emulator import PowercapEmulator, intel_server

    root = Path(tempfile.mkdtemp(prefix="wattlab-powercap-"))
    emulator = PowercapEmulator(root, intel_server())
    # stopped however the run ends: a stop signal can land before the sleep (on a loaded
    # machine, right after the line below), and a thread still writing the tree then
    # outlives the removal of the run's temporary folder
    try:
        emulator.start()
        print(f"emulated powercap tree: {root}  (wattlab record --rapl {root} ...)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
    return 0


KIND = register(MeterKind(
    kind="rapl", default_id="rapl", aliases=("powercap",), address_key="path",
    help="CPU package and DRAM energy from Linux powercap (RAPL), Intel and AMD",
    build=_build, options={"interval_s": (positive_number, None)},
    stream_rate=None,  # not measured: the disk budget counts its chunks only
    emulate=_emulate, emulate_as=("rapl",),
    template="""
# CPU packages and DRAM through Linux powercap (RAPL; Intel and AMD). Needs energy_uj to be
# readable: root, or `sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj ...`.
# [[device]]
# kind = "rapl"
# id = "rapl"
# path = "/sys/class/powercap"
# interval_s = 0.1
""",
))


def powercap_readable(root: str = DEFAULT_ROOT) -> str:
    """One line on what ``root`` holds: for ``wattlab devices`` and the docs' checks."""
    try:
        zones = discover(root)
    except MeterError as e:
        return f"{root}: {e}"
    names = ", ".join(f"{z.path.name} ({z.name})" for z in zones)
    return f"{root}: readable RAPL zones: {names} (uid {os.getuid()})"
