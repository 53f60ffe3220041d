"""Iterations from the busy bursts in power: the summary of an ``IterationStream`` pass.

Why its own module: the offline analysis of a run file, the benchmark's simulated and real
traces and the tests all segment (time, power) chunks the same way, and the confidence is
calibrated on exactly what this returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from wattlab.analysis.iterations.burst_edges import MIN_SEPARATION
from wattlab.analysis.iterations.iteration_result import (
    RESOLVABLE_SPACINGS,
    IterationResult,
    regular_fraction,
    steady_stats,
)
from wattlab.analysis.iterations.iteration_stream import DetectedIteration, IterationStream
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
MIN_ITERATIONS = 3


def merge_inside(found: list[DetectedIteration], windows_ns: list[tuple[int, int]]
                 ) -> tuple[list[DetectedIteration], int]:
    """Iterations starting inside a window (an evaluation) joined to the one before.

    Why: evaluation passes are GPU bursts too, but not training steps; where the program
    marks them, their bursts are not counted. Returns (iterations, how many were joined).
    """
    out: list[DetectedIteration] = []
    joined = 0
    for it in found:
        inside = any(a <= it.start_ns <= b for a, b in windows_ns)
        if inside and out and out[-1].end_ns == it.start_ns:
            last = out.pop()
            out.append(DetectedIteration(last.start_ns, it.end_ns, last.energy_j + it.energy_j,
                                         min(last.separation, it.separation),
                                         it.idle_samples))
            joined += 1
        else:
            out.append(it)
    return out, joined


def confidence_features(regular: float, separation: float, spacings: float,
                        thin_dips: float) -> FloatArray:
    """The logistic's inputs: 1, off-period share, log separation, log period, thin dips.

    The shares (periods outside 0.5-1.6× the median, steps parted by one idle sample) are
    ×10. Each is 0 at the edge of what the segmentation accepts (all periods regular, levels
    ``MIN_SEPARATION`` noise sds apart, 3 sample spacings per period, no thin dip). Where
    steps are parted by one idle sample, some are parted by none and merge.
    """
    spacings = min(max(spacings, 1e-3), CALIBRATED_SPACINGS)
    return np.array([1.0, 10.0 * (regular - 1.0),
                     math.log(max(separation, 1e-3) / MIN_SEPARATION),
                     math.log(spacings / RESOLVABLE_SPACINGS), 10.0 * thin_dips])


CALIBRATED_SPACINGS = 60.0
"""Periods up to ~60 sample spacings were in the fit (50 Hz loops of up to 1.2 s); a longer
period (a kHz meter) counts as this long rather than extrapolate the logistic."""


CONFIDENCE_COEF = np.array([4.331, 2.549, 2.133, -1.312, -0.462])
"""Logistic coefficients for ``confidence_features``, fitted by bench/iterations_real.py
(``--fit``) on simulated training loops with their true steps; the fit and its check on
the real H100 traces are in BENCHMARKS.md."""


def segment_confidence(features: FloatArray, n: int, spacings: float) -> float:
    """Probability that a power-segments result is right (count ±5 %, energy ±10 %)."""
    if n < MIN_ITERATIONS or spacings < RESOLVABLE_SPACINGS:
        return 0.0
    z = float(CONFIDENCE_COEF @ features)
    return 1.0 / (1.0 + math.exp(-z))


def from_segments(found: list[DetectedIteration], stream: IterationStream,
                  mean_power_w: float, rate_hz: float) -> IterationResult:
    """Summary of the iterations a pass of ``IterationStream`` found."""
    periods = np.array([i.period_s for i in found])
    stats = steady_stats(periods, [i.energy_j for i in found])
    spacing = stream.spacing_s or math.nan
    result = IterationResult(None, None, 0.0, stream.steps_seen, mean_power_w, None, None,
                             rate_hz, separation=stream.separation, bursts=found)
    if stats is None or len(found) < MIN_ITERATIONS:
        result.count = 0
        return result
    spacings = stats.median_s / spacing
    result.period_s, result.period_se_s, result.period_iqr_s = (
        stats.median_s, stats.period_se_s, stats.iqr_s)
    result.energy_per_iteration_j = stats.energy_j
    result.energy_per_iteration_se_j = stats.energy_se_j
    result.iterations_used = stats.used
    result.separation = float(np.median([i.separation for i in found]))
    result.regular_fraction = regular_fraction(periods, stats.median_s)
    result.period_spacings = spacings
    result.thin_dips = float(np.mean([0 <= i.idle_samples <= 1 for i in found]))
    result.confidence = segment_confidence(
        confidence_features(result.regular_fraction, result.separation, spacings,
                            result.thin_dips), len(found), spacings)
    if spacings < RESOLVABLE_SPACINGS:
        result.resolvable = False
        result.warnings.append(f"bursts {stats.median_s * 1e3:.1f} ms apart are under "
                               f"{RESOLVABLE_SPACINGS:g} sample spacings ({spacing * 1e3:.1f} ms)")
    if stats.pauses:
        result.warnings.append(f"{stats.pauses} iteration(s) hold a pause (epoch end, "
                               "evaluation): counted, left out of the energy per iteration")
    if stream.skipped:
        result.warnings.append(f"{stream.skipped} stretch(es) longer than the longest period "
                               "or across a gap in the stream: not an iteration")
    return result


def segment(chunks: Iterable[tuple[npt.NDArray[np.int64], FloatArray]], *,
            min_period_s: float = 0.01, max_period_s: float = 1e9,
            evaluation_ns: list[tuple[int, int]] | None = None) -> IterationResult:
    """Segment (t_ns, power_w) chunks into iterations, as a live ``IterationStream`` would."""
    stream = IterationStream(min_period_s=min_period_s, max_period_s=max_period_s)
    found: list[DetectedIteration] = []
    n, power_sum, t_first, t_last = 0, 0.0, 0, 0
    for t, p in chunks:
        if t.size == 0:
            continue
        found += stream.push(t, p)
        t_first = int(t[0]) if n == 0 else t_first
        n, t_last, power_sum = n + t.size, int(t[-1]), power_sum + float(np.nansum(p))
    if n < 2:
        raise UsageError(f"{n} power sample(s) in the window: nothing to segment")
    found += stream.finish()
    found, joined = merge_inside(found, evaluation_ns or [])
    result = from_segments(found, stream, power_sum / n, (n - 1) / ((t_last - t_first) / 1e9))
    if joined:
        result.count -= joined
        result.warnings.append(f"{joined} burst(s) inside marked evaluation phases: not steps")
    return result
