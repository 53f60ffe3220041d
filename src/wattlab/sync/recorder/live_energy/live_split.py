"""One GPU's dynamic energy split among its processes live, by Kepler's rule.

Why this rule and not ``wattlab energy --by-process``'s: the activity rule learns each
process's watts from where it worked alone, which needs the whole run; the only split
computable as rows arrive is the share of SM utilisation (Kepler's), which errs where
utilisation is not power (BENCHMARKS.md, "Energy per process"). The figures here are for a
dashboard; the run file's ``--by-process`` is the better figure after the run.

Time is cut into windows of ``WINDOW_S``. A window is settled once the power stream has
passed its end by ``SETTLE_S`` (the per-process rows lag the power rows by up to a state
read and a flush); then its energy (trapezoids of the power rows, as ``wattlab energy``),
less idle and static, is shared by each process's SM-utilisation-seconds in it. Idle is the
lowest mean power over a stretch with no process present (its last 10 s at most, at least
0.5 s); static the lowest window mean, less idle, with processes present and none active:
both running estimates. While idle is not known, no
window is charged (never a guess); while static is not, only idle is taken off.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict

import numpy as np
import numpy.typing as npt

WINDOW_S = 1.0
WINDOW_NS = int(WINDOW_S * 1e9)
SETTLE_S = 3.0  # rows of processes arrive up to a state read (0.9 s) and a flush late
SETTLE_NS = int(SETTLE_S * 1e9)
# a process marker is stamped up to one state read (0.9 s) after the context came or went:
# idle and static are measured only where they end this long before the next marker
EDGE_MARGIN_NS = 900_000_000
IDLE_MIN_NS = 500_000_000  # the shortest stretch with no process that measures idle
IDLE_SPAN_NS = 10_000_000_000  # idle is the mean over at most the last 10 s of a stretch
DEFAULT_PERIOD_NS = 166_000_000  # the driver's sampling period on an H100/H200 (~1/6 s)


class GpuLiveSplit:
    """Windows of one GPU: power rows, per-process SM rows, presence from the markers."""

    def __init__(self) -> None:
        self.idle_w: float | None = None
        self.static_w: float | None = None
        self.late_rows = 0  # per-process rows for windows already settled (not charged)
        self._t_ns = np.empty(0, dtype=np.int64)  # power rows still needed, and their
        self._cum_j = np.empty(0, dtype=np.float64)  # energy from the first row
        self._last_w = math.nan
        self._next_k: int | None = None  # the first window not settled
        self._sm_s: dict[int, dict[int, float]] = defaultdict(dict)  # window -> pid -> SM%·s
        self._period_ns = DEFAULT_PERIOD_NS
        self._events_ns: list[int] = []  # presence changes, in time order
        self._present_after: list[frozenset[int]] = []  # pids present after each change
        self._present: frozenset[int] = frozenset()

    # ---- feeding --------------------------------------------------------------------------
    def presence(self, t_ns: int, pid: int, came: bool) -> None:
        """Process ``pid`` came or left at ``t_ns`` (its marker)."""
        self._present = self._present | {pid} if came else self._present - {pid}
        i = bisect_right(self._events_ns, t_ns)  # markers of one instant in their order
        self._events_ns.insert(i, t_ns)
        self._present_after.insert(i, self._present)

    def add_power(self, t_ns: npt.NDArray[np.int64], power_w: npt.NDArray[np.float64]
                  ) -> list[tuple[int, dict[int, float]]]:
        """Power rows in time order; the windows they settle: (window, {pid: J})."""
        if not len(t_ns):
            return []
        w = np.where(np.isfinite(power_w), power_w, np.nan)
        if len(self._t_ns):
            t = np.concatenate(([self._t_ns[-1]], t_ns))
            w = np.concatenate(([self._last_w], w))
            start_j = float(self._cum_j[-1])
        else:
            t, start_j = t_ns, 0.0
            self._next_k = int(t_ns[0] // WINDOW_NS) + 1  # the first whole window
        steps = np.nan_to_num(0.5 * (w[1:] + w[:-1]) * (np.diff(t) * 1e-9))
        cum = start_j + np.concatenate(([0.0], np.cumsum(steps)))
        keep = 1 if len(self._t_ns) else 0
        self._t_ns = np.concatenate((self._t_ns, t[keep:]))
        self._cum_j = np.concatenate((self._cum_j, cum[keep:]))
        self._last_w = float(w[-1])
        return self._settle()

    def add_processes(self, t_ns: npt.NDArray[np.int64], pid: npt.NDArray[np.float64],
                      sm_pct: npt.NDArray[np.float64]) -> None:
        """Per-process rows: each covers one driver period before its stamp."""
        ok = np.isfinite(pid) & np.isfinite(sm_pct) & (sm_pct > 0)
        order = np.lexsort((t_ns, pid))  # each pid's rows in time order: its own steps
        same_pid = np.diff(pid[order]) == 0
        steps = np.diff(t_ns[order])[same_pid & (np.diff(t_ns[order]) > 0)]
        if len(steps):
            self._period_ns = min(int(np.median(steps)), WINDOW_NS)
        t_end, p, sm = t_ns[ok], pid[ok].astype(np.int64), sm_pct[ok]
        if not len(t_end):
            return
        t_start = t_end - self._period_ns
        k0, k1 = t_start // WINDOW_NS, t_end // WINDOW_NS
        first_s = (np.minimum(t_end, (k0 + 1) * WINDOW_NS) - t_start) * 1e-9
        second_s = np.where(k1 > k0, (t_end - k1 * WINDOW_NS) * 1e-9, 0.0)
        k = np.concatenate((k0, k1))
        pids = np.concatenate((p, p))
        sm_s = np.concatenate((sm * first_s, sm * second_s))
        pairs, where = np.unique(np.stack((k, pids)), axis=1, return_inverse=True)
        sums = np.bincount(where.ravel(), weights=sm_s)
        next_k = self._next_k if self._next_k is not None else -(2 ** 62)
        for (kk, pp), s in zip(pairs.T.tolist(), sums.tolist(), strict=True):
            if s <= 0:
                continue
            if kk < next_k:
                self.late_rows += 1
                continue
            bucket = self._sm_s[kk]
            bucket[pp] = bucket.get(pp, 0.0) + s

    # ---- settling -------------------------------------------------------------------------
    def _settle(self) -> list[tuple[int, dict[int, float]]]:
        assert self._next_k is not None
        last_k = int((self._t_ns[-1] - SETTLE_NS) // WINDOW_NS)  # windows ending before it
        out: list[tuple[int, dict[int, float]]] = []
        for k in range(self._next_k, last_k):
            a, b = k * WINDOW_NS, (k + 1) * WINDOW_NS
            ja, jb = np.interp([a, b], self._t_ns, self._cum_j)
            mean_w = (jb - ja) / WINDOW_S
            sm = self._sm_s.pop(k, {})
            alone = self._alone(a, b) if not sm else None
            if alone is not None:  # no rows: the reader skips the utilisation call then
                sm = {alone: WINDOW_S}
            self._learn(a, b, mean_w, active=bool(sm))
            charged = self._share(mean_w, sm)
            if charged:
                out.append((k, charged))
        if last_k > self._next_k:
            self._next_k = last_k
            keep_from = last_k * WINDOW_NS - IDLE_SPAN_NS  # idle looks back this far
            cut = max(0, int(np.searchsorted(self._t_ns, keep_from)) - 1)
            self._t_ns, self._cum_j = self._t_ns[cut:], self._cum_j[cut:]
            for k in [k for k in self._sm_s if k < last_k]:
                del self._sm_s[k]
        return out

    def _alone(self, a_ns: int, b_ns: int) -> int | None:
        """The one pid present over all of ``[a, b)``, if one process was alone there."""
        i = bisect_right(self._events_ns, a_ns)
        j = bisect_left(self._events_ns, b_ns)
        at_a = self._present_after[i - 1] if i else frozenset()
        sets = [at_a, *self._present_after[i:j]]
        pids = frozenset().union(*sets)
        return next(iter(pids)) if len(pids) == 1 and all(sets) else None

    def _learn(self, a_ns: int, b_ns: int, mean_w: float, active: bool) -> None:
        """Idle from the no-process stretch reaching ``b``; static from a quiet window."""
        i = bisect_right(self._events_ns, b_ns)  # the changes up to b
        present = len(self._present_after[i - 1]) if i else 0
        next_ns = self._events_ns[i] if i < len(self._events_ns) else None
        if present == 0:
            start = max(self._events_ns[i - 1] if i else int(self._t_ns[0]),
                        b_ns - IDLE_SPAN_NS)
            end = b_ns if next_ns is None else min(b_ns, next_ns - EDGE_MARGIN_NS)
            if end - start >= IDLE_MIN_NS:
                ja, jb = np.interp([start, end], self._t_ns, self._cum_j)
                idle_w = float(jb - ja) / ((end - start) * 1e-9)
                self.idle_w = idle_w if self.idle_w is None else min(self.idle_w, idle_w)
        elif (not active and self.idle_w is not None and (i == 0 or self._events_ns[i - 1] <= a_ns)
              and (next_ns is None or next_ns > b_ns + EDGE_MARGIN_NS)):
            static_w = max(0.0, mean_w - self.idle_w)
            self.static_w = static_w if self.static_w is None else min(self.static_w, static_w)

    def _share(self, mean_w: float, sm: dict[int, float]) -> dict[int, float]:
        total = sum(sm.values())
        if self.idle_w is None or total <= 0:
            return {}
        dynamic_j = max(0.0, mean_w - self.idle_w - (self.static_w or 0.0)) * WINDOW_S
        return {pid: dynamic_j * s / total for pid, s in sm.items()}
