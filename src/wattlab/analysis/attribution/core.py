"""The attribution core: the energy of each activity from a power stream and a stated rule.

Why one core: per-request, per-unit-of-work and per-process energy are the same question
(whose joules were these?) and must give the same kind of answer, with idle apart and
every joule counted once. The span is cut at every activity's start and end; in each
piece the energy above idle (dynamic) is shared among the activities running there by the
rule's weights; dynamic energy where nothing ran is ``unattributed``; idle is idle power
times the span. Parts + unattributed + idle must equal the stream's energy over the span
to ``CLOSURE`` (a miss is a bug, raised).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.attribution.rule import Rule

FloatArray = npt.NDArray[np.float64]
CLOSURE = 1e-3  # parts + unattributed + idle against the total, relative


@dataclass(frozen=True)
class Activity:
    """Work of one owner (a request, a process) of one kind, running from t0 to t1 (s).

    ``intensity`` scales the rule's weight for this activity (a utilisation sample, a batch
    share); 1 where the activity is simply on or off.
    """

    owner: str
    kind: str
    t0_s: float
    t1_s: float
    intensity: float = 1.0


@dataclass
class Attribution:
    """Each (owner, kind)'s share of the span's energy, idle and the unattributed part apart."""

    rule: Rule
    t0_s: float
    t1_s: float
    total_j: float
    idle_w: float
    idle_j: float
    unattributed_j: float
    parts_j: dict[tuple[str, str], float]
    notes: list[str] = field(default_factory=list)

    def by_owner(self) -> dict[str, float]:
        """Each owner's energy, all kinds summed."""
        out: dict[str, float] = {}
        for (owner, _), e in self.parts_j.items():
            out[owner] = out.get(owner, 0.0) + e
        return out

    @property
    def closure_j(self) -> float:
        """Parts + unattributed + idle - total (0 up to rounding)."""
        return sum(self.parts_j.values()) + self.unattributed_j + self.idle_j - self.total_j

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule.to_json(), "t0_s": self.t0_s, "t1_s": self.t1_s,
                "total_j": self.total_j, "idle_w": self.idle_w, "idle_j": self.idle_j,
                "unattributed_j": self.unattributed_j,
                "attributed_j": sum(self.parts_j.values()), "closure_j": self.closure_j,
                "notes": list(self.notes)}


def cumulative_energy(t_s: FloatArray, power_w: FloatArray, at_s: FloatArray) -> FloatArray:
    """Energy (J) from ``t_s[0]`` to each of ``at_s``: the integral of the linear interpolant.

    Exact for the piecewise-linear power the trapezoid rule integrates, also between samples;
    ``at_s`` must lie within ``t_s``.
    """
    dt = np.diff(t_s)
    cum = np.concatenate(([0.0], np.cumsum(0.5 * (power_w[1:] + power_w[:-1]) * dt)))
    i = np.clip(np.searchsorted(t_s, at_s, side="right") - 1, 0, t_s.size - 2)
    h = at_s - t_s[i]
    slope = (power_w[i + 1] - power_w[i]) / dt[i]
    out: FloatArray = cum[i] + power_w[i] * h + 0.5 * slope * h * h
    return out


def pieces(activities: Sequence[Activity], t0_s: float, t1_s: float) -> FloatArray:
    """The span's edges: its ends and every activity edge inside it, sorted, unique."""
    inner = [t for a in activities for t in (a.t0_s, a.t1_s) if t0_s < t < t1_s]
    return np.unique(np.array([t0_s, t1_s, *inner], dtype=np.float64))


def running(edges: FloatArray, activities: Sequence[Activity], values: FloatArray
            ) -> FloatArray:
    """Per piece, the sum of ``values`` of the activities running in it (difference array)."""
    acc = np.zeros(edges.size, dtype=np.float64)
    i0, i1 = piece_range(edges, activities)
    np.add.at(acc, i0, values)
    np.add.at(acc, i1, -values)
    out: FloatArray = np.cumsum(acc)[:-1]
    return out


def piece_range(edges: FloatArray, activities: Sequence[Activity]
                ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Each activity's first piece and one past its last (clipped to the span)."""
    t0 = np.clip([a.t0_s for a in activities], edges[0], edges[-1])
    t1 = np.clip([a.t1_s for a in activities], edges[0], edges[-1])
    return (np.searchsorted(edges, t0).astype(np.intp),
            np.searchsorted(edges, t1).astype(np.intp))


def attribute(t_s: FloatArray, power_w: FloatArray, idle_w: float,
              activities: Sequence[Activity], rule: Rule, *,
              span_s: tuple[float, float] | None = None) -> Attribution:
    """Share the span's dynamic energy among ``activities`` by ``rule``; idle apart.

    ``t_s``/``power_w``: the power stream (finite, time increasing); ``span_s``: the span
    to attribute (default: the stream's), clipped to the stream. Raises RuntimeError where
    the parts do not add up to the total (a bug, never a property of the data).
    """
    t0_s = max(t_s[0], span_s[0]) if span_s else float(t_s[0])
    t1_s = min(t_s[-1], span_s[1]) if span_s else float(t_s[-1])
    edges = pieces(activities, t0_s, t1_s)
    e_at = cumulative_energy(t_s, power_w, edges)
    dynamic = np.diff(e_at) - idle_w * np.diff(edges)
    parts: dict[tuple[str, str], float] = {}
    unattributed = float(dynamic.sum())
    if activities:
        w = np.array([rule.weight(a.kind) * a.intensity for a in activities])
        total_w = running(edges, activities, w)
        # shared where some activity of weight > 0 runs: counted, as the running sum of
        # weights may leave a rounding residue (1e-15) where none does
        shared = (running(edges, activities, (w > 0).astype(np.float64)) > 0.5) & (total_w > 0)
        per_weight = np.concatenate(([0.0], np.cumsum(
            np.where(shared, dynamic / np.where(shared, total_w, 1.0), 0.0))))
        i0, i1 = piece_range(edges, activities)
        for a, e in zip(activities, w * (per_weight[i1] - per_weight[i0]), strict=True):
            parts[(a.owner, a.kind)] = parts.get((a.owner, a.kind), 0.0) + float(e)
        unattributed = float(dynamic[~shared].sum())
    total = float(e_at[-1] - e_at[0])
    out = Attribution(rule, t0_s, t1_s, total, idle_w, idle_w * (t1_s - t0_s), unattributed,
                      parts)
    if abs(out.closure_j) > CLOSURE * max(abs(total), 1e-12):
        raise RuntimeError(f"attribution does not add up: parts + unattributed + idle - total "
                           f"= {out.closure_j:.6g} J of {total:.6g} J (a bug in wattlab)")
    return out

