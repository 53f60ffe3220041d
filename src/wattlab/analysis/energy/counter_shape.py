"""A counter's value between its reads, placed by the shape of the same GPU's sampled power.

Why: NVML's energy counter is the GPU's most accurate energy figure, but the reader reads it
rarely (one read costs ~4 ms of CPU on an H200, BENCHMARKS.md), so a phase edge mostly falls
between two reads. A straight line between them is off by up to the power's range times
d(Δ-d)/Δ. The 50 Hz sample buffer knows how the power moved in between: the counter says how
much energy the interval held, the samples say when in the interval it was spent.

Between reads t_i and t_i+1 the counter at x is C_i + ΔC·S(t_i, x)/S(t_i, t_i+1), S the
integral of the samples. If the samples are off by a factor that drifts by at most ρ across
the interval, that value is off by at most ρ·2·E1·E2/(E1 + E2), E1 and E2 the energy before
and after x in the interval. ρ is read from the run itself: how far the samples' ratio to the
counter moves between read intervals, beyond what the counter's own 0.1 s update explains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import integrate_view, known_gaps_ns
from wattlab.runfile import Run, SourceView

FloatArray = npt.NDArray[np.float64]

# least drift of the samples' ratio to the counter assumed: over ~20 s windows the H200's
# samples were within -0.60 .. +1.22 % of the counter (BENCHMARKS.md), so 2 % is generous
SHAPE_DRIFT_FLOOR = 0.02


@dataclass(frozen=True)
class ShapeSource:
    """The sampled power stream that places a counter's edges."""

    view: SourceView
    channel: str
    known_gaps_ns: list[tuple[int, int]]

    @property
    def name(self) -> str:
        return f"{self.view.source_id}:{self.channel}"


@dataclass(frozen=True)
class ShapedEdges:
    """Counter values at edges; ``shaped`` marks those placed by the samples."""

    value: FloatArray
    shaped: npt.NDArray[np.bool_]
    uncertainty_j: FloatArray  # the shape's part only; the counter's own lag comes on top
    drift: float
    shape_name: str


def shape_source(run: Run, counter: SourceView) -> ShapeSource | None:
    """The same GPU's sampled power stream (one with a sample period), if the run has it."""
    uuid = counter.descriptor.get("config", {}).get("uuid")
    if not uuid:
        return None
    for view in run.sources.values():
        config = view.descriptor.get("config", {})
        if view is counter or config.get("uuid") != uuid or "sample_period_s" not in config:
            continue
        for name, unit in zip(view.channel_names, view.units, strict=True):
            if unit == "W" and len(view) > 1:
                return ShapeSource(view, name, known_gaps_ns(run, view.source_id))
    return None


def shaped_edges(reads_s: FloatArray, reads_j: FloatArray, edges_s: FloatArray,
                 shape: ShapeSource, slack_s: float) -> ShapedEdges:
    """Counter values at sorted edges inside the reads' span, placed by ``shape``.

    An interval is shaped only if the samples cover it without a gap, up to ``slack_s`` at
    each end (the reader's first drain and its last read are a few ms apart), and both the
    counter and the samples rose in it; any other edge is interpolated linearly.
    """
    query = np.unique(np.concatenate((reads_s, edges_s)))
    cum = integrate_view(shape.view, [shape.channel], query, known_gaps_ns=shape.known_gaps_ns,
                         bridges=False)[0]
    integral = np.interp(reads_s, query, cum.integral)
    uncovered = np.interp(reads_s, query, cum.uncovered_s)
    d_counter, d_shape, d_t = np.diff(reads_j), np.diff(integral), np.diff(reads_s)
    first, last = cum.span_s
    ok = ((reads_s[:-1] >= first - slack_s) & (reads_s[1:] <= last + slack_s)
          & (np.diff(uncovered) <= 1e-9) & (d_counter > 0) & (d_shape > 0))
    drift = _drift(d_shape[ok] / d_counter[ok], d_t[ok], slack_s)
    i = np.clip(np.searchsorted(reads_s, edges_s, side="right") - 1, 0, reads_s.size - 2)
    inside = ok[i] & (edges_s > reads_s[i]) & (edges_s < reads_s[i + 1])
    value = np.interp(edges_s, reads_s, reads_j)
    unc = np.zeros(edges_s.shape)
    k = i[inside]
    fraction = (np.interp(edges_s[inside], query, cum.integral) - integral[k]) / d_shape[k]
    before = d_counter[k] * fraction
    after = d_counter[k] - before
    value[inside] = reads_j[k] + before
    unc[inside] = drift * 2 * before * after / d_counter[k]
    return ShapedEdges(value, inside, unc, drift, shape.name)


def _drift(ratio: FloatArray, span_s: FloatArray, lag_s: float) -> float:
    """How far the samples' ratio to the counter moves between intervals, as a fraction.

    Each interval's ratio may be off by 2·lag_s/span (the counter lags by up to ``lag_s`` at
    both reads); only what goes beyond that counts.
    """
    if ratio.size < 2:
        return SHAPE_DRIFT_FLOOR
    spread = np.abs(ratio / np.median(ratio) - 1) - 2 * lag_s / span_s
    return max(SHAPE_DRIFT_FLOOR, float(spread.max()))
