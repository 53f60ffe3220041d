"""The simulated GPU running one layer at a time: time and power from FLOPs and bytes.

Why: per-layer energy and clock plans need a GPU whose clocks can be set and whose true
per-layer cost is known exactly, so the measurement and the plan search can be checked.
A layer takes max(compute, memory) time plus a little of the other (imperfect overlap) and
a launch cost; compute time scales with the SM clock, memory time with the memory clock.
Power is idle plus the SMs' dynamic power (∝ f^k, partly burnt while stalled on memory)
plus memory power (∝ memory clock and its utilisation); the parameters resemble an H100
SXM (the `GpuModel` of simulated_gpu.py). Changing clocks stalls the GPU for ``switch_s``.

`SimulatedLayerGpu` keeps a virtual clock and an energy counter that ticks every 100 ms in
whole mJ, as NVML's does, so the same measurement code runs on it and on a real GPU.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from wattlab.device_models import LayerPhysics, simulated_roofline
from wattlab.errors import UsageError
from wattlab.hardware.simulated_gpu import GpuModel

FloatArray = npt.NDArray[np.float64]


def simulated_h100_physics(dtype: str = "float32", switch_s: float = 5e-4) -> LayerPhysics:
    """The layer physics of the simulated H100: its clocks and power model (``GpuModel``)."""
    m = GpuModel()
    return LayerPhysics(simulated_roofline(dtype), m.sm_clocks_mhz, m.mem_clocks_mhz,
                        idle_w=m.idle_w, clock_exponent=m.clock_exponent,
                        mem_idle_w=m.mem_idle_w, mem_dynamic_w=m.mem_dynamic_w,
                        switch_s=switch_s)


class SimulatedLayerGpu:
    """A virtual-time GPU: runs layer costs, changes clocks, keeps an NVML-like counter."""

    def __init__(self, physics: LayerPhysics, seed: int = 0, *, settable: bool = True,
                 noise_frac: float = 0.01, counter_period_s: float = 0.1) -> None:
        self.physics = physics
        self.settable = settable
        self.noise_frac = noise_frac
        self.counter_period_s = counter_period_s
        self.rng = np.random.default_rng([seed, 0x1A7E])
        self.sm_mhz, self.mem_mhz = physics.default_pair
        self.now_s = 0.0
        self.switches = 0
        self._t = [0.0]  # segment ends (s) and the cumulative energy there (J)
        self._e = [0.0]

    def add_segment(self, duration_s: float, power_w: float) -> None:
        """Advance the clock by ``duration_s`` at ``power_w`` (e.g. a run repeated)."""
        self.now_s += duration_s
        self._t.append(self.now_s)
        self._e.append(self._e[-1] + duration_s * power_w)

    def set_clocks(self, sm_mhz: int, mem_mhz: int) -> None:
        """Lock both clocks (a stall of ``switch_s`` when either changes)."""
        if (sm_mhz, mem_mhz) == (self.sm_mhz, self.mem_mhz):
            return
        if not self.settable:
            raise UsageError("this GPU's clocks may not be changed here")
        if ((sm_mhz, mem_mhz) not in self.physics.pairs_mhz if self.physics.pairs_mhz else
                sm_mhz not in self.physics.sm_clocks_mhz
                or mem_mhz not in self.physics.mem_clocks_mhz):
            raise UsageError(f"clock pair {sm_mhz}/{mem_mhz} MHz is not supported")
        t_s, e_j = self.physics.switch_cost()
        self.add_segment(t_s, e_j / t_s)
        self.sm_mhz, self.mem_mhz = sm_mhz, mem_mhz
        self.switches += 1

    def run(self, work_flops: float, bytes_moved: float, repeats: int = 1) -> float:
        """Run one layer ``repeats`` times back to back; its time per run (s)."""
        t, p = self.physics.cost(work_flops, bytes_moved, self.sm_mhz, self.mem_mhz)
        t_s = float(t) * (1 + self.noise_frac * 0.5 * float(self.rng.standard_normal()))
        p_w = float(p) * (1 + self.noise_frac * float(self.rng.standard_normal()))
        self.add_segment(t_s * repeats, p_w)
        return t_s

    def idle(self, duration_s: float) -> None:
        self.add_segment(duration_s, self.physics.idle_w + self.physics.mem_idle_w)

    @property
    def energy_j(self) -> float:
        """True energy since the start (J)."""
        return self._e[-1]

    def true_energy_j(self, t0_s: float, t1_s: float) -> float:
        e = np.interp([t0_s, t1_s], self._t, self._e)
        return float(e[1] - e[0])

    def counter_ticks(self, t0_s: float, t1_s: float) -> tuple[FloatArray, FloatArray]:
        """(tick times s, counter J) of every counter update within [t0, t1], whole mJ."""
        p = self.counter_period_s
        ticks = np.arange(math.ceil(t0_s / p), math.floor(t1_s / p) + 1) * p
        counter = np.floor(np.interp(ticks, self._t, self._e) * 1e3) / 1e3
        return ticks.astype(np.float64), np.asarray(counter, dtype=np.float64)
