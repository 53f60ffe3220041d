"""Derivative-free minimisers for the calibration fit: Nelder-Mead and a bounded scalar search.

Why not ``scipy.optimize``: importing it costs about half a second, a large share of
``wattlab calibrate`` on a long recording, and the fit needs only these two plain methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0
"""1/φ ≈ 0.618: the golden-section step keeps one inner point for the next bracket."""


def nelder_mead(f: Callable[[FloatArray], float], simplex: Sequence[npt.ArrayLike], *,
                xatol: float, fatol: float, maxiter: int) -> tuple[FloatArray, float]:
    """The point of ``simplex`` (n + 1 vertices in n dimensions) that the simplex moves to.

    Standard Nelder-Mead (reflection 1, expansion 2, contraction ½, shrink ½). Stops when
    every vertex is within ``xatol`` (each coordinate) of the best and every value within
    ``fatol`` of the best value, or after ``maxiter`` iterations. ``f`` may return ``inf``
    (a point outside the allowed region). Returns (best vertex, its value).
    """
    sim = np.array([np.asarray(v, dtype=np.float64) for v in simplex])
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1] + 1:
        raise ValueError(f"a simplex in n dimensions has n + 1 vertices, not shape {sim.shape}")
    fs = np.array([f(v) for v in sim])
    for _ in range(maxiter):
        order = np.argsort(fs, kind="stable")
        sim, fs = sim[order], fs[order]
        # sorted: the spread of values is worst - best (Python floats: inf - inf is NaN,
        # not converged, without a numpy warning)
        if (np.max(np.abs(sim[1:] - sim[0])) <= xatol
                and float(fs[-1]) - float(fs[0]) <= fatol):
            break
        centroid = sim[:-1].mean(axis=0)
        away = centroid - sim[-1]
        xr = centroid + away
        fr = f(xr)
        if fr < fs[0]:
            xe = centroid + 2.0 * away
            fe = f(xe)
            sim[-1], fs[-1] = (xe, fe) if fe < fr else (xr, fr)
            continue
        if fr < fs[-2]:
            sim[-1], fs[-1] = xr, fr
            continue
        if fr < fs[-1]:  # contract outside, towards the reflected point
            xc = centroid + 0.5 * away
            fc = f(xc)
            accept = fc <= fr
        else:  # contract inside, towards the worst point
            xc = centroid - 0.5 * away
            fc = f(xc)
            accept = fc < fs[-1]
        if accept:
            sim[-1], fs[-1] = xc, fc
        else:  # shrink every vertex halfway towards the best
            sim[1:] = sim[0] + 0.5 * (sim[1:] - sim[0])
            fs[1:] = [f(v) for v in sim[1:]]
    best = int(np.argmin(fs))
    return sim[best], float(fs[best])


def golden_section(f: Callable[[float], float], lo: float, hi: float, *, xatol: float
                   ) -> float:
    """A local minimum of ``f`` within [lo, hi], to ``xatol``; ``f`` is evaluated only there.

    Golden-section search: the bracket around the best point shrinks by 1/φ per evaluation
    until it is at most ``xatol`` (or a few float steps) wide; returns the best point
    evaluated. Why not parabolic steps (Brent): on this fit's ~25 evaluations they would
    save little.
    """
    if not lo <= hi:
        raise ValueError(f"bounds must be ordered, not ({lo}, {hi})")
    a, b = lo, hi
    c, d = b - INV_PHI * (b - a), a + INV_PHI * (b - a)
    fc, fd = f(c), f(d)
    tol = max(xatol, 4 * math.ulp(max(abs(lo), abs(hi))))
    while b - a > tol:
        if fc <= fd:  # the minimum is in [a, d]; c becomes the upper inner point
            b, d, fd = d, c, fc
            c = b - INV_PHI * (b - a)
            fc = f(c)
        else:  # in [c, b]; d becomes the lower inner point
            a, c, fc = c, d, fd
            d = a + INV_PHI * (b - a)
            fd = f(d)
    return c if fc <= fd else d
