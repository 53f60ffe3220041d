"""The simulated shared GPU recorded offline on a fake clock, its reader's wake-ups late or not.

Why: `demo --shared` runs in real time, so a loaded host makes its reads late and the
per-process stream sees fewer of the driver's samples (one per process a read), and how many
depends on the machine. Here the same reader (NvmlAcquirer on the fake NVML) runs on a fake
clock whose sleeps overrun as a loaded host's do, seeded: the same bytes on every machine,
with the simulator's truth of each process's energy in the run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wattlab.acquisition.acquirers.acquirer import Chunk, Reading
from wattlab.acquisition.acquirers.nvml_acquirer import NvmlAcquirer
from wattlab.drivers.nvml import NvmlDriver
from wattlab.hardware.fake_nvml import FakeNvml
from wattlab.hardware.shared_gpu import IDLE_LEAD_S, shared_simulated_gpu
from wattlab.runfile import schema
from wattlab.runfile.writer import RunFileWriter
from wattlab.samples import Gap, Marker

S = 1_000_000_000
UNIX_MINUS_MONO_NS = 1_700_000_000 * S - 10**12


class LateClock:
    """Monotonic fake time whose sleeps overrun: a wake-up is late with ``late_p``.

    A late wake-up comes ``late_s`` (a range, drawn uniformly) after it was due, as on a
    host whose cores are busy with other work; a seeded draw, so the same every time.
    """

    def __init__(self, late_p: float = 0.0, late_s: tuple[float, float] = (0.0, 0.0),
                 seed: int = 0, t_ns: int = 10**12) -> None:
        self.t_ns = t_ns
        self.late_p, self.late_s = late_p, late_s
        self.rng = np.random.default_rng(seed)

    def __call__(self) -> int:
        return self.t_ns

    def wall(self) -> int:
        return self.t_ns + UNIX_MINUS_MONO_NS

    def sleep(self, dt_s: float) -> None:
        late = self.rng.uniform(*self.late_s) if self.rng.random() < self.late_p else 0.0
        self.t_ns += round((dt_s + late) * 1e9)


def record_shared(path: Path, *, seed: int = 1, processes: int = 3, duration_s: float = 20.0,
                  late_p: float = 0.0, late_s: tuple[float, float] = (0.0, 0.0),
                  intervals_s: dict[str, float] | None = None) -> Path:
    """``demo --shared``'s GPU and reader on a ``LateClock`` (module doc), written to ``path``."""
    clock = LateClock(late_p, late_s, seed)
    start_ns = clock()
    gpu = shared_simulated_gpu(processes, seed, duration_s, clock_ns=clock, start_ns=start_ns,
                               unix_offset_ns=UNIX_MINUS_MONO_NS)
    acq = NvmlAcquirer(NvmlDriver(FakeNvml([gpu])), 0, clock_ns=clock, wall_clock_ns=clock.wall,
                       sleep=clock.sleep, intervals_s=intervals_s)
    descriptors = acq.open()
    readings: list[Reading] = []
    end_ns = start_ns + round((IDLE_LEAD_S + duration_s + 0.5) * 1e9)
    while clock() < end_ns:
        readings += acq.poll()
    readings += acq.flush()
    acq.close()
    w = RunFileWriter(str(path), {schema.CREATED: "test",
                                  schema.SESSION_START_UNIX_NS: start_ns + UNIX_MINUS_MONO_NS},
                      start_ns)
    for d in descriptors:
        w.add_source(d)
    for r in readings:
        if isinstance(r, Chunk):
            w.append(r.source_id, r.t_host_ns, r.t_raw if r.t_raw is not None else r.t_host_ns,
                     r.values, r.flags if r.flags is not None
                     else np.zeros(r.t_host_ns.size, np.uint8))
    w.add_markers(sorted((r for r in readings if isinstance(r, Marker)),
                         key=lambda m: m.t_host_ns))
    w.add_gaps([r for r in readings if isinstance(r, Gap)])
    w.close()
    return path
