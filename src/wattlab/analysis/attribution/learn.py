"""What the rule and the idle part are learnt from: the run itself.

Idle: the mean power over the stretches where no activity runs (each trimmed by a guard
for the stream's lag). Weights: the dynamic power of each piece of the run modelled as
``sum_k w_k * n_k`` (``n_k``: activities of kind k running, by intensity), fitted by least
squares weighted by each piece's duration; pieces where one kind runs alone pin that
kind's weight, pieces with different mixes separate the kinds. The fit's ± is the standard
error from the residual scatter. The rule uses the weights' ratios only: the energy shared
is always the energy measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from wattlab.analysis.attribution.core import (
    Activity,
    FloatArray,
    cumulative_energy,
    pieces,
    running,
)
from wattlab.analysis.attribution.rule import Param, Rule, equal_rule


def measure_idle(t_s: FloatArray, power_w: FloatArray, busy: Sequence[tuple[float, float]],
                 guard_s: float, min_s: float) -> tuple[float, float, float] | None:
    """(idle W, ± W, seconds used) over the time outside ``busy``; None where too little.

    Each free stretch loses ``guard_s`` at both ends (the stream's lag and edge); only
    stretches then at least ``min_s`` long count. ±: the spread (standard deviation) of
    the stretches' mean powers, else of the samples in the one stretch.
    """
    free = free_stretches(busy, float(t_s[0]), float(t_s[-1]))
    kept = [(a + guard_s, b - guard_s) for a, b in free if b - a - 2 * guard_s >= min_s]
    if not kept:
        return None
    ends = np.array(kept, dtype=np.float64)
    e = cumulative_energy(t_s, power_w, ends.ravel()).reshape(-1, 2)
    seconds = ends[:, 1] - ends[:, 0]
    means = (e[:, 1] - e[:, 0]) / seconds
    idle = float((e[:, 1] - e[:, 0]).sum() / seconds.sum())
    if len(kept) > 1:
        pm = float(np.std(means, ddof=1))
    else:
        inside = power_w[(t_s >= kept[0][0]) & (t_s <= kept[0][1])]
        pm = float(np.std(inside, ddof=1)) if inside.size > 1 else math.nan
    return idle, pm, float(seconds.sum())


def free_stretches(busy: Sequence[tuple[float, float]], t0_s: float, t1_s: float
                   ) -> list[tuple[float, float]]:
    """The parts of [t0, t1] that no busy interval covers."""
    out, at = [], t0_s
    for a, b in sorted(busy):
        if a > at:
            out.append((at, min(a, t1_s)))
        at = max(at, b)
    if at < t1_s:
        out.append((at, t1_s))
    return [(a, b) for a, b in out if b > a]


def design(t_s: FloatArray, power_w: FloatArray, idle_w: float,
           activities: Sequence[Activity], *, kinds: list[str], min_piece_s: float
           ) -> tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The fit's data: each piece's duration, dynamic power, work per kind, and whether used.

    Used: pieces at least ``min_piece_s`` long with some work in them.
    """
    edges = pieces(activities, float(t_s[0]), float(t_s[-1]))
    dt = np.diff(edges)
    p_dyn = np.diff(cumulative_energy(t_s, power_w, edges)) / np.where(dt > 0, dt, 1.0) - idle_w
    n = np.stack([running(edges, activities, np.array(
        [a.intensity if a.kind == k else 0.0 for a in activities])) for k in kinds], axis=1)
    return dt, p_dyn, n, (dt >= min_piece_s) & (n.sum(axis=1) > 0)


def prediction_error(t_s: FloatArray, power_w: FloatArray, idle_w: float,
                     activities: Sequence[Activity], *, kinds: list[str], min_piece_s: float
                     ) -> float | None:
    """How well power ∝ the work predicts each piece the fit left out, relative (RMS/mean).

    Leave-one-piece-out (the PRESS residuals of the least squares in ``fit_weights``: each
    piece predicted by the fit on all the others), time-weighted, over the mean dynamic
    power. The rule's own error: a rule that cannot predict the power it shares cannot be
    trusted to share it. None where there are too few pieces to leave one out.
    """
    if not kinds or not activities:
        return None
    dt, p_dyn, n, use = design(t_s, power_w, idle_w, activities, kinds=kinds,
                               min_piece_s=min_piece_s)
    x, y, w = n[use], p_dyn[use], np.sqrt(dt[use])
    if x.shape[0] <= len(kinds) + 1:
        return None
    xw = x * w[:, None]
    pinv = np.linalg.pinv(xw)
    hat = np.einsum("ij,ji->i", xw, pinv)
    resid = y * w - xw @ (pinv @ (y * w))
    loo_w = resid / np.where(hat < 1 - 1e-9, 1 - hat, np.inf) / w  # back to W
    mean = float(np.average(np.abs(y), weights=dt[use]))
    if mean <= 0:
        return None
    return float(np.sqrt(np.average(loo_w**2, weights=dt[use]))) / mean


def fit_weights(t_s: FloatArray, power_w: FloatArray, idle_w: float,
                activities: Sequence[Activity], *, kinds: list[str], min_piece_s: float
                ) -> Rule:
    """Each kind's power per activity, least squares over the run's pieces (module doc).

    Pieces shorter than ``min_piece_s`` (the stream cannot resolve them) are left out.
    Where the kinds cannot be told apart (a kind never runs, a weight comes out <= 0) the
    rule falls back to equal shares and says why.
    """
    dt, p_dyn, n, use = design(t_s, power_w, idle_w, activities, kinds=kinds,
                               min_piece_s=min_piece_s)
    alone = {k: int(np.sum(use & (n[:, i] > 0) & (n.sum(axis=1) == n[:, i])))
             for i, k in enumerate(kinds)}
    x, y, w = n[use], p_dyn[use], np.sqrt(dt[use])
    if x.shape[0] <= len(kinds) or np.linalg.matrix_rank(x * w[:, None]) < len(kinds):
        return equal_rule(kinds, f"too few pieces with different mixes of {kinds} "
                          f"({x.shape[0]} pieces of >= {1e3 * min_piece_s:.3g} ms): equal shares")
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    resid = (y - x @ coef) * w
    s2 = float(resid @ resid) / (x.shape[0] - len(kinds))
    cov = s2 * np.linalg.inv((x * w[:, None]).T @ (x * w[:, None]))
    pm = np.sqrt(np.diag(cov))
    if np.any(coef <= 0):
        return equal_rule(kinds, "the fitted power of "
                          + ", ".join(f"{k} {c:.3g} W" for k, c in zip(kinds, coef, strict=True))
                          + " is not positive: equal shares")
    weights = {k: Param(float(c), float(e), "W") for k, c, e in zip(kinds, coef, pm, strict=True)}
    caveat = additivity_caveat(x @ coef, y - x @ coef, dt[use])
    return Rule("fitted power per kind", "each piece's dynamic energy shared in proportion to "
                "the fitted power of each activity running in it: "
                + " + ".join(f"w_{k} n_{k}" for k in kinds),
                weights, [f"fitted on {x.shape[0]} pieces of >= {1e3 * min_piece_s:.3g} ms; "
                          "pieces with one kind alone: "
                          + ", ".join(f"{k} {c}" for k, c in alone.items())],
                [caveat] if caveat else [])


SATURATION_SHARE = 0.1  # residual drift across the run's concurrency, of the mean power


def additivity_caveat(fitted_w: FloatArray, resid_w: FloatArray, dt_s: FloatArray
                      ) -> str | None:
    """Why the shares are not each activity's cost alone, where the run shows it.

    The rule assumes power adds up over the work in flight. Where the fit's residual drifts
    with the power the fit predicts (a slope over 3 of its standard errors, moving the
    power by more than SATURATION_SHARE of its mean across the run's range), it does not:
    power saturates (or grows faster), and an activity's share depends on what ran beside
    it. Its energy alone cannot be told from such a run (issue 40: the simulated server's
    shares missed their alone-truth by up to 53 %).
    """
    if fitted_w.size < 5 or np.ptp(fitted_w) == 0:
        return None
    w = dt_s / dt_s.sum()
    dx = fitted_w - float(w @ fitted_w)
    sxx = float(w @ dx**2)
    slope = float(w @ (dx * resid_w)) / sxx
    scatter = resid_w - float(w @ resid_w) - slope * dx
    se = math.sqrt(float(w @ scatter**2) / ((fitted_w.size - 2) * sxx))
    drift_w = abs(slope) * float(np.ptp(fitted_w))
    if abs(slope) <= 3 * se or drift_w <= SATURATION_SHARE * abs(float(w @ fitted_w)):
        return None
    how = "saturates" if slope < 0 else "grows faster than the work"
    return (f"power is not additive in the work in flight: it {how} (the fit's residual "
            f"moves {slope:+.2f} ± {se:.2f} W per W it predicts, {drift_w:.3g} W across the "
            "run); each share is the rule's split of what was drawn, not what the work would "
            "cost alone, which this run cannot tell")
