"""`wattlab report`: one self-contained HTML page (PNGs embedded, and written beside it).

What a person at the bench wants to see first: every power stream on one time axis with
the workload's phases and the holes in the data, a few windows where every sample shows,
the energy of each phase per source, and how the driver's reading relates to an external
meter. For a sweep results file: the model curves of every family with their
leave-one-out error and the chosen setting.

Nothing here computes energy, calibration or models a second way: the page draws what
``energy.energy_report``, ``calibration.calibrate`` and ``models.fit_sweep`` return, so it
agrees with ``wattlab energy``, ``wattlab calibrate`` and ``wattlab fit``. Power streams are
read in chunks, so an hour at 20 kHz is drawn without loading it whole.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    GAP_FACTOR,
    grid_edges,
    median_spacing_s,
    power_channel,
    resample_view,
    resolve,
    span_s,
)
from wattlab.analysis.calibration import calibrate, target_updates, update_lattice
from wattlab.analysis.energy import (
    default_reference,
    energy_report,
    energy_streams,
    phases_from_markers,
    summarise,
)
from wattlab.analysis.models import (
    BOOST_MIN_WORKLOADS,
    CURVE_FITS,
    FAMILIES,
    OBJECTIVES,
    SWEEP_FORMAT,
    FitReport,
    SweepTable,
    fit_sweep,
    load_table,
)
from wattlab.analysis.report import plots
from wattlab.analysis.report.layers_view import layers_panel
from wattlab.analysis.report.process_energy_view import process_sections
from wattlab.analysis.report.tuning_view import tuning_panel
from wattlab.device_models import first_order_filter
from wattlab.errors import RunFileError, UsageError, WattlabError
from wattlab.output_files import create_temp
from wattlab.runfile import (
    CalibrationRecord,
    Estimate,
    GapRow,
    MarkerRow,
    Run,
    SourceView,
    open_read_only,
    read_calibrations,
    schema,
)

FloatArray = npt.NDArray[np.float64]
DISPLAY_BINS = 2000
RAW_DISPLAY_MAX = 4000
ZOOM_SAMPLES = 60
MAX_ZOOMS = 3
SESSION_SOURCE = "session"
CAL_GRID_HZ = 1000.0
MAX_HOLE_FRAC = 0.05
"""A kernel window missing more than this fraction of reference gives no scatter point."""
MAX_SWEEP_WORKLOADS = 6
X_LABELS = {"power_limit_w": "power limit (W)", "sm_clock_mhz": "SM clock (MHz)",
            "mem_clock_mhz": "memory clock (MHz)"}
PREFERRED_TARGETS = ("average_power_w", "power_w", "instant_power_w")
"""NVML channel calibrated by default: the 1 s average is what most tools report."""


# ----------------------------------------------------------------------------- phases


@dataclass
class PhaseMarks:
    """Phases as spans, point markers, and what could not be paired (said on the page).

    A span's depth is how many workload phases enclose it; -1 marks the session's own.
    """

    spans: list[plots.Span]
    points: list[MarkerRow]
    warnings: list[str]


def phase_marks(markers: Sequence[MarkerRow]) -> PhaseMarks:
    """Phases paired exactly as ``wattlab energy --by-marker`` pairs them, with nesting depth."""
    phases = sorted(phases_from_markers(markers), key=lambda p: (p.t0_s, -p.t1_s))
    spans: list[plots.Span] = []
    enclosing: list[float] = []  # end times of the workload phases enclosing the current one
    for p in phases:
        if p.source == SESSION_SOURCE:
            spans.append(plots.Span(p.t0_s, p.t1_s, p.name, -1))
            continue
        while enclosing and enclosing[-1] <= p.t0_s:
            enclosing.pop()
        spans.append(plots.Span(p.t0_s, p.t1_s, p.name, len(enclosing)))
        enclosing.append(p.t1_s)
    counts: dict[tuple[str, str, str], int] = {}
    for m in markers:
        counts[(m.source, m.name, m.kind)] = counts.get((m.source, m.name, m.kind), 0) + 1
    paired: dict[tuple[str, str], int] = {}
    for p in phases:
        paired[(p.source, p.name)] = paired.get((p.source, p.name), 0) + 1
    notes = []
    for source, name in sorted({(s, nm) for s, nm, _ in counts}):
        n = paired.get((source, name), 0)
        if (extra := counts.get((source, name, "begin"), 0) - n) > 0:
            notes.append(f"phase {name!r} from {source}: {extra} begin marker(s) never end")
        if (extra := counts.get((source, name, "end"), 0) - n) > 0:
            notes.append(f"phase {name!r} from {source}: {extra} end marker(s) have no begin")
    points = [m for m in markers if m.kind == "point"]  # not counts: thousands a run
    return PhaseMarks(spans, points, notes)


# ----------------------------------------------------------------------------- reading


def shown_streams(run: Run, *, counters: bool = False) -> list[tuple[SourceView, str]]:
    """Streams the page draws: each meter's power channel and every NVML power reading.

    A meter's per-rail channels would crowd the page (``wattlab energy`` lists them); with
    ``counters`` the energy counters (J) are included too.
    """
    return [(v, c) for v, c, method in energy_streams(run)
            if (method == "counter" and counters)
            or (method == "power" and (v.kind == "nvml" or c == power_channel(v)))]


def row_at(view: SourceView, t_ns: int) -> int:
    """First row with time >= t_ns, by bisection on the dataset (no full read)."""
    lo, hi = 0, len(view)
    while lo < hi:
        mid = (lo + hi) // 2
        if int(view.time_slice(mid, mid + 1)[0]) < t_ns:
            lo = mid + 1
        else:
            hi = mid
    return lo


def window(view: SourceView, channel: str, t0_ns: int, t1_ns: int
           ) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Raw samples of one channel with t0_ns <= time <= t1_ns (only those rows are read)."""
    start, stop = row_at(view, t0_ns), row_at(view, t1_ns + 1)
    times = view.time_slice(start, stop)
    values = view.column_slice(channel, start, stop).astype(np.float64)
    return times, values


def _break_holes(t_s: FloatArray, v: FloatArray, spacing_s: float,
                 gaps_s: Sequence[tuple[float, float]] = ()) -> tuple[FloatArray, FloatArray]:
    """Insert NaN where a line would be drawn across lost data.

    Lost: samples further apart than ``GAP_FACTOR`` spacings, or a gap the recorder logged
    between them (the same holes ``wattlab energy`` does not integrate over).
    """
    if t_s.size < 2:
        return t_s, v
    far = np.diff(t_s) > GAP_FACTOR * spacing_s if spacing_s > 0 else np.zeros(t_s.size - 1,
                                                                                 dtype=bool)
    for g0, g1 in gaps_s:  # segments [t_i, t_i+1] that overlap a logged gap
        first = max(0, int(np.searchsorted(t_s, g0, side="right")) - 1)
        last = min(t_s.size - 1, int(np.searchsorted(t_s, g1, side="left")))
        far[first:last] = True
    holes = np.flatnonzero(far)
    if holes.size == 0:
        return t_s, v
    return (np.insert(t_s, holes + 1, t_s[holes] + spacing_s),
            np.insert(v, holes + 1, np.nan))


def display_trace(view: SourceView, channel: str, t0_ns: int, t1_ns: int,
                  *, bins: int = DISPLAY_BINS, gaps_s: Sequence[tuple[float, float]] = ()
                  ) -> plots.Trace:
    """Raw samples when few, else min / mean / max per time bin (empty bins stay NaN)."""
    label = f"{view.source_id}:{channel}"
    unit = view.unit(channel)
    spacing_s = median_spacing_s(view)
    if len(view) <= RAW_DISPLAY_MAX:
        t_s, v = _break_holes(view.time_s, view.channel(channel).astype(np.float64), spacing_s,
                              gaps_s)
        return plots.Trace(label, unit, t_s.astype(np.float64), v)
    width_ns = max(1.0, (t1_ns - t0_ns) / bins)
    low = np.full(bins, np.inf)
    high = np.full(bins, -np.inf)
    total = np.zeros(bins)
    count = np.zeros(bins)
    for t_ns, values in view.iter_chunks(channel):
        b = np.clip(((t_ns - t0_ns) / width_ns).astype(np.int64), 0, bins - 1)
        v = values.astype(np.float64)
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        idx = b[starts]
        low[idx] = np.fmin(low[idx], np.minimum.reduceat(v, starts))
        high[idx] = np.fmax(high[idx], np.maximum.reduceat(v, starts))
        np.add.at(total, idx, np.add.reduceat(v, starts))
        np.add.at(count, idx, np.diff(np.r_[starts, v.size]))
    empty = count == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(empty, np.nan, total / np.maximum(count, 1))
    low[empty] = np.nan
    high[empty] = np.nan
    centre_s = ((t0_ns + (np.arange(bins) + 0.5) * width_ns) / 1e9).astype(np.float64)
    return plots.Trace(label, unit, centre_s, mean, low, high)


# ----------------------------------------------------------------------------- energy


@dataclass
class PhaseEnergy:
    """``energy_report`` rows summed per phase name and stream (one table row each).

    Streams: see ``shown_streams`` (with counters); ``report`` keeps their rows only.

    Arrays are phases x streams, NaN where a stream has no estimate for a phase;
    ``uncertainty_j`` is the sum of the instances' half-widths (edges may be correlated).

    ``per_instance`` is what the figure draws: per name (and per group of a name no stream
    resolves one by one, e.g. "step per epoch"), the mean energy of one instance and the
    spread (standard deviation) over instances, from the streams that resolve it only.
    """

    report: dict[str, Any]
    phases: list[str]
    streams: list[str]
    instances: list[int]
    duration_s: list[float]
    energy_j: FloatArray
    uncertainty_j: FloatArray
    measured_j: FloatArray
    covered_s: FloatArray
    uncovered_s: FloatArray
    per_instance: InstanceEnergy | None = None
    # the verdict (docs/validity.md): per phase name x stream, how many instances' figures
    # are invalid (a sum of them is), and the names of the checks they fail
    invalid: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    failed_checks: dict[tuple[int, int], list[str]] = field(default_factory=dict)

    @property
    def reference(self) -> str | None:
        return self.report["reference"]

    def mean_power_w(self) -> FloatArray:
        """Measured energy over observed time (W)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.covered_s > 0, self.measured_j / self.covered_s, np.nan)

    def error_pct(self) -> FloatArray:
        """Summed energy relative to the reference stream's (%), NaN without a reference."""
        out = np.full(self.energy_j.shape, np.nan)
        if self.reference in self.streams:
            ref = self.energy_j[:, [self.streams.index(self.reference)]]
            with np.errstate(invalid="ignore", divide="ignore"):
                out = 100 * (self.energy_j - ref) / ref
        return out


@dataclass
class InstanceEnergy:
    """Energy of one instance of each phase name per stream: mean, spread, how many.

    NaN where the stream does not resolve the name's instances (they are shorter than its
    sample spacing, lag or counter edges allow), so no bar claims what it cannot know.
    """

    names: list[str]
    streams: list[str]
    mean_j: FloatArray
    spread_j: FloatArray
    count: npt.NDArray[np.int64]
    unresolved: list[str]  # "name: stream" pairs left out


def instance_energy(rows: Sequence[dict[str, Any]], phases: Sequence[dict[str, Any]],
                    streams: list[str]) -> InstanceEnergy:
    """``InstanceEnergy`` from energy-report rows (phases and groups together)."""
    name_of = {p["label"]: p["name"] for p in phases}
    names = list(dict.fromkeys(name_of.values()))
    values: dict[tuple[int, int], list[float]] = {}
    unresolved: dict[tuple[int, int], bool] = {}
    for r in rows:
        key = (names.index(name_of[r["phase"]]), streams.index(f"{r['source']}:{r['channel']}"))
        if r["energy_j"] is None:
            continue
        if r.get("resolves") is False:
            unresolved[key] = True
            continue
        values.setdefault(key, []).append(float(r["energy_j"]))
    shape = (len(names), len(streams))
    mean, spread = np.full(shape, np.nan), np.full(shape, np.nan)
    count = np.zeros(shape, dtype=np.int64)
    for (i, j), v in values.items():
        if unresolved.get((i, j)):
            continue  # some instances unresolved: a mean of the rest would be biased
        mean[i, j], count[i, j] = float(np.mean(v)), len(v)
        spread[i, j] = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
    left_out = [f"{names[i]}: {streams[j]}" for (i, j) in sorted(unresolved)]
    keep = [i for i in range(len(names)) if np.isfinite(mean[i]).any()]
    return InstanceEnergy([names[i] for i in keep], streams, mean[keep], spread[keep],
                          count[keep], left_out)


def phase_energy(run: Run) -> PhaseEnergy:
    """Energy per phase name and stream, from ``energy_report(run, by_marker=True)``."""
    report = energy_report(run, by_marker=True)
    names = list(dict.fromkeys(p["name"] for p in report["phases"]))
    name_of = {p["label"]: p["name"] for p in report["phases"]}
    shown = {f"{v.source_id}:{c}" for v, c in shown_streams(run, counters=True)}
    report["rows"] = [r for r in report["rows"] if f"{r['source']}:{r['channel']}" in shown]
    streams = list(dict.fromkeys(f"{r['source']}:{r['channel']}" for r in report["rows"]))
    shape = (len(names), len(streams))
    sums = {k: np.zeros(shape) for k in ("energy_j", "uncertainty_j", "measured_j",
                                          "covered_s", "uncovered_s")}
    seen = np.zeros(shape, dtype=bool)
    invalid = np.zeros(shape, dtype=np.int64)
    failed: dict[tuple[int, int], list[str]] = {}
    for r in report["rows"]:
        i, j = names.index(name_of[r["phase"]]), streams.index(f"{r['source']}:{r['channel']}")
        for key, total in sums.items():
            total[i, j] += r[key] or 0.0
        seen[i, j] |= r["energy_j"] is not None
        if not r["valid"]:
            invalid[i, j] += 1
            names_failed = failed.setdefault((i, j), [])
            names_failed += [k for k, c in r["checks"].items()
                             if not c["ok"] and k not in names_failed]
    for key in ("energy_j", "uncertainty_j", "measured_j"):
        sums[key][~seen] = np.nan
    instances = [sum(1 for p in report["phases"] if p["name"] == n) for n in names]
    durations = [sum(p["t1_s"] - p["t0_s"] for p in report["phases"] if p["name"] == n)
                 for n in names]
    report["group_rows"] = [r for r in report["group_rows"]
                            if f"{r['source']}:{r['channel']}" in shown]
    per_instance = instance_energy(report["rows"] + report["group_rows"],
                                   report["phases"] + report["groups"], streams)
    return PhaseEnergy(report, names, streams, instances, durations, **sums,
                       per_instance=per_instance, invalid=invalid, failed_checks=failed)


# ----------------------------------------------------------------------------- calibration


@dataclass
class CalibrationView:
    """A calibration record and the readings it explains.

    At each driver update ``t_s``: the reference seen through the fitted kernel and lag
    (``seen_w``) and the reading (``target_w``); the fit is ``target = gain * seen + offset``.
    """

    record: CalibrationRecord
    t_s: FloatArray
    seen_w: FloatArray
    target_w: FloatArray
    stored: bool

    @property
    def label(self) -> str:
        t, r = self.record.target, self.record.reference
        return f"{t.source}:{t.channel} vs {r.source}:{r.channel}"

    def param(self, name: str) -> float:
        found = self.record.params.by_name().get(name)
        value = None if found is None else found.value
        return math.nan if value is None else float(value)


def _seen_through_kernel(run: Run, ref_view: SourceView, ref_ch: str, x_s: FloatArray,
                         record: CalibrationRecord) -> FloatArray:
    """The reference at times ``x_s`` as the fitted kernel and lag see it (NaN: not covered).

    Bin means on a fine grid (gaps stay NaN): a boxcar is a difference of the running
    integral over the window, a first-order lag an exponential filter of the bin means.
    """
    tau = float(cast(float, record.params.tau_s.value))
    boxcar = record.params.width_name == "w_s"
    width = float(cast(float, record.params.width.value))
    reach = width if boxcar else 5 * width
    first, last = span_s(ref_view)
    lo, hi = max(first, float(x_s.min()) - tau - reach), min(last, float(x_s.max()) - tau)
    out = np.full(x_s.shape, np.nan)
    if hi - lo < 2 / CAL_GRID_HZ:
        return out
    edges = grid_edges(lo, hi, CAL_GRID_HZ)
    means = resample_view(run, ref_view, ref_ch, edges)
    hole = ~np.isfinite(means)
    step = 1 / CAL_GRID_HZ
    holes_s = np.r_[0.0, np.cumsum(hole * step)]
    start, end = x_s - tau - reach, x_s - tau
    inside = (start >= edges[0]) & (end <= edges[-1])
    missing = np.interp(end, edges, holes_s) - np.interp(start, edges, holes_s)
    ok = inside & (missing <= MAX_HOLE_FRAC * reach + 1e-9)
    if boxcar:
        integral = np.r_[0.0, np.cumsum(np.where(hole, 0.0, means) * step)]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (np.interp(end, edges, integral) - np.interp(start, edges, integral)) \
                / (width - missing)
        out[ok] = mean[ok]
        return out
    filled = means.copy()
    if hole.any() and (~hole).any():
        centres = 0.5 * (edges[1:] + edges[:-1])
        filled[hole] = np.interp(centres[hole], centres[~hole], means[~hole])
    alpha = math.exp(-step / width)
    smooth = first_order_filter(filled, alpha, 1 - alpha, filled[0])
    out[ok] = np.interp(end[ok], edges[1:], smooth)
    return out


def calibration_view(run: Run, record: CalibrationRecord, stored: bool) -> CalibrationView:
    """Readings and kernel-seen reference for a record, observed as ``calibrate`` does.

    Each distinct reading counts once, at its driver update instant when the fit used those.
    """
    ref_view, ref_ch = resolve(run, f"{record.reference.source}:{record.reference.channel}")
    tgt_view, tgt_ch = resolve(run, record.where)
    x, y, _, poll_s = target_updates(tgt_view, tgt_ch)
    if record.update_times == "lattice" and (
            lattice := update_lattice(x, poll_s)) is not None:
        x = lattice[0]
    seen = _seen_through_kernel(run, ref_view, ref_ch, x, record) if x.size else x
    return CalibrationView(record, x, seen, y, stored)


def default_targets(run: Run) -> list[str]:
    """One NVML power reading per GPU: the 1 s average where recorded, else its samples."""
    per_gpu: dict[str, list[str]] = {}
    for view in run.sources.values():
        if view.kind != "nvml" or len(view) < 2:
            continue
        gpu = view.source_id.rsplit(".", 1)[0]
        for channel, unit in zip(view.channel_names, view.units, strict=True):
            if unit == "W" and channel in PREFERRED_TARGETS:
                per_gpu.setdefault(gpu, []).append(f"{view.source_id}:{channel}")
    return [min(specs, key=lambda s: PREFERRED_TARGETS.index(s.split(":")[1]))
            for specs in per_gpu.values()]


def calibration_views(run: Run, reference: str | None, targets: Sequence[str] | None
                      ) -> tuple[list[CalibrationView], list[str]]:
    """Calibrations to draw: stored by ``wattlab calibrate``, else fitted here.

    Without stored records the default targets are fitted against the external meter;
    explicit ``targets`` are always fitted. Nothing is written to the run.
    """
    notes: list[str] = []
    stored = [] if targets else read_calibrations(run.path)
    records = [(r, True) for r in stored
               if r.reference.source in run.sources and r.target.source in run.sources]
    if not records:
        ref = reference or default_reference(run)
        if ref is None:
            return [], ["NVML calibration: no panel (no external meter in this run to compare "
                        "NVML with; name one with --reference)"]
        wanted = list(targets) if targets else default_targets(run)
        if not wanted:
            return [], [f"NVML calibration: no panel (no NVML power reading to compare "
                        f"with {ref})"]
        for target in wanted:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    records.append((calibrate(run, ref, target), False))
            except (WattlabError, ValueError) as e:
                notes.append(f"NVML calibration of {target} against {ref}: no panel ({e})")
    views = []
    for record, was_stored in records:
        try:
            views.append(calibration_view(run, record, was_stored))
        except WattlabError as e:
            notes.append(f"NVML calibration {record.target.source}: no panel ({e})")
    return views, notes


def _pm(obj: Estimate, scale: float = 1.0, fmt: str = ".4g") -> str:
    value, se = obj.value, obj.se
    if value is None:
        return "-"
    text = format(value * scale, fmt)  # '.4g': 1000 ms stays 1000, never 1e+03
    return text if se is None else f"{text} ± {float(format(se * scale, '.2g')):g}"


def calibration_summary(view: CalibrationView) -> str:
    """One line with the fitted model: kernel, lag, width, gain, offset, residual."""
    rec = view.record
    p = rec.params
    width = (f"w = {_pm(p.width, 1e3)} ms" if p.width_name == "w_s"
             else f"T = {_pm(p.width, 1e3)} ms")
    return (f"{rec.kernel} kernel, τ = {_pm(p.tau_s, 1e3)} ms, {width}, gain "
            f"{_pm(p.gain, fmt='.4f')}, offset {_pm(p.offset_w)} W, effective delay "
            f"{_pm(rec.effective_delay_s, 1e3)} ms; residual {rec.fit.rmse_w:.2f} W "
            f"rms, R² {rec.fit.r2:.4f}" + calibration_caveats(rec))


def calibration_caveats(rec: CalibrationRecord) -> str:
    """Coverage, the energy error for phases of each length, and whether the kernel is pinned."""
    text = f"; it observes {100 * rec.coverage:.0f} % of the time"
    lengths = [row for row in rec.energy.by_length if row.rms_error_after_pct is not None]
    if lengths:
        text += "; energy error (rms) for phases of " + ", ".join(
            f"{row.length_s:g} s: {row.rms_error_after_pct:.1f} %" for row in lengths)
    if not rec.verdict.identifiable:
        text += "; NOT IDENTIFIABLE: " + "; ".join(rec.verdict.warnings)
    return text + calibration_validity_text(rec)


def calibration_validity_text(rec: CalibrationRecord) -> str:
    """The record's validity verdict (issue 37), as `wattlab calibrate` states it."""
    return "; " + validity_verdict(rec)


def validity_verdict(rec: CalibrationRecord) -> str:
    """Valid, not valid with each failed figure's failed checks, or not judged (older record)."""
    verdict = rec.validity
    if verdict is None:
        return "validity not judged (a record from before the verdict)"
    if verdict.valid:
        return f"valid: all {len(verdict.figures)} figures passed their checks"
    bad = [f"{f.figure} ({', '.join(n for n, c in f.checks.items() if not c['ok'])})"
           for f in verdict.figures if not f.valid]
    return (f"NOT VALID: {verdict.invalid_figures} of {len(verdict.figures)} figures "
            f"failed their checks: {'; '.join(bad)}")


# ----------------------------------------------------------------------------- figures


def _gaps_of(gaps: Sequence[GapRow], source_id: str) -> list[tuple[float, float]]:
    """A source's logged gaps with known times, in session seconds."""
    return [(g.time_first_ns / 1e9, g.time_last_ns / 1e9) for g in gaps
            if g.source == source_id and g.time_first_ns is not None
            and g.time_last_ns is not None]


def gap_spans(gaps: Sequence[GapRow]) -> list[plots.Span]:
    """Gaps with known times; a zero-length gap is widened to stay visible."""
    spans = []
    for g in gaps:
        if g.time_first_ns is None or g.time_last_ns is None:
            continue
        first, last = g.time_first_ns / 1e9, g.time_last_ns / 1e9
        spans.append(plots.Span(first, max(last, first + 1e-3), g.source))
    return spans


def zoom_windows(found: Sequence[tuple[SourceView, str]], phases: Sequence[plots.Span],
                 gaps: Sequence[GapRow], *, t0_ns: int, t1_ns: int) -> list[plots.ZoomWindow]:
    """Where single samples matter: the sharpest phase transition, the largest gap, steady."""
    if not found:
        return []
    spacings = [median_spacing_s(v) for v, _ in found]
    fast_s = min(s for s in spacings if s > 0) if any(s > 0 for s in spacings) else 0.0
    slow_s = max(spacings)
    width_ns = int(min(max(ZOOM_SAMPLES * fast_s, 3 * slow_s), 0.25 * (t1_ns - t0_ns) / 1e9)
                   * 1e9)
    if width_ns <= 0:
        return []
    fast_view, fast_channel = found[int(np.argmin([s if s > 0 else np.inf for s in spacings]))]
    centres: list[tuple[str, int, int]] = []  # title, first and last time to show
    workload = [p for p in phases if p.depth == 0]
    boundaries = sorted({int(p.start_s * 1e9) for p in workload}
                        | {int(p.end_s * 1e9) for p in workload})[:200]
    best, best_step = None, 0.0
    for b in boundaries:
        _, before = window(fast_view, fast_channel, b - width_ns // 2, b)
        _, after = window(fast_view, fast_channel, b, b + width_ns // 2)
        if before.size and after.size:
            step = abs(float(np.nanmean(after)) - float(np.nanmean(before)))
            if step > best_step:
                best, best_step = b, step
    if best is not None:
        centres.append((f"sharpest phase transition ({best_step:.0f} W step)", best, best))
    known = [g for g in gaps if g.time_first_ns is not None and g.time_last_ns is not None]
    if known:
        g = max(known, key=lambda r: (r.time_last_ns or 0) - (r.time_first_ns or 0))
        centres.append((f"largest gap ({g.source}: {g.reason})", g.time_first_ns or 0,
                        g.time_last_ns or 0))
    longest = max(workload, key=lambda p: p.end_s - p.start_s) if workload else None
    centre = (int((longest.start_s + longest.end_s) * 0.5e9) if longest
              else (t0_ns + t1_ns) // 2)
    centres.append((f"steady state ({longest.label})" if longest else "middle of the run",
                    centre, centre))
    windows = []
    for title, first, last in centres[:MAX_ZOOMS]:
        lo = max(t0_ns, first - width_ns // 2)
        hi = min(t1_ns, last + width_ns // 2)
        win = plots.ZoomWindow(title, lo / 1e9, hi / 1e9)
        for view, channel in found:
            t, v = window(view, channel, lo, hi)
            t_s, v = _break_holes(t / 1e9, v, median_spacing_s(view),
                                  _gaps_of(gaps, view.source_id))
            win.traces.append(plots.Trace(f"{view.source_id}:{channel}", view.unit(channel),
                                          t_s, v))
        windows.append(win)
    return windows


@dataclass
class Panel:
    """One figure of the report, with the words under it."""

    key: str
    title: str
    figure: Any
    caption: str = ""


# ----------------------------------------------------------------------------- sweeps


def is_sweep_file(path: str) -> bool:
    """A results file of ``wattlab sweep`` (or a published table ``wattlab fit`` reads)."""
    if not os.path.exists(path):
        raise RunFileError(f"{path}: no such file")
    if os.path.isdir(path):
        return True
    with open(path, "rb") as f:
        if not f.read(8).startswith(b"\x89HDF"):
            return True
    with open_read_only(path, swmr=False) as f:
        return bool(f.attrs.get("format") == SWEEP_FORMAT)


def family_curves(table: SweepTable, workload: str, families: Sequence[str],
                  x_grid: FloatArray) -> dict[str, tuple[FloatArray, FloatArray]]:
    """(time, power) of each per-workload family fitted on all rows of one workload."""
    rows = np.array([w == workload for w in table.workload])
    x, t, p = table.x[rows], table.runtime_s[rows], table.mean_power_w[rows]
    out = {}
    for family in families:
        fit = CURVE_FITS.get(family)
        t_curve, p_curve = (fit(x, t), fit(x, p)) if fit else (None, None)
        if t_curve is not None and p_curve is not None:
            out[family] = (t_curve(x_grid), p_curve(x_grid))
    return out


def sweep_panels(table: SweepTable, fit: FitReport) -> tuple[list[Panel], list[str]]:
    """Per workload: time, power and energy against the setting, one curve per family."""
    data = table.usable()
    mape = {s.family: s.mape for s in fit.families}
    x_label = X_LABELS.get(fit.x_name, fit.x_name)
    panels, notes = [], []
    recs = {r.workload: r for r in fit.recommendations}
    names = data.workloads()
    for k, workload in enumerate(names[:MAX_SWEEP_WORKLOADS]):
        rows = np.array([w == workload for w in data.workload])
        x = data.x[rows]
        x_grid = np.linspace(float(x.min()), float(x.max()), 200)
        curves = family_curves(data, workload, [s.family for s in fit.families], x_grid)
        rec = recs.get(workload)
        chosen_points = None
        if fit.chosen not in curves and rec is not None:  # the boosted family: its settings
            chosen_points = (np.array(rec.settings), np.array(rec.predicted_objective))
        figure = plots.sweep_models_figure(
            plots.SweepCurves(x, data.runtime_s[rows], data.mean_power_w[rows], x_grid, curves,
                              mape, fit.chosen, fit.objective, chosen_points),
            x_label=x_label, title=workload,
            recommended_x=None if rec is None else rec.recommended_x,
            default_x=None if rec is None else rec.default_x,
            measured_best_x=None if rec is None else rec.measured_best_x)
        caption = ("Measured runs (dots) and each model family fitted to all of them (time "
                   "and power are fitted; energy = time x power). The legend gives each "
                   f"family's leave-one-out MAPE of the objective ({fit.objective}); the table "
                   f"above has every quantity. Thick: the family chosen by LOO ({fit.chosen}). "
                   "Dashed: the recommended setting; dotted: the default.")
        panels.append(Panel(f"models_{k}", f"Models: {workload}", figure, caption))
    if len(names) > MAX_SWEEP_WORKLOADS:
        notes.append(f"{len(names) - MAX_SWEEP_WORKLOADS} more workloads are in the tables "
                     "but have no figure")
    return panels, notes


# ----------------------------------------------------------------------------- the report


@dataclass
class ReportResult:
    """What was written, the notes shown on the page, and the analysis behind it.

    ``energy`` and ``calibrations`` are set for a run, ``fit`` for a sweep.
    """

    html_path: str
    png_paths: list[str]
    notes: list[str]
    energy: PhaseEnergy | None = None
    calibrations: list[CalibrationView] = field(default_factory=list)
    fit: FitReport | None = None


@dataclass
class ReportOptions:
    """Choices beyond the file names (see ``wattlab report --help``)."""

    dpi: int = 110
    reference: str | None = None
    calibrate: list[str] = field(default_factory=list)
    calibration: bool = True
    objective: str = "energy"
    max_slowdown: float | None = None


def default_output(run_path: str) -> str:
    root, _ = os.path.splitext(run_path.rstrip("/"))
    return root + ".html"


def build_report(path: str, output: str | None = None,
                 options: ReportOptions | None = None) -> ReportResult:
    """Write the HTML report of a run or sweep file and its PNGs; returns what it wrote.

    Everything is drawn before anything is written: on bad input no file appears.
    """
    options = options or ReportOptions()
    output = output or default_output(path)
    out_dir = os.path.dirname(os.path.abspath(output))
    if options.dpi < 20 or options.dpi > 600:
        raise UsageError(f"--dpi {options.dpi}: use 20..600")
    if options.objective not in OBJECTIVES:
        raise UsageError(f"objective {options.objective!r}: use one of {', '.join(OBJECTIVES)}")
    if not os.path.isdir(out_dir):
        raise UsageError(f"{output}: folder {out_dir} does not exist")
    if os.path.exists(output) and os.path.exists(path) and os.path.samefile(output, path):
        raise UsageError(f"{output}: is the input file; choose another -o")
    page = _sweep_page(path, options) if is_sweep_file(path) else _run_page(path, options)
    stem = os.path.splitext(os.path.basename(output))[0]
    images = [(panel, plots.png_bytes(panel.figure, options.dpi)) for panel in page.panels]
    pngs = [os.path.join(out_dir, f"{stem}_{panel.key}.png") for panel, _ in images]
    html_text = page.render({p.key: base64.b64encode(data).decode() for p, data in images})
    _write_all([*zip(pngs, (data for _, data in images), strict=True),
                (output, html_text.encode())])
    return ReportResult(output, pngs, page.notes, page.energy, page.calibrations, page.fit)


def _write_all(files: Sequence[tuple[str, bytes]]) -> None:
    """Write every file whole (temp file, then rename); on failure remove what was written."""
    done: list[str] = []
    try:
        for path, data in files:
            fd, tmp = create_temp(os.path.dirname(os.path.abspath(path)), ".report-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            done.append(path)
    except OSError as e:
        for path in done:
            os.unlink(path)
        raise UsageError(f"cannot write the report: {e}") from e


@dataclass
class Page:
    """Panels to draw and the HTML around them (``render`` gets each panel's base64 PNG)."""

    title: str
    meta: str
    panels: list[Panel]
    notes: list[str]
    sections: list[tuple[str, str]]  # (panel key it follows, HTML); "" = before the figures
    energy: PhaseEnergy | None = None
    calibrations: list[CalibrationView] = field(default_factory=list)
    fit: FitReport | None = None

    def render(self, images: dict[str, str]) -> str:
        parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
                 f"<title>{_e(self.title)}</title><style>{CSS}</style></head><body>",
                 f"<h1>{_e(self.title)}</h1><p class='meta'>{self.meta}</p>"]
        parts += [f"<div class='note'>{_e(n)}</div>" for n in self.notes]
        parts += [h for key, h in self.sections if key == ""]
        for panel in self.panels:
            parts.append(f"<h2>{_e(panel.title)}</h2><img alt='{_e(panel.title)}' "
                         f"src='data:image/png;base64,{images[panel.key]}'>"
                         f"<p class='cap'>{_e(panel.caption)}</p>")
            parts += [h for key, h in self.sections if key == panel.key]
        parts += [h for key, h in self.sections if key == "end"]
        parts.append("</body></html>")
        return "\n".join(parts)


def _made() -> str:
    return f"report made {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}"


def _run_page(run_path: str, options: ReportOptions) -> Page:
    with Run(run_path) as run:
        found = shown_streams(run)
        marks = phase_marks(run.markers)
        gaps = run.gaps
        notes = list(marks.warnings)
        if not found:
            notes.append("no source in this run measures power: nothing to plot over time")
        firsts = [int(v.time_slice(0, 1)[0]) for v, _ in found]
        lasts = [int(v.time_slice(len(v) - 1, len(v))[0]) for v, _ in found]
        t0_ns, t1_ns = (min(firsts), max(lasts)) if found else (0, 1)
        t1_ns = max(t1_ns, t0_ns + 1)
        panels: list[Panel] = []
        if found:
            traces = [display_trace(v, c, t0_ns, t1_ns, gaps_s=_gaps_of(gaps, v.source_id))
                      for v, c in found]
            points = [(m.effective_ns / 1e9, m.name) for m in marks.points]
            panels.append(Panel("timeline", "Power over time", plots.timeline_figure(
                traces, marks.spans, gap_spans(gaps), points),
                "Every power stream on the session timebase. Coloured bands and the lanes "
                "below: phases from begin/end markers (thin grey lines: point markers). Red "
                "hatching and red lane bars: gaps the recorder logged; line breaks: holes in "
                "a stream."))
        windows = zoom_windows(found, marks.spans, gaps, t0_ns=t0_ns, t1_ns=t1_ns)
        if windows:
            panels.append(Panel("zoom", "Sample-level zoom", plots.zoom_figure(
                windows, marks.spans, gap_spans(gaps)),
                "Every sample (dots) in short windows: how each meter and the driver see a "
                "transition, how much they lag and smooth, and what a gap loses."))
        sections: list[tuple[str, str]] = [("", _sources_table(summarise(run)))]
        energy = None
        try:
            energy = phase_energy(run)
        except UsageError as e:
            notes.append(f"energy per phase: none ({e})")
        if energy is not None and energy.per_instance is not None:
            inst = energy.per_instance
            left = (f" Left out, as the stream cannot resolve phases that short: "
                    f"{'; '.join(inst.unresolved[:6])}"
                    f"{' …' if len(inst.unresolved) > 6 else ''}." if inst.unresolved else "")
            panels.append(Panel("energy", "Energy per phase instance", plots.energy_bars_figure(
                inst.names, inst.streams, inst.mean_j, inst.spread_j, inst.count),
                "Energy of one instance of each phase name per stream: the mean over its "
                "instances, the error bar their spread (standard deviation), n the number "
                "of instances; a name no stream resolves one by one appears summed per "
                "enclosing phase ('step per epoch'). Phase edges are the GPU's times where "
                "the markers carry them; 'run' is the span every stream covers." + left))
            sections.append(("energy", _energy_table(energy)))
            notes += energy.report["notes"]
            sections += process_sections(run)
        cal_views: list[CalibrationView] = []
        if options.calibration:
            cal_views, cal_notes = calibration_views(run, options.reference,
                                                     options.calibrate or None)
            notes += cal_notes
        for k, view in enumerate(cal_views):
            key = f"calibration_{k}"
            panels.append(Panel(key, f"NVML calibration: {view.label}", plots.calibration_figure(
                view.t_s, view.seen_w, view.target_w, gain=view.param("gain"),
                offset_w=view.param("offset_w"), fit_text=calibration_summary(view),
                reference_label=f"{view.record.reference.source}:"
                                f"{view.record.reference.channel}",
                target_label=view.record.where),
                ("Stored in the run by wattlab calibrate. " if view.stored else
                 "Fitted for this report by the same code as wattlab calibrate (not stored). ")
                + "Left: each distinct NVML reading against the reference power seen through "
                  "the fitted kernel and lag, with the fit line. Right: the residuals over "
                  "time."))
            sections.append((key, _calibration_table(view)))
        tuning = tuning_panel(run_path)
        if tuning is not None:
            panels.append(Panel("tuning", "Tuning search", tuning[0], tuning[1]))
            sections.append(("tuning", tuning[2]))
        layers = layers_panel(run_path)
        if layers is not None:
            panels.append(Panel("layers", "Layers", layers[0], layers[1]))
            sections.append(("layers", layers[2]))
        if gaps:
            sections.append(("end", _gaps_table(gaps)))
        attrs = run.attrs
    command = " ".join(json.loads(str(attrs.get(schema.COMMAND, "[]")) or "[]")) or "-"
    meta = (f"run file {_e(os.path.abspath(run_path))} &middot; recorded "
            f"{_e(attrs.get(schema.CREATED, '?'))} on {_e(attrs.get(schema.HOST, '?'))} "
            "&middot; command "
            f"<code>{_e(command)}</code> &middot; {len(marks.spans)} phases, "
            f"{len(marks.points)} point markers, {len(gaps)} gaps &middot; {_made()} by "
            f"wattlab {_e(attrs.get(schema.WATTLAB_VERSION, ''))}")
    return Page(f"wattlab report: {os.path.basename(run_path)}", meta, panels, notes,
                sections, energy, cal_views)


def _sweep_page(path: str, options: ReportOptions) -> Page:
    table = load_table(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fit = fit_sweep(table, options.objective, options.max_slowdown, families=FAMILIES)
    panels, notes = sweep_panels(table, fit)
    failed = len(table) - len(table.usable())
    if failed:
        notes.append(f"{failed} run(s) did not finish or have no energy; they are left out")
    unit = X_LABELS.get(fit.x_name, fit.x_name)
    meta = (f"sweep file {_e(os.path.abspath(path))} &middot; {fit.n_rows} runs, "
            f"{fit.n_workloads} workload(s) &middot; x = {_e(unit)} &middot; objective "
            f"{_e(fit.objective)}, max slowdown "
            f"{'none' if fit.max_slowdown is None else f'{fit.max_slowdown:g}'} &middot; "
            f"energy from {_e(table.energy_source)} &middot; {_made()}")
    sections = [("", _loo_table(fit)), ("", _recommendations_table(fit, unit))]
    return Page(f"wattlab report: {os.path.basename(path)}", meta, panels, notes, sections,
                fit=fit)


# ----------------------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1440px;
color:#222;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid
#ddd;padding-bottom:4px}.meta{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
img{max-width:100%;border:1px solid #eee}.cap{color:#555;font-size:.85em;margin:4px 0 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:4px 10px;margin:4px 0;
font-size:.9em}.low{color:#c00}tr.chosen td{font-weight:bold}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1,
           row_class: Sequence[str] = ()) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>'
                   for i, h in enumerate(header))
    body = "".join(
        f"<tr class='{row_class[k] if k < len(row_class) else ''}'>"
        + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
        + "</tr>" for k, r in enumerate(rows))
    return f"<table><tr>{head}</tr>{body}</table>"


def _sources_table(summary: Sequence[Any]) -> str:
    return "<h2>Sources</h2>" + _table(
        ["source", "kind", "model", "samples", "rate (Hz)", "duration (s)", "mean power (W)",
         "energy (J)", "uncovered (s)", "gaps", "channel"],
        [[_e(s.source_id), _e(s.kind), _e(s.model), str(s.samples), _num(s.rate_hz),
          _num(s.duration_s), _num(s.mean_power_w), _num(s.energy_j), _num(s.uncovered_s),
          str(s.gaps), _e(s.channel or "-")] for s in summary], left=3)


def _energy_table(energy: PhaseEnergy) -> str:
    body = []
    mean, error = energy.mean_power_w(), energy.error_pct()
    for i, name in enumerate(energy.phases):
        for j, stream in enumerate(energy.streams):
            duration = energy.duration_s[i]
            uncovered = float(energy.uncovered_s[i, j])
            unc_text = _num(uncovered, ".3f")
            if uncovered > 0.01 * duration:
                unc_text = f"<span class='low'>{unc_text}</span>"
            first = j == 0
            bad = int(energy.invalid[i, j])
            valid = "yes" if not bad else (
                f"<span class='low'>no: {bad} of {energy.instances[i]} "
                f"({_e(', '.join(energy.failed_checks[(i, j)]))})</span>")
            body.append([_e(name) if first else "", str(energy.instances[i]) if first else "",
                         _num(duration, ".3f") if first else "", _e(stream),
                         _num(float(energy.energy_j[i, j])),
                         _num(float(energy.uncertainty_j[i, j])), _num(float(mean[i, j])),
                         unc_text, _num(float(error[i, j]), "+.2f"), valid])
    ref = energy.reference or "- (no external meter in this run)"
    return (_table(["phase", "instances", "duration (s)", "stream", "energy (J)", "± (J)",
                    "mean power (W)", "uncovered (s)", f"vs {ref} (%)", "valid"], body)
            + "<p class='cap'>The numbers of <code>wattlab energy --by-marker</code>, summed "
              "over the instances of each phase name. Holes in a stream are never integrated "
              "over: their time is uncovered (red above 1 % of the phase) and widens the "
              "interval; mean power is over observed time. Energy counters are read at the "
              f"phase edges. Errors are relative to {_e(ref)}. Valid: every instance's "
              "figure passes the checks of docs/validity.md; a sum with an invalid one "
              "is invalid, and the failed checks are named.</p>")


def _calibration_table(view: CalibrationView) -> str:
    rec = view.record
    energy = rec.energy
    before, after = ((None, None) if energy.overall is None
                     else (energy.overall.error_before_pct, energy.overall.error_after_pct))
    rows = [["model", _e(calibration_summary(view))],
            ["update period", f"{rec.update_period_s * 1e3:.1f} ms ({_e(rec.update_times)}"
                              f" times), coverage {rec.coverage * 100:.0f} %"],
            ["energy error, whole overlap",
             f"{_num(before, '+.2f')} % as read, "
             f"{_num(after, '+.2f')} % corrected"],
            [f"phases ≥ {energy.min_phase_s:g} s ({energy.phases_considered})",
             f"mean |error| {_num(energy.mean_abs_error_before_pct)} % as read, "
             f"{_num(energy.mean_abs_error_after_pct)} % corrected"]]
    verdict = _e(validity_verdict(rec))  # a row of its own: the figures above depend on it
    invalid = rec.validity is not None and not rec.validity.valid
    rows.append(["validity", f"<span class='low'>{verdict}</span>" if invalid else verdict])
    return _table(["", _e(view.label)], rows, left=2)


def _gaps_table(gaps: Sequence[GapRow]) -> str:
    return "<h2>Gaps</h2>" + _table(
        ["source", "seq", "from (s)", "to (s)", "samples lost", "reason"],
        [[_e(g.source), f"{g.seq_first}..{g.seq_last}",
          _num(None if g.time_first_ns is None else g.time_first_ns / 1e9, ".3f"),
          _num(None if g.time_last_ns is None else g.time_last_ns / 1e9, ".3f"),
          str(g.samples_lost), _e(g.reason)] for g in gaps])


def _loo_table(fit: FitReport) -> str:
    quantities = ("time", "power", "energy", "edp")
    rows = [[_e(s.family) + (" (chosen)" if s.family == fit.chosen else ""),
             f"{s.n_predicted}/{s.n_heldout}", *(_num(s.mape[q]) for q in quantities)]
            for s in fit.families]
    marks = ["chosen" if s.family == fit.chosen else "" for s in fit.families]
    return ("<h2>Leave-one-out error per model family</h2>"
            + _table(["family", "predicted / held out", "time MAPE (%)", "power MAPE (%)",
                      "energy MAPE (%)", "EDP MAPE (%)"], rows, row_class=marks)
            + f"<p class='cap'>Each run held out once and predicted by the family refitted "
              f"without it. The family with the lowest LOO error of the objective "
              f"({_e(fit.objective)}) on the runs every family predicted is chosen; the "
              f"boosted family shares its curve shape across workloads and needs at least "
              f"{BOOST_MIN_WORKLOADS} of them.</p>")


def _recommendations_table(fit: FitReport, unit: str) -> str:
    rows = [[_e(r.workload), _num(r.default_x, "g"), _num(r.recommended_x, "g"),
             f"{100 * r.predicted_saving:.1f} [{100 * r.saving_interval[0]:.1f}, "
             f"{100 * r.saving_interval[1]:.1f}]", f"{100 * r.predicted_slowdown:+.1f}",
             _num(r.measured_best_x, "g"),
             "-" if r.measured_saving is None else f"{100 * r.measured_saving:.1f}"]
            for r in fit.recommendations]
    return ("<h2>Recommended setting per workload</h2>"
            + _table(["workload", f"default {unit}", f"recommended {unit}",
                      f"predicted {fit.objective} saving (%, 95 % interval)",
                      "predicted time change (%)", f"measured best {unit}",
                      "measured saving at recommended (%)"], rows))
