"""Put each energy-counter read at the counter update it shows, where the reads pin them.

Why: NVML's energy counter moves on a regular grid, one update every 100 ms (the change
times in the H100 capture, ``tests/data/h100_nvml_seed11.npz``, fit a 100.0003 ms grid, and
are seen only after it, never before). A read therefore shows the energy up to the last
update before it. Sweep runs read the counter at the update rate, so each read lags its
update by about the same time and the lag cancels in a difference, until a read's timing
jitter carries it across an update: then one interval holds two updates, the next none,
and a 0.1 s phase on that interval is off by a whole update (70 J at 700 W).

The reads themselves say where the updates are: two reads with the same value had no
update between them, two with different values at least one. Where the feasible update
phases form one arc no wider than half a period, each value is placed at its update's
time; elsewhere (reads 9 s apart say nothing) the reads are kept as they are.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

COUNTER_UPDATE_S = 0.1  # how often NVML's energy counter moves (PROTOCOLS.md §7, H100)
# Stream kinds whose energy counter moves on that grid. Not RAPL (the kernel's counter moves
# about every millisecond): two of its reads ms apart with the counter moved between them
# (a poll and the flush after it) would pin a false grid and shift every read by up to 0.1 s.
GRID_COUNTER_KINDS = frozenset({"nvml"})
PHASE_STEP_S = 0.0005  # resolution of the update phase search
PHASES_X_READS = 1 << 20  # phases × reads tried in one array (8 MB of float64)

FloatArray = npt.NDArray[np.float64]


def update_phase_s(reads_s: FloatArray, values: FloatArray,
                   period_s: float = COUNTER_UPDATE_S) -> float | None:
    """Offset (s, in [0, period)) of the counter's update grid, or None.

    None where the reads allow more than half a period of offsets, or no offset fits every
    pair of reads (a stuck counter, or reads whose times are not what they say).
    """
    if reads_s.size < 2:
        return None
    a, b = reads_s[:-1], reads_s[1:]
    moved = values[1:] != values[:-1]
    phases = np.arange(0.0, period_s, PHASE_STEP_S)
    fits = np.ones(phases.size, dtype=bool)
    step = max(1, PHASES_X_READS // phases.size)  # every phase at once, reads in blocks
    for i in range(0, a.size, step):
        at = phases[:, None]
        updates = np.floor((b[i:i + step] - at) / period_s) - np.floor(
            (a[i:i + step] - at) / period_s)
        fits &= ~np.any(moved[i:i + step] != (updates > 0), axis=1)
    if not fits.any() or fits.sum() * PHASE_STEP_S > 0.5 * period_s:
        return None
    # the fitting phases must be one arc on the circle: roll it to start after a misfit
    start = int(np.flatnonzero(~fits)[0])
    rolled = np.roll(fits, -start)
    inside = np.flatnonzero(rolled)
    if inside[-1] - inside[0] + 1 != inside.size:
        return None
    middle = (start + 0.5 * (inside[0] + inside[-1])) * PHASE_STEP_S
    return float(middle % period_s)


def at_updates(reads_s: FloatArray, values: FloatArray,
               period_s: float = COUNTER_UPDATE_S) -> tuple[FloatArray, FloatArray]:
    """(times, values) of the reads, each at its update's time where the grid is pinned.

    Reads of one update become one point, so the times stay strictly increasing.
    """
    phase = update_phase_s(reads_s, values, period_s)
    if phase is None:
        return reads_s, values
    placed = phase + period_s * np.floor((reads_s - phase) / period_s)
    keep = np.concatenate([[True], np.diff(placed) > 0])
    return placed[keep], values[keep]
