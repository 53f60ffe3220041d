"""The kernels a driver's reading is modelled with, and their fit to the reference.

Why a module of its own: the model ``target(u) = g · (h * reference)(u − τ) + c`` with a
boxcar or first-order-lag kernel ``h``, and the search for its (τ, width) — a coarse
scan, then Nelder-Mead, on a subset first for a long recording — are what every other
step of a calibration (calibrate.py, fit_uncertainty.py) evaluates again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.calibration.minimise import nelder_mead
from wattlab.analysis.calibration.reference_grid import ReferenceGrid
from wattlab.device_models import first_order_filter

FloatArray = npt.NDArray[np.float64]
MAX_KERNEL_S = 3.0
MAX_HOLE_FRAC = 0.05
"""A kernel window may miss this fraction of reference (a meter's lost data) and still count."""
SEARCH_POINTS = 10_000
"""Readings beyond which the (τ, w) search runs on every k-th reading and a coarser grid
(``SEARCH_RATE_HZ``) and only its result is refined on all readings and the fine grid."""
SEARCH_RATE_HZ = 25.0
SEARCH_XATOL = 1e-3
"""How closely the search locates (τ in s, log w) before the refinement on the full data."""
REFINE_FACTOR = 2.0
"""A kernel whose searched fit is this many times worse than the best one is not refined."""


def _boxcar(ref: ReferenceGrid, x: FloatArray, tau: float, w: float) -> FloatArray:
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


def _first_order(ref: ReferenceGrid, x: FloatArray, tau: float, tc: float) -> FloatArray:
    alpha = math.exp(-ref.step_s / tc)
    means = ref.filled_means()
    y = first_order_filter(means, alpha, 1 - alpha, means[0])
    m = ref.at_ends(y, x - tau)  # y is the filter's output at bin ends
    return np.where(ref.bad(x - tau - 5 * tc, x - tau, MAX_HOLE_FRAC), np.nan, m)


MODELS: dict[str, Callable[[ReferenceGrid, FloatArray, float, float], FloatArray]] = {
    "boxcar": _boxcar,
    "first_order": _first_order,
}
WIDTH_NAME = {"boxcar": "w_s", "first_order": "time_constant_s"}


def linear_fit(m: FloatArray, y: FloatArray) -> tuple[float, float, float, int]:
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


def fit_kernel(kernel: str, ref: ReferenceGrid, x: FloatArray, y: FloatArray, d0: float,
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
        return linear_fit(model(ref, x, tau, w), y)[2]

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


def fit_kernels(kernels: tuple[str, ...], ref: ReferenceGrid, x: FloatArray, y: FloatArray,
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
        return {k: fit_kernel(k, ref, x, y, d0) for k in kernels}
    coarse = ref.decimated(max(1, round(1.0 / (ref.step_s * SEARCH_RATE_HZ))))
    found = {k: fit_kernel(k, coarse, x[::stride], y[::stride], d0, search=True)
             for k in kernels}
    best = min(f[2] for f in found.values())
    fits = {}
    for k, (tau, w, mse) in found.items():
        if mse <= REFINE_FACTOR * best:
            fits[k] = fit_kernel(k, ref, x, y, d0, start=(tau, w),
                                  simplex=(2 * SEARCH_XATOL, 2 * SEARCH_XATOL))
        else:  # its error on all the data, at the searched point
            fits[k] = (tau, w, linear_fit(MODELS[k](ref, x, tau, w), y)[2])
    return fits


@dataclass(frozen=True)
class ChosenKernel:
    """The best-fitting kernel with its (τ, width), and the readings' linear fit to it.

    ``fits``: every kernel's best (tau, width, mse); ``m``: the kernel-seen reference at
    each reading (NaN where its window is not covered, ``ok`` elsewhere); ``gain``,
    ``offset_w``, ``mse`` and ``n``: of y ≈ gain·m + offset; ``resid`` and ``r2``: of that
    fit over the covered readings.
    """

    fits: dict[str, tuple[float, float, float]]
    kernel: str
    tau_s: float
    width_s: float
    m: FloatArray
    ok: npt.NDArray[np.bool_]
    gain: float
    offset_w: float
    mse: float
    n: int
    resid: FloatArray
    r2: float

    @property
    def centroid_s(self) -> float:
        """The kernel's centroid: the effective delay is τ plus this."""
        return self.width_s / 2 if self.kernel == "boxcar" else self.width_s


def choose_kernel(kernels: tuple[str, ...], ref: ReferenceGrid, x: FloatArray, y: FloatArray,
                  d0: float) -> ChosenKernel:
    """The kernel that fits the readings ``y`` at ``x`` best (``d0``: a first delay guess)."""
    fits = fit_kernels(kernels, ref, x, y, d0)
    kernel = min(fits, key=lambda name: fits[name][2])
    tau, width, _ = fits[kernel]
    m = MODELS[kernel](ref, x, tau, width)
    g, c, mse, n = linear_fit(m, y)
    ok = np.isfinite(m)
    resid = y[ok] - g * m[ok] - c
    r2 = 1 - float(resid @ resid) / float(((y[ok] - y[ok].mean()) ** 2).sum())
    return ChosenKernel(fits, kernel, tau, width, m, ok, g, c, mse, n, resid, r2)
