"""Rising edges of busy bursts in a sampled power stream: the core of iteration detection.

Why: a training step is a burst of GPU work; between steps the GPU waits (data loading,
the optimizer's host work, logging), so power falls. Real steps jitter (±50 % is common
when a data loader is the bottleneck), so one autocorrelation period miscounts them; the
bursts themselves do not. Each sample is classified busy or idle against two levels found
in the recent past (a two-class split, Otsu's), with hysteresis (busy above 50 % of the way
from the idle to the busy level, idle below 30 %) so noise near a threshold makes no extra
edges. An edge's time is where the power crosses 40 % of the way, interpolated between the two
samples around it, and the cumulative energy is carried at every sample so the energy
between any two edges is a difference of two numbers.

The segmenter is incremental with bounded memory (only ``memory_s`` of past samples are
kept, for the levels), so the offline analysis feeds a whole recording through the same
object that follows a live stream. Edges come ``LOOKAHEAD_S`` late (``finish`` classifies
the rest at the end of a stream).
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
BUSY_FRACTION = 0.5
"""At or above this fraction a sample is busy; in between it keeps the state it had. Half
way, not higher: a step of 1-2 samples at 50 Hz shows as one partly-busy sample, and step
power varies (0.3/0.5 got the most simulated loops right of 0.15-0.3 / 0.45-0.7)."""
EDGE_FRACTION = 0.4
"""An edge's time is where the power crosses this fraction, between the two thresholds."""
MIN_SEPARATION = 4.0
"""Busy and idle levels closer than this many within-level standard deviations are one
level plus noise: a two-class split of one-humped data lands 2.7 (Gaussian) to 3.5
(uniform, exponential) apart, and a real job of 4.6 ms steps at 3.3: no edges then."""
MIN_RELATIVE_CONTRAST = 0.05
"""...or closer than this fraction of the busy level (slow drifts, clock changes)."""
GAP_SPACINGS = 5.0
"""Samples further apart than this many median spacings enclose a gap: no edge across it."""
LOOKAHEAD_S = 2.0
"""A sample is classified once this much newer stream is seen (or half of ``memory_s`` if
shorter), with levels from the past ``memory_s`` and these newer samples: a job that
wakes the GPU (72 → 120 W on an H100) before its first step must not look like a burst."""
BINS_PER_MIN_PERIOD = 4
"""Samples are averaged over bins of a quarter of the shortest period (kHz meters)."""
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


class BinMeans:
    """Means of samples over fixed time bins, incrementally (the last bin waits to close).

    Why: a kHz meter's sample-to-sample noise crosses any threshold now and then; averaging
    over a fraction of the shortest step keeps the edges of real steps and drops the noise.
    A 50 Hz stream is left as it is (one sample per bin).
    """

    def __init__(self, bin_ns: int) -> None:
        self.bin_ns = max(1, bin_ns)
        self._t = np.zeros(0, np.int64)
        self._p = np.zeros(0, np.float64)

    @property
    def newest_ns(self) -> int | None:
        """The latest sample held (none held: None)."""
        return int(self._t[-1]) if self._t.size else None

    def push(self, t: IntArray, p: FloatArray) -> tuple[IntArray, FloatArray]:
        t, p = np.concatenate([self._t, t]), np.concatenate([self._p, p])
        if t.size == 0:
            return t, p
        idx = t // self.bin_ns
        done = int(np.searchsorted(idx, idx[-1]))
        self._t, self._p = t[done:], p[done:]
        return self._means(t[:done], p[:done], idx[:done])

    def flush(self) -> tuple[IntArray, FloatArray]:
        t, p = self._t, self._p
        self._t, self._p = t[:0], p[:0]
        return self._means(t, p, t // self.bin_ns)

    def _means(self, t: IntArray, p: FloatArray, idx: IntArray) -> tuple[IntArray, FloatArray]:
        if t.size == 0:
            return t, p
        starts = np.flatnonzero(np.diff(idx, prepend=idx[0] - 1))
        n = np.diff(np.append(starts, t.size))
        base = idx[starts] * self.bin_ns  # sums of offsets within a bin: no int64 overflow
        offset = np.add.reduceat((t - np.repeat(base, n)).astype(np.float64), starts) / n
        return base + np.round(offset).astype(np.int64), np.add.reduceat(p, starts) / n


@dataclass(frozen=True)
class Edge:
    """A burst's rising edge: time, cumulative energy there, and the levels it was seen with."""

    t_ns: int
    energy_j: float
    separation: float
    after_gap: bool
    peak_before_w: float = math.inf
    busy_w: float = -math.inf
    idle_samples: int = -1
    """Highest power since the previous edge, and the busy threshold when this edge was
    found: a previous "burst" under the threshold now was no burst (a job waking the GPU
    from deep idle long before its first step moves the levels later). ``idle_samples``:
    samples classified idle since the previous edge (one: the dip was barely seen)."""


class BurstEdges:
    """Feed samples in time order; get rising edges of busy bursts as they are seen."""

    def __init__(self, *, min_period_s: float, memory_s: float) -> None:
        self.min_period_ns = round(min_period_s * 1e9)
        self.memory_ns = round(memory_s * 1e9)
        self.lookahead_ns = min(round(LOOKAHEAD_S * 1e9), self.memory_ns // 2)
        self._t = np.zeros(0, np.int64)  # recent samples, for the levels
        self._p = np.zeros(0, np.float64)
        self._pending = 0  # how many of the newest recent samples are not yet classified
        self._state = -1  # 1 busy, 0 idle, -1 unknown (start, after a gap, levels unclear)
        self._last: tuple[int, float, float] | None = None  # (t_ns, power_w, energy_j)
        self._below: tuple[int, float, float] | None = None  # last sample under the edge level
        self._energy_j = 0.0
        self._last_edge_ns: int | None = None
        self._peak_w = -math.inf  # highest power since the last edge
        self._idle_n = 0  # idle samples since the last edge
        self._gap_since_edge = True
        self.levels: Levels | None = None
        self.spacing_ns: float | None = None
        self._bins = BinMeans(self.min_period_ns // BINS_PER_MIN_PERIOD)

    def push(self, t_ns: IntArray, power_w: FloatArray) -> list[Edge]:
        """Take samples (time-ordered, after the previous ones); return the edges found."""
        t = np.asarray(t_ns, dtype=np.int64)
        p = np.asarray(power_w, dtype=np.float64)
        if t.shape != p.shape or t.ndim != 1:
            raise ValueError(f"times {t.shape} and powers {p.shape} must be 1-d of one length")
        keep = np.isfinite(p)
        newest = self._bins.newest_ns if self._bins.newest_ns is not None else (
            int(self._t[-1]) if self._t.size else None)
        if newest is not None:
            keep &= t > newest
        t, p = t[keep], p[keep]
        if t.size and np.any(np.diff(t) <= 0):
            raise ValueError("sample times must increase")
        return self._take(*self._bins.push(t, p))

    def _take(self, t: IntArray, p: FloatArray) -> list[Edge]:
        """Hold binned samples; classify those the lookahead has passed."""
        self._t = np.concatenate([self._t, t])
        self._p = np.concatenate([self._p, p])
        self._pending += t.size
        if self._t.size < 2 or self._pending == 0:
            return []
        frontier = int(self._t[-1]) - self.lookahead_ns
        return self._advance(int(np.searchsorted(self._t[-self._pending:], frontier, "right")))

    @property
    def held_samples(self) -> int:
        return int(self._t.size)

    def finish(self) -> list[Edge]:
        """Classify the samples still held for the lookahead (the stream has ended)."""
        self._take(*self._bins.flush())
        return self._advance(self._pending) if self._t.size >= 2 else []

    def _advance(self, ready: int) -> list[Edge]:
        """Classify the oldest ``ready`` pending samples; forget what the levels no longer need."""
        if ready == 0:
            return []
        self.spacing_ns = float(np.median(np.diff(self._t[-min(self._t.size, 4096):])))
        self.levels = two_levels(self._p)
        first = self._t.size - self._pending
        edges = self._classify(self._t[first:first + ready], self._p[first:first + ready])
        self._pending -= ready
        done = int(self._t[first + ready - 1])
        cut = max(int(np.searchsorted(self._t, done - self.memory_ns)),
                  self._t.size - MAX_SAMPLES)
        cut = min(cut, self._t.size - self._pending)
        self._t, self._p = self._t[cut:], self._p[cut:]
        return edges

    def _classify(self, t: IntArray, p: FloatArray) -> list[Edge]:
        """Hysteresis states of new samples, piece by piece between gaps, and their edges."""
        gap = self._gap_mask(t)
        energy = self._integrate(t, p, gap)
        lv = self.levels
        if lv is None or not lv.separable:  # no steps to see: nothing spans this stretch
            self._state, self._below, self._gap_since_edge = -1, None, True
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
        lo, hi, mid = (lv.threshold_w(f) for f in (IDLE_FRACTION, BUSY_FRACTION, EDGE_FRACTION))
        code = np.where(p >= hi, 1, np.where(p <= lo, 0, -1))
        at = np.where(code >= 0, np.arange(code.size), -1)
        np.maximum.accumulate(at, out=at)
        state = np.where(at >= 0, code[np.maximum(at, 0)], self._state)
        before = np.concatenate([[self._state], state[:-1]])
        rises = np.flatnonzero((state == 1) & (before == 0))
        self._state = int(state[-1])
        out, start = [], 0
        for j in rises:
            e = self._edge(int(j), t, p, energy, mid=mid, separation=lv.separation)
            if self._last_edge_ns is not None and e.t_ns - self._last_edge_ns < self.min_period_ns:
                continue  # a dip inside one step, not a new step
            peak = max(self._peak_w, float(np.max(p[start:j], initial=-math.inf)))
            idle = self._idle_n + int(np.count_nonzero(state[start:j] == 0))
            out.append(Edge(e.t_ns, e.energy_j, e.separation, e.after_gap, peak, hi, idle))
            self._last_edge_ns, self._peak_w, self._idle_n = e.t_ns, -math.inf, 0
            start = int(j)
        self._peak_w = max(self._peak_w, float(np.max(p[start:])))
        self._idle_n += int(np.count_nonzero(state[start:] == 0))
        under = np.flatnonzero(p < mid)
        if under.size:
            k = int(under[-1])
            self._below = (int(t[k]), float(p[k]), float(energy[k]))
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
        """The crossing of the edge level before sample j, interpolated, with energy there."""
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
