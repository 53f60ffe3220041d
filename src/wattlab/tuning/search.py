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
setting is the best *measured* one whose slowdown, plus its own uncertainty, keeps within
the bound: a model only chooses what to measure, never what to keep. Once settled, the kept
setting goes on being measured and the decision is retaken every few dozen iterations;
close calls are revisited by their expected gain, within a share of the run's energy
(refine.py).
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
    SweepTable,
    choose_family,
    loo_predictions,
    score_families,
)
from wattlab.errors import UsageError
from wattlab.tuning.refine import ExploreBudget, expected_gain, p_certifiable, p_within
from wattlab.tuning.surfaces import objective_value

Index = tuple[int, ...]
OBJECTIVES = ("energy", "edp")
SPREAD = (0.3, 0.65)  # first probes along a knob, as fractions of its range from the bottom
MOST_ITERATIONS = 10**7  # the most iterations a budget question asks about (a bound only)


@dataclass(frozen=True)
class SearchConfig:
    """How the search measures and decides."""

    objective: str = "energy"
    max_slowdown: float = 0.05
    min_iters: int = 5
    max_iters: int = 500
    # close calls are measured only to 0.4 % while searching: the kept setting goes on
    # being measured and what is still close is revisited by its expected gain (refine.py)
    rel_se: float = 0.004
    # the default's measurement: every other is compared with it, yet tighter than this
    # costs more exploration than the closer comparisons gain (bench/tune_sim.py)
    baseline_rel_se: float = 0.003
    discard: int = 1
    max_probes_per_knob: int = 8
    z_bound: float = 1.0  # a kept setting's slowdown plus this many SEs is within the bound
    z_verdict: float = 2.0  # a probe ends early once this many SEs say it cannot be kept
    # exploring (every iteration not at the kept setting) may cost at most this share of
    # the run's energy; of the whole run when its length is given, else of the run so far
    explore_share: float = 0.048
    expected_iterations: int | None = None
    # after settling, revisit a setting whose expected gain over the kept one is at least
    # this share of the kept setting's saving (or refine_min_gain of the objective)
    refine_gain: float = 0.01
    refine_min_gain: float = 2e-4
    monitor_every: int = 25  # iterations at the kept setting between two re-decisions
    # a trial: a challenger whose measured gain over the kept setting is at least this share
    # of the kept setting's saving, and that the budget left would certify with at least
    # trial_p_keep, is run in the kept one's place until certified or refuted; its
    # iterations count as exploring unless it ends kept (None: no trials)
    trial_gain: float | None = 0.05
    trial_p_keep: float = 0.5
    trial_give_up: float = 0.1  # a trial whose chance of certification falls below this ends

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
        if self.expected_iterations is not None and self.expected_iterations < 1:
            raise UsageError(f"--expected-iterations must be >= 1, got "
                             f"{self.expected_iterations}")
        if self.trial_gain is not None and not self.trial_gain >= 0.0:
            raise UsageError(f"trial_gain must be >= 0 (or None: no trials), got "
                             f"{self.trial_gain}")
        if not 0.0 <= self.trial_give_up < self.trial_p_keep <= 1.0:
            raise UsageError(f"need 0 <= trial_give_up < trial_p_keep <= 1, got "
                             f"{self.trial_give_up} and {self.trial_p_keep}")
        if not 0.0 < self.explore_share <= 1.0:
            raise UsageError(f"--explore-share is a fraction in (0, 1], got "
                             f"{self.explore_share}")


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
    # running means and sums of squared deviations (Welford) of energy and time: the kept
    # setting gathers thousands of iterations and is re-decided every few dozen
    _moments: list[float] = field(default_factory=lambda: [0.0] * 4, repr=False)

    def add(self, energy_j: float, time_s: float) -> None:
        self.energy_j.append(float(energy_j))
        self.time_s.append(float(time_s))
        n, m = len(self.energy_j), self._moments
        for j, x in ((0, float(energy_j)), (2, float(time_s))):
            delta = x - m[j]
            m[j] += delta / n
            m[j + 1] += delta * (x - m[j])

    def rel_sd(self) -> tuple[float, float]:
        """Relative standard deviation of energy and time per iteration."""
        n, m = len(self.energy_j), self._moments
        if n < 2:
            return 0.0, 0.0
        return math.sqrt(m[1] / (n - 1)) / m[0], math.sqrt(m[3] / (n - 1)) / m[2]

    def stats(self, floor_rel_sd: tuple[float, float] = (0.0, 0.0)
              ) -> tuple[float, float, float, float]:
        """(mean energy J, its SE, mean time s, its SE).

        ``floor_rel_sd``: the least relative spread (energy, time) an iteration may have: a
        few iterations can look steadier than the job is, so the search floors their spread
        with the one the long default measurement showed.
        """
        n, m = len(self.energy_j), self._moments
        if n == 0:
            return math.nan, math.inf, math.nan, math.inf
        if n < 2:
            return m[0], math.inf, m[2], math.inf
        rel = self.rel_sd()
        scale = _widen(n) / math.sqrt(n)
        return (m[0], max(rel[0], floor_rel_sd[0]) * m[0] * scale,
                m[2], max(rel[1], floor_rel_sd[1]) * m[2] * scale)

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
        self.settled_at: int | None = None  # the latest settling
        self.best: Index = self.default
        self.budget = ExploreBudget(config.explore_share, config.expected_iterations)
        # then "kept" (running the kept setting), "revisit" or "trial" (running a challenger)
        self.phase = "search"
        self.trial: Index | None = None  # the challenger on trial, if any
        self.trials: list[dict[str, Any]] = []  # every trial: setting, start, end, outcome
        self.reason = "baseline"  # why the current setting runs
        self._knob = 0
        self._knob_probes = 0
        self._since_change = 0  # iterations seen since the setting last changed
        self._target: int | None = None  # a revisit lasts until its probe has this many
        self._kept_seen = 0
        self.current: Index = self.default
        self._start(self.default, "baseline")

    # ------------------------------------------------------------------ public

    @property
    def settled(self) -> bool:
        """Running the kept setting or a trial (exploring is over, or paused between revisits).

        A trial's iterations are exploring if it fails (``ExploreBudget.pending_j``).
        """
        return self.phase in ("kept", "trial")

    def setting(self, index: Index) -> dict[str, float]:
        return {k: self.axes[k][i] for k, i in zip(self.knobs, index, strict=True)}

    def observe(self, energy_j: float, time_s: float) -> Index | None:
        """One finished iteration at ``current``; returns the next setting if it changes."""
        self.iteration += 1
        if not (energy_j > 0 and time_s > 0):
            return None
        self.budget.add(energy_j, exploring=not self.settled, pending=self.phase == "trial")
        probe = self.probes[self.current]
        if self._since_change < self.cfg.discard:
            self._since_change += 1
            probe.skipped += 1
            return None
        probe.add(energy_j, time_s)
        before = self.current
        if self.settled:  # the kept setting goes on being measured: free data
            self._kept_seen += 1
            if self._kept_seen >= self.cfg.monitor_every:
                self._settle()
        elif self._enough(probe):
            self._next()
        return self.current if self.current != before else None

    def abandon(self, why: str) -> Index | None:
        """Give up on ``current``: no iteration could be measured there.

        E.g. its bursts are too faint to detect. It counts as not meeting the bound; the
        next setting is returned.
        """
        if self.settled or self.current == self.default:
            return None
        self._target = None
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
                "chosen": self.setting(self.best), "settled": self.settled_at is not None,
                "settled_at_iteration": self.settled_at, "probes": len(self.order),
                "baseline": list(base),
                "trial": None if self.trial is None else self.setting(self.trial),
                "trials": self.trials,
                "energy_saving_measured": 1.0 - best[0] / base[0],
                "slowdown_measured": best[2] / base[2] - 1.0,
                "config": asdict(self.cfg)}

    # ------------------------------------------------------------------ internals

    def _start(self, index: Index, purpose: str) -> None:
        if index == self.current and purpose == self.reason and index in self.probes:
            return  # nothing changes (a re-decision that kept the setting)
        if index != self.current:
            self._since_change = 0
        self.current, self.reason = index, purpose
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
        if self._target is not None:  # a revisit: its planned length, or a clear verdict
            return n >= self._target or (probe.index != self.default
                                         and self._clearly_out(probe.index))
        if n >= cfg.max_iters:
            return True
        if n >= cfg.min_iters and not self.budget.search_allows(0.0, self._rest_j()):
            return True  # the exploration share of a run of known length is spent
        if probe.purpose == "baseline":  # the reference of every comparison
            return n >= 2 * cfg.min_iters and probe.precise(cfg.baseline_rel_se)
        if n < cfg.min_iters:
            return False
        if probe.precise(cfg.rel_se, self._floor()):
            return True
        if self._clearly_out(probe.index):
            return True
        slow, se_slow = self.slowdown(probe.index)
        ratio, se_ratio = self._ratio_to_best(probe.index)
        bound_clear = cfg.max_slowdown - slow > cfg.z_verdict * se_slow
        best_clear = abs(ratio - 1.0) > cfg.z_verdict * se_ratio
        return best_clear and (bound_clear or ratio > 1.0)

    def _clearly_out(self, index: Index) -> bool:
        """Clearly too slow, or clearly worse than the best measured setting."""
        cfg = self.cfg
        slow, se_slow = self.slowdown(index)
        if slow - cfg.z_verdict * se_slow > cfg.max_slowdown:
            return True
        ratio, se_ratio = self._ratio_to_best(index)
        return index != self.best and ratio - 1.0 > cfg.z_verdict * se_ratio

    def _floor(self) -> tuple[float, float]:
        """The spread per iteration the default measurement showed (the job's own jitter)."""
        return self.probes[self.default].rel_sd()

    def _stats(self, index: Index) -> tuple[float, float, float, float]:
        return self.probes[index].stats(self._floor())

    def slowdown(self, index: Index) -> tuple[float, float]:
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
        slow, se_slow = self.slowdown(index)
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
        while self.phase == "search" and self._knob < len(self.knobs):
            self.best = self._best_measured()
            if not self.budget.search_allows(self._probe_cost(self.best), self._rest_j()):
                break  # the exploration share of a run of known length is spent
            line = self._line()
            nxt = None
            if self._knob_probes < self.cfg.max_probes_per_knob:
                nxt = self._spread(line) or self._modelled(line) or self._local(line)
            if nxt is not None:
                self._start(nxt[0], nxt[1])
                return
            self._knob += 1
            self._knob_probes = 0
        self._settle()

    def _kept_j(self) -> float:
        return self.probes[self.best].stats()[0]

    def _rest_j(self) -> float:
        """Energy per iteration the rest of the run is priced at, for the exploring share.

        The least of any measured setting not clearly too slow, not the kept one's: a
        revisit may yet switch to a cheaper setting, which shrinks the run the share is of.
        """
        cfg = self.cfg
        out = self._kept_j()
        for idx, probe in self.probes.items():
            if len(probe.energy_j) >= 2:
                slow, se = self.slowdown(idx)
                if slow - cfg.z_verdict * se <= cfg.max_slowdown:
                    out = min(out, probe.stats()[0])
        return out

    def _probe_cost(self, index: Index, iterations: int | None = None) -> float:
        """Energy (J) of ``iterations`` more at a setting (a short probe by default)."""
        e = self.probes[index].stats()[0] if index in self.probes else math.nan
        n = self.cfg.discard + (iterations or 2 * self.cfg.min_iters)
        return n * (e if math.isfinite(e) else self._kept_j())

    def _settle(self) -> None:
        """Keep the best measured setting (or run a trial), first revisiting what may beat it."""
        self._kept_seen = 0
        self._target = None
        self.best = self._best_measured()
        if self.trial is not None:
            self._judge_trial()
        if self.trial is None:
            self._begin_trial()
        revisit = self._revisit()
        if revisit is not None:
            self.phase = "revisit"
            self._target = revisit[2]
            self._start(revisit[0], revisit[1])
            return
        if not self.settled:
            self.settled_at = self.iteration
        if self.trial is not None:
            self.phase = "trial"
            self._start(self.trial, "trial")
        else:
            self.phase = "kept"
            self._start(self.best, "settle")

    def _spare(self) -> int:
        """Iterations of the default the exploring budget still allows."""
        return self.budget.affordable(self.probes[self.default].stats()[0], self._rest_j(),
                                      MOST_ITERATIONS)

    def _begin_trial(self) -> None:
        """Run on trial the challenger most worth it, if any (``SearchConfig.trial_gain``).

        Why: certifying a setting near the bound takes hundreds of its iterations; run in
        the kept setting's place, they cost the budget nothing once it is certified, which
        leaves the budget for the default's measurement and for later revisits. Not while
        the default is kept: its own iterations, the reference, would then cost instead.
        """
        cfg, kept = self.cfg, self.best
        if cfg.trial_gain is None or kept == self.default:
            return  # the default kept: the reference comes free, revisits certify cheaper
        threshold = max(cfg.trial_gain * self._saving(kept), cfg.refine_min_gain)
        # a failed trial is not run again; one kept and later stepped back from may be
        failed = {tuple(t["index"]) for t in self.trials if t["outcome"] != "kept"}
        spare, best = self._spare(), None
        for idx, probe in self.probes.items():
            if idx in (kept, self.default) or idx in failed or len(probe.energy_j) < 2:
                continue
            gain = 1.0 - self._ratio_to_best(idx)[0]
            p_keep = self._p_keepable(idx, spare)
            if gain >= threshold and p_keep >= cfg.trial_p_keep and (
                    best is None or gain * p_keep > best[0]):
                best = (gain * p_keep, idx)
        if best is not None:
            self.trial = best[1]
            self.trials.append({"index": list(best[1]), "setting": self.setting(best[1]),
                                "start": self.iteration, "end": None,
                                "outcome": "running"})

    def _judge_trial(self) -> None:
        """End the trial once certified (kept), refuted, or beyond certifying in its budget.

        A trial that ends unkept is charged to the exploring budget, whole; it ends before
        another stretch of it could overrun the budget's share.
        """
        trial = self.trial
        assert trial is not None
        if trial == self.best:
            outcome = "kept"
        elif self._clearly_out(trial):
            outcome = "refuted"
        elif self._feasible_value(trial) is not None:
            outcome = "not better"  # certified within the bound, yet not below the kept one
        elif not self.budget.allows(self._probe_cost(trial, self.cfg.monitor_every),
                                    self._rest_j()):
            outcome = "out of budget"
        elif self._p_keepable(trial, self._spare()) < self.cfg.trial_give_up:
            outcome = "cannot certify"
        else:
            return
        energy_j = self.budget.pending_j
        self.budget.resolve_pending(kept=outcome == "kept")
        self.trials[-1].update(end=self.iteration, outcome=outcome, energy_j=energy_j)
        self.decisions.append({"iteration": self.iteration, "action": "trial " + outcome,
                               "setting": self.setting(trial)})
        self.trial = None

    def _saving(self, index: Index) -> float:
        """Measured relative saving of the objective at ``index`` against the default."""
        e0, _, t0, _ = self.probes[self.default].stats()
        e, _, t, _ = self.probes[index].stats()
        return 1.0 - objective_value(self.cfg.objective, e, t) / objective_value(
            self.cfg.objective, e0, t0)

    def _neighbours(self, index: Index) -> list[Index]:
        out = []
        for k, n in enumerate(len(v) for v in self.axes.values()):
            for j in (index[k] - 1, index[k] + 1):
                if 0 <= j < n:
                    out.append((*index[:k], j, *index[k + 1:]))
        return out

    def _unmeasured(self, kept: Index, kept_j: float) -> tuple[Index, str, None] | None:
        """A short probe of an unmeasured setting on a knob's line through the kept one.

        Nearest first, while the budget lasts: the search's models can miss the best
        setting of a jagged surface (published power-limit tables are), and a setting
        clearly worse ends after ``min_iters`` iterations.
        """
        lines = []
        for k in range(len(self.knobs)):
            lines += [(abs(j - kept[k]), (*kept[:k], j, *kept[k + 1:]))
                      for j in range(len(self.axes[self.knobs[k]]))]
        for _, idx in sorted(lines):
            if idx not in self.probes:
                if self.budget.allows(self._probe_cost(idx), kept_j):
                    return idx, "sweep", None
                return None
        return None

    def _revisit(self) -> tuple[Index, str, int | None] | None:
        """What is worth measuring now that a setting is kept (None: nothing, or no budget).

        An unmeasured neighbour of the kept setting first (a short probe); then the measured
        setting with the largest expected gain over the kept one, if it is worth more than
        ``refine_gain`` of the kept setting's saving: measured further itself, or the
        default when the challenger's (or the kept setting's) slowdown straddles the bound
        and the default's measurement is the larger part of its uncertainty. The kept
        setting's own iterations are free, so a challenger is measured only once the kept
        one has more iterations than it.
        """
        cfg, kept = self.cfg, self.best
        kept_j = self._rest_j()
        for nb in self._neighbours(kept):
            if nb not in self.probes:
                if self.budget.allows(self._probe_cost(nb), kept_j):
                    return nb, "local", None
                return None
        threshold = max(cfg.refine_gain * self._saving(kept), cfg.refine_min_gain)
        n = {i: len(p.energy_j) for i, p in self.probes.items()}
        spare = self._spare()
        best: tuple[float, Index] | None = None
        waiting = False
        for run in [i for i in (kept, self.trial) if i is not None and i != self.default]:
            # the setting run near the bound: refine the reference until its slowdown is
            # clearly within the bound (a trial's own iterations come free, as the kept's)
            slow, se = self.slowdown(run)
            if slow + cfg.z_verdict * se > cfg.max_slowdown and n[self.default] < n[run]:
                best = (math.inf, self.default)
        for idx in self.probes:
            if idx in (kept, self.trial) or n[idx] < 2:
                continue
            ratio, se_ratio = self._ratio_to_best(idx)
            p_ok = 1.0 if idx == self.default else p_within(*self.slowdown(idx),
                                                             cfg.max_slowdown)
            p_keep = 1.0 if idx == self.default else self._p_keepable(idx, spare)
            gain = expected_gain(1.0 - ratio, se_ratio, p_keep)
            if gain < threshold:
                continue
            measure = (self.default if idx != self.default and 0.02 < p_ok < 0.98
                       and n[self.default] <= n[idx] else idx)
            if measure == idx and n[kept] < 2 * n[idx]:
                waiting = True  # the kept setting's precision comes free: wait for it
                continue
            if best is None or gain > best[0]:
                best = (gain, measure)
        if best is None:
            return None if waiting else self._unmeasured(kept, kept_j)
        # half as many iterations again, or what the budget has left (the last revisit
        # would otherwise be refused whole while its part could still settle the call)
        measure = best[1]
        planned = max(4 * cfg.min_iters, n[measure] // 2)
        more = self.budget.affordable(self.probes[measure].stats()[0], kept_j,
                                      cfg.discard + planned) - cfg.discard
        if more < cfg.min_iters:
            return None
        return measure, "revisit", n[measure] + more

    def _p_keepable(self, index: Index, spare: int) -> float:
        """Probability that ``index`` can be kept once ``spare`` more iterations are spent.

        They are split between it and the default so as to shrink its slowdown's standard
        error the most; a challenger at the bound that no affordable measurement could
        certify is worth nothing to revisit, however likely it is to be within the bound.
        """
        slow, se = self.slowdown(index)
        n_i, n_0 = len(self.probes[index].energy_j), len(self.probes[self.default].energy_j)
        _, _, t, se_t = self._stats(index)
        _, _, t0, se_t0 = self._stats(self.default)
        # var ~ a / n_i + b / n_0: spend where the larger share of the variance is
        a, b = (se_t / t) ** 2 * n_i, (se_t0 / t0) ** 2 * n_0
        if not (math.isfinite(a + b) and a + b > 0):  # unmeasured, or no spread at all
            return p_within(slow, se, self.cfg.max_slowdown)
        total = n_i + n_0 + spare
        m_i = min(max(total * math.sqrt(a) / (math.sqrt(a) + math.sqrt(b)), n_i), n_i + spare)
        m_0 = max(n_0 + spare - (m_i - n_i), n_0)
        se_after = (t / t0) * math.sqrt(a / m_i + b / m_0)
        return p_certifiable(slow, se, se_after, self.cfg.max_slowdown, self.cfg.z_bound)

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
