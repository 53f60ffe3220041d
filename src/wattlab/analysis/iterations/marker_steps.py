"""Step markers of a run (from the framework integrations) as iteration boundaries.

Why: where the training program marks its steps (``--auto-markers``, the Lightning, Hugging
Face, Keras callbacks, or the plain-PyTorch optimizer hook), the count is exact and no
signal processing can beat it; the power stream then only has to say what each step cost.
Frameworks mark ``step`` begin/end pairs; the optimizer hook marks ``optimizer_step``
points. Thinned markers (``every_n_steps``) carry the step number, so each marked window
counts the steps it spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.errors import UsageError
from wattlab.runfile import MarkerRow

AUTO_NAMES = ("step", "optimizer_step")
"""Marker names tried in order when none is given."""
MIN_MARKS = 3


@dataclass(frozen=True)
class StepMarks:
    """Times (ns) where marked steps begin, and how many steps each marker stands for."""

    name: str
    times_ns: npt.NDArray[np.int64]
    steps_per_mark: int

    @property
    def steps(self) -> int:
        return self.times_ns.size * self.steps_per_mark


def _starts(markers: Sequence[MarkerRow], name: str) -> list[MarkerRow]:
    """Begin markers of a name if there are any, else its point markers."""
    named = [m for m in markers if m.name == name]
    begins = [m for m in named if m.kind == "begin"]
    return begins or [m for m in named if m.kind == "point"]


def _steps_per_mark(rows: list[MarkerRow]) -> int:
    numbers = [r.payload.get("step") for r in rows]
    if len(numbers) < 2 or not all(isinstance(n, int) for n in numbers):
        return 1
    return max(1, int(np.median(np.diff(np.asarray(numbers, dtype=np.int64)))))


def step_marks(markers: Sequence[MarkerRow], name: str = "auto", *,
               t0_ns: int | None = None, t1_ns: int | None = None) -> StepMarks | None:
    """The step markers named ``name`` (``auto``: the first of ``AUTO_NAMES`` present).

    None when ``auto`` finds fewer than three; a name given explicitly must exist.
    """
    inside = [m for m in markers
              if (t0_ns is None or m.effective_ns >= t0_ns)
              and (t1_ns is None or m.effective_ns <= t1_ns)]
    for candidate in (AUTO_NAMES if name == "auto" else (name,)):
        rows = sorted(_starts(inside, candidate), key=lambda m: m.effective_ns)
        if len(rows) >= MIN_MARKS:
            times = np.array([r.effective_ns for r in rows], dtype=np.int64)
            return StepMarks(candidate, times, _steps_per_mark(rows))
    if name != "auto":
        present = sorted({m.name for m in markers})
        raise UsageError(f"no {MIN_MARKS}+ begin or point markers named {name!r} in the window;"
                         f" the run has markers {present}")
    return None
