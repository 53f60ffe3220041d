"""What the search runs once a setting is kept: a trial in its place, or a revisit.

Why a module of its own: these are the decisions of the settled search (search.py), taken
every few dozen iterations on the standings (standings.py) alone; the search keeps the
bookkeeping (which trial runs, what was decided when) and asks these what to do next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wattlab.tuning.refine import expected_gain, p_within

if TYPE_CHECKING:
    from wattlab.tuning.search import Index
    from wattlab.tuning.standings import Standings


def pick_trial(st: Standings, failed: set[Index]) -> Index | None:
    """The challenger most worth running on trial, if any (``SearchConfig.trial_gain``).

    Why: certifying a setting near the bound takes hundreds of its iterations; run in
    the kept setting's place, they cost the budget nothing once it is certified, which
    leaves the budget for the default's measurement and for later revisits. Not while
    the default is kept: its own iterations, the reference, would then cost instead.
    ``failed``: settings whose trial failed, not run again (one kept and later stepped
    back from may be).
    """
    cfg, kept = st.cfg, st.best
    if cfg.trial_gain is None or kept == st.default:
        return None  # the default kept: the reference comes free, revisits certify cheaper
    threshold = max(cfg.trial_gain * st.saving(kept), cfg.refine_min_gain)
    spare, best = st.spare(), None
    for idx, probe in st.probes.items():
        if idx in (kept, st.default) or idx in failed or len(probe.energy_j) < 2:
            continue
        gain = 1.0 - st.ratio_to_best(idx)[0]
        p_keep = st.p_keepable(idx, spare)
        if gain >= threshold and p_keep >= cfg.trial_p_keep and (
                best is None or gain * p_keep > best[0]):
            best = (gain * p_keep, idx)
    return None if best is None else best[1]


def trial_outcome(st: Standings, trial: Index) -> str | None:
    """How the trial ends: certified (kept), refuted, or beyond certifying in its budget.

    None: it goes on. It ends before another stretch of it could overrun the budget's share.
    """
    if trial == st.best:
        return "kept"
    if st.clearly_out(trial):
        return "refuted"
    if st.feasible_value(trial) is not None:
        return "not better"  # certified within the bound, yet not below the kept one
    if not st.budget.allows(st.probe_cost(trial, st.cfg.monitor_every), st.rest_j()):
        return "out of budget"
    if st.p_keepable(trial, st.spare()) < st.cfg.trial_give_up:
        return "cannot certify"
    return None


def neighbours(index: Index, sizes: Sequence[int]) -> list[Index]:
    """The settings one step from ``index`` along each knob (``sizes``: settings per knob)."""
    out = []
    for k, n in enumerate(sizes):
        for j in (index[k] - 1, index[k] + 1):
            if 0 <= j < n:
                out.append((*index[:k], j, *index[k + 1:]))
    return out


def _unmeasured(st: Standings, sizes: Sequence[int], kept: Index, kept_j: float
                ) -> tuple[Index, str, None] | None:
    """A short probe of an unmeasured setting on a knob's line through the kept one.

    Nearest first, while the budget lasts: the search's models can miss the best
    setting of a jagged surface (published power-limit tables are), and a setting
    clearly worse ends after ``min_iters`` iterations.
    """
    lines = []
    for k, n in enumerate(sizes):
        lines += [(abs(j - kept[k]), (*kept[:k], j, *kept[k + 1:])) for j in range(n)]
    for _, idx in sorted(lines):
        if idx not in st.probes:
            if st.budget.allows(st.probe_cost(idx), kept_j):
                return idx, "sweep", None
            return None
    return None


def plan_revisit(st: Standings, sizes: Sequence[int], trial: Index | None
                 ) -> tuple[Index, str, int | None] | None:
    """What is worth measuring now that a setting is kept (None: nothing, or no budget).

    An unmeasured neighbour of the kept setting first (a short probe); then the measured
    setting with the largest expected gain over the kept one, if it is worth more than
    ``refine_gain`` of the kept setting's saving: measured further itself, or the
    default when the challenger's (or the kept setting's) slowdown straddles the bound
    and the default's measurement is the larger part of its uncertainty. The kept
    setting's own iterations are free, so a challenger is measured only once the kept
    one has more iterations than it. Returns (setting, purpose, iterations it should
    reach or None).
    """
    cfg, kept = st.cfg, st.best
    kept_j = st.rest_j()
    for nb in neighbours(kept, sizes):
        if nb not in st.probes:
            if st.budget.allows(st.probe_cost(nb), kept_j):
                return nb, "local", None
            return None
    threshold = max(cfg.refine_gain * st.saving(kept), cfg.refine_min_gain)
    n = {i: len(p.energy_j) for i, p in st.probes.items()}
    spare = st.spare()
    best: tuple[float, Index] | None = None
    waiting = False
    for run in [i for i in (kept, trial) if i is not None and i != st.default]:
        # the setting run near the bound: refine the reference until its slowdown is
        # clearly within the bound (a trial's own iterations come free, as the kept's)
        slow, se = st.slowdown(run)
        if slow + cfg.z_verdict * se > cfg.max_slowdown and n[st.default] < n[run]:
            best = (math.inf, st.default)
    for idx in st.probes:
        if idx in (kept, trial) or n[idx] < 2:
            continue
        ratio, se_ratio = st.ratio_to_best(idx)
        p_ok = 1.0 if idx == st.default else p_within(*st.slowdown(idx), cfg.max_slowdown)
        p_keep = 1.0 if idx == st.default else st.p_keepable(idx, spare)
        gain = expected_gain(1.0 - ratio, se_ratio, p_keep)
        if gain < threshold:
            continue
        measure = (st.default if idx != st.default and 0.02 < p_ok < 0.98
                   and n[st.default] <= n[idx] else idx)
        if measure == idx and n[kept] < 2 * n[idx]:
            waiting = True  # the kept setting's precision comes free: wait for it
            continue
        if best is None or gain > best[0]:
            best = (gain, measure)
    if best is None:
        return None if waiting else _unmeasured(st, sizes, kept, kept_j)
    # half as many iterations again, or what the budget has left (the last revisit
    # would otherwise be refused whole while its part could still settle the call)
    measure = best[1]
    planned = max(4 * cfg.min_iters, n[measure] // 2)
    more = st.budget.affordable(st.probes[measure].stats()[0], kept_j,
                                cfg.discard + planned) - cfg.discard
    if more < cfg.min_iters:
        return None
    return measure, "revisit", n[measure] + more
