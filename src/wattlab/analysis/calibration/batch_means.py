"""Standard errors from per-block refits, weighting each block by what it can tell.

A stretch where the load barely changes pins down neither gain nor offset: its own fit of
``y ≈ g·m + c`` may land anywhere. Plain batch means give that block the same say as a
block full of load steps, so one quiet stretch can inflate the gain's standard error a
hundredfold (seen in a 24 s demo: 0.02 where the blocks that vary agree to 5·10⁻⁴). The
whole-run least-squares fit weights each block by its information, so the batch means
that judge it must too.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def linear_information(m: FloatArray, y: FloatArray) -> tuple[float, float]:
    """Inverse variances (in units of 1/σ²) of a block's least-squares gain and offset.

    Gain: Σ(m − m̄)². Offset: 1 / (1/n + m̄²/Σ(m − m̄)²). NaN where the block cannot be fitted.
    """
    ok = np.isfinite(m) & np.isfinite(y)
    n = int(ok.sum())
    if n < 2:
        return math.nan, math.nan
    mm = m[ok]
    spread = float(((mm - mm.mean()) ** 2).sum())
    if spread <= 0:
        return math.nan, math.nan
    return spread, 1.0 / (1.0 / n + float(mm.mean()) ** 2 / spread)


def weighted_batch_se(estimates: FloatArray, weights: FloatArray) -> float:
    """Standard error of the weighted mean of per-block estimates; NaN with fewer than 3.

    ``√(B/(B−1) · Σ pₖ²(xₖ − x̄)²)`` with ``pₖ = wₖ/Σw``: equal weights give the familiar
    ``s/√B``, and a block with little information adds little.
    """
    ok = np.isfinite(estimates) & np.isfinite(weights) & (weights > 0)
    b = int(ok.sum())
    if b < 3:
        return math.nan
    p = weights[ok] / weights[ok].sum()
    x = estimates[ok]
    mean = float(p @ x)
    return math.sqrt(b / (b - 1) * float((p**2) @ ((x - mean) ** 2)))
