"""Sparse-sweep prediction: a workload measured at k of N settings, its optimum from the others.

Why: a full sweep costs N runs of the user's job; measuring 2-4 settings (the default, which
the user runs anyway, and a few below it) is affordable. The missing settings are filled in
from the workloads that were swept fully: in log space a workload's time (and power) curve
is its own level plus a shape, so each other workload's curve is shifted onto the k
measured points (the shift is the mean log difference there), the ones that fit those points
best (least squares after the shift) are its neighbours, and their mean shifted curve is the
prediction. This is the shared-shape model ``log y = a_w + g(x)`` with a_w from the k rows
and g from the workloads whose shape the k rows single out. How many neighbours to average
is not fixed: it is chosen by leave-one-workload-out on the other workloads (each measured
at the same settings, its own other settings hidden), on the regret of the pick.

The uncertainty of a recommendation is reported two ways: that backtest (how often the
pick was the measured best, or one step off, on the other workloads), and a bootstrap over
the other workloads (how often the pick stays the same when the pool is resampled).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wattlab.analysis.models.energy_models import OBJECTIVES, _best, _objective
from wattlab.analysis.models.sweep_results import SweepTable
from wattlab.errors import UsageError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
NEIGHBOUR_COUNTS = (1, 2, 3, 5, 8, 12)
CHOICES = ("spread", "random")
BOOTSTRAP_DRAWS = 200


@dataclass
class Grid:
    """Log time and log power per (workload, setting) on the union of settings; NaN: unmeasured."""

    names: list[str]
    x: FloatArray
    log_time: FloatArray
    log_power: FloatArray

    @classmethod
    def of(cls, table: SweepTable) -> Grid:
        """Repeats averaged (in log space) per workload and setting."""
        names = table.workloads()
        x = np.unique(table.x)
        index = {w: i for i, w in enumerate(names)}
        rows = np.array([index[w] for w in table.workload], dtype=np.int64)
        cols = np.searchsorted(x, table.x)
        shape = (len(names), x.shape[0])
        n = np.zeros(shape)
        np.add.at(n, (rows, cols), 1.0)
        out = []
        for y in (np.log(table.runtime_s), np.log(table.mean_power_w)):
            s = np.zeros(shape)
            np.add.at(s, (rows, cols), y)
            with np.errstate(invalid="ignore"):
                out.append(np.where(n > 0, s / np.maximum(n, 1), np.nan))
        return cls(names, x, out[0], out[1])

    def settings(self, g: int) -> IntArray:
        """Columns where workload ``g`` was measured."""
        return np.flatnonzero(np.isfinite(self.log_time[g]) & np.isfinite(self.log_power[g]))

    def covering(self, cols: IntArray, pool: IntArray) -> IntArray:
        """The workloads of ``pool`` measured at every column of ``cols``."""
        ok = np.all(np.isfinite(self.log_time[np.ix_(pool, cols)])
                    & np.isfinite(self.log_power[np.ix_(pool, cols)]), axis=1)
        return pool[ok]


def _ranked(y: FloatArray, target: FloatArray, measured: IntArray,
            pool: IntArray) -> tuple[IntArray, FloatArray]:
    """Pool positions, best fit first, and each pool curve's shift onto ``target``."""
    at = y[np.ix_(pool, measured)]
    shift = np.mean(target[measured] - at, axis=1)
    misfit = np.sum((target[measured] - at - shift[:, None]) ** 2, axis=1)
    return np.argsort(misfit, kind="stable").astype(np.int64), shift


def _shifted(y: FloatArray, target: FloatArray, measured: IntArray, query: IntArray,
             pool: IntArray, *, m: int) -> FloatArray:
    """Mean of the ``m`` pool curves that best fit ``target`` at ``measured``, after a shift."""
    order, shift = _ranked(y, target, measured, pool)
    best = order[:m]
    return np.asarray(np.mean(y[np.ix_(pool[best], query)] + shift[best, None], axis=0))


@dataclass
class Task:
    """One question: a workload measured at ``measured``, choose among ``cols`` by a rule.

    ``ref`` is the default setting's index in ``cols`` (the slowdown bound's reference).
    """

    grid: Grid
    measured: IntArray
    cols: IntArray
    objective: str
    max_slowdown: float | None
    ref: int


@dataclass
class Prediction:
    """Time and power of one workload at the task's candidate settings (measured ones kept)."""

    time_s: FloatArray
    power_w: FloatArray


def predict(task: Task, g: int, pool: IntArray, m: int) -> Prediction:
    """Workload ``g`` at the candidate settings, from its measured ones and ``pool``'s curves."""
    grid, measured, cols = task.grid, task.measured, task.cols
    t = _shifted(grid.log_time, grid.log_time[g], measured, cols, pool, m=m)
    p = _shifted(grid.log_power, grid.log_power[g], measured, cols, pool, m=m)
    known = np.isin(cols, measured)
    t[known], p[known] = grid.log_time[g, cols[known]], grid.log_power[g, cols[known]]
    return Prediction(np.exp(t), np.exp(p))


def pick(task: Task, pred: Prediction) -> int:
    """Index into ``task.cols`` of the best setting by ``pred`` under the slowdown bound."""
    obj = _objective(task.objective, pred.time_s, pred.power_w)
    return _best(task.cols.astype(np.float64), pred.time_s, obj, task.ref, task.max_slowdown)


@dataclass
class Outcome:
    """A pick scored against the workload's full measurement."""

    pick: int
    best: int
    regret: float  # measured objective at the pick / at the measured best − 1
    violates: bool  # the pick's measured slowdown exceeds the bound

    @property
    def hit(self) -> bool:
        return self.pick == self.best

    @property
    def near(self) -> bool:
        return abs(self.pick - self.best) <= 1


def score(task: Task, g: int, chosen: int) -> Outcome:
    """How good setting ``task.cols[chosen]`` is for workload ``g``, by its measurement."""
    cols = task.cols
    truth = Prediction(np.exp(task.grid.log_time[g, cols]), np.exp(task.grid.log_power[g, cols]))
    best = pick(task, truth)
    obj = _objective(task.objective, truth.time_s, truth.power_w)
    slow = truth.time_s[chosen] / truth.time_s[task.ref] - 1.0
    bound = np.inf if task.max_slowdown is None else task.max_slowdown
    return Outcome(chosen, best, float(obj[chosen] / obj[best] - 1.0), bool(slow > bound + 1e-12))


def _backtest(task: Task, pool: IntArray, m: int) -> list[Outcome]:
    """Each workload of ``pool`` measured at ``task.measured`` only, predicted from the rest."""
    return [score(task, int(v), pick(task, predict(task, int(v), pool[pool != v], m)))
            for v in pool]


def _loss(outcomes: list[Outcome]) -> float:
    """Mean regret; a pick breaking the slowdown bound costs as if it saved nothing extra."""
    return float(np.mean([max(o.regret, 0.0) + (1.0 if o.violates else 0.0) for o in outcomes]))


def choose_neighbours(task: Task, pool: IntArray) -> tuple[int, list[Outcome]]:
    """Neighbour count with the lowest leave-one-workload-out loss on ``pool``, its outcomes."""
    best: tuple[float, int, list[Outcome]] | None = None
    for m in NEIGHBOUR_COUNTS:
        if m >= pool.shape[0]:
            break
        outcomes = _backtest(task, pool, m)
        loss = _loss(outcomes)
        if best is None or loss < best[0]:
            best = (loss, m, outcomes)
    if best is None:
        raise UsageError(f"sparse prediction needs at least 2 other fully swept workloads "
                         f"measured at the same settings; {pool.shape[0]} found")
    return best[1], best[2]


# --------------------------------------------------------------------------- evaluation


def measured_positions(n: int, k: int, choice: str, rng: np.random.Generator) -> IntArray:
    """Which k of n ascending settings are measured: always the highest (the default).

    ``spread``: evenly over the range (k = 3: lowest, middle, highest); ``random``: the
    highest and k − 1 others drawn at random.
    """
    if choice == "spread":
        return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))
    others = rng.choice(n - 1, size=k - 1, replace=False)
    return np.sort(np.append(others, n - 1)).astype(np.int64)


@dataclass
class WorkloadResult:
    """One held-out workload: what was measured, the pick, and the truth."""

    workload: str
    measured_x: list[float]
    recommended_x: float
    best_x: float
    hit: bool
    within_one_step: bool
    regret: float
    violates_bound: bool
    neighbours: int


@dataclass
class SparseEvaluation:
    """Leave-one-workload-out sparse prediction: rates over workloads (and draws)."""

    origin: str
    objective: str
    max_slowdown: float | None
    k: int
    choice: str
    seed: int | None
    draws: int
    hit_rate: float
    within_one_step_rate: float
    mean_regret: float
    violation_rate: float
    spread: dict[str, float]  # over draws (random choice): std of each rate
    workloads: list[WorkloadResult]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _check(table: SweepTable, objective: str, max_slowdown: float | None) -> Grid:
    if objective not in OBJECTIVES:
        raise UsageError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if max_slowdown is not None and max_slowdown < 0:
        raise UsageError(f"--max-slowdown must be >= 0, got {max_slowdown}")
    data = table.usable()
    if len(data) == 0:
        raise UsageError(f"{table.origin}: no finished runs with positive time and energy")
    return Grid.of(data)


def evaluate_sparse(table: SweepTable, k: int, objective: str = "energy",
                    max_slowdown: float | None = None, *, choice: str = "spread",
                    seed: int = 0, draws: int = 1) -> SparseEvaluation:
    """Hold out each workload, keep k of its settings, predict its best from the others.

    The held-out workload's other settings are used only to score the pick. ``random``
    choice repeats the whole evaluation ``draws`` times (seeded) and reports the mean rate
    and its spread over draws.
    """
    grid = _check(table, objective, max_slowdown)
    if choice not in CHOICES:
        raise UsageError(f"choice {choice!r} is not one of {', '.join(CHOICES)}")
    sizes = {grid.names[g]: grid.settings(g).shape[0] for g in range(len(grid.names))}
    smallest = min(sizes, key=lambda w: sizes[w])
    if k < 1 or k >= sizes[smallest]:
        raise UsageError(f"{table.origin}: --measured must be 1 to N-1; workload {smallest!r} "
                         f"has N = {sizes[smallest]} settings, got {k}")
    rng = np.random.default_rng(seed)
    everyone = np.arange(len(grid.names))
    per_draw: list[list[WorkloadResult]] = []
    for _ in range(draws if choice == "random" else 1):
        results = []
        for g in everyone:
            cols = grid.settings(int(g))
            measured = cols[measured_positions(cols.shape[0], k, choice, rng)]
            pool = grid.covering(cols, everyone[everyone != g])
            task = Task(grid, measured, cols, objective, max_slowdown, cols.shape[0] - 1)
            m, _ = choose_neighbours(task, pool)
            o = score(task, int(g), pick(task, predict(task, int(g), pool, m)))
            results.append(WorkloadResult(
                grid.names[g], grid.x[measured].tolist(), float(grid.x[cols[o.pick]]),
                float(grid.x[cols[o.best]]), o.hit, o.near, o.regret, o.violates, m))
        per_draw.append(results)
    rates = np.array([[np.mean([getattr(r, a) for r in rs]) for a in
                       ("hit", "within_one_step", "regret", "violates_bound")]
                      for rs in per_draw])
    spread = dict(zip(("hit_rate", "within_one_step_rate", "mean_regret", "violation_rate"),
                      rates.std(axis=0).tolist(), strict=True))
    mean = rates.mean(axis=0)
    return SparseEvaluation(table.origin, objective, max_slowdown, k, choice,
                            seed if choice == "random" else None, len(per_draw),
                            float(mean[0]), float(mean[1]), float(mean[2]), float(mean[3]),
                            spread, per_draw[0])


# --------------------------------------------------------------------------- a new workload


@dataclass
class SparseRecommendation:
    """The best setting for a workload measured at a few settings, with its uncertainty."""

    origin: str
    workload: str
    objective: str
    max_slowdown: float | None
    measured_x: list[float]
    default_x: float
    recommended_x: float
    predicted_saving: float  # vs the default setting
    predicted_slowdown: float
    settings: list[float]
    predicted_time_s: list[float]
    predicted_power_w: list[float]
    predicted_objective: list[float]
    neighbours: int
    neighbour_workloads: list[str]
    bootstrap_agreement: float  # share of resampled pools that pick the same setting
    bootstrap_within_one_step: float
    saving_interval: tuple[float, float]  # 2.5 / 97.5 % over the bootstrap
    backtest_hit_rate: float  # the other workloads measured at the same settings
    backtest_within_one_step_rate: float
    backtest_workloads: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recommend_sparse(table: SweepTable, workload: str, objective: str = "energy",
                     max_slowdown: float | None = None, *, seed: int = 0,
                     ) -> SparseRecommendation:
    """Recommend a setting for ``workload`` (a few rows) from the table's other workloads.

    Candidate settings: those of the union grid measured by at least half of the other
    workloads that were measured where ``workload`` was; the default is the table's
    ``default_x`` if measured, else the highest setting ``workload`` was measured at.
    """
    grid = _check(table, objective, max_slowdown)
    if workload not in grid.names:
        more = " ..." if len(grid.names) > 8 else ""
        raise UsageError(f"{table.origin}: no workload named {workload!r} "
                         f"(has {', '.join(grid.names[:8])}{more})")
    g = grid.names.index(workload)
    measured = grid.settings(g)
    others = np.array([v for v in range(len(grid.names)) if v != g], dtype=np.int64)
    pool = grid.covering(measured, others)
    finite = np.isfinite(grid.log_time[pool]) & np.isfinite(grid.log_power[pool])
    cols = np.flatnonzero(finite.sum(axis=0) * 2 >= max(pool.shape[0], 1))
    cols = np.union1d(cols, measured)
    pool = grid.covering(cols, pool)
    default = float(grid.x[measured[-1]])
    if table.default_x is not None and table.default_x in grid.x[measured]:
        default = float(table.default_x)
    ref = int(np.flatnonzero(grid.x[cols] == default)[0])
    task = Task(grid, measured, cols, objective, max_slowdown, ref)
    m, outcomes = choose_neighbours(task, pool)
    pred = predict(task, g, pool, m)
    chosen = pick(task, pred)
    obj = _objective(objective, pred.time_s, pred.power_w)
    agree, near, savings = _bootstrap(task, g, pool, m, chosen=chosen, seed=seed)
    order = _ranked(grid.log_time, grid.log_time[g], measured, pool)[0][:m]
    return SparseRecommendation(
        table.origin, workload, objective, max_slowdown, grid.x[measured].tolist(),
        default, float(grid.x[cols[chosen]]), float(1.0 - obj[chosen] / obj[ref]),
        float(pred.time_s[chosen] / pred.time_s[ref] - 1.0), grid.x[cols].tolist(),
        pred.time_s.tolist(), pred.power_w.tolist(), obj.tolist(), m,
        [grid.names[v] for v in pool[order]], agree, near,
        (float(np.percentile(savings, 2.5)), float(np.percentile(savings, 97.5))),
        float(np.mean([o.hit for o in outcomes])), float(np.mean([o.near for o in outcomes])),
        len(outcomes))


def _bootstrap(task: Task, g: int, pool: IntArray, m: int, *, chosen: int, seed: int,
               ) -> tuple[float, float, FloatArray]:
    """Resample the other workloads: how often the pick stays, and the predicted saving."""
    rng = np.random.default_rng(seed)
    picks, savings = [], []
    for _ in range(BOOTSTRAP_DRAWS):
        pred = predict(task, g, rng.choice(pool, size=pool.shape[0], replace=True), m)
        c = pick(task, pred)
        obj = _objective(task.objective, pred.time_s, pred.power_w)
        picks.append(c)
        savings.append(1.0 - obj[c] / obj[task.ref])
    p = np.array(picks)
    return float(np.mean(p == chosen)), float(np.mean(np.abs(p - chosen) <= 1)), np.array(savings)
