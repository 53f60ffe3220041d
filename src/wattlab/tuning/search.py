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

from scipy.stats import t as student_t

from wattlab.errors import UsageError
from wattlab.tuning.knob_line import local_pick, model_candidates, spread_pick
from wattlab.tuning.refine import ExploreBudget
from wattlab.tuning.revisits import pick_trial, plan_revisit, trial_outcome
from wattlab.tuning.standings import Standings

Index = tuple[int, ...]
OBJECTIVES = ("energy", "edp")


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
    """The tuner's state machine: ``observe`` each iteration, apply what ``current`` says.

    The comparisons it decides on are its ``standings`` (standings.py); the next probe
    along a knob comes from knob_line.py, trials and revisits from revisits.py.
    """

    def __init__(self, axes: dict[str, tuple[float, ...]], config: SearchConfig,
                 default: Index | None = None) -> None:
        config.check()
        if not axes or any(len(v) == 0 for v in axes.values()):
            raise UsageError("tune needs at least one knob with settings to try")
        self.axes = {k: tuple(sorted(v)) for k, v in axes.items()}
        self.knobs = list(self.axes)
        self.cfg = config
        self.default: Index = default or tuple(len(v) - 1 for v in self.axes.values())
        self.order: list[Index] = []
        self.models: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.iteration = 0
        self.settled_at: int | None = None  # the latest settling
        self.budget = ExploreBudget(config.explore_share, config.expected_iterations)
        self.standings = Standings(config, self.default, self.budget)
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
    def probes(self) -> dict[Index, Probe]:
        """Every setting measured so far, by index."""
        return self.standings.probes

    @property
    def best(self) -> Index:
        """The best measured setting that keeps within the bound (the kept one once settled)."""
        return self.standings.best

    @property
    def settled(self) -> bool:
        """Running the kept setting or a trial (exploring is over, or paused between revisits).

        A trial's iterations are exploring if it fails (``ExploreBudget.pending_j``).
        """
        return self.phase in ("kept", "trial")

    def setting(self, index: Index) -> dict[str, float]:
        return {k: self.axes[k][i] for k, i in zip(self.knobs, index, strict=True)}

    def slowdown(self, index: Index) -> tuple[float, float]:
        """(time / default's time - 1, its standard error)."""
        return self.standings.slowdown(index)

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
        same = self.best == self.default  # nothing changed: no uncertainty either
        return {"objective": self.cfg.objective, "max_slowdown": self.cfg.max_slowdown,
                "knobs": self.knobs, "default": self.setting(self.default),
                "chosen": self.setting(self.best), "settled": self.settled_at is not None,
                "settled_at_iteration": self.settled_at, "probes": len(self.order),
                "baseline": list(base),
                "baseline_iterations": len(self.probes[self.default].energy_j),
                "trial": None if self.trial is None else self.setting(self.trial),
                "trials": self.trials,
                "energy_saving_measured": 1.0 - best[0] / base[0],
                "energy_saving_se": self.standings.energy_saving(self.best)[1],
                "slowdown_measured": best[2] / base[2] - 1.0,
                "slowdown_se": 0.0 if same else self.standings.slowdown(self.best)[1],
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
        cfg, st, n = self.cfg, self.standings, len(probe.energy_j)
        if self._target is not None:  # a revisit: its planned length, or a clear verdict
            return n >= self._target or (probe.index != self.default
                                         and st.clearly_out(probe.index))
        if n >= cfg.max_iters:
            return True
        if n >= cfg.min_iters and not self.budget.search_allows(0.0, st.rest_j()):
            return True  # the exploration share of a run of known length is spent
        if probe.purpose == "baseline":  # the reference of every comparison
            return n >= 2 * cfg.min_iters and probe.precise(cfg.baseline_rel_se)
        if n < cfg.min_iters:
            return False
        if probe.precise(cfg.rel_se, st.floor()):
            return True
        if st.clearly_out(probe.index):
            return True
        slow, se_slow = st.slowdown(probe.index)
        ratio, se_ratio = st.ratio_to_best(probe.index)
        bound_clear = cfg.max_slowdown - slow > cfg.z_verdict * se_slow
        best_clear = abs(ratio - 1.0) > cfg.z_verdict * se_ratio
        return best_clear and (bound_clear or ratio > 1.0)

    def _line(self) -> list[Index]:
        """The settings along the current knob, the others at the best so far."""
        k = self._knob
        return [(*self.best[:k], j, *self.best[k + 1:]) for j in range(len(self.axes[
            self.knobs[k]]))]

    def _next(self) -> None:
        """Pick the next probe along the current knob, move to the next knob, or settle."""
        st = self.standings
        while self.phase == "search" and self._knob < len(self.knobs):
            st.best = st.best_measured()
            if not self.budget.search_allows(st.probe_cost(self.best), st.rest_j()):
                break  # the exploration share of a run of known length is spent
            line = self._line()
            nxt = None
            if self._knob_probes < self.cfg.max_probes_per_knob:
                nxt = (spread_pick(line, self.probes) or self._modelled(line)
                       or local_pick(line, self.best, self.probes))
            if nxt is not None:
                self._start(nxt[0], nxt[1])
                return
            self._knob += 1
            self._knob_probes = 0
        self._settle()

    def _modelled(self, line: list[Index]) -> tuple[Index, str] | None:
        """The model's best predicted setting on the line, if not measured yet."""
        knob = self.knobs[self._knob]
        found = model_candidates(self.standings, line, self._knob, knob, self.axes[knob])
        if found is None:
            return None
        candidates, model = found
        self.models.append({"iteration": self.iteration, "knob": knob, **model,
                            "candidates": [self.setting(c) for c in candidates]})
        for pick in candidates:
            if pick not in self.probes:
                return pick, "model"
        return None

    def _settle(self) -> None:
        """Keep the best measured setting (or run a trial), first revisiting what may beat it."""
        self._kept_seen = 0
        self._target = None
        self.standings.best = self.standings.best_measured()
        if self.trial is not None:
            self._judge_trial()
        if self.trial is None:
            self._begin_trial()
        revisit = plan_revisit(self.standings, [len(v) for v in self.axes.values()],
                               self.trial)
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

    def _begin_trial(self) -> None:
        """Run on trial the challenger most worth it, if any (``revisits.pick_trial``)."""
        # a failed trial is not run again; one kept and later stepped back from may be
        failed = {tuple(t["index"]) for t in self.trials if t["outcome"] != "kept"}
        pick = pick_trial(self.standings, failed)
        if pick is not None:
            self.trial = pick
            self.trials.append({"index": list(pick), "setting": self.setting(pick),
                                "start": self.iteration, "end": None,
                                "outcome": "running"})

    def _judge_trial(self) -> None:
        """End the trial once certified (kept), refuted, or beyond certifying in its budget.

        A trial that ends unkept is charged to the exploring budget, whole.
        """
        trial = self.trial
        assert trial is not None
        outcome = trial_outcome(self.standings, trial)
        if outcome is None:
            return
        energy_j = self.budget.pending_j
        self.budget.resolve_pending(kept=outcome == "kept")
        self.trials[-1].update(end=self.iteration, outcome=outcome, energy_j=energy_j)
        self.decisions.append({"iteration": self.iteration, "action": "trial " + outcome,
                               "setting": self.setting(trial)})
        self.trial = None
