"""Whether a calibration's data can pin its kernel: profile likelihoods and the load's spectrum.

Why: a load that repeats at the kernel's own width hides the kernel. A 1 s boxcar turns a
1 Hz square wave into a flat line, and one of 2 s does the same, so a fit over (τ, w) finds
a minimum somewhere on a long flat valley; per-block refits all start from that minimum and
agree with each other, and the batch-means spread says ±5 ms on a width the data cannot
tell from one twice as long. The profile likelihood asks the data directly: hold the width
(or the effective delay) at each value of a grid, refit the rest, and see how much worse
the fit gets. Where it hardly gets worse, the data cannot tell, and the interval says so.

With n_eff effectively independent readings and Gaussian residuals, −2 log L changes by
n_eff · ln(mse(θ) / mse_min); the 95 % interval is where that stays under 3.84. n_eff comes
from the residuals' lag-1 autocorrelation (an AR(1) view of readings that share most of
their 1 s window).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from wattlab.analysis.calibration.minimise import golden_section

FloatArray = npt.NDArray[np.float64]
CHI2_95 = 3.841
"""−2 log-likelihood rise that bounds a 95 % interval for one parameter."""
PROFILE_POINTS = 15
NEAR_BEST = np.array([0.8, 0.9, 0.97, 1.03, 1.1, 1.25])
"""Extra profile points around the best, as multiples of it (delays: ±0.5·(k − 1) s)."""
MAX_RELATIVE_WIDTH = 0.25
"""A kernel width whose 95 % interval is wider than this fraction of itself is not pinned."""
MAX_DELAY_INTERVAL_S = 0.25
"""An effective delay whose 95 % interval is wider than this is not pinned."""
MIN_R2 = 0.9
"""Below this the kernel explains too little of the reading's variation to be trusted."""
MAX_GAIN_RSE = 0.05
"""A gain known to worse than 5 % cannot correct energy to the 1 % the tool aims at."""
REPEAT_SHARE = 0.5
"""A load whose variance sits this much at one frequency and its harmonics is periodic."""
HARMONICS = 7
"""Harmonics counted with a repetition's line (a square wave has 93 % of its power in 1-5)."""

Cost = Callable[[float, float], float]  # (tau s, width s) -> mean squared residual


@dataclass(frozen=True)
class KernelFit:
    """The fitted kernel: pure delay, width, and its centroid as a fraction of the width."""

    tau_s: float
    width_s: float
    centroid: float  # 0.5 for a boxcar, 1 for a first-order lag

    @property
    def effective_delay_s(self) -> float:
        return self.tau_s + self.centroid * self.width_s


@dataclass
class Profile:
    """A profile likelihood's 95 % interval over one parameter."""

    low: float  # NaN where the interval runs off the grid
    high: float
    connected: bool  # one basin: every grid point inside the interval's span is inside

    @property
    def half_width(self) -> float:
        return 0.5 * (self.high - self.low)


@dataclass
class Verdict:
    """Identifiable or not, why not, what load would fix it, and widened uncertainties."""

    identifiable: bool
    warnings: list[str] = field(default_factory=list)
    advice: str = ""
    se_floor: dict[str, float] = field(default_factory=dict)  # profile-based standard errors


def effective_points(residuals: FloatArray) -> float:
    """Independent readings equivalent to autocorrelated residuals (AR(1), at least 2)."""
    r = residuals[np.isfinite(residuals)]
    if r.size < 3:
        return float(max(r.size, 1))
    r = r - r.mean()
    denom = float(r @ r)
    rho = float(r[1:] @ r[:-1]) / denom if denom > 0 else 0.0
    rho = min(max(rho, 0.0), 0.999)
    return float(np.clip(r.size * (1 - rho) / (1 + rho), 2.0, r.size))


def _interval(grid: FloatArray, mse: FloatArray, best: tuple[float, float],
              n_eff: float) -> Profile:
    """The 95 % interval of a profile (edges interpolated between grid points)."""
    grid, mse = np.append(grid, best[0]), np.append(mse, best[1])
    order = np.argsort(grid, kind="stable")
    grid, mse = grid[order], mse[order]
    rise = n_eff * np.log(np.maximum(mse, 1e-300) / best[1])
    inside = rise <= CHI2_95
    idx = np.flatnonzero(inside)
    connected = bool(inside[idx[0]:idx[-1] + 1].all())

    def edge(i: int, j: int) -> float:  # between inside point i and outside neighbour j
        if not 0 <= j < grid.size:
            return math.nan
        f = (CHI2_95 - rise[i]) / (rise[j] - rise[i]) if rise[j] != rise[i] else 0.0
        return float(grid[i] + f * (grid[j] - grid[i]))

    return Profile(edge(int(idx[0]), int(idx[0]) - 1),
                   edge(int(idx[-1]), int(idx[-1]) + 1), connected)


def width_profile(cost: Cost, fit: KernelFit, *, bounds: tuple[float, float], best_mse: float,
                  n_eff: float) -> Profile:
    """Profile over the kernel width: at each width, the best τ (effective delay free)."""
    grid = np.unique(np.concatenate((np.geomspace(bounds[0], bounds[1], PROFILE_POINTS),
                                     fit.width_s * NEAR_BEST)))
    grid = grid[(grid >= bounds[0]) & (grid <= bounds[1])]
    eff = fit.effective_delay_s
    mse = np.array([_best_over_tau(cost, w, eff - fit.centroid * w) for w in grid])
    return _interval(grid, mse, (fit.width_s, best_mse), n_eff)


def delay_profile(cost: Cost, fit: KernelFit, *, bounds: tuple[float, float], best_mse: float,
                  n_eff: float) -> Profile:
    """Profile over the effective delay: at each delay, the best width."""
    grid = fit.effective_delay_s + np.concatenate((np.linspace(-1.0, 1.0, PROFILE_POINTS),
                                                   0.5 * (NEAR_BEST - 1.0)))
    lo, hi = math.log(bounds[0]), math.log(bounds[1])

    def best_width(e: float) -> float:
        def at(log_w: float) -> float:
            w = math.exp(log_w)
            return cost(e - fit.centroid * w, w)
        scan = np.linspace(lo, hi, 9)
        k = int(np.argmin([at(v) for v in scan]))
        a, b = scan[max(k - 1, 0)], scan[min(k + 1, scan.size - 1)]
        return at(golden_section(at, a, b, xatol=3e-3))

    mse = np.array([best_width(e) for e in grid])
    return _interval(grid, mse, (fit.effective_delay_s, best_mse), n_eff)


def _best_over_tau(cost: Cost, width: float, tau0: float) -> float:
    """Least misfit over τ near tau0 (a scan over ±1 s, then golden section)."""
    scan = tau0 + np.linspace(-1.0, 1.0, 11)
    values = [cost(t, width) for t in scan]
    k = int(np.argmin(values))
    a, b = scan[max(k - 1, 0)], scan[min(k + 1, scan.size - 1)]
    t = golden_section(lambda v: cost(v, width), a, b, xatol=1e-3)
    return min(cost(t, width), float(values[k]))


def repeating_share(means_w: FloatArray, step_s: float) -> tuple[float, float]:
    """(frequency Hz, share of variance) of the load's strongest repetition (0.05-5 Hz)."""
    x = means_w[np.isfinite(means_w)]
    if x.size < 16:
        return math.nan, 0.0
    x = x - x.mean()
    power = np.abs(np.fft.rfft(x)) ** 2
    freq = np.fft.rfftfreq(x.size, step_s)
    total = float(power[1:].sum())
    band = np.flatnonzero((freq >= 0.05) & (freq <= 5.0))
    if total <= 0 or band.size == 0:
        return math.nan, 0.0
    k = int(band[np.argmax(power[band])])
    lines = np.zeros(power.size, dtype=bool)  # the line and its harmonics (a square wave's)
    for harmonic in range(1, HARMONICS + 1):
        j = k * harmonic
        lines[max(j - 1, 1):j + 2] = True
    return float(freq[k]), min(1.0, float(power[lines].sum()) / total)


def judge(width: Profile, delay: Profile, *, width_scale_s: float, r2: float, gain: float,
          gain_se: float, repeat_hz: float, repeat_share: float) -> Verdict:
    """Identifiable when both profiles are single, narrow basins and the gain is pinned.

    ``width_scale_s``: what a width interval is judged against, the kernel's width or the
    update period if longer (±1 ms on a 6 ms part-time window is pinned for energy).
    """
    warnings = []
    if math.isnan(width.low) or math.isnan(width.high) or not width.connected:
        warnings.append(
            f"the kernel width is not pinned: widths from {_fmt(width.low)} to "
            f"{_fmt(width.high)} fit within the 95 % likelihood bound"
            + ("" if width.connected else " (in separate basins)"))
    elif width.high - width.low > MAX_RELATIVE_WIDTH * width_scale_s:
        warnings.append(f"the kernel width is known only to {width.low:.3f}-{width.high:.3f} s")
    if math.isnan(delay.low) or math.isnan(delay.high) or not delay.connected:
        warnings.append(f"the effective delay is not pinned: delays from {_fmt(delay.low)} to "
                        f"{_fmt(delay.high)} fit within the 95 % likelihood bound"
                        + ("" if delay.connected else " (in separate basins)"))
    elif delay.high - delay.low > MAX_DELAY_INTERVAL_S:
        warnings.append(f"the effective delay is known only to {delay.low:.3f}-"
                        f"{delay.high:.3f} s")
    if r2 < MIN_R2:
        warnings.append(f"the fit explains only {100 * r2:.0f} % of the reading's variation")
    if not abs(gain_se) <= MAX_GAIN_RSE * abs(gain):
        warnings.append(f"the gain is uncertain by {100 * gain_se / abs(gain):.0f} %")
    advice = ""
    if warnings:
        advice = ("record a load whose power changes at irregular times, with on and off "
                  "stretches from 0.1 s to several kernel widths (`wattlab excite`)")
        if repeat_share >= REPEAT_SHARE and math.isfinite(repeat_hz):
            advice = (f"the load repeats every {1 / repeat_hz:.2f} s ({100 * repeat_share:.0f} % "
                      "of its variation), and a kernel that averages over whole repetitions "
                      f"cannot be told from a longer one; {advice}")
    se_floor = {"w": _se(width), "eff": _se(delay)}
    return Verdict(not warnings, warnings, advice, se_floor)


def _se(profile: Profile) -> float:
    """A standard error from a 95 % interval (infinite where the interval is open)."""
    if math.isnan(profile.low) or math.isnan(profile.high) or not profile.connected:
        return math.inf
    return profile.half_width / 1.96


def _fmt(value: float) -> str:
    return "the edge of the search" if math.isnan(value) else f"{value:.3f} s"
