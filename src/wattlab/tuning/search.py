"""The search: which setting to run next, from the iterations measured so far.

Why iteration-driven: the same object runs inside a live recording (fed by the iteration
detector) and in the benchmark (fed by a simulated surface), so what is benchmarked is what
runs. It measures the default setting first (the reference for the slowdown bound), then
searches one knob at a time (coordinate search, the other knobs at their best so far):
two spread probes, then repeatedly a model of time and power along the knob — the family
chosen by leave-one-out error among those ``wattlab fit`` has — proposes the best
unmeasured setting predicted to respect the bound, and a local search measures the
neighbours of the best measured one. A probe lasts until its mean energy and time per
iteration are known to ``rel_se`` (standard error), within ``min_iters``..``max_iters``,
after dropping the first iteration at a new setting (it straddles the change). The settled
setting is the best *measured* one whose slowdown, less its own uncertainty, keeps within
the bound: a model only chooses what to measure, never what to keep.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import t as student_t

from wattlab.analysis.models import (
    CURVE_FITS,
    PER_WORKLOAD,
    choose_family,
    loo_predictions,
    score_families,
)
from wattlab.analysis.sweep_results import SweepTable
from wattlab.errors import UsageError
from wattlab.tuning.surfaces import objective_value

Index = tuple[int, ...]
OBJECTIVES = ("energy", "edp")
SPREAD = (0.3, 0.65)  # first probes along a knob, as fractions of its range from the bottom


@dataclass(frozen=True)
class SearchConfig:
    """How the search measures and decides."""

    objective: str = "energy"
    max_slowdown: float = 0.05
    min_iters: int = 5
    max_iters: int = 500
    rel_se: float = 0.002
    # the default's measurement: every other is compared with it, yet tighter than this
    # costs more exploration than the closer comparisons gain (bench/tune_sim.py)
    baseline_rel_se: float = 0.003
    discard: int = 1
    max_probes_per_knob: int = 8
    z_bound: float = 1.0  # a kept setting's slowdown plus this many SEs is within the bound
    z_verdict: float = 2.0  # a probe ends early once this many SEs say it cannot be kept

    def check(self) -> None:
        """Bad values are usage errors that name the option."""
        if self.objective not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, "
                             f"got {self.objective!r}")
        if not (math.isfinite(self.max_slowdown) and 0.0 <= self.max_slowdown <= 1.0):
            raise UsageError(f"--max-slowdown is a fraction in [0, 1] (0.05 = 5 %), "
                             f"got {self.max_slowdown}")
        if not 1 <= self.min_iters <= self.max_iters:
            raise UsageError(f"--min-iters must be >= 1 and <= --max-iters, got "
                             f"{self.min_iters} and {self.max_iters}")


@functools.lru_cache(maxsize=1024)
def _widen(n: int) -> float:
    """A few iterations underestimate the spread: Student's t (95 %) over the normal's."""
    return float(student_t.ppf(0.975, n - 1) / 1.96) if n > 1 else math.inf


@dataclass
class Probe:
    """Iterations measured at one setting: mean energy and time with standard errors."""

    index: Index
    setting: dict[str, float]
    purpose: str
    energy_j: list[float] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    skipped: int = 0

    def stats(self, floor_rel_sd: tuple[float, float] = (0.0, 0.0)
              ) -> tuple[float, float, float, float]:
        """(mean energy J, its SE, mean time s, its SE).

        ``floor_rel_sd``: the least relative spread (energy, time) an iteration may have: a
        few iterations can look steadier than the job is, so the search floors their spread
        with the one the long default measurement showed.
        """
        if not self.energy_j:
            return math.nan, math.inf, math.nan, math.inf
        e, t = np.array(self.energy_j), np.array(self.time_s)
        n = len(e)
        widen = _widen(n)

        def se(a: np.ndarray, floor: float) -> float:
            if n < 2:
                return math.inf
            sd = max(float(a.std(ddof=1)), floor * float(a.mean()))
            return sd / math.sqrt(n) * widen

        return float(e.mean()), se(e, floor_rel_sd[0]), float(t.mean()), se(t, floor_rel_sd[1])

    def rel_sd(self) -> tuple[float, float]:
        """Relative standard deviation of energy and time per iteration."""
        if len(self.energy_j) < 2:
            return 0.0, 0.0
        e, t = np.array(self.energy_j), np.array(self.time_s)
        return float(e.std(ddof=1) / e.mean()), float(t.std(ddof=1) / t.mean())

    def precise(self, rel_se: float, floor_rel_sd: tuple[float, float] = (0.0, 0.0)) -> bool:
        """Mean energy and time both known to ``rel_se`` (relative standard error)."""
        e, se_e, t, se_t = self.stats(floor_rel_sd)
        return se_e <= rel_se * e and se_t <= rel_se * t


class Search:
    """The tuner's state machine: ``observe`` each iteration, apply what ``current`` says."""

    def __init__(self, axes: dict[str, tuple[float, ...]], config: SearchConfig,
                 default: Index | None = None) -> None:
        config.check()
        if not axes or any(len(v) == 0 for v in axes.values()):
            raise UsageError("tune needs at least one knob with settings to try")
        self.axes = {k: tuple(sorted(v)) for k, v in axes.items()}
        self.knobs = list(self.axes)
        self.cfg = config
        self.default: Index = default or tuple(len(v) - 1 for v in self.axes.values())
        self.probes: dict[Index, Probe] = {}
        self.order: list[Index] = []
        self.models: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.iteration = 0
        self.settled_at: int | None = None
        self.best: Index = self.default
        self._knob = 0
        self._knob_probes = 0
        self.current: Index = self.default
        self._start(self.default, "baseline")

    # ------------------------------------------------------------------ public

    @property
    def settled(self) -> bool:
        return self.settled_at is not None

    def setting(self, index: Index) -> dict[str, float]:
        return {k: self.axes[k][i] for k, i in zip(self.knobs, index, strict=True)}

    def observe(self, energy_j: float, time_s: float) -> Index | None:
        """One finished iteration at ``current``; returns the next setting if it changes."""
        self.iteration += 1
        if self.settled or not (energy_j > 0 and time_s > 0):
            return None
        probe = self.probes[self.current]
        if probe.skipped < self.cfg.discard:
            probe.skipped += 1
            return None
        probe.energy_j.append(float(energy_j))
        probe.time_s.append(float(time_s))
        if not self._enough(probe):
            return None
        before = self.current
        self._next()
        return self.current if self.current != before else None

    def abandon(self, why: str) -> Index | None:
        """Give up on ``current``: no iteration could be measured there.

        E.g. its bursts are too faint to detect. It counts as not meeting the bound; the
        next setting is returned.
        """
        if self.settled or self.current == self.default:
            return None
        self.probes[self.current].purpose += " (abandoned)"
        self.decisions.append({"iteration": self.iteration, "action": "abandon", "why": why,
                               "setting": self.setting(self.current)})
        before = self.current
        self._next()
        return self.current if self.current != before else None

    def summary(self) -> dict[str, Any]:
        """What was decided, for the run file and the report."""
        base = self.probes[self.default].stats()
        best = self.probes[self.best].stats()
        return {"objective": self.cfg.objective, "max_slowdown": self.cfg.max_slowdown,
                "knobs": self.knobs, "default": self.setting(self.default),
                "chosen": self.setting(self.best), "settled": self.settled,
                "settled_at_iteration": self.settled_at, "probes": len(self.order),
                "baseline": list(base),
                "energy_saving_measured": 1.0 - best[0] / base[0],
                "slowdown_measured": best[2] / base[2] - 1.0,
                "config": asdict(self.cfg)}

    # ------------------------------------------------------------------ internals

    def _start(self, index: Index, purpose: str) -> None:
        self.current = index
        if index not in self.probes:
            self.probes[index] = Probe(index, self.setting(index), purpose)
            self.order.append(index)
            self._knob_probes += purpose != "baseline"
        self.decisions.append({"iteration": self.iteration, "action": purpose,
                               "setting": self.setting(index)})

    def _enough(self, probe: Probe) -> bool:
        """Measured well enough: precise, or clearly too slow, or clearly worse than the best.

        Precision is spent only where a decision is close (near the bound, near the best).
        """
        cfg, n = self.cfg, len(probe.energy_j)
        if n >= cfg.max_iters:
            return True
        if probe.purpose == "baseline":  # the reference of every comparison
            return n >= 2 * cfg.min_iters and probe.precise(cfg.baseline_rel_se)
        if n < cfg.min_iters:
            return False
        if probe.precise(cfg.rel_se, self._floor()):
            return True
        slow, se_slow = self._slowdown(probe.index)
        if slow - cfg.z_verdict * se_slow > cfg.max_slowdown:
            return True  # clearly too slow
        ratio, se_ratio = self._ratio_to_best(probe.index)
        bound_clear = cfg.max_slowdown - slow > cfg.z_verdict * se_slow
        best_clear = abs(ratio - 1.0) > cfg.z_verdict * se_ratio
        return best_clear and (bound_clear or ratio > 1.0)

    def _floor(self) -> tuple[float, float]:
        """The spread per iteration the default measurement showed (the job's own jitter)."""
        return self.probes[self.default].rel_sd()

    def _stats(self, index: Index) -> tuple[float, float, float, float]:
        return self.probes[index].stats(self._floor())

    def _slowdown(self, index: Index) -> tuple[float, float]:
        """(time / default's time - 1, its standard error)."""
        _, _, t, se_t = self._stats(index)
        _, _, t0, se_t0 = self._stats(self.default)
        return t / t0 - 1.0, t / t0 * math.hypot(se_t / t, se_t0 / t0)

    def _ratio_to_best(self, index: Index) -> tuple[float, float]:
        """(objective / best measured objective, its standard error)."""
        e, se_e, t, se_t = self._stats(index)
        eb, se_eb, tb, se_tb = self._stats(self.best)
        rel = [se_e / e, se_eb / eb]
        if self.cfg.objective == "edp":
            rel += [se_t / t, se_tb / tb]
        ratio = objective_value(self.cfg.objective, e, t) / objective_value(
            self.cfg.objective, eb, tb)
        return ratio, ratio * math.hypot(*rel)

    def _feasible_value(self, index: Index) -> float | None:
        """The objective at a measured setting if it keeps (with its SE) within the bound."""
        if len(self.probes[index].energy_j) < 2:
            return None  # abandoned or not measured
        slow, se_slow = self._slowdown(index)
        if index != self.default and slow + self.cfg.z_bound * se_slow > self.cfg.max_slowdown:
            return None
        e, _, t, _ = self.probes[index].stats()
        return objective_value(self.cfg.objective, e, t)

    def _best_measured(self) -> Index:
        values = {i: v for i in self.probes if (v := self._feasible_value(i)) is not None}
        return min(values, key=lambda i: values[i])

    def _line(self) -> list[Index]:
        """The settings along the current knob, the others at the best so far."""
        k = self._knob
        return [(*self.best[:k], j, *self.best[k + 1:]) for j in range(len(self.axes[
            self.knobs[k]]))]

    def _next(self) -> None:
        """Pick the next probe along the current knob, move to the next knob, or settle."""
        while self._knob < len(self.knobs):
            self.best = self._best_measured()
            line = self._line()
            nxt = None
            if self._knob_probes < self.cfg.max_probes_per_knob:
                nxt = self._spread(line) or self._modelled(line) or self._local(line)
            if nxt is not None:
                self._start(nxt[0], nxt[1])
                return
            self._knob += 1
            self._knob_probes = 0
        self.best = self._best_measured()
        self.settled_at = self.iteration
        self._start(self.best, "settle")

    def _spread(self, line: list[Index]) -> tuple[Index, str] | None:
        n = len(line)
        for frac in SPREAD:
            idx = line[min(n - 1, round(frac * (n - 1)))]
            if idx not in self.probes:
                return idx, "spread"
        return None

    def _local(self, line: list[Index]) -> tuple[Index, str] | None:
        """An unmeasured neighbour of the best measured setting on the line."""
        pos = line.index(self.best) if self.best in line else None
        if pos is None:
            return None
        for j in (pos - 1, pos + 1):
            if 0 <= j < len(line) and line[j] not in self.probes:
                return line[j], "local"
        return None

    def _modelled(self, line: list[Index]) -> tuple[Index, str] | None:
        """The model's best predicted setting on the line, if not measured yet."""
        measured = [i for i in line if i in self.probes and len(self.probes[i].energy_j) > 1]
        if len(measured) < 3:
            return None
        k = self._knob
        x = np.array([self.axes[self.knobs[k]][i[k]] for i in measured])
        stats = [self.probes[i].stats() for i in measured]
        t = np.array([s[2] for s in stats])
        e = np.array([s[0] for s in stats])
        table = SweepTable(self.knobs[k], ["run"] * len(measured), x, t, e)
        families = tuple(f for f in PER_WORKLOAD if f != "spline" or len(measured) >= 5)
        scores = score_families(table, loo_predictions(table, families))
        quantity = "energy" if self.cfg.objective == "energy" else "edp"
        try:
            chosen = choose_family(scores, self.cfg.objective)
        except UsageError:
            return None
        xs = np.array([self.axes[self.knobs[k]][i[k]] for i in line])
        fit = CURVE_FITS[chosen.family]
        t_curve, p_curve = fit(x, t), fit(x, e / t)
        if t_curve is None or p_curve is None:
            return None
        t_hat = np.maximum(t_curve(xs), 1e-9)
        e_hat = t_hat * np.maximum(p_curve(xs), 1e-9)
        obj = e_hat if self.cfg.objective == "energy" else e_hat * t_hat
        # the model's own held-out error says how far to trust it: every setting it cannot
        # tell from the best (within twice that error) is a candidate worth measuring
        err_obj = 2e-2 * chosen.mape_common[quantity]
        err_t = 2e-2 * chosen.mape_common.get("time", 0.0)
        t0 = self.probes[self.default].stats()[2]
        ok = t_hat * (1 - err_t) <= t0 * (1 + self.cfg.max_slowdown)
        best_obj = float(obj[ok].min()) if ok.any() else math.inf
        near = ok & (obj * (1 - err_obj) <= best_obj * (1 + err_obj))
        candidates = [line[j] for j in np.argsort(obj) if near[j]]
        self.models.append({"iteration": self.iteration, "knob": self.knobs[k],
                            "family": chosen.family, "points": len(measured),
                            "loo_mape": {s.family: s.mape_common.get(quantity) for s in scores},
                            "candidates": [self.setting(c) for c in candidates]})
        for pick in candidates:
            if pick not in self.probes:
                return pick, "model"
        return None
