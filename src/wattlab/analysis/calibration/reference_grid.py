"""The calibration's reference: its running integral on a uniform fine grid, gaps marked.

Why a module of its own: the kernel fits (kernel_fit.py) ask the reference for window
means at every reading about a thousand times, the energy checks (energy_check.py) for
its energy over phases; a uniform grid answers each by an index computation, and which
bins are gaps (a meter's lost data) travels with it. calibrate.py builds it once per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import (
    Cumulative,
    bin_means,
    grid_edges,
    integrate_view,
    known_gaps_ns,
)
from wattlab.runfile import Run, SourceView

FloatArray = npt.NDArray[np.float64]


@dataclass
class ReferenceGrid:
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

    def decimated(self, factor: int) -> ReferenceGrid:
        """The same reference on a grid ``factor`` times coarser (exact bin means)."""
        cum, hole = self.cum_j[::factor], self.cum_hole_s[::factor]
        edges = self.edges[::factor]
        means = np.diff(cum) / np.diff(edges)
        means[np.diff(hole) > 0] = np.nan
        return ReferenceGrid(edges, cum, hole, means)


def reference_grid(run: Run, view: SourceView, channel: str, span: tuple[float, float],
              rate_hz: float) -> tuple[ReferenceGrid, Cumulative]:
    """The reference on the fine grid, and its running integral there (one pass)."""
    edges = grid_edges(span[0], span[1], rate_hz)
    cum_raw = integrate_view(view, [channel], edges, bridges=False,
                             known_gaps_ns=known_gaps_ns(run, view.source_id))[0]
    means = bin_means(cum_raw)
    nan = ~np.isfinite(means)
    if not nan.any():  # the running integral itself (fewer arrays of millions of bins)
        start = float(cum_raw.integral[0])  # 0 where the grid starts at the first sample
        cum = cum_raw.integral - start if start else cum_raw.integral
        return ReferenceGrid(edges, cum, np.zeros(edges.size), means), cum_raw
    dt = np.diff(edges)
    cum = np.concatenate(([0.0], np.cumsum(np.where(nan, 0.0, means) * dt)))
    cum_hole = np.concatenate(([0.0], np.cumsum(np.where(nan, dt, 0.0))))
    return ReferenceGrid(edges, cum, cum_hole, means), cum_raw


def coarser_means(cum: Cumulative, edges_s: FloatArray) -> FloatArray:
    """Bin means on a coarser grid from a running integral on a fine one (no re-reading)."""
    return bin_means(Cumulative(edges_s, np.interp(edges_s, cum.times_s, cum.integral),
                                np.interp(edges_s, cum.times_s, cum.uncovered_s), cum.span_s))
