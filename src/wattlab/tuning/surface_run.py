"""A simulated training run on a surface: per-iteration energy and time at the setting in force.

Why: the tuner's benchmark needs runs whose best setting is known; each iteration costs what
the surface says at the current setting, times a lognormal noise (``noise`` is its relative
standard deviation, like the jitter of real steps), and the search decides as it would live.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wattlab.tuning.search import Search, SearchConfig
from wattlab.tuning.surfaces import Surface, objective_value


@dataclass(frozen=True)
class SurfaceOutcome:
    """One simulated run: what it cost against the default and the oracle (true values)."""

    surface: str
    iterations: int
    explore_iterations: int
    explore_energy_frac: float
    run_saving: float  # whole run, exploration included, vs the whole run at the default
    settled_saving: float  # per iteration at the chosen setting vs the default
    settled_slowdown: float
    oracle_saving: float
    oracle_slowdown: float
    steps_from_oracle: int
    energy_gap_pct: float  # chosen vs oracle objective, % of the oracle's
    probes: int
    chosen: tuple[int, ...]
    oracle: tuple[int, ...]
    settled_at: int | None  # the iteration of the latest settling (None: never settled)
    search: Search = field(repr=False, compare=False)  # its probes, for the misses' analysis

    def within_bound(self, max_slowdown: float) -> bool:
        return self.settled_slowdown <= max_slowdown + 1e-9

    def saving_kept(self) -> bool:
        """At least 95 % of the oracle's saving (the goal of issue 19)."""
        return self.settled_saving >= 0.95 * self.oracle_saving - 1e-9

    def cheap(self) -> bool:
        """At most 5 % of the run's energy spent exploring."""
        return self.explore_energy_frac <= 0.05

    def goal(self, max_slowdown: float) -> bool:
        return self.within_bound(max_slowdown) and self.saving_kept() and self.cheap()


def simulate(surface: Surface, config: SearchConfig, iterations: int, noise: float,
             seed: int = 0) -> SurfaceOutcome:
    """Run ``iterations`` iterations with the search steering the setting."""
    rng = np.random.default_rng(seed)
    search = Search(surface.axes, config, surface.default)
    factors = np.exp(rng.normal(0.0, noise, size=(iterations, 2)) - noise**2 / 2)
    total = explore = 0.0
    explore_iters = 0
    trial_j: dict[int, float] = {}  # true energy and iterations of each trial (by number),
    trial_iters: dict[int, int] = {}  # charged as exploring if it fails
    for i in range(iterations):
        idx = search.current
        e = float(surface.energy_j[idx]) * factors[i, 0]
        t = float(surface.time_s[idx]) * factors[i, 1]
        total += float(surface.energy_j[idx])
        if search.phase == "trial":
            k = len(search.trials) - 1
            trial_j[k] = trial_j.get(k, 0.0) + float(surface.energy_j[idx])
            trial_iters[k] = trial_iters.get(k, 0) + 1
        elif not search.settled:
            explore += float(surface.energy_j[idx])
            explore_iters += 1
        search.observe(e, t)
    for k, trial in enumerate(search.trials):
        if trial["outcome"] != "kept":  # failed, or still running at the end: exploring
            explore += trial_j.get(k, 0.0)
            explore_iters += trial_iters.get(k, 0)
    d = surface.default
    chosen = search.best
    oracle = surface.oracle(config.objective, config.max_slowdown)

    def obj(idx: tuple[int, ...]) -> float:
        return objective_value(config.objective, surface.energy_j[idx], surface.time_s[idx])

    return SurfaceOutcome(
        surface.name, iterations, explore_iters, explore / total,
        1.0 - total / (iterations * float(surface.energy_j[d])),
        1.0 - obj(chosen) / obj(d), float(surface.time_s[chosen] / surface.time_s[d] - 1.0),
        1.0 - obj(oracle) / obj(d), float(surface.time_s[oracle] / surface.time_s[d] - 1.0),
        int(sum(abs(a - b) for a, b in zip(chosen, oracle, strict=True))),
        100.0 * (obj(chosen) / obj(oracle) - 1.0), len(search.order), chosen, oracle,
        search.settled_at,
        search)
