"""Fit how the driver's power reading relates to a reference: lag, smoothing, gain, offset.

Model: ``target(u) = g · (h * reference)(u − τ) + c`` where ``u`` is when the target's value
was last updated (NVML readings are held between ~100 ms updates; each distinct reading is
one observation, evaluated at the instant it appeared). Convention: kernels are *causal*
and start at 0 — a boxcar of width w averages the trailing window [u − τ − w, u − τ], a
first-order lag has time constant T — so τ is the pure delay and the *effective* delay is
τ + the kernel's centroid (w/2 or T). A "part-time" kernel is a boxcar narrower than the
update period: the driver only observes w/P of the time (its *coverage*).

Reference integrals come from a cumulative sum on a fine grid, so τ and w are continuous
parameters (no grid quantisation); g and c are solved by least squares for each (τ, w).
Uncertainties are batch means: the fit is repeated on ``blocks`` consecutive stretches
(for g and c weighted by each block's information, ``batch_means``).
A long recording (more than ``SEARCH_POINTS`` readings) is searched on a subset and a
coarser grid first, then refined on everything (``_fit_kernels``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    GAP_FACTOR,
    Cumulative,
    bin_means,
    estimate_lag,
    grid_edges,
    integrate_view,
    json_safe,
    known_gaps_ns,
    median_spacing_s,
    resample_points,
    resolve,
    span_s,
)
from wattlab.analysis.calibration.batch_means import linear_information, weighted_batch_se
from wattlab.analysis.calibration.identifiability import (
    KernelFit,
    Verdict,
    delay_profile,
    effective_points,
    judge,
    repeating_share,
    width_profile,
)
from wattlab.analysis.calibration.minimise import golden_section, nelder_mead
from wattlab.analysis.calibration.poll_lattice import fit_poll_lattice
from wattlab.analysis.energy import Phase, corrected_energy, phases_from_markers, stream_identity
from wattlab.device_models import first_order_filter
from wattlab.errors import RunFileError, UsageError
from wattlab.runfile import Run, SourceView, StoredCalibration, write_calibration

FloatArray = npt.NDArray[np.float64]
RECORD_FORMAT = "wattlab-calibration/1"
KERNELS = ("boxcar", "first_order")
MAX_KERNEL_S = 3.0
MAX_HOLE_FRAC = 0.05
"""A kernel window may miss this fraction of reference (a meter's lost data) and still count."""
MIN_BLOCK_POINTS = 20
"""Fewest readings per batch-means block; a short run gets fewer blocks (at least 3)."""
SEARCH_POINTS = 10_000
"""Readings beyond which the (τ, w) search runs on every k-th reading and a coarser grid
(``SEARCH_RATE_HZ``) and only its result is refined on all readings and the fine grid."""
SEARCH_RATE_HZ = 25.0
SEARCH_XATOL = 1e-3
"""How closely the search locates (τ in s, log w) before the refinement on the full data."""
REFINE_FACTOR = 2.0
"""A kernel whose searched fit is this many times worse than the best one is not refined."""
MIN_OVERLAP_FACTOR = 3.0
"""Reference and target must overlap this many (max lag + longest kernel) spans."""
PHASE_LENGTHS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Phase lengths whose energy error a calibration reports (those up to half the run)."""
MAX_LENGTH_WINDOWS = 400
CONVENTION = ("causal kernels starting at 0 (a boxcar averages the trailing window "
              "[u-tau-w, u-tau]); tau is the pure delay; effective delay = tau + centroid")


def est(value: float, se: float) -> dict[str, float | None]:
    """A value with its standard error, JSON-safe."""
    def clean(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {"value": clean(value), "se": clean(se)}


@dataclass
class _Ref:
    """The reference as a cumulative integral on a uniform fine grid (NaN bins: its gaps).

    Why a uniform grid: a value at any time is an index computation, not a binary search
    over millions of edges, which is what makes thousands of fit evaluations affordable.
    """

    edges: FloatArray
    cum_j: FloatArray
    cum_hole_s: FloatArray
    means: FloatArray

    def __post_init__(self) -> None:
        self.step_s = float(self.edges[-1] - self.edges[0]) / (self.edges.size - 1)
        self.has_holes = bool(self.cum_hole_s[-1] > 0)
        self._filled: FloatArray | None = None
        self._cum_filled: FloatArray | None = None
        # (value, step to the next edge) side by side: one memory access per lookup; the
        # last edge's row (step 0) serves a time exactly at the end of the grid
        self._cum_pairs = np.zeros((self.cum_j.size, 2))
        self._cum_pairs[:, 0] = self.cum_j
        np.subtract(self.cum_j[1:], self.cum_j[:-1], out=self._cum_pairs[:-1, 1])

    def _index(self, t: FloatArray) -> tuple[npt.NDArray[np.int64], FloatArray]:
        """Grid bin of each time and the fraction of the bin before it (clamped to the grid)."""
        pos = (t - self.edges[0]) / self.step_s
        last = self.edges.size - 1
        if pos.size and (pos.min() < 0 or pos.max() >= last):
            np.clip(pos, 0.0, last, out=pos)
            i = np.minimum(pos.astype(np.int64), last - 1)
        else:
            i = pos.astype(np.int64)
        return i, pos - i

    def at(self, arr: FloatArray, t: FloatArray) -> FloatArray:
        """``arr`` (given at the edges) linearly interpolated at ``t``, held past the ends."""
        i, frac = self._index(t)
        lo = arr[i]
        return np.asarray(lo + frac * (arr[i + 1] - lo), dtype=np.float64)

    def at_ends(self, y: FloatArray, t: FloatArray) -> FloatArray:
        """A series given at bin ends (``y[k]`` at edge k + 1, edge 0 takes ``y[0]``) at ``t``.

        Why not ``at`` on the series with ``y[0]`` prepended: that copies millions of bins
        for the 180 k readings looked up.
        """
        i, frac = self._index(t)
        lo = y[np.maximum(i - 1, 0)]
        return np.asarray(lo + frac * (y[i] - lo), dtype=np.float64)

    def integral(self, t: FloatArray) -> FloatArray:
        i, frac = self._index(t)
        pair = np.take(self._cum_pairs, i, axis=0)
        return np.asarray(pair[:, 0] + frac * pair[:, 1], dtype=np.float64)

    def _integral_at(self, pos: FloatArray) -> FloatArray:
        """The running integral at grid positions 0 ≤ pos ≤ last edge (``pos`` is consumed)."""
        i = pos.astype(np.int64)
        pair = np.take(self._cum_pairs, i, axis=0)
        pos -= i  # the fraction of the bin before each position
        pos *= pair[:, 1]
        pos += pair[:, 0]
        return pos

    def window_means(self, x: FloatArray, tau: float, w: float) -> FloatArray | None:
        """Means over [x − τ − w, x − τ], or None if a window leaves the grid.

        Why: the fits ask this ~1 000 times of every reading; on a grid without holes it
        is positions by one subtraction and scaling, two lookups and no masks (the general
        path costs twice as many passes over the readings).
        """
        end = x - (float(self.edges[0]) + tau)
        end /= self.step_s
        width = w / self.step_s
        if end.size == 0 or end.min() < width or end.max() > self.edges.size - 1:
            return None
        start = end - width
        means = self._integral_at(end)
        means -= self._integral_at(start)
        means /= w
        return means

    def hole_s(self, a: FloatArray, b: FloatArray) -> FloatArray:
        """Seconds of reference gap inside each window [a, b]."""
        if not self.has_holes:
            return np.zeros(np.broadcast(a, b).shape)
        return self.at(self.cum_hole_s, b) - self.at(self.cum_hole_s, a)

    def bad(self, a: FloatArray, b: FloatArray, hole_frac: float = 0.0
            ) -> npt.NDArray[np.bool_]:
        """Windows [a, b] that leave the grid or have more than ``hole_frac`` of gap."""
        outside = (a < self.edges[0]) | (b > self.edges[-1])
        if not self.has_holes:
            return np.asarray(outside, dtype=np.bool_)
        holes = self.hole_s(a, b) > hole_frac * (b - a) + 1e-9
        return np.asarray(outside | holes, dtype=np.bool_)

    def cum_filled(self) -> FloatArray:
        """Running integral with gaps bridged (for energies of windows with small gaps)."""
        if not self.has_holes:
            return self.cum_j
        if self._cum_filled is None:  # once: every phase and sliding window asks for it
            dt = np.diff(self.edges)
            self._cum_filled = np.concatenate(([0.0], np.cumsum(self.filled_means() * dt)))
        return self._cum_filled

    def filled_means(self) -> FloatArray:
        """Bin means with gaps filled by interpolation (only for kernels that need a series)."""
        if self._filled is None:
            ok = np.isfinite(self.means)
            if ok.all():
                self._filled = self.means
            elif not ok.any():
                self._filled = np.zeros(self.means.shape)
            else:
                centres = 0.5 * (self.edges[1:] + self.edges[:-1])
                self._filled = np.asarray(np.interp(centres, centres[ok], self.means[ok]),
                                          dtype=np.float64)
        return self._filled

    def decimated(self, factor: int) -> _Ref:
        """The same reference on a grid ``factor`` times coarser (exact bin means)."""
        cum, hole = self.cum_j[::factor], self.cum_hole_s[::factor]
        edges = self.edges[::factor]
        means = np.diff(cum) / np.diff(edges)
        means[np.diff(hole) > 0] = np.nan
        return _Ref(edges, cum, hole, means)


def _boxcar(ref: _Ref, x: FloatArray, tau: float, w: float) -> FloatArray:
    """Mean over the covered part of each window; NaN where gaps exceed MAX_HOLE_FRAC."""
    if not ref.has_holes:
        fast = ref.window_means(x, tau, w)
        if fast is not None:
            return fast
    a, b = x - tau - w, x - tau
    covered = w - ref.hole_s(a, b) if ref.has_holes else w
    with np.errstate(invalid="ignore", divide="ignore"):
        m = (ref.integral(b) - ref.integral(a)) / covered
    return np.where(ref.bad(a, b, MAX_HOLE_FRAC), np.nan, m)


def _first_order(ref: _Ref, x: FloatArray, tau: float, tc: float) -> FloatArray:
    alpha = math.exp(-ref.step_s / tc)
    means = ref.filled_means()
    y = first_order_filter(means, alpha, 1 - alpha, means[0])
    m = ref.at_ends(y, x - tau)  # y is the filter's output at bin ends
    return np.where(ref.bad(x - tau - 5 * tc, x - tau, MAX_HOLE_FRAC), np.nan, m)


MODELS: dict[str, Callable[[_Ref, FloatArray, float, float], FloatArray]] = {
    "boxcar": _boxcar,
    "first_order": _first_order,
}
WIDTH_NAME = {"boxcar": "w_s", "first_order": "time_constant_s"}


def _linear(m: FloatArray, y: FloatArray) -> tuple[float, float, float, int]:
    """(gain, offset, mean squared residual, n) of y ≈ g·m + c over finite points."""
    ok = np.isfinite(m) & np.isfinite(y)
    n = int(ok.sum())
    if n < 10:
        return math.nan, math.nan, math.inf, n
    mm, yy = (m, y) if n == m.size else (m[ok], y[ok])
    mc, yc = mm - mm.mean(), yy - yy.mean()
    var = _dot(mc, mc)
    if var <= 0:
        return math.nan, math.nan, math.inf, n
    g = _dot(mc, yc) / var
    c = float(yy.mean() - g * mm.mean())
    r = yy - g * mm - c
    return g, c, _dot(r, r) / n, n


def _dot(a: FloatArray, b: FloatArray) -> float:
    """a·b without BLAS, whose threads wait on each other on a busy machine.

    Why: on the shared 2-core machine a BLAS dot of 180 k readings took ~0.6 ms against
    ~0.05 ms here, and each of the ~1 000 fit evaluations takes three.
    """
    return float(np.einsum("i,i->", a, b))


def _fit_kernel(kernel: str, ref: _Ref, x: FloatArray, y: FloatArray, d0: float,
                *, start: tuple[float, float] | None = None, maxiter: int = 400,
                search: bool = False, simplex: tuple[float, float] = (0.01, 0.05)
                ) -> tuple[float, float, float]:
    """Best (tau, width, mse) for one kernel: a coarse scan, then Nelder-Mead in (tau, log w).

    ``search``: stop once (τ, log w) is known to ``SEARCH_XATOL`` (a start for refinement);
    ``simplex``: the first steps in τ and log w from each start.
    """
    model = MODELS[kernel]
    min_w = 2.0 * ref.step_s

    def cost(p: FloatArray) -> float:
        tau, w = float(p[0]), math.exp(float(p[1]))
        if not min_w <= w <= MAX_KERNEL_S:
            return math.inf
        return _linear(model(ref, x, tau, w), y)[2]

    if start is None:
        centroid = 0.5 if kernel == "boxcar" else 1.0
        cands = []
        for w in np.geomspace(min_w, MAX_KERNEL_S, 24):
            for shift in (-0.05, 0.0, 0.05):
                p = np.array([d0 - centroid * w + shift, math.log(w)])
                cands.append((cost(p), p))
        cands.sort(key=lambda c: c[0])
        starts = [c[1] for c in cands[:3]]
    else:
        starts = [np.array([start[0], math.log(start[1])])]
    best = (math.inf, np.array([d0, math.log(min_w)]))
    for p0 in starts:
        x_min, f_min = nelder_mead(
            cost, [p0, p0 + np.array([simplex[0], 0]), p0 + np.array([0, simplex[1]])],
            xatol=SEARCH_XATOL if search else 1e-5, fatol=math.inf if search else 1e-10,
            maxiter=maxiter)
        if f_min < best[0]:
            best = (f_min, x_min)
    return float(best[1][0]), math.exp(float(best[1][1])), best[0]


def _fit_kernels(kernels: tuple[str, ...], ref: _Ref, x: FloatArray, y: FloatArray,
                 d0: float) -> dict[str, tuple[float, float, float]]:
    """Each kernel's best (tau, width, mse); a long recording is searched on a subset first.

    Why: each evaluation is a pass over the readings (and for a first-order lag a filter
    pass over the grid), so a full search over an hour of 50 Hz readings against a 1 kHz
    grid takes tens of seconds. The search on every k-th reading and a ``SEARCH_RATE_HZ``
    grid finds the basin; Nelder-Mead on all readings and the fine grid then refines it to the same
    optimum. A kernel whose searched fit is far worse than the best is not refined.
    """
    stride = math.ceil(x.size / SEARCH_POINTS)
    if stride <= 1:
        return {k: _fit_kernel(k, ref, x, y, d0) for k in kernels}
    coarse = ref.decimated(max(1, round(1.0 / (ref.step_s * SEARCH_RATE_HZ))))
    found = {k: _fit_kernel(k, coarse, x[::stride], y[::stride], d0, search=True)
             for k in kernels}
    best = min(f[2] for f in found.values())
    fits = {}
    for k, (tau, w, mse) in found.items():
        if mse <= REFINE_FACTOR * best:
            fits[k] = _fit_kernel(k, ref, x, y, d0, start=(tau, w),
                                  simplex=(2 * SEARCH_XATOL, 2 * SEARCH_XATOL))
        else:  # its error on all the data, at the searched point
            fits[k] = (tau, w, _linear(MODELS[k](ref, x, tau, w), y)[2])
    return fits


class TargetUpdates(NamedTuple):
    """The distinct readings of a polled stream and how it was polled."""

    t_s: FloatArray  # when each value first appeared
    values: FloatArray
    held: bool  # values were held between polls: the instrument updates less often
    poll_s: float  # median time between polls


def target_updates(view: SourceView, channel: str) -> TargetUpdates:
    """Distinct readings: each value at the time it first appeared, and the poll rhythm.

    ``held``: more than 5 % of the polls repeated the value before; a meter that gives a new
    value at every read repeats one only by chance (a 90 ms poll of a 100 ms update repeats
    ~10 %, a 20 ms poll ~80 %).
    """
    t = view.time_ns.astype(np.float64) / 1e9
    v = view.channel(channel).astype(np.float64)
    ok = np.isfinite(v)
    t, v = t[ok], v[ok]
    if t.size < 20:
        raise RunFileError(f"source {view.source_id!r}: too few readings to calibrate")
    new = np.concatenate(([True], v[1:] != v[:-1]))
    held = float(1 - new.mean()) > 0.05
    return TargetUpdates(t[new], v[new], held, float(np.median(np.diff(t))))


def _lower_envelope(n: FloatArray, y: FloatArray) -> tuple[float, float]:
    """(u0, P) of the line under every point (n, y) with the least total gap above it.

    Poll delays only ever add, so the updates lie on the lower envelope: the line is the
    edge of the lower convex hull above the mean of n (an LP's solution; stalled polls far
    above it do not move it, unlike a least-squares line).
    """
    hull: list[int] = []
    for i in range(n.size):  # monotone chain; n is increasing
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (n[i] - n[a]) >= (y[i] - y[a]) * (n[b] - n[a]):
                hull.pop()  # b is on or above the chord a-i
            else:
                break
        hull.append(i)
    if len(hull) < 2:
        return float(y[0]), 0.0
    mean_n = float(n.mean())
    k = int(np.searchsorted(n[hull], mean_n).clip(1, len(hull) - 1))
    a, b = hull[k - 1], hull[k]
    slope = float((y[b] - y[a]) / (n[b] - n[a]))
    return float(y[a] - slope * n[a]), slope


def update_lattice(x: FloatArray, poll_s: float = 0.0) -> tuple[FloatArray, float, float] | None:
    """The driver's periodic update instants behind the times readings were first seen.

    A reading is first seen at the poll after the driver's update, so first-seen times lag
    the updates by 0..1 poll interval (``poll_s``); if the updates are periodic (readings
    fall on a lattice n·P + u0 with at most one reading per tick), the lattice's lower
    envelope gives the update instants (a reading after a stalled poll keeps its own time,
    or the next update's if that is earlier). Returns (update times, period s, mean poll
    delay s) or None when the readings are not periodic.

    The ticks between two readings are counted step by step from the period, less what the
    poll delay can add: polled well inside the period, two readings 1.8 periods apart are
    two ticks apart; polled at 0.9 of it, they are one tick apart with delays 0.05 and 0.85.
    """
    if x.size < 20:
        return None
    step = np.diff(x)
    # the period: a tick per reading (each update seen once), or the usual step (fast polls;
    # a missed update makes the first too long, slow polls make the second too short)
    p0 = max(float((x[-1] - x[0]) / (x.size - 1)), float(np.median(step)))
    slack = max(0.0, poll_s - 0.5 * p0)  # how much of a step the poll delay may be
    n = np.concatenate(([0.0], np.cumsum(np.maximum(1.0, np.round((step - slack) / p0)))))
    # the first reading shows the value held when recording began, not an update
    u0, period = _lower_envelope(n[1:], x[1:] - x[0])
    u0 += float(x[0])
    delay = x - u0 - n * period
    snap = delay <= max(0.8, 1.05 * poll_s / period) * period  # else a stalled poll
    snap[0] = False
    snap[1:] &= np.diff(n) >= 1
    if snap.mean() < 0.9:
        return None
    u = np.minimum.accumulate(np.where(snap, x - delay, x)[::-1])[::-1]
    return u, period, float(delay[snap].mean())


def _identify(ref: _Ref, x: FloatArray, y: FloatArray, fit: KernelFit, *, kernel: str,
              resid: FloatArray, r2: float, gain: tuple[float, float], period_s: float,
              ref_means: tuple[FloatArray, float]) -> tuple[Verdict, dict[str, Any]]:
    """Profile likelihoods of the width and the effective delay, and the verdict on them.

    A long recording is profiled on every k-th reading and the coarse grid, as it is
    searched (``_fit_kernels``); the misfit's rise is judged with the readings' effective
    count (``effective_points``) either way.
    """
    stride = max(1, math.ceil(x.size / SEARCH_POINTS))
    grid = ref if stride == 1 else ref.decimated(
        max(1, round(1.0 / (ref.step_s * SEARCH_RATE_HZ))))
    xs, ys = x[::stride], y[::stride]
    model = MODELS[kernel]

    def cost(t: float, w: float) -> float:
        return _linear(model(grid, xs, t, w), ys)[2]

    best = cost(fit.tau_s, fit.width_s)
    bounds, n_eff = (2.0 * grid.step_s, MAX_KERNEL_S), effective_points(resid)
    w_prof = width_profile(cost, fit, bounds=bounds, best_mse=best, n_eff=n_eff)
    d_prof = delay_profile(cost, fit, bounds=bounds, best_mse=best, n_eff=n_eff)
    repeat_hz, share = repeating_share(*ref_means)
    verdict = judge(w_prof, d_prof, width_scale_s=max(fit.width_s, period_s), r2=r2,
                    gain=gain[0],
                    gain_se=gain[1], repeat_hz=repeat_hz, repeat_share=share)
    profiles = {"n_eff": n_eff, "load_repeat_hz": repeat_hz, "load_repeat_share": share,
                WIDTH_NAME[kernel]: [w_prof.low, w_prof.high],
                "effective_delay_s": [d_prof.low, d_prof.high],
                "width_connected": w_prof.connected, "delay_connected": d_prof.connected}
    return verdict, profiles


def _held_lattice(view: SourceView, channel: str, first_seen_s: FloatArray, poll_s: float
                  ) -> tuple[FloatArray, float, float, float] | None:
    """(update instants, period, its standard error, mean poll delay) of held readings.

    Polls well inside the update period: the readings' own lattice (``update_lattice``).
    Polls at a similar rate (the default 90 ms against 100 ms updates): the pattern of
    polls that saw nothing new (``fit_poll_lattice``).
    """
    polled = fit_poll_lattice(view.time_ns.astype(np.float64) / 1e9,
                              view.channel(channel).astype(np.float64))
    if polled is not None and polled.update_t_s.size == first_seen_s.size:
        delay = float(np.mean(first_seen_s - polled.update_t_s))
        return polled.update_t_s, polled.period_s, polled.period_se_s, delay
    lattice = update_lattice(first_seen_s, poll_s)
    if lattice is None:
        return None
    updates, period, delay = lattice
    return updates, period, period / math.sqrt(12 * first_seen_s.size), delay


def update_instants(view: SourceView, channel: str) -> tuple[FloatArray, FloatArray, float] | None:
    """(update instants s, readings, period s) of a held stream, or None off a lattice.

    Why: a reading is an exact window integral only at the instant the driver computed it;
    first-seen times add up to a poll of jitter, which a deconvolution cannot tell from power.
    """
    first_seen, values, held, poll_s = target_updates(view, channel)
    lattice = _held_lattice(view, channel, first_seen, poll_s) if held else None
    if lattice is None:
        return None
    return lattice[0], values, lattice[1]


def _ref_grid(run: Run, view: SourceView, channel: str, span: tuple[float, float],
              rate_hz: float) -> tuple[_Ref, Cumulative]:
    """The reference on the fine grid, and its running integral there (one pass)."""
    edges = grid_edges(span[0], span[1], rate_hz)
    cum_raw = integrate_view(view, [channel], edges, bridges=False,
                             known_gaps_ns=known_gaps_ns(run, view.source_id))[0]
    means = bin_means(cum_raw)
    nan = ~np.isfinite(means)
    if not nan.any():  # the running integral itself (fewer arrays of millions of bins)
        start = float(cum_raw.integral[0])  # 0 where the grid starts at the first sample
        cum = cum_raw.integral - start if start else cum_raw.integral
        return _Ref(edges, cum, np.zeros(edges.size), means), cum_raw
    dt = np.diff(edges)
    cum = np.concatenate(([0.0], np.cumsum(np.where(nan, 0.0, means) * dt)))
    cum_hole = np.concatenate(([0.0], np.cumsum(np.where(nan, dt, 0.0))))
    return _Ref(edges, cum, cum_hole, means), cum_raw


def _coarser(cum: Cumulative, edges_s: FloatArray) -> FloatArray:
    """Bin means on a coarser grid from a running integral on a fine one (no re-reading)."""
    return bin_means(Cumulative(edges_s, np.interp(edges_s, cum.times_s, cum.integral),
                                np.interp(edges_s, cum.times_s, cum.uncovered_s), cum.span_s))


def _phase_errors(
    phases: list[Phase], ref: _Ref, *, tgt_cum: Callable[[FloatArray], FloatArray],
    tgt_power: Callable[[FloatArray], FloatArray], g: tuple[float, float],
    c: tuple[float, float], d: tuple[float, float], span: tuple[float, float],
) -> list[dict[str, Any]]:
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
        raw = tgt_cum(np.array([a, b]))
        e_raw = float(raw[1] - raw[0])
        shifted = tgt_cum(np.array([a + d[0], b + d[0]]))
        e_shift = float(shifted[1] - shifted[0])
        e_cor, e_se = corrected_energy(e_shift, b - a, g, c=c, d=d,
                                       p_edges_w=tgt_power(np.array([a + d[0], b + d[0]])))
        rows.append({
            "name": ph.name, "index": ph.index, "t0_s": a, "t1_s": b, "duration_s": b - a,
            "reference_j": e_ref, "reference_gap_s": hole, "target_j": e_raw, "corrected_j": e_cor,
            "corrected_se_j": e_se,
            "error_before_pct": 100 * (e_raw - e_ref) / e_ref if e_ref else None,
            "error_after_pct": 100 * (e_cor - e_ref) / e_ref if e_ref else None,
        })
    return rows


def _length_errors(length_s: float, ref: _Ref, terms: dict[str, Any]) -> dict[str, Any]:
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
    before = np.array([r["error_before_pct"] for r in rows if r["error_before_pct"] is not None])
    after = np.array([r["error_after_pct"] for r in rows if r["error_after_pct"] is not None])

    def rms(x: FloatArray) -> float | None:
        return float(np.sqrt(np.mean(x * x))) if x.size else None

    return {"length_s": length_s, "windows": int(after.size), "rms_error_before_pct": rms(before),
            "rms_error_after_pct": rms(after),
            "p95_abs_error_after_pct": float(np.percentile(np.abs(after), 95)) if after.size
            else None}


def calibrate(
    run: Run,
    reference: str,
    target: str,
    *,
    grid_rate_hz: float = 1000.0,
    blocks: int = 8,
    max_lag_s: float = 2.0,
    kernels: tuple[str, ...] = KERNELS,
    min_phase_s: float = 2.0,
    update_times: str = "auto",
) -> dict[str, Any]:
    """Fit ``target`` (e.g. ``gpu0.power:average_power_w``) against ``reference``.

    Returns a calibration record (JSON-safe dict): kernel, τ, width, gain, offset with
    standard errors, fit residual, update period and coverage, power-dependent gain test,
    and energy error before/after correction overall and per phase. ``update_times``:
    held readings are observed at their driver update instants when these are periodic
    (``auto``; see ``update_lattice``), or always (``lattice``) / never (``first_seen``).
    """
    for kern in kernels:
        if kern not in MODELS:
            raise UsageError(f"unknown kernel {kern!r}; kernels are {sorted(MODELS)}")
    ref_view, ref_ch = resolve(run, reference)
    tgt_view, tgt_ch = resolve(run, target)
    r0, r1 = span_s(ref_view)
    if update_times not in ("auto", "lattice", "first_seen"):
        raise UsageError(f"update_times {update_times!r}: use auto, lattice or first_seen")
    x_all, y_all, held, poll_s = target_updates(tgt_view, tgt_ch)
    period = float(np.median(np.diff(x_all)))
    lattice = (_held_lattice(tgt_view, tgt_ch, x_all, poll_s)
               if held and update_times != "first_seen" else None)
    if lattice is None and update_times == "lattice":
        raise UsageError(f"{target}: readings are not on a periodic update lattice")
    poll_delay, period_se = math.nan, math.nan
    if lattice is not None:
        x_all, period, period_se, poll_delay = lattice
    t0 = max(r0, float(x_all[0]) - max_lag_s - MAX_KERNEL_S)
    t1 = min(r1, float(x_all[-1]) + max_lag_s)
    if t1 - t0 < MIN_OVERLAP_FACTOR * (max_lag_s + MAX_KERNEL_S):
        raise UsageError(f"{run.path}: {reference} and {target} overlap for only "
                         f"{max(t1 - t0, 0):.1f} s; calibration needs "
                         f"{MIN_OVERLAP_FACTOR * (max_lag_s + MAX_KERNEL_S):.0f} s")
    ref, ref_cum = _ref_grid(run, ref_view, ref_ch, (t0, t1), grid_rate_hz)
    core = (x_all >= t0 + max_lag_s + MAX_KERNEL_S) & (x_all <= t1 - max_lag_s)
    x, y = x_all[core], y_all[core]
    # first guess of the effective delay by cross-correlation on a 100 Hz grid
    coarse = min(100.0, grid_rate_hz)
    c_edges = grid_edges(t0, t1, coarse)
    c_ref = _coarser(ref_cum, c_edges)
    del ref_cum
    c_tgt = resample_points(x_all, y_all, 0.5 * (c_edges[1:] + c_edges[:-1]),
                            GAP_FACTOR * max(period, 1e-3))
    lag = estimate_lag(c_ref, c_tgt, coarse, max_lag_s=max_lag_s)

    fits = _fit_kernels(kernels, ref, x, y, lag.lag_s)
    kernel = min(fits, key=lambda name: fits[name][2])
    tau, width, mse = fits[kernel]
    model = MODELS[kernel]
    m = model(ref, x, tau, width)
    g, c, mse, n = _linear(m, y)
    ok = np.isfinite(m)
    resid = y[ok] - g * m[ok] - c
    r2 = 1 - float(resid @ resid) / float(((y[ok] - y[ok].mean()) ** 2).sum())

    # energy-window shift d: the target's energy over [a+d, b+d] matches the reference's
    # at the target's own sample times: between them the running integral is linear
    tgt_t = tgt_view.time_ns / 1e9
    tgt_c = integrate_view(tgt_view, [tgt_ch], tgt_t, bridges=False,
                           known_gaps_ns=known_gaps_ns(run, tgt_view.source_id),
                           gap_limit_s=GAP_FACTOR * max(median_spacing_s(tgt_view), 1e-3))[0]

    def tgt_cum(t: FloatArray) -> FloatArray:
        return np.interp(t, tgt_t, tgt_c.integral)

    def tgt_power(t: FloatArray) -> FloatArray:
        return resample_points(x_all, y_all, t, np.inf)

    centroid = width / 2 if kernel == "boxcar" else width
    lo_x, hi_x = float(x[0]), float(x[-1])

    def delay_fit(a_s: float, b_s: float, gain: float, off: float, d0: float) -> float:
        """Shift matching 1 s target energies to the reference's; NaN if [a, b] is too short."""
        win = np.arange(a_s, b_s - 1.0, 0.25)  # overlapping 1 s windows, gap-free reference
        e_ref = ref.integral(win + 1.0) - ref.integral(win)
        e_ref[ref.bad(win, win + 1.0)] = np.nan
        if np.isfinite(e_ref).sum() < 3:
            return math.nan

        def cost(d: float) -> float:
            e_t = tgt_cum(win + 1.0 + d) - tgt_cum(win + d)
            r = (e_t - off) / gain - e_ref
            return float(np.nanmean(r * r))

        return golden_section(cost, d0 - 0.3, d0 + 0.3, xatol=1e-5)

    # the target must cover every shifted window [a + d, b + d] (d within ±0.3 s of d0)
    tgt_end = float(x_all[-1]) - tau - centroid - 0.35
    d_energy = delay_fit(lo_x, min(hi_x, tgt_end), g, c, tau + centroid)
    if not math.isfinite(d_energy):
        d_energy = tau + centroid

    # batch means: refit on consecutive blocks; for a long recording on every k-th reading
    # (and, for a first-order lag, whose filter runs over the whole grid, a grid of ~T/10)
    per_block: list[tuple[float, float, float, float, float, float]] = []
    block_info: list[tuple[float, float]] = []  # each block's say on g and c
    blocks = max(3, min(blocks, x.size // MIN_BLOCK_POINTS))
    bounds = np.linspace(lo_x, hi_x, blocks + 1)
    long_run = x.size > SEARCH_POINTS
    block_ref = ref.decimated(int(np.clip(round(0.1 * width / ref.step_s), 1, round(
        1 / (ref.step_s * SEARCH_RATE_HZ))))) if long_run and kernel != "boxcar" else ref
    per_block_points = max(MIN_BLOCK_POINTS, SEARCH_POINTS // blocks)
    for k in range(blocks):
        sel = np.flatnonzero((x >= bounds[k]) & (x < bounds[k + 1]))
        if long_run:
            sel = sel[::max(1, sel.size // per_block_points)]
        if sel.size < MIN_BLOCK_POINTS:
            continue
        bt, bw, _ = _fit_kernel(kernel, block_ref, x[sel], y[sel], tau + centroid,
                                start=(tau, width), maxiter=200)
        block_m = model(block_ref, x[sel], bt, bw)
        bg, bc, _, _ = _linear(block_m, y[sel])
        block_info.append(linear_information(block_m, y[sel]))
        bd = delay_fit(bounds[k], min(bounds[k + 1], tgt_end), bg, bc, d_energy)
        per_block.append((bt, bw, bg, bc, bt + (bw / 2 if kernel == "boxcar" else bw), bd))
    arr = np.array(per_block) if per_block else np.full((1, 6), np.nan)
    n_ok = np.isfinite(arr).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se_b = np.where(n_ok > 2, np.nanstd(np.where(n_ok > 2, arr, 0.0), axis=0, ddof=1)
                        / np.sqrt(np.maximum(n_ok, 1)), np.nan)
    # residual-based floor for g and c (inflated for autocorrelation: ~1 s correlated)
    mc = m[ok] - m[ok].mean()
    n_eff = max(2.0, (hi_x - lo_x) / max(width, period, 1e-3))
    sigma = math.sqrt(mse)
    se_g_res = sigma / math.sqrt(float(mc @ mc) / n * n_eff) if mc.size else math.nan
    se_c_res = math.sqrt(sigma**2 / n_eff + (m[ok].mean() * se_g_res) ** 2)
    se = dict(zip(("tau", "w", "g", "c", "eff", "d"), se_b.tolist(), strict=True))
    info = np.array(block_info) if block_info else np.full((1, 2), np.nan)  # as ``arr``
    se["g"] = float(np.nanmax([weighted_batch_se(arr[:, 2], info[:, 0]), se_g_res]))
    se["c"] = float(np.nanmax([weighted_batch_se(arr[:, 3], info[:, 1]), se_c_res]))
    verdict, profiles = _identify(
        ref, x, y, KernelFit(tau, width, centroid / width), kernel=kernel, resid=resid, r2=r2,
        gain=(g, se["g"]), period_s=period, ref_means=(c_ref, 1.0 / coarse))
    # where the data cannot pin a parameter, its uncertainty says so (batch means cannot)
    se["w"] = float(np.nanmax([se["w"], verdict.se_floor["w"]]))
    se["eff"] = float(np.nanmax([se["eff"], verdict.se_floor["eff"]]))
    se["tau"] = float(np.nanmax([se["tau"], math.hypot(verdict.se_floor["eff"],
                                                       centroid / width * se["w"])]))

    # power-dependent gain: y = g0·m + g1·m·(m − m̄)/m̄ + c
    mbar = float(m[ok].mean())
    design = np.column_stack([m[ok], m[ok] * (m[ok] - mbar) / mbar, np.ones(ok.sum())])
    coef, *_ = np.linalg.lstsq(design, y[ok], rcond=None)
    r_q = y[ok] - design @ coef
    mse_q = float(r_q @ r_q) / ok.sum()
    slopes = []
    for k in range(blocks):
        sel = (x[ok] >= bounds[k]) & (x[ok] < bounds[k + 1])
        if sel.sum() >= MIN_BLOCK_POINTS:
            cb, *_ = np.linalg.lstsq(design[sel], y[ok][sel], rcond=None)
            slopes.append(cb[1])
    slope_se = float(np.std(slopes, ddof=1) / math.sqrt(len(slopes))) if len(slopes) > 2 \
        else math.nan
    warranted = bool(abs(coef[1]) > 3 * slope_se and mse_q < 0.98 * mse)

    g_e, c_e, d_e = (g, se["g"]), (c, se["c"]), (d_energy, se["d"])
    # phases need the reference over [a, b] and the target over [a + d, b + d]
    span = (max(float(ref.edges[0]), float(x_all[0]) - d_energy),
            min(float(ref.edges[-1]), float(x_all[-1]) - d_energy))
    phases = [p for p in phases_from_markers(run.markers) if p.t1_s - p.t0_s > 0]
    terms: dict[str, Any] = {"tgt_cum": tgt_cum, "tgt_power": tgt_power, "g": g_e, "c": c_e,
                             "d": d_e, "span": span}
    overall = _phase_errors([Phase("overall", 0, span[0], span[1], "")], ref, **terms)
    per_phase = _phase_errors(phases, ref, **terms)
    by_length = [_length_errors(length, ref, terms) for length in PHASE_LENGTHS_S
                 if length <= (span[1] - span[0]) / 2]
    long = [p for p in per_phase if p["duration_s"] >= min_phase_s]

    def mean_abs(key: str) -> float | None:
        vals = [abs(p[key]) for p in long if p[key] is not None]
        return float(np.mean(vals)) if vals else None

    held_coverage = min(1.0, width / period) if kernel == "boxcar" else 1.0
    name = "part_time" if kernel == "boxcar" and width < 0.9 * period else kernel
    ident = stream_identity(tgt_view, tgt_ch)
    return json_safe({
        "format": RECORD_FORMAT,
        "key": ident,
        "target": {"source": tgt_view.source_id, "channel": tgt_ch,
                   "unit": tgt_view.unit(tgt_ch)},
        "reference": {"source": ref_view.source_id, "channel": ref_ch,
                      "model": ref_view.model, "kind": ref_view.kind},
        "run": run.path,
        "created": datetime.now(UTC).isoformat(),
        "convention": CONVENTION,
        "kernel": name,
        "params": {
            "tau_s": est(tau, se["tau"]),
            WIDTH_NAME[kernel]: est(width, se["w"]),
            "gain": est(g, se["g"]),
            "offset_w": est(c, se["c"]),
        },
        "effective_delay_s": est(tau + centroid, se["eff"]),
        "energy_delay_s": est(d_energy, se["d"]),
        "cross_correlation_lag": lag.to_json(),
        "identifiable": verdict.identifiable,
        "warnings": verdict.warnings,
        "advice": verdict.advice,
        "profiles": profiles,
        "update_period_s": period,
        "update_period_se_s": period_se,
        "held_readings": held,
        "update_times": "lattice" if lattice is not None else "first_seen",
        "poll_delay_s": poll_delay,
        "coverage": held_coverage,
        "fit": {"rmse_w": math.sqrt(mse), "r2": r2, "n_points": n,
                "grid_rate_hz": grid_rate_hz, "blocks": len(per_block)},
        "kernels": {name: {"rmse_w": math.sqrt(v[2]), "tau_s": v[0], WIDTH_NAME[name]: v[1]}
                    for name, v in fits.items()},
        "power_dependent_gain": {
            "slope": est(float(coef[1]), slope_se),
            "meaning": "gain = g0 + slope * (P - mean P) / mean P",
            "rmse_w": math.sqrt(mse_q),
            "warranted": warranted,
        },
        "energy": {
            "overall": overall[0] if overall else None,
            "phases": per_phase,
            "min_phase_s": min_phase_s,
            "phases_considered": len(long),
            "mean_abs_error_before_pct": mean_abs("error_before_pct"),
            "mean_abs_error_after_pct": mean_abs("error_after_pct"),
            "by_length": by_length,
        },
    })


# --------------------------------------------------------------------------- records


def store_in_run(path: str, record: dict[str, Any]) -> str:
    """Write the record under /analysis/calibration/<source>:<channel> (raw data untouched).

    Needs the recorder to have closed the file; a record of the same stream is replaced.
    """
    target = record["target"]
    pinned = {name: v["value"] for name, v in record["params"].items() if v["value"] is not None}
    return write_calibration(path, StoredCalibration(
        target["source"], target["channel"], record["kernel"],
        bool(record.get("identifiable", True)), pinned, record), hint=" (or use --no-store)")


def load_record(path: str, *, force: bool = False) -> dict[str, Any]:
    """A calibration record from JSON (checked for the fields energy correction needs).

    A record whose data could not pin the kernel is refused unless ``force``: applying it
    would correct energy with numbers the recording could not tell.
    """
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not a readable calibration JSON ({e})") from e
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise UsageError(f"{path}: not a wattlab calibration record ({RECORD_FORMAT})")
    for key in ("gain", "offset_w"):
        if record.get("params", {}).get(key, {}).get("value") is None:
            raise UsageError(f"{path}: calibration record lacks params.{key}")
    if record.get("energy_delay_s", {}).get("value") is None:
        raise UsageError(f"{path}: calibration record lacks energy_delay_s")
    if record.get("identifiable") is False and not force:
        reasons = "; ".join(record.get("warnings", [])) or "no reason recorded"
        raise UsageError(f"{path}: this calibration is not identifiable ({reasons}); "
                         f"{record.get('advice') or 'record a richer load'}, or pass "
                         "--force-calibration to apply it anyway")
    return record
