"""The validity verdict on every figure a calibration reports (docs/validity.md, issue 37).

Why: a gain fitted across a hole in the reference, or a phase's error taken where the
target's times step back, looks as sure as any other. Each figure compares two streams, so
each is judged by the same checks as ``energy`` (``windows_verdict``) on both streams over
the window it was taken on (the target's shifted by the energy delay, as it was
integrated) and is valid where both are. A marked phase the energy errors leave out has
no figure: it is listed (``left_out``) with the checks that say why, and does not make the
record invalid (the recording's own ``session`` phase is one on every real run: the target
ends before the workload's end plus the energy delay). The summary over long phases is a
total: invalid where a phase it sums is, naming it.
"""

from __future__ import annotations

from wattlab.analysis.energy import CHECKS, combined_checks, phases_from_markers, windows_verdict
from wattlab.runfile import (
    CalibrationValidity,
    EnergyCheck,
    FigureVerdict,
    PhaseEnergy,
    Run,
    SourceView,
)

Stream = tuple[SourceView, str]
Window = tuple[str, float, float]
NO_ERROR_FIGURE = {"ok": False, "applies": True,
                   "reason": "no energy error: the phase reaches past what both streams cover "
                             "once the target is shifted by the energy delay, or the reference "
                             "misses too much of it"}


def phase_figure(phase: PhaseEnergy) -> str:
    """A phase's figure name: ``phase:<name>`` (``#<index>`` for a repeat), as ``energy``."""
    return f"phase:{phase.name}" + (f"#{phase.index}" if phase.index else "")


def calibration_validity(run: Run, ref: Stream, target: Stream, *,
                         fit_ref_s: tuple[float, float], fit_target_s: tuple[float, float],
                         energy: EnergyCheck, delay_s: float) -> CalibrationValidity:
    """Every figure's verdict: the parameters, the overall error, each phase, the summary.

    ``fit_ref_s``/``fit_target_s``: the spans the fit read of each stream; ``delay_s``: the
    energy delay by which the target's windows were shifted.
    """
    windows: list[Window] = [("params", *fit_ref_s)]
    shifted: list[Window] = [("params", *fit_target_s)]
    phases = ([("overall", energy.overall)] if energy.overall else []) + \
        [(phase_figure(p), p) for p in energy.phases]
    for name, p in phases:
        windows.append((name, p.t0_s, p.t1_s))
        shifted.append((name, p.t0_s + delay_s, p.t1_s + delay_s))
    left_out = _left_out(run, energy)
    windows += left_out
    shifted += [(name, a + delay_s, b + delay_s) for name, a, b in left_out]
    per_stream = {}
    for (view, channel), spans in ((ref, windows), (target, shifted)):
        rows = windows_verdict(run, view, channel, spans)
        per_stream[f"{view.source_id}:{channel}"] = {r.phase: r.checks for r in rows}
    figures: list[FigureVerdict] = []
    missing: list[FigureVerdict] = []
    for name, t0_s, t1_s in windows:
        checks = combined_checks({s: by[name] for s, by in per_stream.items()})
        no_figure = (name, t0_s, t1_s) in left_out
        if no_figure and all(c["ok"] for c in checks.values()):
            checks["coverage"] = NO_ERROR_FIGURE
        (missing if no_figure else figures).append(FigureVerdict(
            name, t0_s, t1_s, all(c["ok"] for c in checks.values()), checks, []))
    figures.append(_summary(energy, {f.figure: f for f in figures}))
    invalid = sum(not f.valid for f in figures)
    return CalibrationValidity(invalid == 0, invalid, figures, missing)


def _left_out(run: Run, energy: EnergyCheck) -> list[Window]:
    """Marked phases with no energy error: listed with why, never silently dropped.

    The energy errors leave out a phase outside what both streams cover, or one the
    reference misses too much of.
    """
    kept = {(p.name, p.index) for p in energy.phases}
    return [(f"phase:{p.label}", p.t0_s, p.t1_s) for p in phases_from_markers(run.markers)
            if p.t1_s > p.t0_s and (p.name, p.index) not in kept]


def _summary(energy: EnergyCheck, figures: dict[str, FigureVerdict]) -> FigureVerdict:
    """The mean |error| over long phases: a total, each check failing where a part's does."""
    parts = [figures[phase_figure(p)] for p in energy.phases
             if p.duration_s >= energy.min_phase_s and p.error_after_pct is not None]
    checks = {}
    for name in CHECKS:
        failing = [f.figure for f in parts if not f.checks[name]["ok"]]
        checks[name] = {"ok": not failing,
                        "applies": any(f.checks[name]["applies"] for f in parts),
                        "reason": (f"fails in {', '.join(failing)}" if failing else
                                   f"passes in every phase summed ({len(parts)})")}
    bad = [f.figure for f in parts if not f.valid]
    return FigureVerdict("mean_abs_error", None, None, not bad, checks, bad)
