"""Training-loop workloads for the simulated GPU, with the steps' true start times.

Why: iteration detection (and ``tune``, which builds on it) must be tested where the truth
is known exactly and the difficulty can be turned up: steps whose spacing jitters (a data
loader as the bottleneck), steps near the 50 Hz sample spacing, GPU work while waiting,
and pauses (evaluation). The real H100 traces in tests/data/traces check the same code on
a real device; these cover the range in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.device_models import Segment, WorkloadSchedule
from wattlab.hardware.simulated_gpu import SimulatedGpu

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TrainingLoop:
    """Shape of a simulated training loop (times in s, utilisations 0..1)."""

    steps: int = 60
    busy_s: float = 0.2
    wait_s: float = 0.25
    jitter: float = 0.5
    busy_util: float = 1.0
    wait_util: float = 0.0
    util_jitter: float = 0.0
    lead_s: float = 3.0
    tail_s: float = 3.0
    pause_every: int = 0
    pause_s: float = 1.5


def training_schedule(loop: TrainingLoop, seed: int) -> tuple[WorkloadSchedule, FloatArray]:
    """The loop as a schedule, and each step's start time (s since the schedule's start).

    Each wait is ``wait_s`` × U(1 − jitter, 1 + jitter) (so the spacing jitters by about
    ±jitter·wait), each busy stretch ``busy_s`` × U(0.9, 1.1); every ``pause_every`` steps
    a pause of ``pause_s`` at the wait's utilisation (an evaluation, an epoch's end).
    """
    rng = np.random.default_rng([seed, 0x57E9])
    segs = [Segment(loop.lead_s, 0.0, "lead")]
    starts = []
    t = loop.lead_s
    for k in range(loop.steps):
        busy = loop.busy_s * rng.uniform(0.9, 1.1)
        wait = loop.wait_s * rng.uniform(1 - loop.jitter, 1 + loop.jitter)
        if loop.pause_every and k % loop.pause_every == loop.pause_every - 1:
            wait += loop.pause_s
        util = float(np.clip(loop.busy_util * (1 + loop.util_jitter * rng.normal()), 0.01, 1.0))
        starts.append(t)
        segs += [Segment(busy, util, "step"), Segment(wait, loop.wait_util, "wait")]
        t += busy + wait
    segs.append(Segment(loop.tail_s, 0.0, "tail"))
    return WorkloadSchedule(segs), np.array(starts)


def drained_samples(gpu: SimulatedGpu, end_ns: int, every_ns: int = 2_000_000_000
                    ) -> tuple[IntArray, FloatArray]:
    """Every 50 Hz sample up to ``end_ns``, drained from the ring as a reader would.

    Times are the GPU's clock (ns since its start), powers W.
    """
    seen: dict[int, int] = {}
    for now in range(gpu.start_ns + every_ns, end_ns + every_ns, every_ns):
        stamps_us, mw = gpu.power_samples(min(now, end_ns))
        seen.update(zip(stamps_us.tolist(), mw.tolist(), strict=True))
    us = np.array(sorted(seen), dtype=np.int64)
    t_ns = us * 1000 - gpu.unix_offset_ns - gpu.start_ns
    return t_ns, np.array([seen[u] for u in us.tolist()], dtype=np.float64) / 1e3


def simulated_training(loop: TrainingLoop, seed: int
                       ) -> tuple[IntArray, FloatArray, FloatArray, SimulatedGpu]:
    """(sample times ns, powers W, true step starts s, the GPU) of a simulated loop."""
    schedule, starts = training_schedule(loop, seed)
    gpu = SimulatedGpu(seed=seed, schedule=schedule, clock_ns=lambda: 0, start_ns=0,
                       unix_offset_ns=1_700_000_000_000_000_000)
    t_ns, power_w = drained_samples(gpu, round(schedule.duration_s * 1e9))
    return t_ns, power_w, starts, gpu
