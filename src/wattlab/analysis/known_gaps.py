"""Recorded gaps of a stream, asked which of a chunk's segments they make holes of.

Why a module of its own: the recorder writes where a stream lost data, and the
integral (``alignment.StreamIntegral``) must not bridge those stretches even where the
samples on either side are close; finding the segments each gap overlaps, fast for the
usual ordered gaps and by counting for gaps that end before they start, is a job apart
from the integral.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


class KnownGaps:
    """(first, last) intervals in the times' units, each a stretch with no data."""

    def __init__(self, gaps: Sequence[tuple[float, float]]) -> None:
        ordered = sorted(gaps)
        self.count = len(ordered)
        self._a = np.array([g[0] for g in ordered], dtype=np.float64)
        self._b = np.sort(np.array([g[1] for g in ordered], dtype=np.float64))
        self._pairs = np.array(ordered, dtype=np.float64).reshape(-1, 2)  # by start
        # the latest end among the gaps up to each one: those before the first end past a
        # chunk's start cannot reach into it
        self._reach = np.maximum.accumulate(self._pairs[:, 1]) if ordered else self._b
        self._ordered = bool(np.all(self._pairs[:, 0] <= self._pairs[:, 1]))

    def open_within(self, first: Any, last: Any) -> bool:
        """Some gap is open inside [first, last].

        More gaps started before its end than ended by its start: the same count as per
        segment in ``open_over``.
        """
        return int(np.searchsorted(self._a, last, side="left")) > int(
            np.searchsorted(self._b, first, side="right"))

    def open_over(self, t: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        """Per segment of ``t``: some gap starts before its end and ends after its start."""
        lo = np.searchsorted(self._a, t[1:], side="left")  # gaps starting before end
        hi = np.searchsorted(self._b, t[:-1], side="right")  # gaps ending before start
        return np.asarray(lo > hi, dtype=np.bool_)

    def mark(self, t: npt.NDArray[Any], bad: npt.NDArray[np.bool_]) -> None:
        """Mark in ``bad`` the segments of ``t`` that a gap overlaps."""
        if not self.count:
            return
        if self._ordered:  # each recorded gap marks the segments it overlaps
            lo = np.searchsorted(self._a, t[-1], side="left")
            hi = np.searchsorted(self._reach, t[0], side="right")
            first, last = self._pairs[hi:lo].T
            if t.dtype.kind in "iu":  # as t's type: no float copy of t per search
                first, last = np.floor(first).astype(t.dtype), np.ceil(last).astype(t.dtype)
            i0 = np.maximum(np.searchsorted(t, first, side="right") - 1, 0)
            i1 = np.minimum(np.searchsorted(t, last, side="left"), t.size - 1)
            for x, y in zip(i0, i1, strict=True):
                bad[x:y] = True
        else:  # as ``open_over`` counts them, for gaps that end before they start
            bad |= self.open_over(t)
