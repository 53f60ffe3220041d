"""After the search settles: what is still worth measuring, and how much may be spent.

Why: the kept setting goes on being measured for the rest of the run (free data), so a
decision that was close when the search settled (two neighbours a fraction of a percent
apart, a setting right at the slowdown bound) can be revisited with far more iterations
than the search could afford. What to revisit is chosen by its expected gain (value of
information); how much is spent is capped as a share of the run's energy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _cdf(z: float) -> float:
    """Standard normal CDF (math.erf: scipy's costs ~50 µs a call, called every check)."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def expected_gain(gain: float, se_gain: float, p_feasible: float) -> float:
    """Expected relative improvement of switching, if the challenger turns out better.

    ``gain``: estimated relative improvement (1 - challenger / kept objective), ``se_gain``
    its standard error, ``p_feasible`` the probability the challenger keeps the bound: the
    normal expected improvement E[max(0, gain)] times that probability.
    """
    if not math.isfinite(se_gain) or se_gain <= 0:
        return max(gain, 0.0) * p_feasible
    z = gain / se_gain
    return p_feasible * (se_gain * _pdf(z) + gain * _cdf(z))


def p_within(slowdown: float, se: float, bound: float) -> float:
    """Probability that a setting's true slowdown is within ``bound`` (normal)."""
    if not math.isfinite(se) or se <= 0:
        return float(slowdown <= bound)
    return _cdf((bound - slowdown) / se)


def p_certifiable(slowdown: float, se_now: float, se_after: float, bound: float,
                  z: float) -> float:
    """Probability that more iterations bring a slowdown's estimate within the bound.

    Keeping a setting needs its estimate plus ``z`` standard errors within ``bound``; after
    the iterations the budget still allows the SE is ``se_after``, and the estimate then is
    normal about today's with the variance the new iterations resolve (preposterior).
    """
    spread = math.sqrt(max(se_now * se_now - se_after * se_after, 0.0))
    room = bound - z * se_after - slowdown
    if spread <= 0:
        return float(room >= 0)
    return _cdf(room / spread)


@dataclass
class ExploreBudget:
    """Energy spent exploring against a share of the run's energy.

    With the run's length known (``expected_iterations``) the share is of the whole run,
    its rest priced at the kept setting's energy; without it, of the energy so far, so a
    longer run earns more revisits as it goes and the share holds whenever it ends.
    ``pending_j``: energy of a trial under way, exploring unless the trial ends kept; it is
    counted against the share until then, so a failed trial never overruns it.
    """

    share: float
    expected_iterations: int | None = None
    total_j: float = 0.0
    explore_j: float = 0.0
    pending_j: float = 0.0
    iterations: int = 0

    def add(self, energy_j: float, exploring: bool, pending: bool = False) -> None:
        self.iterations += 1
        self.total_j += energy_j
        if exploring:
            self.explore_j += energy_j
        elif pending:
            self.pending_j += energy_j

    def resolve_pending(self, kept: bool) -> None:
        """A trial ended: its energy was the kept setting's (refunded), or exploring."""
        if not kept:
            self.explore_j += self.pending_j
        self.pending_j = 0.0

    def allows(self, cost_j: float, kept_energy_j: float) -> bool:
        """Whether ``cost_j`` more exploring keeps within the share of the run."""
        run_j = self.total_j + cost_j
        if self.expected_iterations is not None:
            rest = max(self.expected_iterations - self.iterations, 0)
            run_j = max(run_j, self.total_j + rest * kept_energy_j)
        return self.explore_j + self.pending_j + cost_j <= self.share * run_j

    def affordable(self, iteration_j: float, kept_energy_j: float, most: int) -> int:
        """The most iterations (up to ``most``) of ``iteration_j`` each the share still allows.

        Exploring grows faster than the run it is a share of, so the answer is a threshold.
        """
        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.allows(mid * iteration_j, kept_energy_j):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def search_allows(self, cost_j: float, kept_energy_j: float) -> bool:
        """The first search is capped only when the run's length is known."""
        return self.expected_iterations is None or self.allows(cost_j, kept_energy_j)
