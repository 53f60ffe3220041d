"""The period of repeating work from the autocorrelation of power: the fallback method.

Why: where a power stream shows no separate busy bursts (the GPU never idles between
steps, or a fast meter sees a pattern finer than bursts), a training loop still draws
power in a repeating pattern, so the autocorrelation has peaks at the period and its
multiples; the period is refined over many multiples (lag of the k-th peak / k), which
gives sub-sample precision. It assumes one steady period: jittering steps blur the peaks,
which is why burst segmentation (``burst_edges``) comes first.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from wattlab.analysis.iterations.iteration_result import IterationResult
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]


def _autocorr(x: FloatArray) -> FloatArray:
    """Normalised autocorrelation (NaN-aware, unbiased by the overlap count)."""
    ok = np.isfinite(x)
    v = np.where(ok, x - np.nanmean(x), 0.0)
    size = 1 << int(np.ceil(np.log2(2 * x.size)))
    f = np.fft.rfft(v, size)
    fo = np.fft.rfft(ok.astype(np.float64), size)
    num = np.fft.irfft(f * np.conj(f), size)[: x.size]
    cnt = np.fft.irfft(fo * np.conj(fo), size)[: x.size]
    var = num[0] / max(cnt[0], 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ac = (num / np.maximum(cnt, 1.0)) / var
    return np.asarray(np.where(cnt > 0.25 * x.size, ac, np.nan), dtype=np.float64)


def _refine(ac: FloatArray, i: int) -> float:
    """Parabolic sub-sample position of a peak near index i."""
    if 0 < i < ac.size - 1 and np.all(np.isfinite(ac[i - 1:i + 2])):
        y0, y1, y2 = ac[i - 1], ac[i], ac[i + 1]
        den = y0 - 2 * y1 + y2
        if den < 0:
            return i + float(np.clip(0.5 * (y0 - y2) / den, -0.5, 0.5))
    return float(i)


def detect_period(power_w: FloatArray, rate_hz: float, min_period_s: float = 0.01,
                  max_period_s: float | None = None) -> IterationResult:
    """The dominant repetition period of a power signal sampled at ``rate_hz``.

    Confidence is the autocorrelation at the period (near 1 for a clean repetition, near 0
    for noise). The period is refined from the peaks at its multiples.
    """
    n = power_w.size
    duration = n / rate_hz
    max_p = max_period_s or duration / 4
    if duration < 3 * max_p or n < 16:
        raise UsageError(f"{duration:.2f} s of power is too short to find periods up to "
                         f"{max_p:.3f} s (needs 3 periods)")
    ac = _autocorr(power_w)
    lo = max(2, math.ceil(min_period_s * rate_hz))
    hi = min(n // 2, int(max_p * rate_hz) + 1)
    mean_power = float(np.nanmean(power_w))
    seg = ac[lo:hi]
    # candidate peaks: local maxima above zero
    peaks = [i for i in range(lo + 1, hi - 1)
             if np.isfinite(ac[i]) and ac[i] > 0 and ac[i] >= ac[i - 1] and ac[i] >= ac[i + 1]]
    if not peaks or not np.isfinite(seg).any():
        return IterationResult(None, None, 0.0, 0, mean_power, None, None, rate_hz,
                               method="autocorrelation")
    best = max(ac[i] for i in peaks)
    first = next(i for i in peaks if ac[i] >= 0.85 * best)  # the fundamental, not a multiple
    p0 = _refine(ac, first)
    # refine over multiples k·p0 while the correlation stays high
    estimates = [p0]
    k = 2
    while k * p0 < 0.5 * n:
        c = round(k * p0)
        w = max(1, int(0.1 * p0))
        win = ac[max(0, c - w):min(n, c + w + 1)]
        if win.size == 0 or not np.isfinite(win).any() or np.nanmax(win) < 0.5 * ac[first]:
            break
        j = max(0, c - w) + int(np.nanargmax(win))
        estimates.append(_refine(ac, j) / k)
        k += 1
    period = estimates[-1] / rate_hz
    se = (float(np.std(np.array(estimates[len(estimates) // 2:]) / rate_hz, ddof=1))
          / math.sqrt(max(1, len(estimates) // 2)) if len(estimates) > 3
          else 0.5 / rate_hz / max(1, len(estimates)))
    se = max(se, 0.1 / rate_hz / len(estimates))  # sub-sample refinement has limits
    confidence = float(np.clip(ac[first], 0.0, 1.0))
    energy = mean_power * period
    energy_se = math.hypot(mean_power * se,
                           period * float(np.nanstd(power_w)) / math.sqrt(duration / period))
    return IterationResult(period, se, confidence, int(duration / period), mean_power, energy,
                           energy_se, rate_hz, method="autocorrelation")
