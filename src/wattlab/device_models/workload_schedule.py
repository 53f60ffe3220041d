"""A workload as utilisation over time: segments of constant busyness, once or repeating.

Why a shared model: the same schedule drives a real GPU (the calibration telegraph load)
and the simulated GPU (demo, sweeps, tuning), and the analysis checks itself against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Segment:
    """A stretch of constant GPU utilisation (0 idle .. 1 fully busy)."""

    duration_s: float
    utilisation: float
    name: str = ""


class WorkloadSchedule:
    """Utilisation over time, as segments; after the end the GPU idles (or it repeats)."""

    def __init__(
        self,
        segments: Iterable[Segment | tuple[float, float] | tuple[float, float, str]],
        repeat: bool = False,
    ) -> None:
        segs: list[Segment] = []
        for s in segments:
            seg = s if isinstance(s, Segment) else Segment(*s)
            if not (seg.duration_s > 0 and math.isfinite(seg.duration_s)):
                raise UsageError(f"workload segment {seg}: duration must be > 0 s")
            if not 0.0 <= seg.utilisation <= 1.0:
                raise UsageError(f"workload segment {seg}: utilisation must be within 0..1")
            segs.append(seg)
        if not segs:
            raise UsageError("a workload schedule needs at least one segment")
        self.segments: tuple[Segment, ...] = tuple(segs)
        self.repeat = repeat
        dur = np.array([s.duration_s for s in segs])
        self._util = np.array([s.utilisation for s in segs])
        self._ends_s = np.cumsum(dur)
        self._starts_s = self._ends_s - dur
        self._cum_u = np.concatenate([[0.0], np.cumsum(dur * self._util)])

    @property
    def duration_s(self) -> float:
        """Length of one pass through the segments (s)."""
        return float(self._ends_s[-1])

    def _wrap(self, t_s: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Split times into (whole cycles, time within the cycle); no cycles unless repeating."""
        if not self.repeat:
            return np.zeros_like(t_s), t_s
        cycles = np.floor(t_s / self.duration_s)
        return cycles, t_s - cycles * self.duration_s

    def utilisation_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """Utilisation at schedule times (s); 0 before the start and after the end."""
        t = np.asarray(t_s, dtype=np.float64)
        _, within = self._wrap(t)
        idx = np.searchsorted(self._ends_s, within, side="right")
        u = np.append(self._util, 0.0)[np.minimum(idx, len(self._util))]
        return np.where(t < 0, 0.0, u)

    def integral(self, t_s: npt.ArrayLike) -> FloatArray:
        """Exact integral of utilisation from 0 to t (s): busy-seconds."""
        t = np.maximum(np.asarray(t_s, dtype=np.float64), 0.0)
        cycles, within = self._wrap(t)
        idx = np.minimum(np.searchsorted(self._ends_s, within, side="right"), len(self._util))
        util = np.append(self._util, 0.0)[idx]
        start = np.append(self._starts_s, self.duration_s)[idx]
        partial = self._cum_u[idx] + util * (within - start)
        return cycles * self._cum_u[-1] + partial

    def pieces_from(self, t_s: float) -> Iterator[tuple[float, float]]:
        """(seconds left, utilisation) of each segment from schedule time t on, endlessly.

        Why: a simulated GPU that runs the job slower than the schedule's own pace walks
        the schedule piece by piece at its own rate; after a once-only schedule's end the
        GPU idles for ever.
        """
        t = max(0.0, float(t_s))
        cycle, n = self.duration_s, len(self._util)
        within = t - math.floor(t / cycle) * cycle if self.repeat else t
        idx = int(np.searchsorted(self._ends_s, within, side="right"))
        if idx < n and float(self._ends_s[idx]) - within > 1e-12:
            yield float(self._ends_s[idx]) - within, float(self._util[idx])
        while True:
            idx += 1
            if idx >= n:
                if not self.repeat:
                    yield math.inf, 0.0
                    return
                idx = 0
            yield float(self._ends_s[idx] - self._starts_s[idx]), float(self._util[idx])

    def segment_name_at(self, t_s: float) -> str:
        """Name of the segment running at t (s); "" outside the schedule."""
        if t_s < 0:
            return ""
        _, within = self._wrap(np.array([t_s]))
        idx = int(np.searchsorted(self._ends_s, within, side="right")[0])
        return self.segments[idx].name if idx < len(self.segments) else ""

    @classmethod
    def constant(cls, utilisation: float, duration_s: float) -> WorkloadSchedule:
        """One steady segment: the simplest load for physics tests."""
        return cls([Segment(duration_s, utilisation, "constant")])

    @classmethod
    def demo(cls, seed: int, duration_s: float = 20.0) -> WorkloadSchedule:
        """Idle, half, full, bursts, idle, full, half, idle: every regime a calibration needs."""
        if duration_s <= 0:
            raise UsageError(f"demo schedule duration must be > 0 s, got {duration_s}")
        rng = np.random.default_rng([seed, 0xDE70])
        plan = [
            ("idle", 0.0, 0.10),
            ("half", 0.5, 0.14),
            ("full", 1.0, 0.18),
            ("burst", -1.0, 0.16),
            ("idle", 0.0, 0.08),
            ("full", 1.0, 0.14),
            ("half", 0.5, 0.10),
            ("idle", 0.0, 0.10),
        ]
        weights = np.array([p[2] for p in plan]) * rng.uniform(0.75, 1.25, len(plan))
        lengths = weights / weights.sum() * duration_s
        segs: list[Segment] = []
        for (name, util, _), length in zip(plan, lengths, strict=True):
            if util >= 0:
                segs.append(Segment(float(length), util, name))
                continue
            on_s, off_s = rng.choice([0.05, 0.1, 0.2]), rng.choice([0.05, 0.1, 0.2])
            left = float(length)
            busy = True
            while left > 1e-9:
                step = min(float(on_s if busy else off_s), left)
                segs.append(Segment(step, 1.0 if busy else 0.0, name))
                left -= step
                busy = not busy
        return cls(segs)

    @classmethod
    def random(cls, seed: int, duration_s: float) -> WorkloadSchedule:
        """Random idle/half/full segments of 50 ms to 3 s, like the real H100 capture."""
        if duration_s <= 0:
            raise UsageError(f"random schedule duration must be > 0 s, got {duration_s}")
        rng = np.random.default_rng([seed, 0x5A4D])
        lengths = np.array([0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0])
        levels = (("idle", 0.0), ("half", 0.5), ("full", 1.0))
        segs: list[Segment] = []
        left = duration_s
        while left > 1e-9:
            name, util = levels[int(rng.integers(len(levels)))]
            step = min(float(rng.choice(lengths)), left)
            segs.append(Segment(step, util, name))
            left -= step
        return cls(segs)
