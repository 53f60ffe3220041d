"""A requested window that reaches outside the run: clipped to the run, and said.

Why clip and not refuse: a report asks for many figures at once (markers, several
``--window``); refusing all of them for one edge past the end loses what the data do allow.
The clipped figure is kept, its window check fails with what was cut, and ``--strict``
turns that into exit 1. A window with nothing inside the run is refused (UsageError): there
is nothing to clip it to. Before this, a window past the end was filled at the window's mean
power: ``--window 12.5:40`` on the 25.6 s demo run reported 9 308 J, nearly the whole
run's 9 858 J, for 13 s of data.
"""

from __future__ import annotations

from wattlab.analysis.energy.validity.verdict import Check, failed, not_applicable, passed
from wattlab.errors import UsageError

CUT_TOLERANCE_S = 0.0005  # the run's edges as printed (to the ms) are inside it
NOT_ASKED = not_applicable("not a requested window: markers' and the run's edges are checked "
                           "per stream (coverage)")
INSIDE = passed("inside the run")


def clip_window(t0_s: float, t1_s: float, run_s: tuple[float, float]) -> tuple[float, float]:
    """The part of [t0, t1] inside the run's span; UsageError where there is none."""
    a, b = run_s
    lo, hi = max(t0_s, a), min(t1_s, b)
    if not lo < hi:
        raise UsageError(f"window {t0_s:g}:{t1_s:g} lies outside the run ({a:.3f}..{b:.3f} s, "
                         "the span every stream covers): nothing to clip it to")
    return lo, hi


def window_check(asked: tuple[float, float] | None, used: tuple[float, float],
                 run_s: tuple[float, float]) -> Check:
    """``asked``: the window as requested (None for the run and marker phases)."""
    if asked is None:
        return NOT_ASKED
    cut = (used[0] - asked[0]) + (asked[1] - used[1])
    if cut <= CUT_TOLERANCE_S:
        return INSIDE
    return failed(f"asked {asked[0]:g}..{asked[1]:g} s, the run covers {run_s[0]:.3f}.."
                  f"{run_s[1]:.3f} s: clipped to {used[0]:.3f}..{used[1]:.3f} s "
                  f"({cut:.3f} s cut)")
