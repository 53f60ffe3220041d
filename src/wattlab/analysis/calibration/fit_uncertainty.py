"""How well a calibration's data pin its fit: standard errors, identifiability, gain test.

Why a module of its own: after the best fit (kernel_fit.py), a calibration (calibrate.py)
asks how far to trust it: batch means (the fit repeated on consecutive blocks) with a
floor from the residuals for the gain and offset, profile likelihoods of the width and
the delay with a verdict on them (identifiability.py), and whether the gain depends on
the power level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.calibration.batch_means import linear_information, weighted_batch_se
from wattlab.analysis.calibration.energy_check import TargetEnergy
from wattlab.analysis.calibration.identifiability import (
    KernelFit,
    Verdict,
    delay_profile,
    effective_points,
    judge,
    repeating_share,
    width_profile,
)
from wattlab.analysis.calibration.kernel_fit import (
    MAX_KERNEL_S,
    MODELS,
    SEARCH_POINTS,
    SEARCH_RATE_HZ,
    WIDTH_NAME,
    ChosenKernel,
    fit_kernel,
    linear_fit,
)
from wattlab.analysis.calibration.reference_grid import ReferenceGrid
from wattlab.runfile import Estimate, GainTest, Profiles, finite

FloatArray = npt.NDArray[np.float64]
MIN_BLOCK_POINTS = 20
"""Fewest readings per batch-means block; a short run gets fewer blocks (at least 3)."""


@dataclass(frozen=True)
class BatchErrors:
    """Standard errors of the fit by batch means, and the blocks they came from.

    ``se``: of tau, w (the width), g, c, eff (the effective delay) and d (the energy
    delay); ``bounds`` cut the readings into ``blocks`` blocks, ``fitted`` of them had
    enough readings to fit.
    """

    se: dict[str, float]
    bounds: FloatArray
    blocks: int
    fitted: int


def batch_errors(ref: ReferenceGrid, x: FloatArray, y: FloatArray, fit: ChosenKernel, *,
                 target: TargetEnergy, blocks: int, d_energy: float, target_end_s: float,
                 period_s: float) -> BatchErrors:
    """Refit on consecutive blocks: the spread of their results is each parameter's error.

    For a long recording on every k-th reading (and, for a first-order lag, whose filter
    runs over the whole grid, a grid of ~T/10). The errors of g and c are at least what
    the residuals say (inflated for autocorrelation: ~1 s correlated). Each block's energy
    delay needs the target up to ``target_end_s``.
    """
    kernel, tau, width = fit.kernel, fit.tau_s, fit.width_s
    centroid = fit.centroid_s
    model = MODELS[kernel]
    lo_x, hi_x = float(x[0]), float(x[-1])
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
        bt, bw, _ = fit_kernel(kernel, block_ref, x[sel], y[sel], tau + centroid,
                               start=(tau, width), maxiter=200)
        block_m = model(block_ref, x[sel], bt, bw)
        bg, bc, _, _ = linear_fit(block_m, y[sel])
        block_info.append(linear_information(block_m, y[sel]))
        bd = target.delay_fit(bounds[k], min(bounds[k + 1], target_end_s), bg, bc, d_energy)
        per_block.append((bt, bw, bg, bc, bt + (bw / 2 if kernel == "boxcar" else bw), bd))
    arr = np.array(per_block) if per_block else np.full((1, 6), np.nan)
    n_ok = np.isfinite(arr).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se_b = np.where(n_ok > 2, np.nanstd(np.where(n_ok > 2, arr, 0.0), axis=0, ddof=1)
                        / np.sqrt(np.maximum(n_ok, 1)), np.nan)
    # residual-based floor for g and c (inflated for autocorrelation: ~1 s correlated)
    m, ok = fit.m, fit.ok
    mc = m[ok] - m[ok].mean()
    n_eff = max(2.0, (hi_x - lo_x) / max(width, period_s, 1e-3))
    sigma = math.sqrt(fit.mse)
    se_g_res = sigma / math.sqrt(float(mc @ mc) / fit.n * n_eff) if mc.size else math.nan
    se_c_res = math.sqrt(sigma**2 / n_eff + (m[ok].mean() * se_g_res) ** 2)
    se = dict(zip(("tau", "w", "g", "c", "eff", "d"), se_b.tolist(), strict=True))
    info = np.array(block_info) if block_info else np.full((1, 2), np.nan)  # as ``arr``
    se["g"] = float(np.nanmax([weighted_batch_se(arr[:, 2], info[:, 0]), se_g_res]))
    se["c"] = float(np.nanmax([weighted_batch_se(arr[:, 3], info[:, 1]), se_c_res]))
    return BatchErrors(se, bounds, blocks, len(per_block))


def power_dependent_gain(fit: ChosenKernel, x: FloatArray, y: FloatArray,
                         batch: BatchErrors) -> GainTest:
    """Whether the gain depends on the power: y = g0·m + g1·m·(m − m̄)/m̄ + c.

    The slope's error comes from its spread over the batch-means blocks; it is warranted
    when clearly nonzero and it lowers the misfit by 2 % or more.
    """
    m, ok, bounds = fit.m, fit.ok, batch.bounds
    mbar = float(m[ok].mean())
    design = np.column_stack([m[ok], m[ok] * (m[ok] - mbar) / mbar, np.ones(ok.sum())])
    coef, *_ = np.linalg.lstsq(design, y[ok], rcond=None)
    r_q = y[ok] - design @ coef
    mse_q = float(r_q @ r_q) / ok.sum()
    slopes = []
    for k in range(batch.blocks):
        sel = (x[ok] >= bounds[k]) & (x[ok] < bounds[k + 1])
        if sel.sum() >= MIN_BLOCK_POINTS:
            cb, *_ = np.linalg.lstsq(design[sel], y[ok][sel], rcond=None)
            slopes.append(cb[1])
    slope_se = float(np.std(slopes, ddof=1) / math.sqrt(len(slopes))) if len(slopes) > 2 \
        else math.nan
    warranted = bool(abs(coef[1]) > 3 * slope_se and mse_q < 0.98 * fit.mse)
    return GainTest(Estimate.of(float(coef[1]), slope_se),
                    "gain = g0 + slope * (P - mean P) / mean P", finite(math.sqrt(mse_q)),
                    warranted)


def identify(ref: ReferenceGrid, x: FloatArray, y: FloatArray, fit: KernelFit, *, kernel: str,
             resid: FloatArray, r2: float, gain: tuple[float, float], period_s: float,
             ref_means: tuple[FloatArray, float]) -> tuple[Verdict, Profiles]:
    """Profile likelihoods of the width and the effective delay, and the verdict on them.

    A long recording is profiled on every k-th reading and the coarse grid, as it is
    searched (``kernel_fit.fit_kernels``); the misfit's rise is judged with the readings' effective
    count (``effective_points``) either way.
    """
    stride = max(1, math.ceil(x.size / SEARCH_POINTS))
    grid = ref if stride == 1 else ref.decimated(
        max(1, round(1.0 / (ref.step_s * SEARCH_RATE_HZ))))
    xs, ys = x[::stride], y[::stride]
    model = MODELS[kernel]

    def cost(t: float, w: float) -> float:
        return linear_fit(model(grid, xs, t, w), ys)[2]

    best = cost(fit.tau_s, fit.width_s)
    bounds, n_eff = (2.0 * grid.step_s, MAX_KERNEL_S), effective_points(resid)
    w_prof = width_profile(cost, fit, bounds=bounds, best_mse=best, n_eff=n_eff)
    d_prof = delay_profile(cost, fit, bounds=bounds, best_mse=best, n_eff=n_eff)
    repeat_hz, share = repeating_share(*ref_means)
    verdict = judge(w_prof, d_prof, width_scale_s=max(fit.width_s, period_s), r2=r2,
                    gain=gain[0],
                    gain_se=gain[1], repeat_hz=repeat_hz, repeat_share=share)
    profiles = Profiles(finite(n_eff), finite(repeat_hz), finite(share), WIDTH_NAME[kernel],
                        [finite(w_prof.low), finite(w_prof.high)],
                        [finite(d_prof.low), finite(d_prof.high)],
                        bool(w_prof.connected), bool(d_prof.connected))
    return verdict, profiles
