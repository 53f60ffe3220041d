"""Iterations from the workload's own step markers, with energy from the tapped samples.

Why: a training loop that marks its steps (``wattlab.mark``, ``--auto-markers`` callbacks)
says exactly where each iteration begins, which no power-based detector can beat, and it
keeps working at settings where the bursts are too faint to detect. The markers reach the
run file through the recorder, so they are read back from it (SWMR, new rows only, once a
second); an iteration runs from one step's start to the next, and its energy is the
tapped 50 Hz power integrated over that span.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from wattlab.analysis.iterations import DetectedIteration
from wattlab.runfile import markers_from

READ_EVERY_S = 1.0
KEEP_S = 300.0  # power kept for the energy of iterations whose markers arrive late


class EnergyTrack:
    """Cumulative energy of a power stream over a bounded recent window."""

    def __init__(self) -> None:
        self.t_ns = np.zeros(0, np.int64)
        self.cum_j = np.zeros(0, np.float64)

    def push(self, t_ns: npt.NDArray[np.int64], power_w: npt.NDArray[np.float64]) -> None:
        """Append samples; each one's power counts back to the sample before it."""
        if len(t_ns) == 0:
            return
        prev_t = np.r_[self.t_ns[-1:], t_ns[:-1]] if len(self.t_ns) else np.r_[t_ns[:1],
                                                                              t_ns[:-1]]
        start = float(self.cum_j[-1]) if len(self.cum_j) else 0.0
        cum = start + np.cumsum((t_ns - prev_t) / 1e9 * power_w)
        t = np.concatenate([self.t_ns, t_ns])
        keep = t >= t[-1] - round(KEEP_S * 1e9)
        self.t_ns, self.cum_j = t[keep], np.concatenate([self.cum_j, cum])[keep]

    @property
    def last_ns(self) -> int:
        return int(self.t_ns[-1]) if len(self.t_ns) else 0

    def energy_j(self, a_ns: int, b_ns: int) -> float:
        """Energy between two times within the window (J)."""
        e = np.interp([a_ns, b_ns], self.t_ns, self.cum_j)
        return float(e[1] - e[0])


class StepMarkers:
    """New step starts (marker ``name``, kind begin or point) from a run being recorded."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name
        self.rows = 0
        self._read_at = 0.0
        self.starts: list[int] = []  # monotonic ns, not yet closed by the next start

    def poll(self, energy: EnergyTrack) -> list[DetectedIteration]:
        """Iterations closed since the last call whose span the power already covers."""
        now = time.monotonic()
        if now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            self._read()
        out = []
        while len(self.starts) >= 2 and self.starts[1] <= energy.last_ns:
            a, b = self.starts[0], self.starts[1]
            self.starts.pop(0)
            if energy.t_ns.size and a >= energy.t_ns[0]:
                out.append(DetectedIteration(a, b, energy.energy_j(a, b)))
        return out

    def _read(self) -> None:
        new = markers_from(self.path, self.rows)
        if new is None:
            return  # the recorder has not created the file yet
        self.rows += len(new.rows)
        self.starts += [m.time_ns + new.session_start_ns for m in new.rows
                        if m.name == self.name and m.kind in ("begin", "point")]
