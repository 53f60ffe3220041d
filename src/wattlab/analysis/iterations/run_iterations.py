"""Training iterations of a run: count, period distribution and energy per iteration.

Why several methods, in this order: step markers (from the framework integrations) give an
exact count, so they win when the run has them; otherwise the busy bursts of each step are
found in the power (``IterationStream``, the same code that follows a live stream); where
the power shows no bursts, one autocorrelation period is the last resort. Steps shorter
than ~3 sample spacings cannot be told apart in the samples at all: then only markers can
count them, and their energy comes from the energy counter (or the samples) over many
steps at once. The result says which method was used, and warns about the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    grid_edges,
    integrate_view,
    known_gaps_ns,
    resample_view,
    resolve,
    span_s,
)
from wattlab.analysis.energy import (
    Phase,
    counter_energy,
    invalid_reasons,
    phases_from_markers,
    shape_source,
    span_verdict,
)
from wattlab.analysis.iterations.burst_edges import MIN_SEPARATION
from wattlab.analysis.iterations.iteration_result import (
    RESOLVABLE_SPACINGS,
    IterationResult,
    steady_stats,
)
from wattlab.analysis.iterations.iteration_stream import quartiles
from wattlab.analysis.iterations.marker_steps import StepMarks, step_marks
from wattlab.analysis.iterations.period_autocorr import detect_period
from wattlab.analysis.iterations.power_segments import segment
from wattlab.analysis.iterations.steps_in_bursts import with_steps_in_bursts
from wattlab.errors import UsageError
from wattlab.runfile import Run, SourceView

FloatArray = npt.NDArray[np.float64]
CHUNK_ROWS = 1 << 16
"""Rows pushed at a time offline (a live reader pushes ~1 s at a time; results agree)."""
EVALUATION_NAMES = ("eval", "evaluate", "evaluation", "validation", "val", "test", "predict")
"""Marked phases whose GPU bursts are not training steps (integrations mark these)."""


def window_chunks(view: SourceView, channel: str, t0_ns: int, t1_ns: int
                  ) -> Iterator[tuple[npt.NDArray[np.int64], FloatArray]]:
    """(t_ns, power) chunks of a channel inside [t0, t1]."""
    for t, v in view.iter_chunks(channel, CHUNK_ROWS):
        keep = (t >= t0_ns) & (t <= t1_ns)
        if keep.any():
            yield t[keep], np.asarray(v[keep], dtype=np.float64)


def evaluation_windows_ns(run: Run) -> list[tuple[int, int]]:
    """Begin/end windows of evaluation-like phases the run marks."""
    return [(round(p.t0_s * 1e9), round(p.t1_s * 1e9)) for p in phases_from_markers(run.markers)
            if p.name in EVALUATION_NAMES]


def from_markers(run: Run, view: SourceView, channel: str, marks: StepMarks, *,
                 spacing_s: float, mean_power_w: float) -> IterationResult:
    """Count from step markers; energy from the samples between them, or over groups."""
    t_s = marks.times_ns / 1e9
    periods = np.diff(t_s) / marks.steps_per_mark
    med = float(np.median(periods))
    result = IterationResult(med, None, 1.0, marks.steps, mean_power_w, None, None,
                             1.0 / spacing_s, method="markers", markers=marks.name)
    if med >= RESOLVABLE_SPACINGS * spacing_s:
        cum = integrate_view(view, [channel], t_s, known_gaps_ns=known_gaps_ns(run,
                                                                                view.source_id))[0]
        covered = np.diff(cum.uncovered_s) <= 0
        energies = np.where(covered, np.diff(cum.integral), np.nan) / marks.steps_per_mark
        stats = steady_stats(periods, energies)
        if stats is not None:
            result.period_s, result.period_se_s, result.period_iqr_s = (
                stats.median_s, stats.period_se_s, stats.iqr_s)
            result.energy_per_iteration_j = stats.energy_j
            result.energy_per_iteration_se_j = stats.energy_se_j
            result.iterations_used = stats.used
        if not covered.all():
            result.warnings.append(f"{int(np.sum(~covered))} marked step(s) touch a gap in "
                                   f"{view.source_id}: left out of the energy")
        return result
    q1, _, q3 = quartiles(periods)
    result.resolvable, result.period_iqr_s = False, q3 - q1
    result.warnings.append(f"steps {med * 1e3:.2f} ms apart are shorter than "
                           f"{RESOLVABLE_SPACINGS:g} sample spacings ({spacing_s * 1e3:.1f} ms):"
                           " energy per step is the energy over all marked steps / steps")
    steps = (marks.times_ns.size - 1) * marks.steps_per_mark
    group = Phase("steps", 0, float(t_s[0]), float(t_s[-1]), "markers")
    counter = counter_stream(run, view)
    if counter is not None:
        row = counter_energy(counter[0], counter[1], [group], shape_source(run, counter[0]))[0]
        if row.energy_j is not None:
            result.method = "counter"
            result.energy_per_iteration_j = row.energy_j / steps
            result.energy_per_iteration_se_j = (row.uncertainty_j or 0.0) / steps
            result.iterations_used = steps
            return result
    cum = integrate_view(view, [channel], t_s[[0, -1]])[0]
    result.energy_per_iteration_j = float(np.diff(cum.integral)[0]) / steps
    result.iterations_used = steps
    return result


def counter_stream(run: Run, view: SourceView) -> tuple[SourceView, str] | None:
    """The energy counter of the same device (``gpu0.samples`` → ``gpu0.energy``), if any."""
    device = view.source_id.partition(".")[0]
    for other in run.sources.values():
        if other.source_id.partition(".")[0] != device or len(other) < 2:
            continue
        for name, unit in zip(other.channel_names, other.units, strict=True):
            if unit == "J":
                return other, name
    return None


def iterations(run: Run, spec: str, *, markers: str = "auto", rate_hz: float | None = None,
               min_period_s: float = 0.01, max_period_s: float | None = None,
               t0_s: float | None = None, t1_s: float | None = None) -> IterationResult:
    """Iterations of a run in a stream ``SRC[:CHANNEL]`` (``markers``: a name, auto, none).

    The result carries the stream's verdict over the span analysed (docs/validity.md); a
    failed check is also a warning.
    """
    view, channel = resolve(run, spec)
    result = _iterations(run, view, channel, spec, markers=markers, rate_hz=rate_hz,
                         min_period_s=min_period_s, max_period_s=max_period_s, t0_s=t0_s,
                         t1_s=t1_s)
    a, b = span_s(view)
    figure = span_verdict(run, view, channel, a if t0_s is None else max(a, t0_s),
                          b if t1_s is None else min(b, t1_s))
    result.valid, result.checks = figure.valid, figure.checks
    result.warnings += [f"invalid (docs/validity.md): {why}"
                        for why in invalid_reasons(figure.to_json())]
    return result


def _iterations(run: Run, view: SourceView, channel: str, spec: str, *, markers: str,
                rate_hz: float | None, min_period_s: float, max_period_s: float | None,
                t0_s: float | None, t1_s: float | None) -> IterationResult:
    """``iterations`` without the verdict."""
    a, b = span_s(view)
    a = a if t0_s is None else max(a, t0_s)
    b = b if t1_s is None else min(b, t1_s)
    if b <= a:
        raise UsageError(f"{run.path}: {spec} has no samples in {a:.3f}..{b:.3f} s")
    a_ns, b_ns = round(a * 1e9), round(b * 1e9)
    longest = max_period_s or (b - a)
    segs = segment(window_chunks(view, channel, a_ns, b_ns), min_period_s=min_period_s,
                   max_period_s=longest, evaluation_ns=evaluation_windows_ns(run))
    spacing, mean_power = 1.0 / segs.rate_hz, segs.mean_power_w
    marks = None if markers == "none" else step_marks(run.markers, markers, t0_ns=a_ns,
                                                      t1_ns=b_ns)
    if marks is not None:
        result = from_markers(run, view, channel, marks, spacing_s=spacing,
                              mean_power_w=mean_power)
        result.separation = segs.separation
        if result.resolvable and segs.count and abs(segs.count - result.count) > 0.05 * \
                result.count:
            result.warnings.append(f"the power shows {segs.count} bursts for {result.count} "
                                   "marked steps: steps may not map to GPU bursts")
        return result
    if segs.count and segs.resolvable:
        chunks = list(window_chunks(view, channel, a_ns, b_ns))
        return with_steps_in_bursts(segs, np.concatenate([t for t, _ in chunks]),
                                    np.concatenate([p for _, p in chunks]))
    return autocorrelation_fallback(run, view, channel, segs, (a, b),
                                    rate_hz=rate_hz, min_period_s=min_period_s,
                                    max_period_s=max_period_s)


def autocorrelation_fallback(run: Run, view: SourceView, channel: str,
                             segs: IterationResult, window_s: tuple[float, float], *,
                             rate_hz: float | None, min_period_s: float,
                             max_period_s: float | None) -> IterationResult:
    """One autocorrelation period where the power shows no steps; says why it fell back.

    Without bursts, nothing says a repetition in the power is one training step (a 120 ms
    pattern in a job of 4.6 ms steps is real, and not the steps), so the result is marked
    unresolvable, its confidence is 0 and the autocorrelation at the period is reported
    beside it.
    """
    a, b = window_s
    spacing = 1.0 / segs.rate_hz
    why = (f"busy and idle power levels {segs.separation or 0:.1f} noise sds apart, "
           f"{MIN_SEPARATION:g} needed"
           if segs.count == 0 else "bursts closer than the stream resolves")
    segs.warnings.append(f"no step per burst in the power ({why}): steps are shorter than "
                         f"~{RESOLVABLE_SPACINGS:g} sample spacings ({spacing * 1e3:.0f} ms) "
                         "or the GPU never idles between them; mark the steps "
                         "(--auto-markers) to count them")
    if rate_hz is None:
        rate_hz = min(1000.0, max(20.0 / min_period_s, 10.0), segs.rate_hz)
    try:
        result = detect_period(resample_view(run, view, channel, grid_edges(a, b, rate_hz)),
                               rate_hz, min_period_s, max_period_s)
    except UsageError as e:
        segs.resolvable, segs.confidence = False, 0.0
        segs.warnings.append(f"no autocorrelation either: {e}")
        return segs
    result.autocorrelation, result.confidence = result.confidence, 0.0
    result.separation, result.resolvable = segs.separation, False
    result.warnings = [*segs.warnings, "the period is the autocorrelation's: a repetition in "
                       "the power, which may span many steps or none"]
    return result
