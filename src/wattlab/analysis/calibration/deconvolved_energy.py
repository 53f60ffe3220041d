"""Phase energy by deconvolving NVML's window readings on their update lattice.

Why: the 1 s average is, up to gain and offset, the mean true power over a window of known
width ending at a known time (its update instant less the pure delay τ), and readings one
update apart share all but one update period of it: their difference is the slice that
entered minus the slice that left. Shifting the stream by its delay and rescaling it
(``energy.corrected_energy``) leaves every phase edge smeared over the whole window, 5-25 %
on 2 s holds. Here the power on a grid a fraction of the update period fine is solved from
all the overlapping windows at once, by least squares, together with the instant reading's
short windows where its record is given. A weak prior that neighbouring bins differ by
``SMOOTH_W`` rms pins what no window tells (a pattern repeating with the window's width) and
what happens inside a bin. Phase energy is the sum of the bins it covers; its uncertainty is
the fit's posterior covariance, scaled by the readings' scatter about the fit, plus the
record's gain, offset and delay errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
from scipy.linalg import cho_solve_banded, cholesky_banded

from wattlab.analysis.calibration.stream_calibration import target_updates, update_instants
from wattlab.analysis.energy import correction_terms, phases_from_markers
from wattlab.errors import UsageError
from wattlab.runfile import CalibrationRecord, Run

FloatArray = npt.NDArray[np.float64]
BINS_PER_UPDATE = 5
"""Grid bins per update period: 20 ms on an H100, the 50 Hz sample buffer's own step."""
SMOOTH_W = 150.0
"""Prior rms change of power between neighbouring bins, W (a step from idle to full load
is ~4 of these, so real edges pass; a window-periodic pattern over a whole run does not)."""
BREAK_W = 3000.0
"""Prior rms step across a break (a phase mark), W: more than any step a GPU makes, so a
step is free there; finite, so bins an update slice cannot tell apart stay pinned."""
WINDOW_KERNELS = ("boxcar", "part_time")


@dataclass(frozen=True)
class Windows:
    """One NVML view's readings as means of true power over known windows."""

    name: str
    end_s: FloatArray  # each window's end: update instant − τ
    width_s: float
    power_w: FloatArray  # (reading − offset) / gain
    gain: tuple[float, float]
    offset_w: tuple[float, float]
    delay_se_s: float
    disagreement_w: float = 0.0  # rms of the record's readings about its fit to the reference


def mark_breaks(run: Run) -> FloatArray:
    """Every begin and end of the run's marked phases, s: where its power likely steps."""
    phases = phases_from_markers(run.markers)
    return np.unique(np.array([t for p in phases for t in (p.t0_s, p.t1_s)], dtype=np.float64))


def windows_from_record(run: Run, record: CalibrationRecord, *, force: bool = False
                        ) -> Windows:
    """A calibrated view of ``run`` as window means; refuses what is not one.

    Needs a boxcar (or part-time) kernel, an identifiable record, and readings on a periodic
    update lattice with a record fitted on it. Without the lattice a reading's window is
    known only to a poll interval and the fit turns that jitter into power; ``force`` takes
    first-seen times then (and an unidentifiable record), and the scatter about the fit
    widens every uncertainty accordingly.
    """
    where = record.where
    if record.kernel not in WINDOW_KERNELS:
        raise UsageError(f"{where}: the calibration's kernel is {record.kernel!r}, not "
                         "a window (boxcar); energy cannot be deconvolved from it")
    if not record.verdict.identifiable and not force:
        reasons = "; ".join(record.verdict.warnings) or "no reason recorded"
        raise UsageError(f"{where}: the calibration is not identifiable ({reasons}); the "
                         "windows to deconvolve are not known (--force-calibration: anyway)")
    view = run.source(record.target.source)
    channel = record.target.channel
    if record.update_times == "lattice":
        found = update_instants(view, channel)
        if found is None:
            raise UsageError(f"{where}: readings in {run.path} are not on a periodic update "
                             "lattice, so no reading's window is known")
        times_s, values = found[0], found[1]
    elif force:
        times_s, values = target_updates(view, channel)[:2]
    else:
        raise UsageError(f"{where}: the calibration was fitted on first-seen times, not on "
                         "the driver's update lattice, so each window is known only to a poll "
                         "interval (record with the default polls, faster than the updates; "
                         "--force-calibration: deconvolve anyway)")
    p = record.params
    gain, offset, _ = correction_terms(record)
    eff_se = record.effective_delay_s.se
    rmse = record.fit.rmse_w
    return Windows(where, times_s - float(cast(float, p.tau_s.value)),
                   float(cast(float, p.width.value)),
                   (values - offset[0]) / gain[0], gain, offset,
                   float(eff_se) if eff_se is not None else math.nan,
                   float(rmse) / gain[0] if rmse is not None and math.isfinite(rmse) else 0.0)


@dataclass
class Fusion:
    """True power on a grid recovered from window readings, and its posterior covariance."""

    edges_s: FloatArray
    power_w: FloatArray
    factor: FloatArray  # upper banded Cholesky factor of the posterior precision
    sigma_w: dict[str, float]  # each view's rms scatter about the fit
    main: Windows  # the view whose gain, offset and delay errors phase energies carry
    views: list[str]
    break_lag_s: float | None = None  # where the breaks sat after their marks (None: none)

    def describe(self) -> str:
        """One line for a report: what was deconvolved, on what grid, how well it fits."""
        step_ms = 1e3 * float(self.edges_s[1] - self.edges_s[0])
        fits = ", ".join(f"{name} {s:.2f} W rms" for name, s in self.sigma_w.items())
        breaks = ("" if self.break_lag_s is None else
                  f"; free steps at the marks, {1e3 * self.break_lag_s:+.1f} ms after them")
        return (f"{self.main.name}: energy deconvolved on a {step_ms:.0f} ms grid from "
                f"{' + '.join(self.views)} (scatter about the fit: {fits}{breaks})")

    def _weights(self, t0_s: float, t1_s: float) -> FloatArray:
        """Seconds of each bin inside [t0, t1]."""
        lo = np.clip(self.edges_s[:-1], t0_s, t1_s)
        hi = np.clip(self.edges_s[1:], t0_s, t1_s)
        return np.asarray(hi - lo, dtype=np.float64)

    def covers(self, t0_s: float, t1_s: float) -> bool:
        return bool(self.edges_s[0] <= t0_s < t1_s <= self.edges_s[-1])

    def energy_j(self, t0_s: float, t1_s: float) -> tuple[float, float]:
        """(energy J, standard error J) over [t0, t1]; NaN outside the recovered span."""
        if not self.covers(t0_s, t1_s):
            return math.nan, math.nan
        e = self._weights(t0_s, t1_s)
        energy = float(e @ self.power_w)
        var_fit = float(e @ cho_solve_banded((self.factor, False), e))
        m = self.main
        edges = np.searchsorted(self.edges_s, [t0_s, t1_s], side="right") - 1
        step_w = float(np.diff(self.power_w[np.clip(edges, 0, self.power_w.size - 1)])[0])
        delay = step_w * m.delay_se_s if math.isfinite(m.delay_se_s) else 0.0
        # the record's readings scatter about its reference by ``disagreement_w`` over each
        # window, independently from one window to the next: that much of the phase's
        # energy no deconvolution can take from the readings (exact spans included)
        span = t1_s - t0_s
        var = (var_fit + (energy * m.gain[1] / m.gain[0]) ** 2
               + (span * m.offset_w[1] / m.gain[0]) ** 2 + delay**2
               + m.disagreement_w**2 * m.width_s * span)
        return energy, math.sqrt(var)


def _grid(t0_s: float, t1_s: float, step_s: float, breaks_s: FloatArray
          ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Bin edges every ``step_s`` over [t0, t1], and which are breaks.

    Each break inside is an edge of its own; a regular edge closer than a quarter step to
    one gives way, so no bin is a sliver.
    """
    regular = t0_s + step_s * np.arange(math.ceil((t1_s - t0_s) / step_s) + 1)
    inside = np.unique(breaks_s[(breaks_s > regular[0]) & (breaks_s < regular[-1])])
    if inside.size:
        near = np.abs(regular[:, None] - inside[None, :]).min(axis=1) < step_s / 4
        near[[0, -1]] = False
        regular = regular[~near]
    edges = np.union1d(regular, inside)
    return np.asarray(edges, dtype=np.float64), np.isin(edges, inside)


def _rows(win: Windows, edges_s: FloatArray) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """(first bin, weights) of each reading: the share of its window in each bin it touches."""
    start = win.end_s - win.width_s
    first = np.searchsorted(edges_s, start, side="right") - 1
    last = np.searchsorted(edges_s, win.end_s, side="left") - 1
    cols = first[:, None] + np.arange(int((last - first).max()) + 1)[None, :]
    cols = np.minimum(cols, edges_s.size - 2)
    lo = np.maximum(edges_s[cols], start[:, None])
    hi = np.minimum(edges_s[cols + 1], win.end_s[:, None])
    w = np.where(cols <= last[:, None], np.maximum(hi - lo, 0.0), 0.0) / win.width_s
    return first, w


def fuse_records(run: Run, records: list[CalibrationRecord], *, force: bool = False,
                 smooth_w: float = SMOOTH_W, breaks_s: npt.ArrayLike = (),
                 break_lag_s: float | None = None) -> Fusion:
    """The fusion of ``run``'s streams that ``records`` calibrate (the first one leads).

    Why the first leads: the 1 s average covers all the time and carries the energy; an
    instant reading's short windows (~25 % of the time) place edges inside its update period.
    ``breaks_s``: the phase marks, where the power may step (``fuse``).
    """
    if not records:
        raise UsageError("deconvolution needs a calibration record")
    views = [windows_from_record(run, r, force=force) for r in records]
    if len({v.name for v in views}) < len(views):
        raise UsageError("two calibration records of the same stream; give each stream once")
    return fuse(views, period_s=float(records[0].update_period_s), smooth_w=smooth_w,
                breaks_s=breaks_s, break_lag_s=break_lag_s)


@dataclass
class _Problem:
    """The least-squares system on one grid: each view's rows and each edge's prior."""

    edges_s: FloatArray
    rows: list[tuple[npt.NDArray[np.int64], FloatArray]]
    prior: FloatArray  # inverse prior variance of the step across each inner edge, 1/W²


def _problem(views: list[Windows], span: tuple[float, float, float], breaks_s: FloatArray,
             prior_w: tuple[float, float]) -> _Problem:
    """The system on the grid ``span`` (t0, t1, step) with ``breaks_s`` as edges.

    The prior allows ``prior_w`` = (smooth, break) rms W across a regular edge and a break.
    """
    edges, is_break = _grid(*span, breaks_s)
    prior = np.where(is_break[1:-1], 1.0 / prior_w[1] ** 2, 1.0 / prior_w[0] ** 2)
    return _Problem(edges, [_rows(v, edges) for v in views], prior)


def _solve(views: list[Windows], pb: _Problem, sigma: dict[str, float]
           ) -> tuple[FloatArray, FloatArray, float]:
    """(power per bin, banded Cholesky factor, cost: weighted misfit plus prior)."""
    n = pb.edges_s.size - 1
    band = max(w.shape[1] for _, w in pb.rows)
    ab = np.zeros((band, n))  # upper form: ab[band-1+i-j, j] = N[i, j]
    rhs = np.zeros(n)
    for v, (first, w) in zip(views, pb.rows, strict=True):
        s2 = sigma[v.name] ** 2
        cols = np.minimum(first[:, None] + np.arange(w.shape[1]), n - 1)
        rhs += np.bincount(cols.ravel(), (w * v.power_w[:, None]).ravel() / s2, n)
        for d in range(w.shape[1]):
            prod = (w[:, : w.shape[1] - d] * w[:, d:]).ravel() / s2
            ab[band - 1 - d] += np.bincount(cols[:, d:].ravel(), prod, n)
    ab[band - 1, :-1] += pb.prior
    ab[band - 1, 1:] += pb.prior
    ab[band - 2, 1:] -= pb.prior
    factor = cholesky_banded(ab, lower=False)
    x = cho_solve_banded((factor, False), rhs)
    misfit = sum(float(np.sum(r**2)) / sigma[v.name] ** 2
                 for v, r in zip(views, _residuals(views, pb, x), strict=True))
    return x, factor, misfit + float(np.sum(pb.prior * np.diff(x) ** 2))


def _residuals(views: list[Windows], pb: _Problem, x: FloatArray) -> list[FloatArray]:
    """Each view's readings less what the power ``x`` predicts for them."""
    out = []
    for v, (first, w) in zip(views, pb.rows, strict=True):
        cols = np.minimum(first[:, None] + np.arange(w.shape[1]), x.size - 1)
        out.append(v.power_w - (w * x[cols]).sum(axis=1))
    return out


def _scatter(views: list[Windows], pb: _Problem, x: FloatArray) -> dict[str, float]:
    """Each view's rms residual about the fit ``x``."""
    return {v.name: max(float(np.sqrt(np.mean(r**2))), 1e-3)
            for v, r in zip(views, _residuals(views, pb, x), strict=True)}



def _break_lag(views: list[Windows], span: tuple[float, float, float], marks_s: FloatArray,
               sigma: dict[str, float], *, prior_w: tuple[float, float]) -> float:
    """How long after its mark each break lies: the lag whose fit costs least.

    Searched within ±2.5 bins (half an update period on the default grid), to an eighth of
    a bin.

    Why: a mark is stamped by the host or a CUDA event, the reference's power steps some ms
    later (the GPU's response, the reference's own sampling); a break placed off the step
    makes the prior pay for the step beside it, so the cost's minimum finds the lag.
    """
    def cost(lag_s: float) -> float:
        return _solve(views, _problem(views, span, marks_s + lag_s, prior_w), sigma)[2]

    coarse = np.arange(-2.5, 2.51, 0.5) * span[2]
    best = float(coarse[int(np.argmin([cost(g) for g in coarse]))])
    fine = best + np.arange(-2, 3) * 0.125 * span[2]
    return float(fine[int(np.argmin([cost(g) for g in fine]))])


def fuse(views: list[Windows], *, period_s: float, bins_per_update: int = BINS_PER_UPDATE,
         smooth_w: float = SMOOTH_W, breaks_s: npt.ArrayLike = (),
         break_lag_s: float | None = None, break_w: float = BREAK_W) -> Fusion:
    """Least-squares power on a grid from every view's windows (the first view leads).

    Each view is weighted by its own scatter about the fit (a first pass with 1 W for the
    average and 20 W for the rest, then each view's residual rms). ``breaks_s``: instants
    where the power may step (phase marks); each becomes a bin edge across which the prior
    allows ``break_w``, after ``break_lag_s`` (None: the lag that fits best, ``_break_lag``).
    """
    if not views or any(v.end_s.size < 20 for v in views):
        raise UsageError("deconvolution needs at least 20 readings of each view")
    if not (period_s > 0 and math.isfinite(period_s)):
        raise UsageError(f"update period {period_s!r}: the lattice is not known")
    step = period_s / bins_per_update
    # one update period past the windows at each end: a phase at the stream's own ends is
    # covered, by the prior alone, and its variance says so
    span = (min(float((v.end_s - v.width_s).min()) for v in views) - period_s,
            max(float(v.end_s.max()) for v in views) + period_s, step)
    marks = np.asarray(breaks_s, dtype=np.float64).ravel()
    sigma = {v.name: (1.0 if i == 0 else 20.0) for i, v in enumerate(views)}
    prior_w = (smooth_w, break_w)
    plain = _problem(views, span, marks[:0], prior_w)
    sigma = _scatter(views, plain, _solve(views, plain, sigma)[0])
    lag = None
    if marks.size:
        lag = (_break_lag(views, span, marks, sigma, prior_w=prior_w)
               if break_lag_s is None else break_lag_s)
        pb = _problem(views, span, marks + lag, prior_w)
        sigma = _scatter(views, pb, _solve(views, pb, sigma)[0])
    else:
        pb = plain
    x, factor, _ = _solve(views, pb, sigma)
    return Fusion(pb.edges_s, x, factor, sigma, views[0], [v.name for v in views], lag)
