"""What a calibration does to energy: the target's energy shift and its errors per phase.

Why a module of its own: a calibration (calibrate.py) is judged by energies, not only by
its fit to the readings: the shift that matches the target's energy windows to the
reference's, and the error of each phase's energy before and after the correction,
overall, per marked phase and per phase length. These ask the target's running integral
(``TargetEnergy``) and the reference (reference_grid.py) for energies over windows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    GAP_FACTOR,
    integrate_view,
    known_gaps_ns,
    median_spacing_s,
    resample_points,
)
from wattlab.analysis.calibration.kernel_fit import MAX_HOLE_FRAC
from wattlab.analysis.calibration.minimise import golden_section
from wattlab.analysis.calibration.reference_grid import ReferenceGrid
from wattlab.analysis.energy import Phase, corrected_energy, phases_from_markers
from wattlab.runfile import EnergyCheck, LengthErrors, PhaseEnergy, Run, SourceView, finite

FloatArray = npt.NDArray[np.float64]
PHASE_LENGTHS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Phase lengths whose energy error a calibration reports (those up to half the run)."""
MAX_LENGTH_WINDOWS = 400


class TargetEnergy:
    """The target's energy over any window, and the shift that matches it to the reference's.

    Its running integral is taken at its own sample times, between which it is linear;
    ``readings_t_s``/``readings`` are its readings as observed (update instants where
    known), from which its power at any time is interpolated.
    """

    def __init__(self, run: Run, view: SourceView, channel: str, *, readings_t_s: FloatArray,
                 readings: FloatArray, ref: ReferenceGrid) -> None:
        self.readings_t_s = readings_t_s
        self.readings = readings
        self.ref = ref
        self._t_s = view.time_ns / 1e9
        self._cum = integrate_view(
            view, [channel], self._t_s, bridges=False,
            known_gaps_ns=known_gaps_ns(run, view.source_id),
            gap_limit_s=GAP_FACTOR * max(median_spacing_s(view), 1e-3))[0]

    def cum_j(self, t: FloatArray) -> FloatArray:
        """The target's running integral at times ``t`` (s)."""
        return np.interp(t, self._t_s, self._cum.integral)

    def power_w(self, t: FloatArray) -> FloatArray:
        """The target's readings interpolated at times ``t`` (s)."""
        return resample_points(self.readings_t_s, self.readings, t, np.inf)

    def delay_fit(self, a_s: float, b_s: float, gain: float, off: float, d0: float) -> float:
        """Shift matching 1 s target energies to the reference's; NaN if [a, b] is too short.

        The energy-window shift d: the target's energy over [a + d, b + d] matches the
        reference's over [a, b]; searched within ±0.3 s of ``d0``.
        """
        ref = self.ref
        win = np.arange(a_s, b_s - 1.0, 0.25)  # overlapping 1 s windows, gap-free reference
        e_ref = ref.integral(win + 1.0) - ref.integral(win)
        e_ref[ref.bad(win, win + 1.0)] = np.nan
        if np.isfinite(e_ref).sum() < 3:
            return math.nan

        def cost(d: float) -> float:
            e_t = self.cum_j(win + 1.0 + d) - self.cum_j(win + d)
            r = (e_t - off) / gain - e_ref
            return float(np.nanmean(r * r))

        return golden_section(cost, d0 - 0.3, d0 + 0.3, xatol=1e-5)


def energy_errors(run: Run, ref: ReferenceGrid, target: TargetEnergy, *,
                  g: tuple[float, float], c: tuple[float, float], d: tuple[float, float],
                  min_phase_s: float) -> EnergyCheck:
    """The calibration record's energy errors: overall, per marked phase, per phase length.

    ``g``, ``c``, ``d``: gain, offset (W) and energy delay (s), each with its standard
    error; the mean errors are over the phases of at least ``min_phase_s``.
    """
    # phases need the reference over [a, b] and the target over [a + d, b + d]
    span = (max(float(ref.edges[0]), float(target.readings_t_s[0]) - d[0]),
            min(float(ref.edges[-1]), float(target.readings_t_s[-1]) - d[0]))
    phases = [p for p in phases_from_markers(run.markers) if p.t1_s - p.t0_s > 0]
    terms: dict[str, Any] = {"target": target, "g": g, "c": c, "d": d, "span": span}
    overall = _phase_errors([Phase("overall", 0, span[0], span[1], "")], ref, **terms)
    per_phase = _phase_errors(phases, ref, **terms)
    by_length = [_length_errors(length, ref, terms) for length in PHASE_LENGTHS_S
                 if length <= (span[1] - span[0]) / 2]
    long = [p for p in per_phase if p.duration_s >= min_phase_s]

    def mean_abs(errors: list[float | None]) -> float | None:
        vals = [abs(e) for e in errors if e is not None]
        return finite(float(np.mean(vals))) if vals else None

    return EnergyCheck(overall[0] if overall else None, per_phase, min_phase_s, len(long),
                       mean_abs([p.error_before_pct for p in long]),
                       mean_abs([p.error_after_pct for p in long]), by_length)


def _phase_errors(
    phases: list[Phase], ref: ReferenceGrid, *, target: TargetEnergy, g: tuple[float, float],
    c: tuple[float, float], d: tuple[float, float], span: tuple[float, float],
) -> list[PhaseEnergy]:
    """Each phase's energy: the reference's, the target's as read and as corrected.

    Phases outside ``span``, or whose reference misses more than ``MAX_HOLE_FRAC``, are
    left out.
    """
    rows = []
    for ph in phases:
        a, b = ph.t0_s, ph.t1_s
        if a < span[0] or b > span[1] or b <= a:
            continue
        aa, bb = np.array([a]), np.array([b])
        if ref.bad(aa, bb, MAX_HOLE_FRAC)[0]:
            continue
        hole = float(ref.hole_s(aa, bb)[0])  # a meter's lost data, bridged by a line
        e_ref = float(np.diff(np.interp([a, b], ref.edges, ref.cum_filled()))[0])
        raw = target.cum_j(np.array([a, b]))
        e_raw = float(raw[1] - raw[0])
        shifted = target.cum_j(np.array([a + d[0], b + d[0]]))
        e_shift = float(shifted[1] - shifted[0])
        e_cor, e_se = corrected_energy(e_shift, b - a, g, c=c, d=d,
                                       p_edges_w=target.power_w(np.array([a + d[0], b + d[0]])))
        rows.append(PhaseEnergy(
            ph.name, int(ph.index), float(a), float(b), float(b - a), finite(e_ref),
            finite(hole), finite(e_raw), finite(e_cor), finite(e_se),
            finite(100 * (e_raw - e_ref) / e_ref) if e_ref else None,
            finite(100 * (e_cor - e_ref) / e_ref) if e_ref else None))
    return rows


def _length_errors(length_s: float, ref: ReferenceGrid, terms: dict[str, Any]) -> LengthErrors:
    """Energy errors of phases of one length, slid over the run (half-overlapping windows).

    Why: what a view observes of the load (its coverage and smoothing) shows as the energy
    error of phases of a given length; a user with 2 s phases needs that number, not the
    whole run's.
    """
    span = terms["span"]
    starts = np.arange(span[0], span[1] - length_s, length_s / 2)
    if starts.size > MAX_LENGTH_WINDOWS:
        starts = starts[np.linspace(0, starts.size - 1, MAX_LENGTH_WINDOWS).astype(np.int64)]
    windows = [Phase("window", i, float(a), float(a) + length_s, "")
               for i, a in enumerate(starts)]
    rows = _phase_errors(windows, ref, **terms)
    before = np.array([r.error_before_pct for r in rows if r.error_before_pct is not None])
    after = np.array([r.error_after_pct for r in rows if r.error_after_pct is not None])

    def rms(x: FloatArray) -> float | None:
        return finite(float(np.sqrt(np.mean(x * x)))) if x.size else None

    return LengthErrors(length_s, int(after.size), rms(before), rms(after),
                        finite(float(np.percentile(np.abs(after), 95))) if after.size else None)
