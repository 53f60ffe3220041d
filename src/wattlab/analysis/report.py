"""`wattlab report`: one self-contained HTML page (PNGs embedded, and written beside it).

What a person at the bench wants to see first: every power stream on one time axis with
the workload's phases and the holes in the data, a few windows where every sample shows,
and the energy of each phase per source. Calibration and model panels are added when the
run holds such results (``/analysis/...``) or the analysis modules offer them.

All reading is streamed in chunks, so an hour at 20 kHz is drawn without loading it whole.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis import plots
from wattlab.analysis.run_file import GapRow, MarkerRow, Run, SourceView, _text
from wattlab.analysis.summary import (
    GAP_FACTOR,
    energy_channel,
    power_channel,
    summarise,
)
from wattlab.errors import UsageError, WattlabError

DISPLAY_BINS = 2000
RAW_DISPLAY_MAX = 4000
ZOOM_SAMPLES = 60
MAX_ZOOMS = 3
SESSION_SOURCE = "session"


@dataclass(frozen=True)
class Phase:
    """A begin/end marker pair: ns since session start; depth = how many phases enclose it."""

    name: str
    source: str
    start_ns: int
    end_ns: int
    depth: int = 0
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Phases:
    """Phases, point markers, and what could not be paired (said in the report)."""

    phases: list[Phase]
    points: list[MarkerRow]
    warnings: list[str]


def phases_from_markers(markers: Sequence[MarkerRow]) -> Phases:
    """Pair begin/end markers by (source, name), innermost first, like nested brackets."""
    open_: dict[tuple[str, str], list[MarkerRow]] = {}
    pairs: list[tuple[MarkerRow, MarkerRow]] = []
    points: list[MarkerRow] = []
    warnings: list[str] = []
    for m in sorted(markers, key=lambda r: r.time_ns):
        key = (m.source, m.name)
        if m.kind == "begin":
            open_.setdefault(key, []).append(m)
        elif m.kind == "end":
            stack = open_.get(key)
            if stack:
                pairs.append((stack.pop(), m))
            else:
                warnings.append(f"end of phase {m.name!r} from {m.source} at "
                                f"{m.time_ns / 1e9:.3f} s has no begin")
        else:
            points.append(m)
    for (source, name), stack in open_.items():
        for m in stack:
            warnings.append(f"phase {name!r} from {source} begun at {m.time_ns / 1e9:.3f} s "
                            "never ends")
    pairs.sort(key=lambda p: (p[0].time_ns, -p[1].time_ns))
    phases: list[Phase] = []
    enclosing: list[int] = []  # end times of the workload phases that enclose the current one
    for begin, end in pairs:
        if begin.source == SESSION_SOURCE:
            phases.append(Phase(begin.name, begin.source, begin.time_ns, end.time_ns, -1,
                                begin.payload))
            continue
        while enclosing and enclosing[-1] <= begin.time_ns:
            enclosing.pop()
        phases.append(Phase(begin.name, begin.source, begin.time_ns, end.time_ns,
                            len(enclosing), begin.payload))
        enclosing.append(end.time_ns)
    return Phases(phases, points, warnings)


# ----------------------------------------------------------------------------- reading


def power_sources(run: Run) -> list[tuple[SourceView, str]]:
    """Every source that measures power, with its power channel (see summary.power_channel)."""
    found = []
    for view in run.sources.values():
        channel = power_channel(view)
        if channel is not None and len(view) > 0:
            found.append((view, channel))
    return found


def median_spacing_s(view: SourceView) -> float:
    diffs = np.diff(view.time_slice(0, 10_000))
    return float(np.median(diffs)) / 1e9 if diffs.size else 0.0


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
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Raw samples of one channel with t0_ns <= time <= t1_ns."""
    start, stop = row_at(view, t0_ns), row_at(view, t1_ns + 1)
    col = view.channel_index(channel)
    times = view.time_slice(start, stop)
    values = np.asarray(view._group["values"][start:stop, col], dtype=np.float64)
    return times, values


def _break_holes(t_s: npt.NDArray[np.float64], v: npt.NDArray[np.float64], spacing_s: float
                 ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Insert NaN where samples are far apart so a line is never drawn across a hole."""
    if t_s.size < 2 or spacing_s <= 0:
        return t_s, v
    holes = np.flatnonzero(np.diff(t_s) > GAP_FACTOR * spacing_s)
    if holes.size == 0:
        return t_s, v
    return (np.insert(t_s, holes + 1, t_s[holes] + spacing_s),
            np.insert(v, holes + 1, np.nan))


def display_trace(view: SourceView, channel: str, t0_ns: int, t1_ns: int,
                  bins: int = DISPLAY_BINS) -> plots.Trace:
    """Raw samples when few, else min / mean / max per time bin (empty bins stay NaN)."""
    label = f"{view.source_id}:{channel}"
    unit = view.unit(channel)
    spacing_s = median_spacing_s(view)
    if len(view) <= RAW_DISPLAY_MAX:
        t_s, v = _break_holes(view.time_s, view.channel(channel).astype(np.float64), spacing_s)
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


def cumulative_energy_j(view: SourceView, channel: str, times_ns: npt.NDArray[np.int64]
                        ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Energy and covered seconds from the first sample up to each time.

    Trapezoids between samples, interpolated inside the interval a time falls in; an
    interval longer than GAP_FACTOR x the median spacing is a hole and adds nothing, so a
    difference of two values never bridges lost data (its covered time says so). Before
    the first sample both are 0, after the last both are the totals; NaN if no samples.
    """
    times = np.asarray(times_ns, dtype=np.int64)
    energy = np.full(times.shape, np.nan)
    covered = np.full(times.shape, np.nan)
    limit_ns = GAP_FACTOR * median_spacing_s(view) * 1e9
    e_carry = c_carry = 0.0
    prev: tuple[int, float] | None = None
    first_ns: int | None = None
    for chunk_t, chunk_v in view.iter_chunks(channel):
        t, p = chunk_t.astype(np.int64), chunk_v.astype(np.float64)
        if prev is not None:
            t = np.r_[prev[0], t]
            p = np.r_[prev[1], p]
        if t.size >= 2:
            dt_ns = np.diff(t).astype(np.float64)
            ok = (dt_ns <= limit_ns) & np.isfinite(p[1:]) & np.isfinite(p[:-1])
            seg_e = np.where(ok, 0.5 * (p[1:] + p[:-1]) * dt_ns / 1e9, 0.0)
            seg_c = np.where(ok, dt_ns / 1e9, 0.0)
            cum_e = e_carry + np.r_[0.0, np.cumsum(seg_e)]
            cum_c = c_carry + np.r_[0.0, np.cumsum(seg_c)]
            sel = (times >= t[0]) & (times <= t[-1])
            if sel.any():
                q = times[sel]
                i = np.clip(np.searchsorted(t, q, side="right") - 1, 0, t.size - 2)
                f = np.clip((q - t[i]) / np.maximum(dt_ns[i], 1.0), 0.0, 1.0)
                part_e = (p[i] * f + 0.5 * (p[i + 1] - p[i]) * f * f) * dt_ns[i] / 1e9
                energy[sel] = cum_e[i] + np.where(ok[i], part_e, 0.0)
                covered[sel] = cum_c[i] + np.where(ok[i], f * dt_ns[i] / 1e9, 0.0)
            e_carry, c_carry = float(cum_e[-1]), float(cum_c[-1])
        if first_ns is None:
            first_ns = int(t[0])
        prev = (int(t[-1]), float(p[-1]))
    if prev is not None and first_ns is not None:
        # outside the stream nothing was observed: zero before it, the total after it
        before, after = times < first_ns, times > prev[0]
        energy[before], covered[before] = 0.0, 0.0
        energy[after], covered[after] = e_carry, c_carry
    return energy, covered


def counter_energy_j(view: SourceView, channel: str, times_ns: npt.NDArray[np.int64]
                     ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """An energy counter read at each time, and the seconds it spans up to there.

    Linear between readings; before the first reading 0, after the last the total, like
    ``cumulative_energy_j``, so differences only count the time the counter observed.
    """
    t = view.time_ns
    e = view.channel(channel).astype(np.float64)
    if t.size < 2:
        nan = np.full(times_ns.shape, np.nan)
        return nan, nan.copy()
    energy = np.interp(times_ns, t, e - e[0])
    covered = (np.clip(times_ns, t[0], t[-1]) - t[0]) / 1e9
    return energy.astype(np.float64), covered.astype(np.float64)


@dataclass
class PhaseEnergy:
    """Energy of every phase instance per source; NaN where a source does not cover it."""

    phases: list[Phase]
    sources: list[str]
    energy_j: npt.NDArray[np.float64]  # n_phases x n_sources
    coverage: npt.NDArray[np.float64]  # fraction of the phase the source observed

    def by_name(self) -> list[dict[str, Any]]:
        """One row per phase name: instances, total duration, energy per source (summed).

        ``coverage`` is the fraction of the phases' total time each source observed.
        """
        rows: dict[str, dict[str, Any]] = {}
        n = len(self.sources)
        for i, ph in enumerate(self.phases):
            row = rows.setdefault(ph.name, {"phase": ph.name, "instances": 0, "duration_s": 0.0,
                                            "energy_j": np.zeros(n), "covered_s": np.zeros(n)})
            row["instances"] += 1
            row["duration_s"] += ph.duration_s
            row["energy_j"] = row["energy_j"] + np.nan_to_num(self.energy_j[i])
            row["covered_s"] = row["covered_s"] + self.coverage[i] * ph.duration_s
        for row in rows.values():
            row["coverage"] = row.pop("covered_s") / max(row["duration_s"], 1e-12)
        return list(rows.values())


def phase_energy(run: Run, phases: Sequence[Phase]) -> PhaseEnergy:
    """Energy per phase and source, from power samples or from energy counters."""
    starts = np.array([p.start_ns for p in phases], dtype=np.int64)
    ends = np.array([p.end_ns for p in phases], dtype=np.int64)
    both = np.r_[starts, ends]
    duration_s = np.maximum((ends - starts) / 1e9, 1e-12)
    columns, cover, names = [], [], []
    for view in run.sources.values():
        channel = power_channel(view)
        if channel is not None and len(view) > 1:
            e, c = cumulative_energy_j(view, channel, both)
            columns.append(e[len(phases):] - e[:len(phases)])
            cover.append((c[len(phases):] - c[:len(phases)]) / duration_s)
            names.append(f"{view.source_id}:{channel}")
        elif (counter := energy_channel(view)) is not None and len(view) > 1:
            e, c = counter_energy_j(view, counter, both)
            columns.append(e[len(phases):] - e[:len(phases)])
            cover.append((c[len(phases):] - c[:len(phases)]) / duration_s)
            names.append(f"{view.source_id}:{counter}")
    shape = (len(phases), len(names))
    energy = np.column_stack(columns) if columns else np.zeros(shape)
    coverage = np.nan_to_num(np.column_stack(cover), nan=0.0) if cover else np.zeros(shape)
    return PhaseEnergy(list(phases), names, energy.reshape(shape), coverage.reshape(shape))


# ----------------------------------------------------------------------------- figures


def _spans(phases: Sequence[Phase]) -> list[plots.Span]:
    return [plots.Span(p.start_ns / 1e9, p.end_ns / 1e9, p.name, p.depth) for p in phases]


def gap_spans(gaps: Sequence[GapRow]) -> list[plots.Span]:
    """Gaps with known times; a zero-length gap is widened to stay visible."""
    spans = []
    for g in gaps:
        if g.time_first_ns is None or g.time_last_ns is None:
            continue
        first, last = g.time_first_ns / 1e9, g.time_last_ns / 1e9
        spans.append(plots.Span(first, max(last, first + 1e-3), g.source))
    return spans


def zoom_windows(found: Sequence[tuple[SourceView, str]], phases: Sequence[Phase],
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
    boundaries = sorted({p.start_ns for p in phases if p.depth == 0}
                        | {p.end_ns for p in phases if p.depth == 0})[:200]
    best, best_step = None, 0.0
    for b in boundaries:
        _, before = window(fast_view, fast_channel, b - width_ns // 2, b)
        _, after = window(fast_view, fast_channel, b, b + width_ns // 2)
        if before.size and after.size:
            step = abs(float(np.mean(after)) - float(np.mean(before)))
            if step > best_step:
                best, best_step = b, step
    if best is not None:
        centres.append((f"sharpest phase transition ({best_step:.0f} W step)", best, best))
    known = [g for g in gaps if g.time_first_ns is not None and g.time_last_ns is not None]
    if known:
        g = max(known, key=lambda r: (r.time_last_ns or 0) - (r.time_first_ns or 0))
        centres.append((f"largest gap ({g.source}: {g.reason})", g.time_first_ns or 0,
                        g.time_last_ns or 0))
    workload = [p for p in phases if p.depth == 0]
    longest = max(workload, key=lambda p: p.end_ns - p.start_ns) if workload else None
    centre = (longest.start_ns + longest.end_ns) // 2 if longest else (t0_ns + t1_ns) // 2
    centres.append((f"steady state ({longest.name})" if longest else "middle of the run",
                    centre, centre))
    windows = []
    for title, first, last in centres[:MAX_ZOOMS]:
        lo = max(t0_ns, first - width_ns // 2)
        hi = min(t1_ns, last + width_ns // 2)
        win = plots.ZoomWindow(title, lo / 1e9, hi / 1e9)
        for view, channel in found:
            t, v = window(view, channel, lo, hi)
            t_s, v = _break_holes(t / 1e9, v, median_spacing_s(view))
            win.traces.append(plots.Trace(f"{view.source_id}:{channel}", view.unit(channel),
                                          t_s, v))
        windows.append(win)
    return windows


# ----------------------------------------------------------------------------- panels


@dataclass
class Panel:
    """One figure of the report, with the words under it."""

    key: str
    title: str
    figure: Any
    caption: str = ""


PanelProvider = Callable[[Run], list[Panel]]
OPTIONAL_PANELS = (
    ("calibration", "NVML calibration", "wattlab.analysis.calibration"),
    ("models", "Energy models", "wattlab.analysis.models"),
)


def _stored(run: Run, key: str) -> Any:
    group = run._file.get("analysis")
    return None if group is None else group.get(key)


def _stored_calibration_panels(run: Run) -> list[Panel]:
    """Groups /analysis/calibration/<name> with reference_w, target_w [, corrected_w]."""
    panels = []
    for name, g in (_stored(run, "calibration") or {}).items():
        if "reference_w" not in g or "target_w" not in g:
            continue
        corrected = np.asarray(g["corrected_w"][:]) if "corrected_w" in g else None
        fit = ", ".join(f"{k} = {_text(v)}" for k, v in g.attrs.items() if np.isscalar(v))
        fig = plots.calibration_figure(
            np.asarray(g["reference_w"][:]), np.asarray(g["target_w"][:]),
            corrected_w=corrected, fit_text=fit,
            reference_label=_text(g.attrs.get("reference", "reference")),
            target_label=_text(g.attrs.get("target", "NVML")))
        panels.append(Panel(f"calibration_{name}", f"NVML calibration: {name}", fig, fit))
    return panels


def _stored_model_panels(run: Run) -> list[Panel]:
    """Groups /analysis/models/<name> with x, measured, x_grid and curve_<model> datasets."""
    panels = []
    for name, g in (_stored(run, "models") or {}).items():
        if not {"x", "measured", "x_grid"} <= set(g):
            continue
        curves = {k[len("curve_"):]: np.asarray(g[k][:]) for k in g if k.startswith("curve_")}
        loo = {k[len("loo_mape_pct_"):]: float(v) for k, v in g.attrs.items()
               if k.startswith("loo_mape_pct_")}
        optimum = g.attrs.get("optimum_x")
        fig = plots.model_curves_figure(
            np.asarray(g["x"][:]), np.asarray(g["measured"][:]), curves,
            np.asarray(g["x_grid"][:]), x_label=_text(g.attrs.get("x_label", "setting")),
            y_label=_text(g.attrs.get("y_label", "value")),
            optimum_x=None if optimum is None else float(optimum), loo_error=loo)
        panels.append(Panel(f"models_{name}", f"Energy model: {name}", fig,
                            "curves with their leave-one-out error (MAPE); dashed: optimum"))
    return panels


def optional_panels(run: Run) -> tuple[list[Panel], list[str]]:
    """Stored /analysis results, else the analysis module's ``report_panels(run)``."""
    panels: list[Panel] = []
    notes: list[str] = []
    stored = {"calibration": _stored_calibration_panels, "models": _stored_model_panels}
    for key, title, module_name in OPTIONAL_PANELS:
        found = stored[key](run)
        if found:
            panels += found
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            notes.append(f"{title}: no panel ({module_name} is not in this installation and "
                         f"the run holds no /analysis/{key} results)")
            continue
        provider: PanelProvider | None = getattr(module, "report_panels", None)
        if provider is None:
            notes.append(f"{title}: no panel ({module_name} offers no report_panels(run))")
            continue
        try:
            found = provider(run)
        except WattlabError as e:
            notes.append(f"{title}: no panel ({e})")
            continue
        if not found:
            notes.append(f"{title}: nothing to show for this run")
        panels += found
    return panels, notes


# ----------------------------------------------------------------------------- the report


@dataclass
class ReportResult:
    """What was written: the page, the PNGs beside it, and notes shown on the page."""

    html_path: str
    png_paths: list[str]
    notes: list[str]
    phase_energy: PhaseEnergy


def default_output(run_path: str) -> str:
    root, _ = os.path.splitext(run_path)
    return root + ".html"


def build_report(run_path: str, output: str | None = None, *, dpi: int = 110) -> ReportResult:
    """Write the HTML report of ``run_path`` and its PNGs; returns what it wrote."""
    output = output or default_output(run_path)
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise UsageError(f"{output}: folder {out_dir} does not exist")
    stem = os.path.splitext(os.path.basename(output))[0]
    with Run(run_path) as run:
        found = power_sources(run)
        found_phases = phases_from_markers(run.markers)
        phases = found_phases.phases
        gaps = run.gaps
        notes = list(found_phases.warnings)
        if not found:
            notes.append("no source in this run measures power: nothing to plot over time")
        firsts = [int(v.time_slice(0, 1)[0]) for v, _ in found]
        lasts = [int(v.time_slice(len(v) - 1, len(v))[0]) for v, _ in found]
        t0_ns, t1_ns = (min(firsts), max(lasts)) if found else (0, 1)
        t1_ns = max(t1_ns, t0_ns + 1)
        panels: list[Panel] = []
        traces = [display_trace(v, c, t0_ns, t1_ns) for v, c in found]
        points = [(m.time_ns / 1e9, m.name) for m in found_phases.points]
        panels.append(Panel("timeline", "Power over time", plots.timeline_figure(
            traces, _spans(phases), gap_spans(gaps), points),
            "Every power stream on the session timebase. Coloured bands and the lanes below: "
            "phases from begin/end markers (thin lines: point markers). Red hatching: gaps "
            "the recorder logged; line breaks: holes in a stream."))
        windows = zoom_windows(found, phases, gaps, t0_ns=t0_ns, t1_ns=t1_ns)
        if windows:
            panels.append(Panel("zoom", "Sample-level zoom", plots.zoom_figure(
                windows, _spans(phases), gap_spans(gaps)),
                "Every sample (dots) in short windows: how each meter and the driver see a "
                "transition, how much they lag and smooth."))
        energy = phase_energy(run, [p for p in phases if p.end_ns > p.start_ns])
        rows = energy.by_name()
        if rows and energy.sources:
            matrix = np.array([np.nan_to_num(r["energy_j"]) for r in rows])
            panels.append(Panel("energy", "Energy per phase", plots.energy_bars_figure(
                [r["phase"] for r in rows], energy.sources, matrix),
                "Energy of each phase name, all its instances summed, per source."))
        extra, extra_notes = optional_panels(run)
        panels += extra
        notes += extra_notes
        summary = summarise(run)
        attrs = run.attrs
        markers_n = len(run.markers)
    pngs: list[str] = []
    images: list[tuple[Panel, str]] = []
    for panel in panels:
        png = os.path.join(out_dir, f"{stem}_{panel.key}.png")
        data = plots.save_png(panel.figure, png, dpi)
        pngs.append(png)
        images.append((panel, base64.b64encode(data).decode()))
    page = _html(run_path, attrs, summary, images=images, energy_rows=rows,
                 energy_sources=energy.sources, gaps=gaps, notes=notes, markers_n=markers_n)
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)
    return ReportResult(output, pngs, notes, energy)


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
font-size:.9em}.low{color:#c00}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None or not np.isfinite(value) else format(value, fmt)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>'
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html(run_path: str, attrs: dict[str, Any], summary: Sequence[Any], *,
          images: Sequence[tuple[Panel, str]], energy_rows: Sequence[dict[str, Any]],
          energy_sources: Sequence[str], gaps: Sequence[GapRow], notes: Sequence[str],
          markers_n: int) -> str:
    command = " ".join(json.loads(str(attrs.get("command", "[]")) or "[]")) or "-"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>wattlab report: {_e(os.path.basename(run_path))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>wattlab report: {_e(os.path.basename(run_path))}</h1>",
        f"<p class='meta'>run file {_e(os.path.abspath(run_path))} &middot; recorded "
        f"{_e(attrs.get('created', '?'))} on {_e(attrs.get('host', '?'))} &middot; command "
        f"<code>{_e(command)}</code> &middot; {markers_n} markers, {len(gaps)} gaps &middot; "
        f"report made {_e(dt.datetime.now(dt.UTC).isoformat(timespec='seconds'))} by wattlab "
        f"{_e(attrs.get('wattlab_version', ''))}</p>",
    ]
    parts += [f"<div class='note'>{_e(n)}</div>" for n in notes]
    parts.append("<h2>Sources</h2>")
    parts.append(_table(
        ["source", "kind", "model", "samples", "rate (Hz)", "duration (s)", "mean power (W)",
         "energy (J)", "uncovered (s)", "gaps", "channel"],
        [[_e(s.source_id), _e(s.kind), _e(s.model), str(s.samples), _num(s.rate_hz),
          _num(s.duration_s), _num(s.mean_power_w), _num(s.energy_j), _num(s.uncovered_s),
          str(s.gaps), _e(s.channel or "-")] for s in summary], left=3))
    by_key = {p.key: (p, b64) for p, b64 in images}
    for key in ("timeline", "zoom"):
        if key in by_key:
            parts.append(_figure(*by_key.pop(key)))
    if energy_rows:
        parts.append("<h2>Energy per phase</h2>")
        body = []
        for r in energy_rows:
            for j, source in enumerate(energy_sources):
                e = float(r["energy_j"][j])
                cover = float(r["coverage"][j])
                covered = (f"{cover:.0%}" if cover >= 0.99
                           else f"<span class='low'>{cover:.0%}</span>")
                mean = e / (cover * r["duration_s"]) if cover * r["duration_s"] > 0 else None
                first = j == 0
                body.append([_e(r["phase"]) if first else "", str(r["instances"]) if first else "",
                             _num(r["duration_s"], ".3f") if first else "", _e(source),
                             _num(e) if cover > 0 else "-", _num(mean), covered])
        parts.append(_table(["phase", "instances", "duration (s)", "source", "energy (J)",
                             "mean power (W)", "covered"], body))
        parts.append("<p class='cap'>Trapezoidal integration on the session timebase; holes "
                     "in a stream are not bridged: energy counts observed time only, mean power "
                     "is over observed time, coverage below 99 % is in red.</p>")
    if "energy" in by_key:
        panel, b64 = by_key.pop("energy")
        parts.append(_figure(panel, b64, heading=False))
    for panel, b64 in by_key.values():
        parts.append(_figure(panel, b64))
    if gaps:
        parts.append("<h2>Gaps</h2>")
        parts.append(_table(
            ["source", "seq", "from (s)", "to (s)", "samples lost", "reason"],
            [[_e(g.source), f"{g.seq_first}..{g.seq_last}",
              _num(None if g.time_first_ns is None else g.time_first_ns / 1e9, ".3f"),
              _num(None if g.time_last_ns is None else g.time_last_ns / 1e9, ".3f"),
              str(g.samples_lost), _e(g.reason)] for g in gaps]))
    parts.append("</body></html>")
    return "\n".join(parts)


def _figure(panel: Panel, b64: str, heading: bool = True) -> str:
    title = f"<h2>{_e(panel.title)}</h2>" if heading else ""
    return (f"{title}<img alt='{_e(panel.title)}' "
            f"src='data:image/png;base64,{b64}'><p class='cap'>{_e(panel.caption)}</p>")
