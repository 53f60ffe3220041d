"""The three levels a qualification measures (idle, two loads), found from a run's markers.

The documented marking (docs/qualify.md): one phase per level, named ``idle``, ``load1``
and ``load2`` (begin/end markers: ``wattlab.phase("load1")`` in a workload, or the
simulated GPU's schedule segments of those names). Windows are placed inside each level
after a settling time, back to back, so they never overlap.

Level edges are the marks' host times, the order they were sent in, not the GPU's: on the
lent H200 the end of a 63 s idle level ran 142 us *after* the next level's begin on the
GPU's timeline (beyond both marks' stated +-), which made two back-to-back levels overlap.
The windows start ``SETTLE_S`` after an edge, so where inside a millisecond it lies does
not move them onto other work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from wattlab.analysis.energy import phases_from_markers
from wattlab.analysis.qualify.olympic import WINDOWS_PER_LEVEL, check_windows
from wattlab.errors import UsageError
from wattlab.runfile import MarkerRow

LEVELS = ("idle", "load1", "load2")
SETTLE_S = 2.0
"""Left out at the start of each level: NVML's 1 s average still holds the last level."""


@dataclass(frozen=True)
class Level:
    """One marked level and the five windows scored in it (session seconds)."""

    name: str
    t0_s: float
    t1_s: float
    windows_s: tuple[tuple[float, float], ...] = ()


def marked_phases(markers: Sequence[MarkerRow], where: str) -> list[Level]:
    """Whichever of the levels a run marks, each once and not overlapping, in time order.

    A run may hold only some levels of a qualification recorded in parts.
    """
    as_sent = [replace(m, gpu_time_ns=None, gpu_uncertainty_ns=None) for m in markers]
    phases = [p for p in phases_from_markers(as_sent) if p.name in LEVELS]
    found: dict[str, Level] = {}
    for p in phases:
        if p.name in found:
            raise UsageError(f"{where}: phase {p.name!r} is marked more than once; a "
                             "qualification takes one phase per level")
        found[p.name] = Level(p.name, p.t0_s, p.t1_s)
    levels = sorted(found.values(), key=lambda lv: lv.t0_s)
    for a, b in pairwise(levels):
        if b.t0_s < a.t1_s:
            raise UsageError(f"{where}: phases {a.name!r} and {b.name!r} overlap "
                             f"({a.t0_s:.3f}..{a.t1_s:.3f} s, {b.t0_s:.3f}..{b.t1_s:.3f} s)")
    return levels


def place_windows(level: Level, window_s: float, settle_s: float = SETTLE_S) -> Level:
    """The level with five back-to-back windows after ``settle_s``; refused if it is short."""
    need_s = settle_s + WINDOWS_PER_LEVEL * window_s
    if level.t1_s - level.t0_s < need_s:
        raise UsageError(f"phase {level.name!r} lasts {level.t1_s - level.t0_s:.1f} s; "
                         f"{WINDOWS_PER_LEVEL} non-overlapping {window_s:g} s windows after "
                         f"{settle_s:g} s of settling need {need_s:.1f} s")
    start = level.t0_s + settle_s
    windows = tuple((start + k * window_s, start + (k + 1) * window_s)
                    for k in range(WINDOWS_PER_LEVEL))
    check_windows(level.name, windows)
    return Level(level.name, level.t0_s, level.t1_s, windows)
