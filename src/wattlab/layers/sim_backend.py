"""`Backend` on the simulated layer GPU: a job is a list of operations it executes.

An operation is ``("run", work_flops, bytes)`` or ``("clock", sm_mhz, mem_mhz)``; a layer
is one run, a group of layers several, a planned step runs with clock changes between.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wattlab.hardware.simulated_layer_gpu import SimulatedLayerGpu
from wattlab.layers.measure import Window

Op = tuple[str, float, float]
POLL_S = 0.003  # as polling NVML's energy counter on an H100 (~3 ms a call)


class SimBackend:
    """Runs jobs on a `SimulatedLayerGpu` in virtual time."""

    def __init__(self, gpu: SimulatedLayerGpu) -> None:
        self.gpu = gpu

    def _once(self, job: Sequence[Op]) -> None:
        for kind, a, b in job:
            if kind == "clock":
                self.gpu.set_clocks(int(a), int(b))
            else:
                self.gpu.run(a, b)

    def time_s(self, job: Sequence[Op], repeats: int) -> float:
        # one run op by op, the others as one stretch at its power (each run alike)
        t0, e0 = self.gpu.now_s, self.gpu.energy_j
        self._once(job)
        once_s = self.gpu.now_s - t0
        if repeats > 1 and once_s > 0:
            self.gpu.add_segment(once_s * (repeats - 1), (self.gpu.energy_j - e0) / once_s)
        return self.gpu.now_s - t0

    def window(self, job: Sequence[Op], repeats: int, chunks: int) -> Window:
        self.gpu.idle(0.2)
        start = self.gpu.now_s
        chunk_s = np.array([self.time_s(job, repeats // chunks) for _ in range(chunks)])
        end = self.gpu.now_s
        ticks, energy = self.gpu.counter_ticks(start, end)
        # the host sees each tick up to one poll late
        seen = ticks + self.gpu.rng.uniform(0, POLL_S, ticks.shape[0])
        return Window(chunk_s, repeats, start, end, seen, energy, POLL_S / 12**0.5)
