"""How each measured setting stands against the default and the best: what the search weighs.

Why a module of its own: every decision of the search (search.py) — when a probe has
measured enough, which setting is kept, what a trial or a revisit is worth (revisits.py)
— asks the same few questions of the probes so far: the slowdown against the default, the
objective against the best, whether a setting keeps within the bound, what more
iterations cost. They depend only on the probes, the default, the best and the budget.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from wattlab.tuning.refine import ExploreBudget, p_certifiable, p_within
from wattlab.tuning.surfaces import objective_value

if TYPE_CHECKING:
    from wattlab.tuning.search import Index, Probe, SearchConfig

MOST_ITERATIONS = 10**7  # the most iterations a budget question asks about (a bound only)


class Standings:
    """The probes so far, the default and the best measured setting, and how they compare."""

    def __init__(self, cfg: SearchConfig, default: Index, budget: ExploreBudget) -> None:
        self.cfg = cfg
        self.default = default
        self.budget = budget
        self.probes: dict[Index, Probe] = {}
        self.best: Index = default

    def floor(self) -> tuple[float, float]:
        """The spread per iteration the default measurement showed (the job's own jitter)."""
        return self.probes[self.default].rel_sd()

    def stats(self, index: Index) -> tuple[float, float, float, float]:
        return self.probes[index].stats(self.floor())

    def slowdown(self, index: Index) -> tuple[float, float]:
        """(time / default's time - 1, its standard error)."""
        _, _, t, se_t = self.stats(index)
        _, _, t0, se_t0 = self.stats(self.default)
        return t / t0 - 1.0, t / t0 * math.hypot(se_t / t, se_t0 / t0)

    def energy_saving(self, index: Index) -> tuple[float, float]:
        """(1 - energy / default's energy, its standard error): 0 ± 0 for the default."""
        if index == self.default:
            return 0.0, 0.0
        e, se_e, _, _ = self.stats(index)
        e0, se_e0, _, _ = self.stats(self.default)
        return 1.0 - e / e0, e / e0 * math.hypot(se_e / e, se_e0 / e0)

    def ratio_to_best(self, index: Index) -> tuple[float, float]:
        """(objective / best measured objective, its standard error)."""
        e, se_e, t, se_t = self.stats(index)
        eb, se_eb, tb, se_tb = self.stats(self.best)
        rel = [se_e / e, se_eb / eb]
        if self.cfg.objective == "edp":
            rel += [se_t / t, se_tb / tb]
        ratio = objective_value(self.cfg.objective, e, t) / objective_value(
            self.cfg.objective, eb, tb)
        return ratio, ratio * math.hypot(*rel)

    def feasible_value(self, index: Index) -> float | None:
        """The objective at a measured setting if it keeps (with its SE) within the bound."""
        if len(self.probes[index].energy_j) < 2:
            return None  # abandoned or not measured
        slow, se_slow = self.slowdown(index)
        if index != self.default and slow + self.cfg.z_bound * se_slow > self.cfg.max_slowdown:
            return None
        e, _, t, _ = self.probes[index].stats()
        return objective_value(self.cfg.objective, e, t)

    def best_measured(self) -> Index:
        values = {i: v for i in self.probes if (v := self.feasible_value(i)) is not None}
        return min(values, key=lambda i: values[i])

    def clearly_out(self, index: Index) -> bool:
        """Clearly too slow, or clearly worse than the best measured setting."""
        cfg = self.cfg
        slow, se_slow = self.slowdown(index)
        if slow - cfg.z_verdict * se_slow > cfg.max_slowdown:
            return True
        ratio, se_ratio = self.ratio_to_best(index)
        return index != self.best and ratio - 1.0 > cfg.z_verdict * se_ratio

    def saving(self, index: Index) -> float:
        """Measured relative saving of the objective at ``index`` against the default."""
        e0, _, t0, _ = self.probes[self.default].stats()
        e, _, t, _ = self.probes[index].stats()
        return 1.0 - objective_value(self.cfg.objective, e, t) / objective_value(
            self.cfg.objective, e0, t0)

    def p_keepable(self, index: Index, spare: int) -> float:
        """Probability that ``index`` can be kept once ``spare`` more iterations are spent.

        They are split between it and the default so as to shrink its slowdown's standard
        error the most; a challenger at the bound that no affordable measurement could
        certify is worth nothing to revisit, however likely it is to be within the bound.
        """
        slow, se = self.slowdown(index)
        n_i, n_0 = len(self.probes[index].energy_j), len(self.probes[self.default].energy_j)
        _, _, t, se_t = self.stats(index)
        _, _, t0, se_t0 = self.stats(self.default)
        # var ~ a / n_i + b / n_0: spend where the larger share of the variance is
        a, b = (se_t / t) ** 2 * n_i, (se_t0 / t0) ** 2 * n_0
        if not (math.isfinite(a + b) and a + b > 0):  # unmeasured, or no spread at all
            return p_within(slow, se, self.cfg.max_slowdown)
        total = n_i + n_0 + spare
        m_i = min(max(total * math.sqrt(a) / (math.sqrt(a) + math.sqrt(b)), n_i), n_i + spare)
        m_0 = max(n_0 + spare - (m_i - n_i), n_0)
        se_after = (t / t0) * math.sqrt(a / m_i + b / m_0)
        return p_certifiable(slow, se, se_after, self.cfg.max_slowdown, self.cfg.z_bound)

    def kept_j(self) -> float:
        return self.probes[self.best].stats()[0]

    def rest_j(self) -> float:
        """Energy per iteration the rest of the run is priced at, for the exploring share.

        The least of any measured setting not clearly too slow, not the kept one's: a
        revisit may yet switch to a cheaper setting, which shrinks the run the share is of.
        """
        cfg = self.cfg
        out = self.kept_j()
        for idx, probe in self.probes.items():
            if len(probe.energy_j) >= 2:
                slow, se = self.slowdown(idx)
                if slow - cfg.z_verdict * se <= cfg.max_slowdown:
                    out = min(out, probe.stats()[0])
        return out

    def probe_cost(self, index: Index, iterations: int | None = None) -> float:
        """Energy (J) of ``iterations`` more at a setting (a short probe by default)."""
        e = self.probes[index].stats()[0] if index in self.probes else math.nan
        n = self.cfg.discard + (iterations or 2 * self.cfg.min_iters)
        return n * (e if math.isfinite(e) else self.kept_j())

    def spare(self) -> int:
        """Iterations of the default the exploring budget still allows."""
        return self.budget.affordable(self.probes[self.default].stats()[0], self.rest_j(),
                                      MOST_ITERATIONS)
