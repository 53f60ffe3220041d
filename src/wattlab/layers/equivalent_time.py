"""Each layer's power inside real steps, by equivalent-time sampling of NVML's 50 Hz samples.

Why: a layer lasts µs to ms, a power sample covers ~20 ms, and a layer replayed alone
draws a few % more power than inside the step (no neighbours to overlap with, other
clocks). But training repeats the same step hundreds of times, and the 50 Hz samples fall
at every phase of it: folding each sample onto its phase within its step (the step's start
from a CUDA event per step, all anchored to unix time) builds the step's power profile, as
an equivalent-time oscilloscope builds a fast periodic wave from slow samples.

A sample stamped ``t`` stands for ``t - delay_s``: the 50 Hz buffer is a ~20 ms boxcar
whose centre lags its stamp by ~25 ms on an H100 (docs/analysis.md: 19.9 ms boxcar,
effective delay 22-25 ms; docs/report-live-integrations.md: ~25 ms behind a load step), so
``DELAY_S`` = 25 ms. Phase = (t - delay - step start) / step length; the profile is the
mean power in each of ``bins`` equal phase bins. A row (layer and pass, ``between
layers``, GPU idle) runs over segments of the step (`kernel_trace.Layout`, scaled to each
step's length); its power is the profile's mean over its segments, its energy that power ×
its share of the step.

Resolution: each sample averages ~20 ms, so the profile is the true one smoothed by a
20 ms window: a layer's power mixes its neighbours' within ~±10 ms, and a step shorter
than that shows a flat profile. Sums do not suffer: the rows' energies add up to the
profile's mean × the step, whatever the smoothing.

Uncertainty: samples close in time share their fluctuations (and with a step length near
a multiple of 20 ms, consecutive samples revisit the same phase), so the spread of samples
inside a bin understates the error. The standard error comes from a delete-one-block
jackknife over ``BLOCKS`` contiguous stretches of the run (each ≥ 1 s, long against the
correlation); the delay's own uncertainty adds in quadrature: the largest change of a row's
power when the delay moves by ±``DELAY_SPREAD_S``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.errors import WattlabError
from wattlab.layers.kernel_trace import Layout

FloatArray = npt.NDArray[np.float64]
DELAY_S = 0.025
DELAY_SPREAD_S = 0.010
BLOCKS = 10
SAMPLES_PER_BIN = 25
MAX_BINS = 64
COUNTER_TICK_S = 0.1  # how stale an energy-counter read can be (it updates every ~100 ms)


class FoldError(WattlabError):
    """Too few power samples inside the steps to build a profile."""


@dataclass
class RowPower:
    """A row's power in the step (W), its energy per step (J) and its share of the step."""

    key: str
    share: float
    power_w: float
    power_se_w: float  # the two below in quadrature
    power_stat_se_w: float  # the jackknife's, from the samples' spread
    power_delay_w: float  # the largest change with the delay moved by ±DELAY_SPREAD_S
    energy_j: float
    energy_se_j: float


@dataclass
class Folded:
    """The step's power profile and every row's power; sums against the energy counter."""

    rows: list[RowPower]
    profile_w: FloatArray
    profile_se_w: FloatArray
    step_s: float
    steps: int
    samples: int
    delay_s: float
    energy_j: float  # the rows' sum per step
    energy_se_j: float
    counter_j: float | None  # the energy counter's energy per step
    counter_se_j: float | None


def phases(step_start_s: FloatArray, sample_s: FloatArray, delay_s: float
           ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Each sample's phase in its step (0..1) and whether it fell inside a step at all."""
    t = sample_s - delay_s
    k = np.searchsorted(step_start_s, t, side="right") - 1
    inside = (k >= 0) & (k < step_start_s.size - 1)
    kk = np.clip(k, 0, step_start_s.size - 2)
    phase = (t - step_start_s[kk]) / (step_start_s[kk + 1] - step_start_s[kk])
    return np.where(inside, phase, 0.0), inside


def overlap(layout: Layout, bins: int) -> tuple[list[str], FloatArray]:
    """The rows' keys and their share of each phase bin (rows × bins, rows sum to 1/bins)."""
    keys = list(dict.fromkeys(layout.keys))
    index = {k: i for i, k in enumerate(keys)}
    edges = np.linspace(0.0, 1.0, bins + 1)
    w = np.zeros((len(keys), bins))
    for key, a, b in zip(layout.keys, layout.start, layout.end, strict=True):
        w[index[key]] += np.clip(np.minimum(b, edges[1:]) - np.maximum(a, edges[:-1]), 0, None)
    return keys, w


def profile(phase: FloatArray, power_w: FloatArray, bins: int) -> FloatArray:
    """Mean power per phase bin; an empty bin takes its neighbours' (circular interpolation)."""
    b = np.minimum((phase * bins).astype(int), bins - 1)
    n = np.bincount(b, minlength=bins)
    total = np.bincount(b, weights=power_w, minlength=bins)
    full = n > 0
    if not full.any():
        raise FoldError("no power sample inside the steps")
    centres = np.arange(bins)
    return np.interp(centres, centres[full], total[full] / n[full], period=bins)


def _row_powers(w: FloatArray, prof: FloatArray) -> FloatArray:
    return (w @ prof) / np.maximum(w.sum(1), 1e-300)


def fold(layout: Layout, step_start_s: Sequence[float] | FloatArray,
         sample_s: Sequence[float] | FloatArray, power_w: Sequence[float] | FloatArray, *,
         delay_s: float = DELAY_S, bins: int | None = None, blocks: int = BLOCKS,
         counter_j: tuple[float, float] | None = None) -> Folded:
    """Fold the samples onto the steps' phase and give every row of ``layout`` its power.

    ``step_start_s``: each step's start and the last step's end (unix s, one clock with
    ``sample_s``); ``bins``: phase bins (default: about ``SAMPLES_PER_BIN`` samples each);
    ``counter_j``: the energy counter's reads at the first step's start and the last's end.
    """
    starts = np.asarray(step_start_s, float)
    t = np.asarray(sample_s, float)
    p = np.asarray(power_w, float)
    if starts.size < 2 or np.any(np.diff(starts) <= 0):
        raise FoldError("the step starts must be at least two increasing times")
    phase, inside = phases(starts, t, delay_s)
    n = int(inside.sum())
    if n < 2 * blocks:
        raise FoldError(f"only {n} power samples inside the {starts.size - 1} steps: "
                        f"need {2 * blocks}; run the steps longer")
    bins = bins or int(np.clip(n // SAMPLES_PER_BIN, 1, MAX_BINS))
    keys, w = overlap(layout, bins)
    share = w.sum(1)
    ph, pw = phase[inside], p[inside]
    prof = profile(ph, pw, bins)
    rows_w = _row_powers(w, prof)
    step_s = float((starts[-1] - starts[0]) / (starts.size - 1))
    cut = np.array_split(np.arange(n), blocks)
    jack = np.array([profile(np.delete(ph, c), np.delete(pw, c), bins) for c in cut])
    factor = (blocks - 1) / blocks

    def jk_se(values: FloatArray) -> FloatArray:
        return np.sqrt(factor * ((values - values.mean(0)) ** 2).sum(0))

    rows_se = jk_se(np.array([_row_powers(w, j) for j in jack]))
    shifted = []
    for d in (delay_s - DELAY_SPREAD_S, delay_s + DELAY_SPREAD_S):
        ph_d, in_d = phases(starts, t, d)
        shifted.append(_row_powers(w, profile(ph_d[in_d], p[in_d], bins)))
    rows_delay = np.max(np.abs(np.array(shifted) - rows_w), axis=0)
    rows = []
    for i, key in enumerate(keys):
        se = math.hypot(rows_se[i], rows_delay[i])
        rows.append(RowPower(key, float(share[i]), float(rows_w[i]), float(se),
                             float(rows_se[i]), float(rows_delay[i]),
                             float(rows_w[i] * share[i] * step_s), float(se * share[i] * step_s)))
    energy_j = float(prof.mean() * step_s)
    energy_se = float(jk_se(jack.mean(1))) * step_s
    counter, counter_se = None, None
    if counter_j is not None:
        steps = starts.size - 1
        counter = (counter_j[1] - counter_j[0]) / steps
        counter_se = abs(counter) / step_s * COUNTER_TICK_S / math.sqrt(6) / steps
    return Folded(rows, prof, jk_se(jack), step_s, starts.size - 1, n, delay_s, energy_j,
                  energy_se, counter, counter_se)
