"""A power-segments result checked for steps inside its bursts, and recounted by them.

Why: segmentation counts bursts, and a burst is one step only where the GPU idles between
steps. Where the bursts hold a rhythm of several steps each (``inner_rhythm``), the result
reports both levels: the steps (count, period, energy per step) and the groups (count,
period, steps per group). Where a burst holds room for several steps but no clear rhythm,
the burst count is not trusted: its confidence drops below one half and it says why.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from wattlab.analysis.iterations.inner_rhythm import MIN_STRENGTH, InnerRhythm, inner_rhythm
from wattlab.analysis.iterations.iteration_result import RESOLVABLE_SPACINGS, IterationResult
from wattlab.analysis.iterations.iteration_stream import DetectedIteration

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MIN_STEPS_PER_GROUP = 3
"""Bursts holding two cycles are not taken for two steps: a forward and a backward pass of
one step look the same (the single-step H100 traces show exactly that)."""
MIN_SPACING_S = 0.01
"""Faster streams are averaged over bins of this before the rhythm is looked for."""
UNSURE_CONFIDENCE = 0.3
"""The burst count's confidence where its bursts may hold several steps each."""
ROOM_FOR_STEPS = 4
"""Bursts with room for this many steps of 3 sample spacings (240 ms at 50 Hz) and no clear
rhythm may be groups: the simulated loops with a stall every 3-10 steps and dips the
samples do not show were counted as groups at confidence 0.90-0.97 (24 of 1,000), every
one wrong. Why not 3: single steps of 172 ms (the H100 traces) would then be unsure."""
STEP_CONFIDENCE_COEF = np.array([-1.552, 0.871, 0.801, 2.671, 2.759, -1.822])
"""Logistic coefficients for ``step_features``, fitted by bench/iterations_nested.py
(``--fit``) on simulated loops with stalls every few steps; BENCHMARKS.md has the check."""


def step_features(rhythm: InnerRhythm, spacing_s: float) -> FloatArray:
    """The step logistic's inputs.

    1, log strength over its minimum, integrality ×10, log steps per group over 3, log
    period over 3 sample spacings, −log10 of the chance of noise over 10.
    """
    per_group = float(np.median(rhythm.steps_per_burst))
    return np.array([1.0, math.log(max(rhythm.strength, 1e-3) / MIN_STRENGTH),
                     10.0 * rhythm.integrality, math.log(per_group / MIN_STEPS_PER_GROUP),
                     math.log(rhythm.period_s / (3.0 * spacing_s)),
                     -math.log10(max(rhythm.false_alarm, 1e-30)) / 10.0])


def _trailing_burst(bursts: list[DetectedIteration], t_ns: IntArray, p_w: FloatArray,
                    spacing_s: float) -> DetectedIteration | None:
    """The last burst, which no later edge closed: its steps count too."""
    if not bursts:
        return None
    tail = t_ns >= bursts[-1].end_ns
    if not tail.any():
        return None
    return DetectedIteration(bursts[-1].end_ns, int(t_ns[-1]) + 1,
                             float(p_w[tail].sum()) * spacing_s)


def binned(t_ns: IntArray, p_w: FloatArray, bin_s: float) -> tuple[IntArray, FloatArray]:
    """Means over bins of ``bin_s``.

    Why: a kHz meter's samples are more than a rhythm of ≥ 25 ms steps needs, and the
    spectrum's cost grows with their square.
    """
    bins = (t_ns - t_ns[0]) // round(bin_s * 1e9)
    edges = np.flatnonzero(np.diff(bins)) + 1
    starts = np.concatenate([[0], edges])
    counts = np.diff(np.concatenate([starts, [t_ns.size]]))
    return (np.add.reduceat(t_ns, starts) // counts,
            np.add.reduceat(p_w, starts) / counts)


def with_steps_in_bursts(segs: IterationResult, t_ns: IntArray, p_w: FloatArray
                         ) -> IterationResult:
    """``segs`` recounted by the steps inside its bursts, or marked unsure, or as it is."""
    if len(segs.bursts) < 2 or t_ns.size < 2:
        return segs
    spacing_s = float(np.median(np.diff(t_ns))) / 1e9
    if spacing_s < MIN_SPACING_S:
        t_ns, p_w = binned(t_ns, p_w, MIN_SPACING_S)
        spacing_s = MIN_SPACING_S
    trailing = _trailing_burst(segs.bursts, t_ns, p_w, spacing_s)
    bursts = segs.bursts + ([trailing] if trailing else [])
    idle_w, busy_w = np.percentile(p_w, [10, 90])
    rhythm = inner_rhythm(t_ns, p_w, bursts, float(idle_w + 0.5 * (busy_w - idle_w)),
                          spacing_s)
    if rhythm is None:
        return segs
    per_group = float(np.median(rhythm.steps_per_burst))
    room = rhythm.median_span_s / (RESOLVABLE_SPACINGS * spacing_s)
    if rhythm.clear and per_group >= MIN_STEPS_PER_GROUP:
        return _recounted(segs, rhythm, spacing_s)
    if per_group >= MIN_STEPS_PER_GROUP or room >= ROOM_FOR_STEPS:
        segs.confidence = min(segs.confidence, UNSURE_CONFIDENCE)
        segs.warnings.append(
            f"each burst lasts ~{rhythm.median_span_s * 1e3:.0f} ms, room for "
            f"{max(per_group, math.floor(room)):.0f} steps of {RESOLVABLE_SPACINGS:g} sample "
            f"spacings, and shows no clear step rhythm (strength {rhythm.strength:.2f}, "
            f"chance of noise {rhythm.false_alarm:.1e}, integrality "
            f"{rhythm.integrality:.2f}): each may be one long step or a group of steps; "
            "mark the steps (--auto-markers) to count them")
    return segs


def _recounted(segs: IterationResult, rhythm: InnerRhythm, spacing_s: float
               ) -> IterationResult:
    """``segs`` with the steps of ``rhythm`` as its count, its bursts as the groups."""
    per_group = float(np.median(rhythm.steps_per_burst))
    z = float(STEP_CONFIDENCE_COEF @ step_features(rhythm, spacing_s))
    step_confidence = 1.0 / (1.0 + math.exp(-z))
    segs.groups, segs.group_period_s, segs.steps_per_group = (
        segs.count, segs.period_s, per_group)
    segs.inner_strength, segs.inner_integrality = rhythm.strength, rhythm.integrality
    segs.method, segs.count, segs.period_s = "steps-in-bursts", rhythm.steps, rhythm.period_s
    segs.period_se_s = segs.period_iqr_s = None
    segs.energy_per_iteration_j = rhythm.energy_per_step_j
    segs.energy_per_iteration_se_j = rhythm.energy_per_step_se_j
    segs.iterations_used = rhythm.steps
    segs.period_spacings = rhythm.period_s / spacing_s
    segs.confidence *= step_confidence
    segs.warnings.append(
        f"the power bursts once per group of ~{per_group:.0f} steps ({segs.groups} groups, "
        f"{(segs.group_period_s or 0.0) * 1e3:.0f} ms apart): steps counted by the rhythm "
        "inside the bursts; energy per step leaves the stalls between groups out")
    return segs
