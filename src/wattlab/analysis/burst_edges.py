"""Rising edges of busy bursts in a sampled power stream: the core of iteration detection.

Why: a training step is a burst of GPU work; between steps the GPU waits (data loading,
the optimizer's host work, logging), so power falls. Real steps jitter (±50 % is common
when a data loader is the bottleneck), so one autocorrelation period miscounts them; the
bursts themselves do not. Each sample is classified busy or idle against two levels found
in the recent past (a two-class split, Otsu's), with hysteresis (busy above 70 % of the way
from the idle to the busy level, idle below 30 %) so noise near a threshold makes no extra
edges. An edge's time is where the power crosses half-way, interpolated between the two
samples around it, and the cumulative energy is carried at every sample so the energy
between any two edges is a difference of two numbers.

The segmenter is incremental with bounded memory (only ``memory_s`` of past samples are
kept, for the levels), so the offline analysis feeds a whole recording through the same
object that follows a live stream.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

IDLE_FRACTION = 0.3
"""Below this fraction of the way from the idle to the busy level a sample is idle."""
BUSY_FRACTION = 0.7
"""Above this fraction a sample is busy; in between it keeps the state it had."""
MIN_SEPARATION = 5.0
"""Busy and idle levels closer than this many within-level standard deviations are one
level plus noise (Gaussian noise alone splits ~2.7 apart): no edges are found then."""
MIN_RELATIVE_CONTRAST = 0.05
"""...or closer than this fraction of the busy level (slow drifts, clock changes)."""
GAP_SPACINGS = 5.0
"""Samples further apart than this many median spacings enclose a gap: no edge across it."""
WARMUP_S = 2.0
"""Samples are held until this much of the stream is seen (or ``memory_s`` if shorter),
so the first levels come from more than a burst or two."""
MAX_SAMPLES = 1 << 18
"""Cap on the samples kept for the levels, whatever the stream's rate."""


@dataclass(frozen=True)
class Levels:
    """The idle and busy power levels of a window, and the noise within each."""

    idle_w: float
    busy_w: float
    noise_w: float

    @property
    def separation(self) -> float:
        """(busy − idle) in units of the within-level noise: how clear the bursts are."""
        return (self.busy_w - self.idle_w) / max(self.noise_w, 1e-9)

    @property
    def separable(self) -> bool:
        return (self.separation >= MIN_SEPARATION
                and self.busy_w - self.idle_w >= MIN_RELATIVE_CONTRAST * abs(self.busy_w))

    def threshold_w(self, fraction: float) -> float:
        return self.idle_w + fraction * (self.busy_w - self.idle_w)


def two_levels(power_w: FloatArray) -> Levels | None:
    """Split values into two classes minimising the within-class variance (Otsu).

    Works at any duty cycle (a GPU busy 95 % of the time with short dips, or idle 90 %),
    where fixed percentiles would land inside one class.
    """
    x = np.sort(power_w[np.isfinite(power_w)])
    n = x.size
    if n < 8:
        return None
    c1 = np.cumsum(x)
    c2 = np.cumsum(x * x)
    k = np.arange(1, n)  # k values in the lower class
    s1, q1 = c1[:-1], c2[:-1]
    s2, q2 = c1[-1] - s1, c2[-1] - q1
    within = (q1 - s1 * s1 / k) + (q2 - s2 * s2 / (n - k))
    j = int(np.argmin(within))
    lo, hi = s1[j] / (j + 1), s2[j] / (n - j - 1)
    sd = math.sqrt(max(float(within[j]), 0.0) / max(n - 2, 1))
    return Levels(float(lo), float(hi), sd)


@dataclass(frozen=True)
class Edge:
    """A burst's rising edge: time, cumulative energy there, and the levels it was seen with."""

    t_ns: int
    energy_j: float
    separation: float
    after_gap: bool


class BurstEdges:
    """Feed samples in time order; get rising edges of busy bursts as they are seen."""

    def __init__(self, *, min_period_s: float, memory_s: float) -> None:
        self.min_period_ns = round(min_period_s * 1e9)
        self.memory_ns = round(memory_s * 1e9)
        self.warmup_ns = min(self.memory_ns, round(WARMUP_S * 1e9))
        self._t = np.zeros(0, np.int64)  # recent samples, for the levels
        self._p = np.zeros(0, np.float64)
        self._pending = 0  # how many of the newest recent samples are not yet classified
        self._state = -1  # 1 busy, 0 idle, -1 unknown (start, after a gap, levels unclear)
        self._last: tuple[int, float, float] | None = None  # (t_ns, power_w, energy_j)
        self._below: tuple[int, float, float] | None = None  # last sample under half-way
        self._energy_j = 0.0
        self._last_edge_ns: int | None = None
        self._gap_since_edge = True
        self.levels: Levels | None = None
        self.spacing_ns: float | None = None

    def push(self, t_ns: IntArray, power_w: FloatArray) -> list[Edge]:
        """Take samples (time-ordered, after the previous ones); return the edges found."""
        t = np.asarray(t_ns, dtype=np.int64)
        p = np.asarray(power_w, dtype=np.float64)
        if t.shape != p.shape or t.ndim != 1:
            raise ValueError(f"times {t.shape} and powers {p.shape} must be 1-d of one length")
        keep = np.isfinite(p)
        if self._last is not None:
            keep &= t > self._last[0]
        t, p = t[keep], p[keep]
        if t.size and np.any(np.diff(t) <= 0):
            raise ValueError("sample times must increase")
        self._t = np.concatenate([self._t, t])
        self._p = np.concatenate([self._p, p])
        self._pending += t.size
        if self._t.size < 2 or self._t[-1] - self._t[0] < self.warmup_ns:
            return []
        self.spacing_ns = float(np.median(np.diff(self._t[-min(self._t.size, 4096):])))
        self.levels = two_levels(self._p)
        n_new = self._pending
        self._pending = 0
        edges = self._classify(self._t[-n_new:], self._p[-n_new:])
        cut = max(int(np.searchsorted(self._t, self._t[-1] - self.memory_ns)),
                  self._t.size - MAX_SAMPLES)
        self._t, self._p = self._t[cut:], self._p[cut:]
        return edges

    def _classify(self, t: IntArray, p: FloatArray) -> list[Edge]:
        """Hysteresis states of new samples, piece by piece between gaps, and their edges."""
        gap = self._gap_mask(t)
        energy = self._integrate(t, p, gap)
        lv = self.levels
        if lv is None or not lv.separable:
            self._state, self._below = -1, None
            return []
        out = []
        bounds = [0, *np.flatnonzero(gap).tolist(), t.size]
        for a, b in itertools.pairwise(bounds):
            if a > 0 or gap[0]:
                self._state, self._below, self._gap_since_edge = -1, None, True
            if b > a:
                out += self._piece(t[a:b], p[a:b], energy[a:b], lv)
        return out

    def _piece(self, t: IntArray, p: FloatArray, energy: FloatArray, lv: Levels) -> list[Edge]:
        """Edges in a stretch without gaps, continuing the state the last one ended in."""
        lo, hi, mid = (lv.threshold_w(f) for f in (IDLE_FRACTION, BUSY_FRACTION, 0.5))
        code = np.where(p >= hi, 1, np.where(p <= lo, 0, -1))
        at = np.where(code >= 0, np.arange(code.size), -1)
        np.maximum.accumulate(at, out=at)
        state = np.where(at >= 0, code[np.maximum(at, 0)], self._state)
        before = np.concatenate([[self._state], state[:-1]])
        rises = np.flatnonzero((state == 1) & (before == 0))
        edges = [self._edge(int(j), t, p, energy, mid=mid, separation=lv.separation) for j in rises]
        self._state = int(state[-1])
        under = np.flatnonzero(p < mid)
        if under.size:
            k = int(under[-1])
            self._below = (int(t[k]), float(p[k]), float(energy[k]))
        out = []
        for e in edges:
            if self._last_edge_ns is not None and e.t_ns - self._last_edge_ns < self.min_period_ns:
                continue  # a dip inside one step, not a new step
            self._last_edge_ns = e.t_ns
            out.append(e)
        return out

    def _integrate(self, t: IntArray, p: FloatArray, gap: npt.NDArray[np.bool_]) -> FloatArray:
        """Cumulative energy at each new sample (trapezoids; no energy across a gap)."""
        prev_t, prev_p = (self._last[0], self._last[1]) if self._last else (int(t[0]), p[0])
        tt = np.concatenate([[prev_t], t])
        pp = np.concatenate([[prev_p], p])
        step_j = 0.5 * (pp[1:] + pp[:-1]) * (np.diff(tt) / 1e9)
        step_j[gap] = 0.0
        energy = self._energy_j + np.cumsum(step_j)
        self._energy_j = float(energy[-1])
        self._last = (int(t[-1]), float(p[-1]), self._energy_j)
        return energy

    def _gap_mask(self, t: IntArray) -> npt.NDArray[np.bool_]:
        """New samples that follow a hole in the stream."""
        prev = self._last[0] if self._last is not None else int(t[0])
        tt = np.concatenate([[prev], t])
        limit = GAP_SPACINGS * (self.spacing_ns or float("inf"))
        return np.asarray(np.diff(tt) > limit)

    def _edge(self, j: int, t: IntArray, p: FloatArray, energy: FloatArray, *, mid: float,
              separation: float) -> Edge:
        """The half-way crossing before sample j, interpolated, with energy there."""
        under = np.flatnonzero(p[:j] < mid)
        if under.size:
            k = int(under[-1])
            a = (int(t[k]), float(p[k]), float(energy[k]))
            b = (int(t[k + 1]), float(p[k + 1]), float(energy[k + 1]))
        elif self._below is not None:
            a = self._below
            b = (int(t[0]), float(p[0]), float(energy[0]))
        else:
            return Edge(int(t[j]), float(energy[j]), separation, self._take_gap_flag())
        f = (mid - a[1]) / (b[1] - a[1]) if b[1] != a[1] else 0.0
        f = min(max(f, 0.0), 1.0)
        t_e = a[0] + round(f * (b[0] - a[0]))
        return Edge(t_e, a[2] + f * (b[2] - a[2]), separation, self._take_gap_flag())

    def _take_gap_flag(self) -> bool:
        flag, self._gap_since_edge = self._gap_since_edge, False
        return flag
