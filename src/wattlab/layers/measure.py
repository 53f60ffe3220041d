"""Energy and time of a short piece of GPU work, repeated until the meters resolve it.

Why repetition: a layer takes micro- to milliseconds, far below the 20 ms spacing of
NVML's samples and the 100 ms ticks of its energy counter. Run alone, back to back, for
about a second, the layer holds the GPU at a steady power: the counter's ticks inside that
busy span give the mean power, and the GPU's own timer (CUDA events, or the simulator's
clock) the time per run. Energy per run = power × time.

Uncertainty (one standard error): time, from the spread over ``CHUNKS`` equal parts of the
window; power, from the spread of the power between successive ticks, the tick times'
jitter (how often the counter is polled) and the counter's 1 mJ steps, in quadrature.

The device sits behind `Backend`, so the simulated GPU and a real one (torch_backend.py)
share this code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from wattlab.errors import WattlabError
from wattlab.runfile import MeasuredRun

FloatArray = npt.NDArray[np.float64]
CHUNKS = 8
EDGE_S = 0.05  # ticks this close to the window's edges are not used (ramp, counter lag)


class MeasurementError(WattlabError):
    """Too few counter ticks inside the busy window to give a power."""


@dataclass
class Window:
    """One busy window: the job run ``repeats`` times in ``CHUNKS`` timed parts."""

    chunk_s: FloatArray  # GPU time of each part
    repeats: int
    start_s: float  # the window on the clock the ticks use
    end_s: float
    tick_s: FloatArray  # counter updates seen during the window
    tick_j: FloatArray
    tick_jitter_s: float  # how well each tick's time is known


class Backend(Protocol):
    """A GPU (real or simulated) that runs jobs and watches its energy counter."""

    def time_s(self, job: Any, repeats: int) -> float:
        """GPU time of ``repeats`` back-to-back runs (no energy)."""

    def window(self, job: Any, repeats: int, chunks: int) -> Window:
        """Run the job ``repeats`` times in ``chunks`` timed parts, watching the counter."""


@dataclass(frozen=True)
class Measured:
    """Time and energy of one run of a job, each ± one standard error."""

    time_s: float
    time_se_s: float
    energy_j: float
    energy_se_j: float
    power_w: float
    power_se_w: float
    repeats: int
    window_s: float

    def to_record(self) -> MeasuredRun:
        """As the layer record keeps it: every value a float, ``repeats`` too."""
        return MeasuredRun(time_s=float(self.time_s), time_se_s=float(self.time_se_s),
                           energy_j=float(self.energy_j), energy_se_j=float(self.energy_se_j),
                           power_w=float(self.power_w), power_se_w=float(self.power_se_w),
                           repeats=float(self.repeats), window_s=float(self.window_s))


def repeats_for(backend: Backend, job: Any, min_s: float) -> int:
    """How many runs fill ``min_s`` (after a warm-up run).

    The time per run is the difference of 9 runs and 1, which leaves out the start's lag
    (the GPU waiting for the host's first launch).
    """
    backend.time_s(job, 1)
    nine_s = backend.time_s(job, 9)
    one_s = max((nine_s - backend.time_s(job, 1)) / 8, nine_s / 18)
    return max(CHUNKS, math.ceil(min_s / max(one_s, 1e-9) / CHUNKS) * CHUNKS)


def power_from_ticks(w: Window) -> tuple[float, float]:
    """(mean power W, its standard error) from the counter's ticks inside the window."""
    inside = (w.tick_s >= w.start_s + EDGE_S) & (w.tick_s <= w.end_s - EDGE_S)
    t, e = w.tick_s[inside], w.tick_j[inside]
    if t.shape[0] < 3:
        raise MeasurementError(
            f"only {t.shape[0]} energy-counter ticks inside a {w.end_s - w.start_s:.2f} s "
            "window: make the window longer")
    span_s, energy_j = float(t[-1] - t[0]), float(e[-1] - e[0])
    power = energy_j / span_s
    steps = np.diff(e) / np.diff(t)
    spread = float(np.std(steps, ddof=1) / math.sqrt(steps.shape[0])) if steps.shape[0] > 1 \
        else 0.0
    rel = math.hypot(math.sqrt(2) * w.tick_jitter_s / span_s, 1e-3 / max(energy_j, 1e-9))
    return power, math.hypot(spread, power * rel)


def measure(backend: Backend, job: Any, min_s: float = 1.0, tries: int = 3) -> Measured:
    """Time and energy of one run of ``job``, from a window of at least ``min_s``.

    A window that came out shorter than ``min_s`` (the first runs were slow) is run again,
    longer in proportion; a counter that ticks too rarely for the window gets a window twice
    as long (``tries`` windows at most).
    """
    repeats = repeats_for(backend, job, min_s)
    for attempt in range(tries):
        w = backend.window(job, repeats, CHUNKS)
        span_s = w.end_s - w.start_s
        last = attempt == tries - 1
        if span_s < 0.9 * min_s and not last:
            repeats = math.ceil(repeats * min_s / max(span_s, 1e-3) / CHUNKS) * CHUNKS
            continue
        try:
            power_from_ticks(w)
            break
        except MeasurementError:
            if last:
                raise
            repeats *= 2
    per_run = w.chunk_s / (repeats / CHUNKS)
    time_s = float(np.sum(w.chunk_s) / repeats)
    time_se = float(np.std(per_run, ddof=1) / math.sqrt(CHUNKS))
    power, power_se = power_from_ticks(w)
    energy = power * time_s
    energy_se = energy * math.hypot(power_se / power, time_se / time_s)
    return Measured(time_s, time_se, energy, energy_se, power, power_se, repeats,
                    float(np.sum(w.chunk_s)))
