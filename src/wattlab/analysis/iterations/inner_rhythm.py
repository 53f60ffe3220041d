"""Steps inside bursts: the inner rhythm of a loop whose GPU does not idle between steps.

Why: a data loader that stalls every few steps, gradient accumulation or a prefetch queue
that drains in batches make the power burst once per *group* of steps. Burst segmentation
then counts groups: a ResNet50 loop of 59 steps in groups of 7 read as "9 iterations of
902 ms, confidence 0.92". Inside each burst the steps still show, as a dip in power at
every step boundary, a rhythm too fine and too short-lived for one autocorrelation over
the run. Here the power inside the busy stretch of every burst is tested for one shared
frequency: the share of the within-burst variance that a sinusoid at that frequency
explains, summed over bursts (each burst starts its own phase: a stall resets it). The
period is then refined so that each busy stretch holds a whole number of steps, and how
far the stretches are from whole numbers says how well the steps are told apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import chi2

from wattlab.analysis.iterations.iteration_stream import DetectedIteration

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MIN_SAMPLES = 6
"""A busy stretch needs this many samples to hold two steps of three samples each."""
MAX_FREQUENCY_SPACINGS = 2.5
"""Steps shorter than this many sample spacings are not looked for (Nyquist is 2)."""
FREQUENCIES_PER_RESOLUTION = 10
"""Frequencies tried per 1/span (the spectrum's resolution): the peak is then refined by
the whole-number fit."""
MIN_STRENGTH = 0.25
"""Share of the within-burst variance the rhythm must explain, at least. Why this much:
the 1 Hz square wave on the H100 (0.5 s bursts of one repeated matrix product, no steps
inside) shows a 125 ms pattern explaining 0.19; the step dips of the H200 loops explain
0.45-0.56."""
MAX_FALSE_ALARM = 1e-3
"""...and the chance that noise alone explains as much at some frequency tried must be
below this. Why both: white noise in stretches of 24 samples explains 0.14-0.18 at its
best frequency, so a fixed share alone mistakes noise for steps in short bursts."""
MAX_INTEGRALITY = 0.25
"""RMS distance of stretch / period from whole numbers beyond which the steps are not told
apart (a rhythm that fits no whole number of steps is a burst's shape, not its steps)."""


@dataclass(frozen=True)
class InnerRhythm:
    """Steps found inside the bursts: their period and how many each burst holds.

    ``strength``: share of the within-burst variance explained at the step frequency;
    ``integrality``: RMS distance of each busy stretch / period from a whole number (0:
    every stretch holds exactly whole steps; 0.5: no better than chance).
    ``false_alarm``: the chance that white noise explains ``strength`` at one of the
    frequencies tried (χ² with two degrees of freedom a stretch, times the independent
    frequencies).
    """

    period_s: float
    steps_per_burst: IntArray
    busy_energy_j: FloatArray
    strength: float
    integrality: float
    false_alarm: float
    median_span_s: float

    @property
    def steps(self) -> int:
        return int(self.steps_per_burst.sum())

    @property
    def energy_per_step_j(self) -> float:
        """Energy of the busy stretches per step: the stalls between groups left out."""
        return float(self.busy_energy_j.sum() / max(1, self.steps))

    @property
    def energy_per_step_se_j(self) -> float:
        """Spread of the bursts' energy per step over √bursts."""
        per_step = self.busy_energy_j / self.steps_per_burst
        if per_step.size < 2:
            return math.nan
        return float(np.std(per_step, ddof=1) / math.sqrt(per_step.size))

    @property
    def clear(self) -> bool:
        return (self.strength >= MIN_STRENGTH and self.false_alarm <= MAX_FALSE_ALARM
                and self.integrality <= MAX_INTEGRALITY)


@dataclass(frozen=True)
class _Stretch:
    t_s: FloatArray
    power_w: FloatArray
    span_s: float
    energy_j: float


def _busy_stretch(t_ns: IntArray, p_w: FloatArray, burst: DetectedIteration,
                  threshold_w: float, spacing_s: float) -> _Stretch | None:
    """The samples of a burst from its first to its last busy sample."""
    inside = (t_ns >= burst.start_ns) & (t_ns < burst.end_ns)
    busy = np.flatnonzero(inside & (p_w >= threshold_w))
    if busy.size < MIN_SAMPLES:
        return None
    first, last = int(busy[0]), int(busy[-1])
    t = (t_ns[first:last + 1] - t_ns[first]) / 1e9
    p = p_w[first:last + 1]
    return _Stretch(t, p, float(t[-1]) + spacing_s, float(p.sum()) * spacing_s)


def _explained_share(stretches: list[_Stretch], freqs_hz: FloatArray) -> FloatArray:
    """Per frequency: share of the within-stretch variance a sinusoid there explains."""
    num = np.zeros(freqs_hz.size)
    den = 0.0
    for s in stretches:
        # the burst's own envelope (a ramp, a slow sag) is no rhythm: a line fit goes first
        x = s.power_w - np.polyval(np.polyfit(s.t_s, s.power_w, 1), s.t_s)
        phase = np.exp(-2j * np.pi * np.outer(freqs_hz, s.t_s))
        num += 2.0 * np.abs(phase @ x) ** 2 / x.size
        den += float(x @ x)
    return num / den if den > 0 else np.zeros(freqs_hz.size)


def inner_rhythm(t_ns: IntArray, p_w: FloatArray, bursts: list[DetectedIteration],
                 threshold_w: float, spacing_s: float) -> InnerRhythm | None:
    """Steps inside ``bursts`` (power ≥ ``threshold_w`` is busy).

    None where the bursts hold no room for two steps each.
    """
    found = [_busy_stretch(t_ns, p_w, b, threshold_w, spacing_s) for b in bursts]
    stretches = [s for s in found if s is not None]
    if len(stretches) < 2:
        return None
    longest_step_s = float(np.median([s.span_s for s in stretches])) / 2
    f_lo = 1.0 / longest_step_s
    f_hi = 1.0 / (MAX_FREQUENCY_SPACINGS * spacing_s)
    if f_lo >= f_hi:
        return None
    freqs = np.arange(f_lo, f_hi, 0.5 / longest_step_s / FREQUENCIES_PER_RESOLUTION)
    share = _explained_share(stretches, freqs)
    best = int(np.argmax(share))
    spans = np.array([s.span_s for s in found if s is not None])
    whole = np.maximum(1, np.round(spans * freqs[best]))
    period = float(spans.sum() / whole.sum())  # least squares: spans ≈ whole · period
    whole = np.maximum(1, np.round(spans / period))
    integrality = float(math.sqrt(np.mean((spans / period - whole) ** 2)))
    steps = np.array([1 if s is None else max(1, round(s.span_s / period)) for s in found],
                     dtype=np.int64)
    energy = np.array([b.energy_j if s is None else s.energy_j
                       for s, b in zip(found, bursts, strict=True)])
    samples = sum(s.power_w.size - 2 for s in stretches)  # a line fit takes two of each
    independent = max(1.0, (f_hi - f_lo) * float(np.median(spans)))
    false_alarm = min(1.0, independent * float(
        chi2.sf(share[best] * samples, 2 * len(stretches))))
    return InnerRhythm(period, steps, energy, float(share[best]), integrality, false_alarm,
                       float(np.median(spans)))
