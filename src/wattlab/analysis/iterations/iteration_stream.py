"""Training iterations found on a live power stream, incrementally, in bounded memory.

Why: an online controller (``wattlab tune``) must know, while the job trains, where each
iteration began and ended and what it cost, without keeping the whole stream. An iteration
is the time from one busy burst's rising edge to the next (``burst_edges``): it includes
the step's idle tail (data loading), so iterations tile the run and their energies add up
to the run's. The offline analysis (``iterations``) feeds a recording through this same
class, so online and offline agree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.iterations.burst_edges import BurstEdges, Edge

PERIODS_KEPT = 4096
"""Recent periods kept for ``state`` (a median over the last ~20 min of 0.3 s steps)."""


@dataclass(frozen=True)
class DetectedIteration:
    """One iteration: rising edge to the next rising edge, and the energy in between.

    ``separation``: how far apart the busy and idle power levels were when it was seen, in
    noise standard deviations (larger is clearer; under 4 nothing is detected).
    ``idle_samples``: samples seen idle before the next step began (1: a barely-seen dip,
    where a neighbouring step's dip may have been missed).
    """

    start_ns: int
    end_ns: int
    energy_j: float
    separation: float = float("nan")
    idle_samples: int = -1

    @property
    def period_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def mean_power_w(self) -> float:
        return self.energy_j / self.period_s if self.end_ns > self.start_ns else float("nan")


@dataclass(frozen=True)
class StreamState:
    """Summary for status lines: iterations so far and the recent period distribution."""

    count: int
    median_period_s: float | None
    period_iqr_s: float | None
    median_energy_j: float | None

    def __str__(self) -> str:
        if self.median_period_s is None:
            return f"{self.count} iterations"
        return (f"{self.count} iterations, period {self.median_period_s * 1e3:.1f} ms "
                f"(IQR {(self.period_iqr_s or 0.0) * 1e3:.1f} ms)")


def quartiles(values: npt.ArrayLike) -> tuple[float, float, float]:
    """(25th, 50th, 75th) percentiles."""
    q = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(q[0]), float(q[1]), float(q[2])


class IterationStream:
    """Push power samples as they arrive; get the iterations completed since the last push.

    Memory is bounded by ``memory_s`` of samples (for the busy/idle levels) and the last
    ``PERIODS_KEPT`` periods (for ``state``). An iteration is reported ~2 s after it ends
    (``burst_edges.LOOKAHEAD_S``); ``finish`` reports the rest when the stream ends. Rising
    edges closer than ``min_period_s`` are one step (a dip inside a step); an iteration
    longer than ``max_period_s`` (a pause, an evaluation) is not reported, and the next one
    starts at the following edge.
    """

    def __init__(self, *, min_period_s: float = 0.01, max_period_s: float = 10.0,
                 memory_s: float = 60.0) -> None:
        if not 0 < min_period_s < max_period_s:
            raise ValueError(f"need 0 < min_period_s ({min_period_s}) < max_period_s "
                             f"({max_period_s})")
        if memory_s <= 0:
            raise ValueError(f"memory_s must be > 0, got {memory_s}")
        self.max_period_ns = round(max_period_s * 1e9)
        self._edges = BurstEdges(min_period_s=min_period_s, memory_s=memory_s)
        self._previous: Edge | None = None
        self._count = 0
        self._periods_s: deque[float] = deque(maxlen=PERIODS_KEPT)
        self._energies_j: deque[float] = deque(maxlen=PERIODS_KEPT)
        self._closed = 0
        self.skipped = 0

    def push(self, t_ns: npt.NDArray[np.int64], power_w: npt.NDArray[np.float64]
             ) -> list[DetectedIteration]:
        """Take samples (time-ordered); return iterations completed since the last push."""
        return self._iterations(self._edges.push(t_ns, power_w))

    def finish(self) -> list[DetectedIteration]:
        """At the end of a stream: the iterations the lookahead was still holding back."""
        return self._iterations(self._edges.finish())

    def _iterations(self, edges: list[Edge]) -> list[DetectedIteration]:
        out = []
        for edge in edges:
            prev, self._previous = self._previous, edge
            if prev is None or edge.peak_before_w < edge.busy_w:
                continue  # the first edge, or the previous one began no real burst
            self._closed += 1
            if edge.after_gap or edge.t_ns - prev.t_ns > self.max_period_ns:
                self.skipped += 1
                continue
            it = DetectedIteration(prev.t_ns, edge.t_ns, edge.energy_j - prev.energy_j,
                                   min(prev.separation, edge.separation), edge.idle_samples)
            self._count += 1
            self._periods_s.append(it.period_s)
            self._energies_j.append(it.energy_j)
            out.append(it)
        return out

    @property
    def steps_seen(self) -> int:
        """Bursts seen: iterations completed, skipped, and the one still open."""
        return self._closed + (self._previous is not None)

    @property
    def held_samples(self) -> int:
        """Samples held now (for the levels and the lookahead): bounded by ``memory_s``."""
        return self._edges.held_samples

    @property
    def spacing_s(self) -> float | None:
        """Median sample spacing of the stream (None before the first levels)."""
        ns = self._edges.spacing_ns
        return None if ns is None else ns / 1e9

    @property
    def separation(self) -> float | None:
        """Busy/idle level separation now, in noise standard deviations (None: too early)."""
        lv = self._edges.levels
        return None if lv is None else lv.separation

    @property
    def state(self) -> StreamState:
        if not self._periods_s:
            return StreamState(self._count, None, None, None)
        q1, med, q3 = quartiles(self._periods_s)
        return StreamState(self._count, med, q3 - q1, float(np.median(self._energies_j)))
