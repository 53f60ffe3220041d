"""`Backend` on the simulated layer GPU: a job is a list of operations it executes.

An operation is ``("run", work_flops, bytes)``, ``("clock", sm_mhz, mem_mhz)`` or
``("mark", row_key, edge)`` (a GPU-timed boundary, as a CUDA event recorded from a hook);
a layer is one run, a group of layers several, a traced step the model's runs with marks
and clock changes between.

The host is simulated too, as on a real GPU: issuing each run or clock change costs it
``host_s``, a mark ``hook_s``, and the GPU cannot start work before the host has issued
it (it idles meanwhile). A step of large layers keeps the host ahead of the GPU; a small
layer replayed alone does not, so its time alone includes the host's launch overhead,
as it does on a real GPU (why per-layer times are taken inside the step: in_step.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wattlab.hardware.simulated_layer_gpu import SimulatedLayerGpu
from wattlab.layers.in_step import Mark
from wattlab.layers.measure import Window

Op = tuple[str, Any, Any]
POLL_S = 0.003  # as polling NVML's energy counter on an H100 (~3 ms a call)
HOST_S = 1.2e-5  # host time to issue one layer (module call and kernel launch)
HOOK_S = 1.5e-6  # host time of one boundary hook recording an event


class SimBackend:
    """Runs jobs on a `SimulatedLayerGpu` in virtual time, behind a simulated host."""

    def __init__(self, gpu: SimulatedLayerGpu, host_s: float = HOST_S,
                 hook_s: float = HOOK_S) -> None:
        self.gpu = gpu
        self.host_s = host_s
        self.hook_s = hook_s

    def _execute(self, job: Sequence[Op], host_at_s: float) -> tuple[float, float, list[Mark]]:
        """Run the job once with the host at ``host_at_s``.

        Returns the host's time after, the GPU's busy time and the marks (the GPU time
        each was reached).
        """
        busy_s, marks = 0.0, []
        for kind, a, b in job:
            if kind == "mark":
                host_at_s += self.hook_s
                marks.append((str(a), str(b), max(self.gpu.now_s, host_at_s)))
                continue
            host_at_s += self.host_s
            if host_at_s > self.gpu.now_s:
                self.gpu.idle(host_at_s - self.gpu.now_s)
            t0 = self.gpu.now_s
            if kind == "clock":
                self.gpu.set_clocks(int(a), int(b))
            else:
                self.gpu.run(float(a), float(b))
            busy_s += self.gpu.now_s - t0
        return host_at_s, busy_s, marks

    def time_s(self, job: Sequence[Op], repeats: int) -> float:
        # one run op by op; the others as one stretch at the steady pace: the GPU's busy
        # time, or the host's issue time where that is longer (the GPU idling meanwhile)
        t0, e0 = self.gpu.now_s, self.gpu.energy_j
        _, busy_s, marks = self._execute(job, self.gpu.now_s)
        if repeats > 1 and busy_s > 0:
            issue_s = sum(self.host_s for kind, _, _ in job if kind != "mark") \
                + len(marks) * self.hook_s
            pace_s = max(busy_s, issue_s)
            idle_w = self.gpu.physics.idle_w + self.gpu.physics.mem_idle_w
            busy_j = self.gpu.energy_j - e0 - idle_w * (self.gpu.now_s - t0 - busy_s)
            power_w = (busy_j + idle_w * (pace_s - busy_s)) / pace_s
            self.gpu.add_segment(pace_s * (repeats - 1), power_w)
        return self.gpu.now_s - t0

    def step_marks(self, step: Sequence[Op], steps: int) -> list[Mark]:
        """``steps`` steps back to back (the host queueing ahead), with marks.

        A "step" mark before each step and after the last; times in s from the first mark.
        """
        host_at_s, marks = self.gpu.now_s, []
        for _ in range(steps):
            marks.append(("", "step", max(self.gpu.now_s, host_at_s)))
            host_at_s, _, seen = self._execute(step, host_at_s)
            marks += seen
        marks.append(("", "step", max(self.gpu.now_s, host_at_s)))
        return [(k, e, t - marks[0][2]) for k, e, t in marks]

    def window(self, job: Sequence[Op], repeats: int, chunks: int) -> Window:
        self.gpu.idle(0.2)
        start = self.gpu.now_s
        chunk_s = np.array([self.time_s(job, repeats // chunks) for _ in range(chunks)])
        end = self.gpu.now_s
        ticks, energy = self.gpu.counter_ticks(start, end)
        # the host sees each tick up to one poll late
        seen = ticks + self.gpu.rng.uniform(0, POLL_S, ticks.shape[0])
        return Window(chunk_s, repeats, start, end, seen, energy, POLL_S / 12**0.5)
