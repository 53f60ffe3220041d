"""The shared parts of a GPU's power: idle (no context) and static (contexts, no kernel).

*Idle* is the GPU's power while no process holds a context on it: measured over the run's
stretches with no process present. Where there are none (a process held the GPU
throughout), idle cannot be measured from the run: the run's lowest stable power (its
lowest 1 s mean) stands in, marked, with the spread of that second as its ±; it is an
upper bound (it holds static, and work if the GPU never rested).
*Static* is what live contexts add while no kernel runs: the power over stretches where
processes are present and every one of them shows no activity, less idle. Where there is
no such stretch it is not measured (0, said so): the context's cost is then in the dynamic
part. *Dynamic* is the rest.

Who pays the shared parts when they are charged (``--charge static,idle``, for chargeback):
each moment a process holds a context it shares that moment with the others present, in
equal parts; static and idle are charged by these shares, which sum to 1 where any process
was present, so no joule is charged twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wattlab.analysis.attribution.core import Activity, FloatArray, piece_range, pieces, running
from wattlab.analysis.attribution.learn import free_stretches, measure_idle
from wattlab.analysis.attribution.power_stream import PowerStream
from wattlab.analysis.attribution.process_table import Process, ProcessTable

IDLE_MIN_S = 1.0  # a stretch with no process shorter than this does not measure idle
STATIC_MIN_S = 0.5  # nor one with processes and no activity static
STABLE_S = 1.0  # the window of "the lowest stable power"


@dataclass
class Baseline:
    """Idle and static power (W) with their ± and how each was obtained."""

    idle_w: float
    idle_pm_w: float
    idle_how: str
    idle_measured: bool
    static_w: float
    static_pm_w: float
    static_how: str
    # the ± of idle + static, what the dynamic energy lies above: measured as one mean where
    # static was (static is that mean less idle, so idle's ± is in static's), else idle's
    base_pm_w: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"idle_w": self.idle_w, "idle_pm_w": self.idle_pm_w, "idle_how": self.idle_how,
                "idle_measured": self.idle_measured, "static_w": self.static_w,
                "static_pm_w": self.static_pm_w, "static_how": self.static_how}


def presence(table: ProcessTable) -> list[tuple[float, float]]:
    """Each process's present span."""
    return [p.present_s for p in table.processes]


def active_intervals(table: ProcessTable) -> list[tuple[float, float]]:
    """The sample intervals in which some process showed activity."""
    return [(a, b) for p in table.processes
            for a, b, s, m in zip(p.t0_s, p.t1_s, p.sm, p.mem, strict=True)
            if s + m > 0]


def measure_baseline(stream: PowerStream, table: ProcessTable) -> Baseline:
    """Idle and static of one GPU over its run (module doc)."""
    t, p = stream.t_s, stream.power_w
    guard = max(stream.edge_s, 0.1)
    present = presence(table)
    # idle only clear of every presence edge, static only well inside the presence: a
    # stretch at an edge may hold a context the list did not show yet (or any more)
    edge = table.edge_s
    widened = [(a - edge, b + edge) for a, b in present]
    narrowed = [(a + edge, b - edge) for a, b in present if b - a > 2 * edge]
    got = measure_idle(t, p, widened, guard_s=guard, min_s=IDLE_MIN_S)
    if got is not None:
        idle_w, idle_pm, measured = got[0], got[1], True
        idle_how = f"measured on {stream.name} over {got[2]:.2f} s with no process on the GPU"
    else:
        idle_w, idle_pm = lowest_stable(t, p)
        measured = False
        idle_how = (f"not measurable from this run: no stretch of >= {IDLE_MIN_S:g} s without a "
                    f"process on the GPU; the run's lowest stable power ({STABLE_S:g} s mean) "
                    "stands in: an upper bound of idle")
    # activity too is known only to the read step (a lone process's may come from the
    # device's utilisation, read with the list): static only clear of it by that much
    active = [(a - edge, b + edge) for a, b in active_intervals(table)]
    busy = active + free_stretches(narrowed, float(t[0]), float(t[-1]))
    got = measure_idle(t, p, busy, guard_s=guard, min_s=STATIC_MIN_S)
    if got is None:
        return Baseline(idle_w, idle_pm, idle_how, measured, 0.0, 0.0,
                        f"not measured: no stretch of >= {STATIC_MIN_S:g} s where processes held "
                        "the GPU with no activity; what a live context costs is in dynamic",
                        idle_pm)
    static_w = got[0] - idle_w
    return Baseline(idle_w, idle_pm, idle_how, measured, static_w,
                    math.hypot(got[1], idle_pm) if math.isfinite(got[1]) else idle_pm,
                    f"measured on {stream.name} over {got[2]:.2f} s with processes present "
                    "and no activity, less idle", got[1] if math.isfinite(got[1]) else idle_pm)


def place_lone_edges(procs: list[Process], stream: PowerStream, base: Baseline, edge_s: float
                     ) -> int:
    """Move each edge where a process came or went alone to where the power crossed.

    A ``process``/``process-exit`` marker says only that the change fell in the list read
    before it (``edge_s``: half that step); placed halfway, a last process's lone work up
    to half a read long went to no process (the simulated GPU: 25-45 J of a 955 J
    process, 5 %). Where no other process was present within a read of it, a live context
    shows in the power: above idle by static, work above that. The edge goes where the power
    crossed halfway to static, when the stream resolves it (its edge under half the read
    step's half) and static is told from zero (over three times its ±). An end without an
    exit marker (the stream's end) stays. Returns how many moved.
    """
    if (edge_s <= 0 or stream.edge_s >= edge_s / 2 or base.static_w <= 0
            or base.static_w <= 3 * base.static_pm_w):
        return 0
    level_w = base.idle_w + base.static_w / 2
    moved = 0
    for p in procs:
        others = [q.present_s for q in procs if q is not p]
        placed = list(p.present_s)
        for side, at in enumerate(p.present_s):
            lo, hi = at - edge_s, at + edge_s  # the read step the change fell in
            # another's presence, known to a read itself, must not reach into this read
            # step (a tenth of it spare: reads a step apart meet exactly)
            if (side == 1 and not p.exited) or lo < stream.t_s[0] or hi > stream.t_s[-1] or any(
                    a - edge_s < hi - edge_s / 10 and lo + edge_s / 10 < b + edge_s
                    for a, b in others):
                continue
            inside = (stream.t_s >= lo) & (stream.t_s <= hi)
            t, live = stream.t_s[inside], stream.power_w[inside] > level_w
            if t.size < 2:
                continue
            placed[side] = crossing(t, live, lo, hi, rising=side == 0)
            moved += 1
        p.present_s = (placed[0], placed[1])
    return moved


def crossing(t_s: FloatArray, live: np.ndarray, lo_s: float, hi_s: float, *,
             rising: bool) -> float:
    """Where ``live`` turned on (``rising``) or off within [lo, hi]: between the samples."""
    if not live.any():
        return hi_s if rising else lo_s
    i = int(np.argmax(live)) if rising else int(live.size - 1 - np.argmax(live[::-1]))
    if rising:
        return lo_s if i == 0 else float(t_s[i - 1] + t_s[i]) / 2
    return hi_s if i == live.size - 1 else float(t_s[i] + t_s[i + 1]) / 2


def lowest_stable(t_s: FloatArray, power_w: FloatArray) -> tuple[float, float]:
    """The lowest mean power over any ``STABLE_S`` of samples, and those samples' spread."""
    end = np.searchsorted(t_s, t_s + STABLE_S)
    full = end < t_s.size
    if not np.any(full):
        return float(np.min(power_w)), float(np.std(power_w))
    cum = np.concatenate(([0.0], np.cumsum(power_w)))
    starts = np.flatnonzero(full)
    means = (cum[end[starts]] - cum[starts]) / (end[starts] - starts)
    i = int(starts[np.argmin(means)])
    window = power_w[i:end[i]]
    return float(window.mean()), float(window.std(ddof=1)) if window.size > 1 else 0.0


def covered_s(spans: Sequence[tuple[float, float]], t0_s: float, t1_s: float) -> float:
    """Seconds of [t0, t1] that some span covers."""
    return (t1_s - t0_s) - sum(b - a for a, b in free_stretches(spans, t0_s, t1_s))


def charge_shares(table: ProcessTable, span_s: tuple[float, float]) -> dict[str, float]:
    """Each process's share of the time processes held the GPU within ``span_s``."""
    acts = [Activity(p.key, "present", *p.present_s) for p in table.processes]
    if not acts:
        return {}
    edges = pieces(acts, *span_s)
    count = running(edges, acts, np.ones(len(acts)))
    dt = np.diff(edges)
    per_one = np.concatenate(([0.0], np.cumsum(np.where(count > 0.5, dt / np.maximum(count, 1),
                                                         0.0))))
    held = float(dt[count > 0.5].sum())
    if held <= 0:
        return {}
    i0, i1 = piece_range(edges, acts)
    out: dict[str, float] = {}
    for a, lo, hi in zip(acts, i0, i1, strict=True):
        out[a.owner] = out.get(a.owner, 0.0) + float(per_one[hi] - per_one[lo]) / held
    return out
