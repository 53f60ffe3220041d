"""The energy counter against the integral of the same GPU's 50 Hz samples.

Why: a counter wrong by a factor, frozen, or from another GPU looks perfectly smooth. Its
own reads are the only instants where its value is known without interpolation, so the
comparison is made between two reads: the counter's difference against the samples'
integral over the same span, within the two figures' stated ± added (each is a bound, not
a standard error). The NVML "instant" field covers only part of each update and is not
used. For a window, the span is from the last read at or before its start to the first at
or after its end, kept where the samples are (reads outside them are dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wattlab.analysis.alignment import chunks_s
from wattlab.analysis.energy.counter_shape import shape_source
from wattlab.analysis.energy.counter_ticks import COUNTER_UPDATE_S, GRID_COUNTER_KINDS, at_updates
from wattlab.analysis.energy.validity.time_scan import scan_times
from wattlab.analysis.energy.validity.verdict import Check, failed, not_applicable, passed
from wattlab.runfile import Run, SourceView


@dataclass(frozen=True)
class Span:
    """Two counter reads: their times and the counter's difference."""

    t0_s: float
    t1_s: float
    counter_j: float


def read_span(reads_s: np.ndarray, reads_j: np.ndarray, t0_s: float, t1_s: float,
              inside: tuple[float, float]) -> Span | None:
    """The reads bracketing [t0, t1] (or the outermost ones in it), within ``inside``."""
    i0 = max(0, int(np.searchsorted(reads_s, t0_s, side="right")) - 1)
    i1 = min(reads_s.size - 1, int(np.searchsorted(reads_s, t1_s, side="left")))
    lo, hi = inside
    keep = np.flatnonzero((reads_s[i0:i1 + 1] >= lo) & (reads_s[i0:i1 + 1] <= hi)) + i0
    if keep.size < 2:
        return None
    a, b = int(keep[0]), int(keep[-1])
    return Span(float(reads_s[a]), float(reads_s[b]), float(reads_j[b] - reads_j[a]))


def counter_checks(run: Run, view: SourceView, channel: str,
                   windows: dict[str, tuple[float, float]]) -> tuple[dict[str, Check], str]:
    """Per window label, the counter's check; and the samples stream compared ("" if none)."""
    from wattlab.analysis.energy.source_energy import Phase, integrate_power

    shape = shape_source(run, view)
    if shape is None:
        none = not_applicable("no 50 Hz samples of this GPU (matched by UUID) in the run")
        return {label: none for label in windows}, ""
    if scan_times(shape.view).backwards_s.size or scan_times(view).backwards_s.size:
        bad = failed("time goes backwards in the counter or its samples: not compared")
        return {label: bad for label in windows}, shape.name
    parts = list(chunks_s(view, channel))
    reads_s = np.concatenate([t for t, _ in parts])
    reads_j = np.concatenate([v for _, v in parts])
    if view.kind in GRID_COUNTER_KINDS:
        reads_s, reads_j = at_updates(reads_s, reads_j)
    scan = scan_times(shape.view)
    inside = (scan.first_s - COUNTER_UPDATE_S, scan.last_s + COUNTER_UPDATE_S)
    spans = {label: read_span(reads_s, reads_j, a, b, inside)
             for label, (a, b) in windows.items()}
    phases = [Phase(label, 0, s.t0_s, s.t1_s, "") for label, s in spans.items() if s]
    rows = integrate_power(run, shape.view, [shape.channel], phases)[shape.channel][0] \
        if phases else []
    integral = {r.phase: r for r in rows}
    out: dict[str, Check] = {}
    for label, span in spans.items():
        row = integral.get(label)
        if span is None or row is None:
            out[label] = not_applicable("fewer than two counter reads where the samples are")
            continue
        if row.energy_j is None or row.uncertainty_j is None:
            out[label] = failed(f"{shape.name} has no data between the reads at "
                                f"{span.t0_s:.3f} and {span.t1_s:.3f} s")
            continue
        power_w = max(abs(row.mean_power_w or 0.0), abs(span.counter_j) / (span.t1_s - span.t0_s))
        counter_unc_j = 2 * COUNTER_UPDATE_S * power_w  # each read lags by up to an update
        allowed_j = counter_unc_j + row.uncertainty_j
        diff_j = span.counter_j - row.energy_j
        text = (f"{span.t0_s:.3f}..{span.t1_s:.3f} s: counter {span.counter_j:.1f} "
                f"± {counter_unc_j:.1f} J, {shape.name} {row.energy_j:.1f} "
                f"± {row.uncertainty_j:.1f} J, difference {diff_j:+.1f} J")
        out[label] = (passed(f"{text}, within ± {allowed_j:.1f} J")
                      if abs(diff_j) <= allowed_j else
                      failed(f"{text}, beyond the ± {allowed_j:.1f} J both allow"))
    return out, shape.name
