"""MLPerf's Olympic score and the windows it is taken over.

Why its own module: the score is the rule a qualification stands on (drop the highest and
the lowest of five window means, average the middle three), and the windows must be five,
non-overlapping, or the score means something else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

from wattlab.errors import UsageError

WINDOWS_PER_LEVEL = 5


def olympic_mean(values: Sequence[float]) -> float:
    """The mean of five values without their highest and lowest (NaN if any is missing)."""
    if len(values) != WINDOWS_PER_LEVEL:
        raise UsageError(f"an Olympic score takes {WINDOWS_PER_LEVEL} window means, "
                         f"got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        return math.nan
    middle = sorted(values)[1:-1]
    return sum(middle) / len(middle)


def check_windows(level: str, windows_s: Sequence[tuple[float, float]]) -> None:
    """Refuse windows that are not five, not positive or overlap (one line naming why)."""
    if len(windows_s) != WINDOWS_PER_LEVEL:
        raise UsageError(f"level {level!r}: {len(windows_s)} window(s); the qualification "
                         f"needs {WINDOWS_PER_LEVEL} non-overlapping windows a level")
    ordered = sorted(windows_s)
    for a, b in ordered:
        if not b > a:
            raise UsageError(f"level {level!r}: window {a:.3f}..{b:.3f} s is empty")
    for (a0, b0), (a1, b1) in pairwise(ordered):
        if a1 < b0:
            raise UsageError(f"level {level!r}: windows {a0:.3f}..{b0:.3f} s and "
                             f"{a1:.3f}..{b1:.3f} s overlap")
