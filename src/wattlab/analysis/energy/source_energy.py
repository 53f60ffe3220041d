"""Energy and mean power per source and per phase, with intervals that account for gaps.

Why: "how many joules did this phase take" must never hide missing data. Power streams are
integrated (trapezoids) one chunk at a time, every W channel of a source in the same pass;
a gap (a hole longer than ``GAP_FACTOR`` median spacings, non-finite values, or a gap the
recorder wrote) is not bridged: its time is reported as uncovered and the energy interval
widens by the uncovered time times the range of power seen in the phase. Energy counters
(J channels) are differenced at the phase edges. A calibration record turns an NVML
stream's energy into a reference-equivalent estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    chunks_s,
    integrate_view,
    json_safe,
    known_gaps_ns,
    median_spacing_s,
    parse_spec,
    power_channel,
    span_s,
)
from wattlab.analysis.energy import phase_resolution as resolution
from wattlab.analysis.energy.counter_shape import ShapeSource, shape_source, shaped_edges
from wattlab.analysis.energy.counter_ticks import (
    COUNTER_UPDATE_S,
    GRID_COUNTER_KINDS,
    at_updates,
)
from wattlab.analysis.energy.run_summary import energy_channel
from wattlab.analysis.energy.validity import clip_window, invalid_reasons, judge, scan_times
from wattlab.analysis.energy.wiring_check import WIRING_PREFIX, wiring_mismatches
from wattlab.errors import UsageError
from wattlab.runfile import CalibrationRecord, Estimate, MarkerRow, Run, SourceView

if TYPE_CHECKING:  # energy_fusion imports calibration, which imports this module
    from wattlab.analysis.calibration import Fusion

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Phase:
    """A time window: from begin/end markers, or the whole run."""

    name: str
    index: int
    t0_s: float
    t1_s: float
    source: str
    clock: str = "host"  # "gpu": both edges are the GPU's execution times (CUDA events)

    @property
    def duration_s(self) -> float:
        return self.t1_s - self.t0_s

    @property
    def label(self) -> str:
        return self.name if self.index == 0 else f"{self.name}#{self.index}"


def phases_from_markers(markers: Sequence[MarkerRow]) -> list[Phase]:
    """Begin/end marker pairs (matched per source and name, nesting allowed) as phases.

    Repeated phases of one name are numbered in time order (``index``); a begin without an
    end is left out. Edges are the GPU's execution times where the markers carry them (a
    framework marker's host time is when the step was queued, not run).
    """
    open_: dict[tuple[str, str], list[MarkerRow]] = {}
    pairs: list[tuple[MarkerRow, MarkerRow]] = []
    for m in sorted(markers, key=lambda m: m.effective_ns):
        key = (m.source, m.name)
        if m.kind == "begin":
            open_.setdefault(key, []).append(m)
        elif m.kind == "end" and open_.get(key):
            pairs.append((open_[key].pop(), m))
    pairs.sort(key=lambda p: p[0].effective_ns)
    counts: dict[str, int] = {}
    out = []
    for begin, end in pairs:
        idx = counts.get(begin.name, 0)
        counts[begin.name] = idx + 1
        gpu = begin.gpu_time_ns is not None and end.gpu_time_ns is not None
        out.append(Phase(begin.name, idx, begin.effective_ns / 1e9, end.effective_ns / 1e9,
                         begin.source, "gpu" if gpu else "host"))
    return out


@dataclass
class EnergyRow:
    """Energy of one stream over one phase.

    ``energy_j`` is the best estimate: the measured part, plus each gap bridged by a line
    between its edge samples, plus time outside the data (or next to a non-finite value) at
    the phase's mean power; ``low_j``..``high_j`` bound it (uncovered time at the
    lowest/highest power seen, plus the uncertainty of the phase edges); ``uncertainty_j``
    is the half-width.
    """

    source: str
    channel: str
    method: str
    phase: str
    t0_s: float
    t1_s: float
    energy_j: float | None
    mean_power_w: float | None
    uncertainty_j: float | None
    low_j: float | None
    high_j: float | None
    measured_j: float | None
    covered_s: float
    uncovered_s: float
    gaps: int
    error_pct: float | None = None
    corrected_j: float | None = None
    corrected_se_j: float | None = None
    corrected_error_pct: float | None = None
    edge_s: float | None = None  # how far in time an edge may be misplaced (``resolution``)
    resolves: bool | None = None  # whether the phase lasts long enough for this stream
    notes: list[str] = field(default_factory=list)
    valid: bool | None = None  # the validity verdict (docs/validity.md), set by ``judge``
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)  # the phases a total sums
    invalid_parts: list[str] = field(default_factory=list)

    def to_json(self, *, checks: bool = True) -> dict[str, Any]:
        """The row as JSON; ``checks=False`` leaves the verdict's checks out (to add later)."""
        # field by field, not ``asdict``: its deep copy cost ~1 ms per demo file's report
        out = {f.name: getattr(self, f.name) for f in fields(self) if checks
               or f.name != "checks"}
        out["notes"] = list(self.notes)
        if checks:
            out["checks"] = dict(self.checks)
        out["parts"], out["invalid_parts"] = list(self.parts), list(self.invalid_parts)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in out.items()}


def integrate_power(
    run: Run, view: SourceView, channels: Sequence[str], phases: list[Phase],
    shifts_s: Sequence[float] = (),
) -> dict[str, tuple[list[EnergyRow], dict[float, FloatArray]]]:
    """Energy rows of power channels of one source, all integrated in one pass over it.

    Per channel: the rows, and per shift s, (∫power, uncovered s) of each phase shifted by s.
    """
    spacing = median_spacing_s(view)
    first, last = span_s(view)
    windows = [(p.t0_s, p.t1_s) for p in phases]
    shifted = [(a + s, b + s) for s in shifts_s for a, b in windows]
    edges = np.array([x for w in windows + shifted for x in w])
    q = np.unique(np.clip(edges, first, last))
    cums = integrate_view(view, channels, q, known_gaps_ns=known_gaps_ns(run, view.source_id),
                          windows_s=windows)
    out: dict[str, tuple[list[EnergyRow], dict[float, FloatArray]]] = {}
    need_bounds: dict[str, list[int]] = {}
    knot = {x: i for i, x in enumerate(q.tolist())}  # every edge, clipped, is one of q
    for channel, cum in zip(channels, cums, strict=True):
        def at(t: float, arr: FloatArray) -> float:
            x = min(max(t, first), last)
            i = knot.get(x)  # np.interp at a knot is its value, exactly: ~20x cheaper so
            return float(arr[i]) if i is not None else float(np.interp(x, q, arr))

        def outside_s(a: float, b: float) -> float:
            return max(0.0, min(b, first) - a) + max(0.0, b - max(a, last))

        rows: list[EnergyRow] = []
        for i, p in enumerate(phases):
            a, b = p.t0_s, p.t1_s
            measured = at(b, cum.integral) - at(a, cum.integral)
            unc = at(b, cum.uncovered_s) - at(a, cum.uncovered_s) + outside_s(a, b)
            bridged = at(b, cum.bridge) - at(a, cum.bridge)
            at_mean = at(b, cum.unbridged_s) - at(a, cum.unbridged_s) + outside_s(a, b)
            covered = max(0.0, (b - a) - unc)
            gaps = sum(1 for g0, g1 in cum.gaps_s if g0 < b and g1 > a)
            mean = measured / covered if covered > 0 else None
            row = EnergyRow(view.source_id, channel, "power", p.label, a, b, None, mean, None,
                            None, None, measured if covered > 0 else None, covered, unc, gaps)
            if mean is not None:
                row.energy_j = measured + bridged + mean * at_mean
                edge = spacing * abs(mean)  # each phase edge is known to within ~half a spacing
                row.uncertainty_j, row.low_j, row.high_j = edge, row.energy_j - edge, \
                    row.energy_j + edge
                if unc > 1e-9:
                    need_bounds.setdefault(channel, []).append(i)
                    row.notes.append(f"{unc:.3f} s not covered ({gaps} gap(s)); not bridged")
            rows.append(row)
        shifted_out: dict[float, FloatArray] = {}
        for s in shifts_s:  # (integral, uncovered s) over each window shifted by s
            shifted_out[s] = np.array([
                (at(b + s, cum.integral) - at(a + s, cum.integral),
                 at(b + s, cum.uncovered_s) - at(a + s, cum.uncovered_s)
                 + outside_s(a + s, b + s)) for a, b in windows]).reshape(-1, 2)
        out[channel] = rows, shifted_out
    for ch, idx in need_bounds.items():  # the lowest and highest power seen in the window
        cum = cums[list(channels).index(ch)]
        for i in idx:
            r = out[ch][0][i]
            lo, hi = float(cum.window_min[i]), float(cum.window_max[i])
            if r.measured_j is None or not math.isfinite(lo):
                continue
            edge = r.uncertainty_j or 0.0
            r.low_j = r.measured_j + lo * r.uncovered_s - edge
            r.high_j = r.measured_j + hi * r.uncovered_s + edge
            r.uncertainty_j = 0.5 * (r.high_j - r.low_j)
    return out


def counter_edge_s(reads_s: npt.NDArray[np.float64], edge_s: float) -> float:
    """Seconds of mean power an edge of a counter difference may be off by.

    The counter's value lags by up to its update period (``COUNTER_UPDATE_S``); between two
    reads Δ apart, linear interpolation at distance d from one is off by at most the power's
    range times d(Δ-d)/Δ, zero at a read. The phase's mean power stands in for that range,
    so an edge on a read (the run's start and end: the reader reads the counter there) is
    known to ~0.1 s of power, and one mid-way between reads 9 s apart to ~2.35 s.
    """
    i = int(np.searchsorted(reads_s, edge_s))
    if i == 0 or i >= reads_s.size or reads_s[i] == edge_s:
        return COUNTER_UPDATE_S
    t0, t1 = float(reads_s[i - 1]), float(reads_s[i])
    return COUNTER_UPDATE_S + (edge_s - t0) * (t1 - edge_s) / (t1 - t0)


def counter_energy(view: SourceView, channel: str, phases: list[Phase],
                   shape: ShapeSource | None = None) -> list[EnergyRow]:
    """Energy rows from a cumulative energy counter, differenced at the phase edges.

    A counter bridges gaps in its readings correctly (it kept counting); each edge is known
    as well as ``counter_edge_s`` says, or, between reads where the same GPU's samples
    cover the interval (``shape``), to the counter's update period plus the shape's part.
    A counter is read rarely, so its reads are held whole; where they pin the counter's
    updates (NVML's, on a 100 ms grid), each value sits at its update (``counter_ticks``).
    """
    parts = list(chunks_s(view, channel))
    reads_s = np.concatenate([t for t, _ in parts])
    reads_j = np.concatenate([v for _, v in parts])
    if view.kind in GRID_COUNTER_KINDS:
        reads_s, reads_j = at_updates(reads_s, reads_j)
    first, last = float(reads_s[0]), float(reads_s[-1])
    resets = int(np.sum(np.diff(reads_j) < 0))
    q = np.unique(np.clip([x for p in phases for x in (p.t0_s, p.t1_s)], first, last))
    placed = (shaped_edges(reads_s, reads_j, q, shape, COUNTER_UPDATE_S)
              if shape is not None and reads_s.size > 1 else None)
    values = np.interp(q, reads_s, reads_j) if placed is None else placed.value
    rows = []
    for p in phases:
        a, b = p.t0_s, p.t1_s
        edges = (max(a, first), min(b, last))
        at = np.searchsorted(q, edges).clip(0, q.size - 1)
        ca, cb = values[at]
        outside = max(0.0, min(b, first) - a) + max(0.0, b - max(a, last))
        covered = (b - a) - outside
        e = float(cb - ca)
        mean = e / covered if covered > 0 else None
        row = EnergyRow(view.source_id, channel, "counter", p.label, a, b, None, mean, None,
                        None, None, e if covered > 0 else None, covered, outside, 0)
        if mean is not None:
            row.energy_j = e + mean * outside
            half = 0.0
            for x, j in zip(edges, at, strict=True):
                if placed is not None and placed.shaped[j]:
                    half += abs(mean) * COUNTER_UPDATE_S + float(placed.uncertainty_j[j])
                else:
                    half += abs(mean) * counter_edge_s(reads_s, x)
            row.uncertainty_j, row.low_j, row.high_j = half, row.energy_j - half, \
                row.energy_j + half
            if placed is not None and placed.shaped[at].any():
                row.notes.append(f"edges between counter reads placed by {placed.shape_name}"
                                 f" (drift {100 * placed.drift:.1f} %)")
            if outside > 0:
                row.notes.append(f"{outside:.3f} s outside the counter's readings")
        if resets:
            row.notes.append(f"counter went backwards {resets} time(s): reset or wrap")
        rows.append(row)
    return rows


def stream_identity(view: SourceView, channel: str) -> dict[str, str]:
    """Calibration key of a stream: GPU model, board, driver version and NVML field."""
    d = view.descriptor
    config = d.get("config", {})
    meaning = channel_meaning(view, channel)
    return {
        "gpu_model": view.model,
        "board": str(config.get("board_part_number", "")),
        "driver_version": str(config.get("driver_version", d.get("firmware", ""))),
        "nvml_field": str(meaning or config.get("nvml_field", "") or channel),
    }


def record_applies(record: CalibrationRecord, view: SourceView, channel: str
                   ) -> list[str] | None:
    """None if a calibration record is for another NVML field; else mismatch warnings."""
    key = record.key.to_json()
    ident = stream_identity(view, channel)
    if ident["nvml_field"] != key["nvml_field"] or channel != record.target.channel:
        return None
    return [f"calibrated on {k} {key[k]!r}, this stream has {ident[k]!r}"
            for k in ("gpu_model", "board", "driver_version") if ident[k] != key[k]]


def correction_terms(record: CalibrationRecord
                     ) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """((g, se), (c, se), (d, se)) from a record; an unknown error counts as 0."""
    def pair(e: Estimate) -> tuple[float, float]:
        return float(cast(float, e.value)), float(e.se or 0.0)

    p = record.params
    return pair(p.gain), pair(p.offset_w), pair(record.energy_delay_s)


def corrected_energy(e_shifted_j: float, duration_s: float, g: tuple[float, float], *,
                     c: tuple[float, float], d: tuple[float, float],
                     p_edges_w: npt.ArrayLike) -> tuple[float, float]:
    """Reference-equivalent energy from ∫target over the phase shifted later by d.

    Returns ((e − c·T)/g, standard error) with the errors of g, c and d propagated (d
    through the power step between the shifted window's edges).
    """
    gv, gs = g
    cv, cs = c
    e = (e_shifted_j - cv * duration_s) / gv
    pe = np.asarray(p_edges_w, dtype=np.float64)
    dp = float(pe[1] - pe[0]) if pe.size == 2 and np.all(np.isfinite(pe)) else 0.0
    var = (e * gs / gv) ** 2 + (duration_s * cs / gv) ** 2 + (dp * d[1] / gv) ** 2
    return e, math.sqrt(var) if math.isfinite(var) else math.nan


def energy_streams(run: Run) -> list[tuple[SourceView, str, str]]:
    """(view, channel, method) for every power channel and energy counter of a run."""
    out = []
    for view in run.sources.values():
        if len(view) < 2:
            continue
        config = view.descriptor.get("config", {})
        skip_watts = "power_channel" in config and config["power_channel"] is None
        for name, unit in zip(view.channel_names, view.units, strict=True):
            if unit == "W" and not skip_watts:
                out.append((view, name, "power"))
            elif unit == "J":
                out.append((view, name, "counter"))
    return out


def default_reference(run: Run) -> str | None:
    """The first source with a power channel not a GPU's own reading: the external meter."""
    for view in run.sources.values():
        if view.kind not in ("nvml", "amdsmi") and len(view) > 1 and (ch := power_channel(view)):
            return f"{view.source_id}:{ch}"
    return None


def energy_report(run: Run, by_marker: bool = True, reference: str | None = None, *,
                  calibration: CalibrationRecord | None = None,
                  windows: Sequence[tuple[float, float]] = (),
                  fusion: Fusion | None = None) -> dict[str, Any]:
    """Energy per stream and phase; errors vs the reference; optional NVML correction.

    ``fusion`` (``energy_fusion.fuse_records``): its stream's corrected energy is the sum
    of the deconvolved power over each phase, where the phase lies inside what it recovered.

    ``windows`` adds phases by time, (start, end) in session seconds, for spans no marker
    names (a load logged by another process, a stretch seen in a plot).
    """
    streams = energy_streams(run)
    if not streams:
        raise UsageError(f"{run.path}: no power or energy channel to integrate")
    phases, asked = _report_phases(run, streams, by_marker, windows)
    ref_key = _reference_key(run, reference)
    rows, notes = _stream_rows(run, streams, phases, calibration)
    if fusion is not None:
        notes.append(fusion.describe())
        _apply_fusion(rows, fusion)
    power_edges = {(v.source_id, ch): resolution.power_edge_s(
        median_spacing_s(v), resolution.channel_lag_s(channel_meaning(v, ch), ch))
        for v, ch, m in streams if m == "power"}
    resolution.annotate(rows, phases, power_edges)
    group_phases, group_rows, group_notes = resolution.group_rows(
        rows, [p for p in phases if p.name != "window"])
    notes += group_notes
    judge(run, rows + group_rows, (phases[0].t0_s, phases[0].t1_s), asked)
    if ref_key is not None:
        _errors_against_reference(rows + group_rows, ref_key)
    notes = [m.line() for m in wiring_mismatches(run.sources, _run_means(run, rows))] + notes
    invalid = [r for r in rows + group_rows if not r.valid]
    out = json_safe({
        "path": run.path,
        "valid": not invalid,
        "invalid_figures": len(invalid),
        "reference": None if ref_key is None else f"{ref_key[0]}:{ref_key[1]}",
        "calibration": None if calibration is None else calibration.key.to_json(),
        "phases": [asdict(p) | {"label": p.label} for p in phases],
        "rows": [r.to_json(checks=False) for r in rows],
        "groups": [asdict(p) | {"label": p.label} for p in group_phases],
        "group_rows": [r.to_json(checks=False) for r in group_rows],
        "chosen": [asdict(c) for c in resolution.choose(
            rows + group_rows, phases + group_phases,
            None if ref_key is None else f"{ref_key[0]}:{ref_key[1]}")],
        "notes": notes,
    })
    # the checks are strict JSON already (bools and text): json_safe need not walk them
    for key, got in (("rows", rows), ("group_rows", group_rows)):
        for row_json, row in zip(out[key], got, strict=True):
            row_json["checks"] = row.checks
    return cast(dict[str, Any], out)


def span_verdict(run: Run, view: SourceView, channel: str, t0_s: float, t1_s: float
                 ) -> EnergyRow:
    """One stream's figure over [t0, t1] with its verdict (docs/validity.md).

    For analyses that report a figure of their own over a span (``iterations``).
    """
    return windows_verdict(run, view, channel, [("span", t0_s, t1_s)])[0]


def windows_verdict(run: Run, view: SourceView, channel: str,
                    windows: Sequence[tuple[str, float, float]]) -> list[EnergyRow]:
    """One stream's figure over each (label, t0, t1) window, each with its verdict.

    For analyses whose figures are taken over windows of their own (``calibrate``'s phases,
    ``qualify``'s windows): the same judge as ``energy``, on a power stream or a counter.
    """
    phases = [Phase(label, 0, t0_s, t1_s, "") for label, t0_s, t1_s in windows]
    method = "counter" if view.unit(channel) == "J" else "power"
    if scan_times(view).backwards_s.size:
        rows = _unintegrated(view, channel, method, phases)
    elif method == "counter":
        rows = counter_energy(view, channel, phases, shape_source(run, view))
    else:
        rows = integrate_power(run, view, [channel], phases)[channel][0]
    judge(run, rows, (min(p.t0_s for p in phases), max(p.t1_s for p in phases)), {})
    return rows


def _report_phases(run: Run, streams: list[tuple[SourceView, str, str]], by_marker: bool,
                   windows: Sequence[tuple[float, float]]
                   ) -> tuple[list[Phase], dict[str, tuple[float, float]]]:
    """The whole run (the span every stream covers, else any covers), markers, windows.

    Windows are clipped to the run (``validity.clip_window``); the second value holds each
    window as asked, by label, for its window check.
    """
    spans = [span_s(v) for v, _, _ in streams]
    a, b = max(s[0] for s in spans), min(s[1] for s in spans)
    if b <= a:
        a, b = min(s[0] for s in spans), max(s[1] for s in spans)
    phases = [Phase("run", 0, a, b, "")]
    if by_marker:
        phases += phases_from_markers(run.markers)
    asked: dict[str, tuple[float, float]] = {}
    for i, (t0_s, t1_s) in enumerate(windows):
        if not t0_s < t1_s:
            raise UsageError(f"window {t0_s:g}:{t1_s:g}: the end must come after the start")
        phases.append(Phase("window", i, *clip_window(t0_s, t1_s, (a, b)), ""))
        asked[phases[-1].label] = (t0_s, t1_s)
    return phases, asked


def _reference_key(run: Run, reference: str | None) -> tuple[str, str] | None:
    """(source, channel) of the reference named, or of the run's external meter, if any."""
    ref_spec = reference or default_reference(run)
    if ref_spec is None:
        return None
    src, ch = parse_spec(ref_spec)
    view = run.source(src)
    return src, ch or power_channel(view) or ""


def _stream_rows(run: Run, streams: list[tuple[SourceView, str, str]], phases: list[Phase],
                 calibration: CalibrationRecord | None) -> tuple[list[EnergyRow], list[str]]:
    """Every stream's rows, corrected where the calibration applies; notes on mismatches.

    Power channels are integrated one pass per source, counters differenced.
    """
    notes: list[str] = []
    rows: list[EnergyRow] = []
    integrated = {}  # one pass per source for all its power channels
    backwards = {v.source_id for v, _, _ in streams if scan_times(v).backwards_s.size}
    for view in {id(v): v for v, _, m in streams if m == "power"}.values():
        if view.source_id in backwards:
            continue
        chans = [ch for v, ch, m in streams if v is view and m == "power"]
        shift = (correction_terms(calibration)[2][0],) if calibration and any(
            record_applies(calibration, view, ch) is not None for ch in chans) else ()
        integrated[view.source_id] = integrate_power(run, view, chans, phases, shift)
    for view, channel, method in streams:
        if view.source_id in backwards:
            rows += _unintegrated(view, channel, method, phases)
            continue
        if method == "counter":
            shape = shape_source(run, view)
            if shape is not None and shape.view.source_id in backwards:
                shape = None
            rows += counter_energy(view, channel, phases, shape)
            continue
        warn = record_applies(calibration, view, channel) if calibration else None
        got, shifted = integrated[view.source_id][channel]
        if warn is not None and calibration is not None:
            _correct_rows(got, shifted, correction_terms(calibration), warn)
            notes += [f"{view.source_id}:{channel}: {w}" for w in warn]
        rows += got
    return rows, notes


def _run_means(run: Run, rows: list[EnergyRow]) -> dict[str, float | None]:
    """Each stream's mean power over the whole run, from its total channel's row."""
    totals = {sid: power_channel(v) or energy_channel(v) for sid, v in run.sources.items()}
    return {r.source: r.mean_power_w for r in rows
            if r.phase == "run" and r.channel == totals[r.source]}


def _unintegrated(view: SourceView, channel: str, method: str, phases: list[Phase]
                  ) -> list[EnergyRow]:
    """Rows with no figure for a stream whose time goes backwards (the integral refuses it).

    Kept, so that the verdict marks them; the note says where the time steps back.
    """
    at_s = float(scan_times(view).backwards_s[0, 0])
    rows = []
    for p in phases:
        row = EnergyRow(view.source_id, channel, method, p.label, p.t0_s, p.t1_s, None, None,
                        None, None, None, None, 0.0, p.duration_s, 0)
        row.notes.append(f"time goes backwards at {at_s:.6f} s: not integrated")
        rows.append(row)
    return rows


def _correct_rows(rows: list[EnergyRow], shifted: dict[float, FloatArray],
                  terms: tuple[tuple[float, float], tuple[float, float], tuple[float, float]],
                  warn: list[str]) -> None:
    """Set each row's reference-equivalent energy from its window shifted by the delay."""
    g, c, d = terms
    for row, (e_shift, unc_s) in zip(rows, shifted[d[0]], strict=True):
        duration = row.t1_s - row.t0_s
        if row.energy_j is None or unc_s >= duration:
            continue
        # the shifted window may run past the data: fill at its mean power, and say so
        p = float(e_shift) / (duration - unc_s)
        row.corrected_j, se = corrected_energy(
            float(e_shift) + p * unc_s, duration, g, c=c, d=d, p_edges_w=[p, p])
        row.corrected_se_j = math.hypot(se, 0.5 * abs(p) * unc_s / g[0])
        if unc_s > 1e-9:
            row.notes.append(f"corrected: {unc_s:.3f} s of the shifted window not covered")
        row.notes += warn


def _apply_fusion(rows: list[EnergyRow], fusion: Fusion) -> None:
    """The fused stream's corrected energy: the deconvolved power summed over each phase."""
    for row in rows:
        if f"{row.source}:{row.channel}" != fusion.main.name or row.energy_j is None:
            continue
        e, se = fusion.energy_j(row.t0_s, row.t1_s)
        if math.isfinite(e):
            row.corrected_j, row.corrected_se_j = e, se
            row.notes.append("corrected: deconvolved")
        else:
            row.notes.append("outside the deconvolved span: not deconvolved")


def _errors_against_reference(rows: list[EnergyRow], ref_key: tuple[str, str]) -> None:
    """Each row's error (and its corrected energy's) against the reference's row of its phase."""
    ref_rows = {r.phase: r for r in rows if (r.source, r.channel) == ref_key}
    for r in rows:
        ref = ref_rows.get(r.phase)
        # the reference meter's own other channels (its rails) are parts, not rivals
        if ref is None or r.source == ref.source or not ref.energy_j:
            continue
        if r.energy_j is not None:
            r.error_pct = 100 * (r.energy_j - ref.energy_j) / ref.energy_j
        if r.corrected_j is not None:
            r.corrected_error_pct = 100 * (r.corrected_j - ref.energy_j) / ref.energy_j


def channel_meaning(view: SourceView, channel: str) -> str:
    """What a channel is, as its source described it ("" where it did not say)."""
    return next((str(c.get("meaning", "")) for c in view.descriptor.get("channels", [])
                 if c.get("name") == channel), "")


def format_report(report: dict[str, Any]) -> str:
    """A fixed-width table: one block per phase (then per group), one line per stream.

    A ``~`` after the energy: the phase is shorter than that stream resolves. ``valid``:
    the figure's verdict (docs/validity.md); under the block, each failed check's reason.
    """
    corrected = any(r["corrected_j"] is not None for r in report["rows"])
    head = (f"{'stream':<40} {'energy J':>12} {'± J':>8} {'mean W':>9} {'uncov s':>8} "
            f"{'err %':>7}" + (f" {'corr J':>11} {'± J':>8} {'corr err %':>10}" if corrected
                               else "") + " valid")
    lines = [f"reference: {report['reference'] or '- (no external meter in this run)'}"]
    wiring = [n for n in report["notes"] if n.startswith(WIRING_PREFIX)]
    lines += [f"!! {n}" for n in wiring]
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for r in report["rows"] + report.get("group_rows", []):
        by_phase.setdefault(r["phase"], []).append(r)
    clock = {p["label"]: p.get("clock", "host") for p in report["phases"]
             + report.get("groups", [])}

    def num(x: Any, fmt: str, width: int) -> str:
        return f"{x:{width}{fmt}}" if x is not None else f"{'-':>{width}}"

    for phase, rows in by_phase.items():
        r0 = rows[0]
        on = ", GPU time" if clock.get(phase) == "gpu" else ""
        lines += ["", f"{phase}  ({r0['t0_s']:.3f} .. {r0['t1_s']:.3f} s, "
                  f"{r0['t1_s'] - r0['t0_s']:.3f} s{on})", head, "-" * len(head)]
        for r in rows:
            name = f"{r['source']}:{r['channel']}" + (" (counter)" if r["method"] == "counter"
                                                       else "")
            flag = "~" if r.get("resolves") is False else " "
            line = (f"{name:<40} {num(r['energy_j'], '.2f', 11)}{flag} "
                    f"{num(r['uncertainty_j'], '.2f', 8)} {num(r['mean_power_w'], '.2f', 9)} "
                    f"{r['uncovered_s']:8.3f} {num(r['error_pct'], '.2f', 7)}")
            if corrected:
                line += (f" {num(r['corrected_j'], '.2f', 11)} "
                         f"{num(r['corrected_se_j'], '.2f', 8)} "
                         f"{num(r['corrected_error_pct'], '.2f', 10)}")
            lines.append(line + (" yes" if r["valid"] else " NO"))
        lines += [f"  ! {r['source']}:{r['channel']}: {why}" for r in rows
                  for why in invalid_reasons(r)]
    unresolved = [c for c in report.get("chosen", []) if c["stream"] is None]
    if unresolved:
        lines += ["", f"~ {len(unresolved)} phase(s) no stream resolves, e.g. "
                  f"{unresolved[0]['phase']}: {unresolved[0]['reason']}"]
    lines += [f"note: {n}" for n in report["notes"] if n not in wiring]
    if not report["valid"]:
        lines.append(f"invalid: {report['invalid_figures']} figure(s) (docs/validity.md)")
    return "\n".join(lines)
