"""A load designed to identify the driver's power kernel: a random telegraph of GPU work.

Why: a calibration can only find a kernel the load excites. A load that repeats (a square
wave, steps a second apart) puts its power at one frequency and its harmonics; a 1 s boxcar
has zeros at 1, 2, 3 Hz, so a 1 Hz load is averaged to a flat line and no fit can tell the
kernel. A random telegraph (levels held for log-uniformly random times between
``min_hold_s`` and ``max_hold_s``) spreads its power over the whole band from about
1 / (2 · max_hold) to 1 / (2 · min_hold) Hz, with no repetition for a kernel to hide in.
"""

from __future__ import annotations

import math

import numpy as np

from wattlab.device_models import Segment, WorkloadSchedule
from wattlab.errors import UsageError

LEVELS = (0.0, 0.5, 1.0)
"""Idle, half and full: the three regimes a calibration needs (and a gain needs two)."""
MIN_HOLD_S = 0.1
MAX_HOLD_S = 3.0


def telegraph(seed: int, duration_s: float, *, min_hold_s: float = MIN_HOLD_S,
              max_hold_s: float = MAX_HOLD_S, levels: tuple[float, ...] = LEVELS
              ) -> WorkloadSchedule:
    """A random telegraph: each hold log-uniform in [min, max] s, at a level unlike the last."""
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise UsageError(f"excitation duration must be > 0 s, got {duration_s}")
    if not 0 < min_hold_s <= max_hold_s:
        raise UsageError(f"holds must satisfy 0 < min ({min_hold_s}) <= max ({max_hold_s}) s")
    if len(set(levels)) < 2 or not all(0.0 <= v <= 1.0 for v in levels):
        raise UsageError(f"excitation levels {levels}: need two or more distinct within 0..1")
    rng = np.random.default_rng([seed, 0xEC17E])
    segments: list[Segment] = []
    left, level = duration_s, levels[0]
    while left > 1e-9:
        hold = float(np.exp(rng.uniform(math.log(min_hold_s), math.log(max_hold_s))))
        level = float(rng.choice([v for v in levels if v != level]))
        step = min(hold, left)
        segments.append(Segment(step, level, f"level {level:g}"))
        left -= step
    return WorkloadSchedule(segments)


def seconds_for(se_now: float, target_se: float, duration_s: float) -> float:
    """Recording time for a target standard error, from one run's (errors fall as 1/√T)."""
    if not (se_now > 0 and target_se > 0):
        return math.nan
    return duration_s * (se_now / target_se) ** 2
