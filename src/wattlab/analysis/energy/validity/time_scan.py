"""What a stream's own times say: where they go backwards and where they leave a hole.

Why a pass of its own: the integral (``alignment.StreamIntegral``) refuses a stream whose
time goes backwards and bridges nothing longer than 5 spacings, but the validity verdict
asks stricter questions of the times themselves (any step back, any hole longer than
``HOLE_SPACINGS`` nominal spacings), and it must answer them on every file, also one whose
recorder flagged nothing. Only the time column is read, a slice at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wattlab.analysis.alignment import median_spacing_s
from wattlab.runfile import SourceView

HOLE_SPACINGS = 3.0  # a segment longer than this many nominal spacings is a hole
SCAN_ROWS = 1 << 20  # rows of times read at a time (8 MB)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TimeScan:
    """A stream's span, nominal spacing, and its segments that step back or leave a hole.

    ``backwards_s`` and ``holes_s`` are (n, 2) arrays of (time of the row before, time of the
    row after), session seconds: a step back has the second earlier than the first.
    """

    first_s: float
    last_s: float
    spacing_s: float
    backwards_s: FloatArray
    holes_s: FloatArray

    def backwards_in(self, t0_s: float, t1_s: float) -> FloatArray:
        """Steps back whose doubtful span (between the two rows' times) reaches into [t0, t1]."""
        if not self.backwards_s.size:  # the usual case: asked once per figure
            return self.backwards_s
        low = np.minimum(self.backwards_s[:, 0], self.backwards_s[:, 1])
        high = np.maximum(self.backwards_s[:, 0], self.backwards_s[:, 1])
        return self.backwards_s[(low <= t1_s) & (high >= t0_s)]

    def holes_in(self, t0_s: float, t1_s: float) -> FloatArray:
        """Holes that overlap (t0, t1)."""
        h = self.holes_s
        return h[(h[:, 0] < t1_s) & (h[:, 1] > t0_s)] if h.size else h


def scan_times(view: SourceView) -> TimeScan:
    """Read a stream's times once (memoised on the view) and keep what breaks them."""
    def compute() -> TimeScan:
        spacing_s = median_spacing_s(view)
        limit_ns = HOLE_SPACINGS * spacing_s * 1e9 if spacing_s > 0 else np.inf
        back: list[FloatArray] = []
        holes: list[FloatArray] = []
        n = len(view)
        for start in range(0, n, SCAN_ROWS):  # one row of overlap joins the slices
            t = view.time_slice(max(0, start - 1), min(n, start + SCAN_ROWS))
            dt = np.diff(t)
            for found, at in ((back, np.flatnonzero(dt < 0)), (holes, np.flatnonzero(
                    dt > limit_ns))):
                found.append(np.column_stack((t[at], t[at + 1])).astype(np.float64) / 1e9)
        first, last = view.first_last_ns()
        return TimeScan(float(first) / 1e9, float(last) / 1e9, spacing_s,
                        np.concatenate(back or [np.empty((0, 2))]).reshape(-1, 2),
                        np.concatenate(holes or [np.empty((0, 2))]).reshape(-1, 2))

    return view.memo("validity_time_scan", compute)
